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
//! * A reader stops within [`POLL`] of its receiver being closed or the
//!   sender stopping, and at once when the socket is shut down.
//! * [`send_now`] never waits: a full socket is an error (the receiver
//!   stopped reading far beyond what the protocol lets it).

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender as EventSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::SendFlags;
use vk_export::socket::{Connection, Listener};

use crate::protocol::{Message, PacketError, PACKET_LEN};

/// How often the socket threads check whether to stop.
pub const POLL: Duration = Duration::from_millis(100);

/// Events queued for the sender at most.
pub const EVENT_QUEUE: usize = 1024;

/// What the socket threads tell the sender.
pub(crate) enum Event {
    Connected(Connection),
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

/// Accepts connections until `stop`; each goes to the sender as an event.
pub(crate) fn accept_loop(listener: Listener, tx: EventSender<Event>, stop: Arc<AtomicBool>) {
    let never = AtomicBool::new(false);
    while !stop.load(Ordering::Relaxed) {
        // A timeout, or a peer refused (another user): keep listening.
        if let Ok(conn) = listener.accept(POLL) {
            if !post(&tx, Event::Connected(conn), &stop, &never) {
                return;
            }
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
