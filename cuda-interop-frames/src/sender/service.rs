//! The sender's socket threads: one accepts connections, one per receiver
//! reads its messages; both hand what they get to the sender's thread
//! through one bounded event queue. Nothing here touches the ring.
//!
//! # Contract
//!
//! * The queue holds [`EVENT_QUEUE`] events; a thread whose event does not
//!   fit waits (itself only) until it does or it is told to stop. A
//!   receiver has at most one acquire queued (another is the same request),
//!   so no receiver can fill the queue with requests.
//! * The acceptor hands the sender at most [`ACCEPT_SLACK`] connections
//!   more than its receiver limit: past that (connections queued or served,
//!   counted until the sender closes them), it refuses a connection itself
//!   with the limit's goodbye and closes it, so a flood of connections
//!   neither reaches the sender's thread nor holds more fds than that. A
//!   failed `accept` (out of fds) waits [`ACCEPT_BACKOFF`] before the next.
//! * A reader stops within [`POLL`] of its receiver being closed or the
//!   sender stopping, and at once when the socket is shut down.
//! * [`send_now`] never waits: a full socket is an error (the receiver
//!   stopped reading far beyond what the protocol lets it).

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender as EventSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::SendFlags;
use vk_export::socket::{Connection, Listener};

use crate::protocol::{DropReason, Message, PacketError, PACKET_LEN};

/// How often the socket threads check whether to stop.
pub const POLL: Duration = Duration::from_millis(100);

/// Events queued for the sender at most.
pub const EVENT_QUEUE: usize = 1024;

/// Connections the acceptor hands the sender beyond its receiver limit
/// (for the sender to refuse by its own rules, or serve as others leave);
/// past that it refuses them itself.
pub const ACCEPT_SLACK: usize = 16;

/// How long the acceptor waits after a failed `accept` (the listener stays
/// readable while the process is out of fds: no busy loop).
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// A connection the acceptor handed the sender, counted in the acceptor's
/// tally of open connections until dropped.
pub(crate) struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the acceptor shares with the sender.
pub(crate) struct Admission {
    /// Connections handed to the sender and not yet closed.
    pub(crate) open: Arc<AtomicUsize>,
    /// The sender's receiver limit.
    pub(crate) max_receivers: u32,
    /// Connections the acceptor refused itself.
    pub(crate) refused: Arc<AtomicU64>,
}

/// What the socket threads tell the sender.
pub(crate) enum Event {
    Connected(Connection, Counted),
    Message { id: u64, message: Message },
    Garbage { id: u64, error: PacketError },
    Gone { id: u64, why: String },
}

/// Queues `event`, waiting while the queue is full; false when the sender
/// is gone or `stop` or `closed` is set.
fn post(
    events: &EventSender<Event>,
    mut event: Event,
    stop: &AtomicBool,
    closed: &AtomicBool,
) -> bool {
    loop {
        match events.try_send(event) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if stop.load(Ordering::Relaxed) || closed.load(Ordering::Relaxed) {
                    return false;
                }
                event = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// What a receiver's reader shares with the sender.
pub(crate) struct ReaderFlags {
    /// The sender stops.
    pub(crate) stop: Arc<AtomicBool>,
    /// The sender dropped this receiver.
    pub(crate) closed: Arc<AtomicBool>,
    /// An acquire of this receiver is queued already.
    pub(crate) acquire_queued: Arc<AtomicBool>,
}

/// Reads one receiver's messages until it goes away, sends garbage, or is
/// stopped.
pub(crate) fn read_messages(
    id: u64,
    mut stream: UnixStream,
    events: EventSender<Event>,
    flags: ReaderFlags,
) {
    let (stop, closed) = (&*flags.stop, &*flags.closed);
    let last = loop {
        if stop.load(Ordering::Relaxed) || closed.load(Ordering::Relaxed) {
            return;
        }
        let mut buf = [0u8; PACKET_LEN + 16];
        match stream.read(&mut buf) {
            Ok(0) => {
                break Event::Gone {
                    id,
                    why: "disconnected".into(),
                }
            }
            Ok(n) => match Message::decode(&buf[..n]) {
                Ok(message) => {
                    if message == Message::Acquire
                        && flags.acquire_queued.swap(true, Ordering::AcqRel)
                    {
                        continue;
                    }
                    if !post(&events, Event::Message { id, message }, stop, closed) {
                        return;
                    }
                }
                Err(error) => break Event::Garbage { id, error },
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // A receiver that closes with messages unread resets the
            // connection: still a departure.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                break Event::Gone {
                    id,
                    why: "disconnected".into(),
                }
            }
            Err(e) => {
                break Event::Gone {
                    id,
                    why: format!("disconnected ({e})"),
                }
            }
        }
    };
    post(&events, last, stop, closed);
}

/// Accepts connections until `stop`; each goes to the sender as an event,
/// up to [`ACCEPT_SLACK`] beyond its receiver limit (module contract).
pub(crate) fn accept_loop(
    listener: Listener,
    tx: EventSender<Event>,
    stop: Arc<AtomicBool>,
    admission: Admission,
) {
    let never = AtomicBool::new(false);
    let cap = admission.max_receivers as usize + ACCEPT_SLACK;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept(POLL) {
            Ok(conn) => {
                if admission.open.load(Ordering::Acquire) >= cap {
                    admission.refused.fetch_add(1, Ordering::Relaxed);
                    let limit = admission.max_receivers;
                    refuse(conn.as_fd(), DropReason::TooManyReceivers { limit });
                    continue;
                }
                admission.open.fetch_add(1, Ordering::AcqRel);
                let counted = Counted(admission.open.clone());
                if !post(&tx, Event::Connected(conn, counted), &stop, &never) {
                    return;
                }
            }
            // No connection within POLL, or a peer of another user.
            Err(vk_export::Error::Timeout(_) | vk_export::Error::PeerRefused { .. }) => {}
            Err(_) => std::thread::sleep(ACCEPT_BACKOFF),
        }
    }
}

/// Refuses a connection: a goodbye with `reason` (where its socket has
/// room), then what it sent is read and discarded (bounded), so that the
/// close that follows does not reset the connection before the peer reads
/// the goodbye.
pub(crate) fn refuse(conn: std::os::fd::BorrowedFd<'_>, reason: DropReason) {
    if let Ok(stream) = conn.try_clone_to_owned().map(UnixStream::from) {
        let _ = send_now(&stream, &Message::Goodbye(reason));
        drain(&stream);
    }
}

/// Reads and discards what a dropped receiver sent and nobody read
/// (bounded): closing a socket with unread messages resets the
/// connection, and the peer could lose the goodbye sent before.
pub(crate) fn drain(stream: &UnixStream) {
    let mut buf = [0u8; 64];
    for _ in 0..4096 {
        match rustix::net::recv(stream, &mut buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((_, n)) if n > 0 => continue,
            _ => return,
        }
    }
}

/// Sends `message` without waiting for room.
pub(crate) fn send_now(stream: &UnixStream, message: &Message) -> std::io::Result<()> {
    let bytes = message.encode();
    match rustix::net::send(stream, &bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(std::io::Error::other(format!(
            "sent {n} of {} bytes",
            bytes.len()
        ))),
        Err(Errno::AGAIN) => Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "its socket is full: it stopped reading",
        )),
        Err(e) => Err(e.into()),
    }
}
