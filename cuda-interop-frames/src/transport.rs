//! The one packet transport of the receiving side: connecting to a
//! sender's socket, receiving and sending [`Message`]s with a deadline,
//! and telling whether the sender hung up.
//!
//! # Contract
//!
//! * [`connect`] bounds `connect(2)` on a full backlog by its timeout;
//!   [`recv_message`] and [`peek`] wait at most until the caller's
//!   deadline; [`send_message`] is bounded by the connection's
//!   `SO_SNDTIMEO`. Nothing here waits without a bound.
//! * [`hung_up`] asks the kernel, without waiting and without taking a
//!   message, whether the sender shut the connection down or closed it
//!   (`POLLRDHUP`/`POLLHUP`): it reports that at once, however many
//!   messages are still queued. A sender shuts a receiver's connection
//!   down before it may write a slot the receiver held (the protocol's
//!   contract), which is what lets `crate::session` refuse queued frames.
//! * [`ConsumerError`] and [`SendError`] are the receiving side's errors:
//!   plain Rust values (a destructor can format them without any
//!   interpreter) whose variants say which kind of failure it was.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};
use vk_export::socket::Connection;

use crate::protocol::{DropReason, Message, PacketError, MAGIC, PACKET_LEN};

/// Why a receiver's call failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// [`connect`]: the sender's backlog stayed full for the timeout.
    #[error("cannot connect to {path}: its backlog stayed full for {timeout:?}")]
    ConnectTimeout {
        /// The socket path.
        path: String,
        /// The bound that passed.
        timeout: Duration,
    },
    /// [`connect`]: a system call failed.
    #[error("cannot connect to {path}: {call} failed: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// The call that failed.
        call: &'static str,
        /// Its error.
        source: std::io::Error,
    },
    /// No message arrived within the timeout.
    #[error("no message from the sender within {0:?}")]
    Timeout(Duration),
    /// Another thread was receiving for the whole timeout.
    #[error("no frame within {0:?}: another thread's next() was receiving")]
    Busy(Duration),
    /// `poll` on the socket failed.
    #[error("poll on the sender's socket failed: {0}")]
    Poll(std::io::Error),
    /// `recv` on the socket failed.
    #[error("recv from the sender failed: {0}")]
    Recv(std::io::Error),
    /// The sender closed the connection without saying why (it exited or
    /// crashed).
    #[error("the sender closed the connection (it stopped or crashed); connect again")]
    Closed,
    /// The sender dropped this receiver, and said why. No frame from before
    /// the drop is handed out after it.
    #[error("the sender dropped this receiver: {0}; connect again")]
    Dropped(DropReason),
    /// This receiver gave the connection up; the reason.
    #[error("the connection to the sender was given up ({0}); connect again")]
    GivenUp(String),
    /// A frame this receiver does not hold (released already).
    #[error("frame {sequence} of slot {slot} is not held by this receiver")]
    NotHeld {
        /// The frame's slot.
        slot: u32,
        /// Its sequence number.
        sequence: u64,
    },
    /// A latest receiver asked for a frame while it holds one: the sender
    /// gives it one at a time.
    #[error(
        "a latest receiver holds one frame at a time: release frame {sequence} before asking for \
         the next"
    )]
    LatestHoldsOne {
        /// The frame it holds.
        sequence: u64,
    },
    /// A frame another receiver handed out.
    #[error("frame {sequence} was received by another receiver: release it there")]
    NotThisReceiver {
        /// Its sequence number.
        sequence: u64,
    },
    /// A packet that is not a valid frame-protocol packet.
    #[error(transparent)]
    Packet(#[from] PacketError),
    /// A valid message the protocol does not allow here.
    #[error("{0}")]
    Protocol(String),
    /// The sender shares a multi-image ring (several named images a slot),
    /// which this receiver of one image a slot does not take.
    #[error(
        "the sender shares a multi-image ring (parts {}): a receiver of one image per slot \
         cannot take it; receive it with vulkan_receiver::PartsReader, a CudaReceiver made from \
         Session::connect_named_any, or the Python Receiver (a dict of tensors)",
        parts.join(", ")
    )]
    MultiImage {
        /// The parts' names, in slot order.
        parts: Vec<String>,
    },
    /// A Vulkan-side error (wire message, record, device).
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
    /// A CUDA-side error.
    #[error(transparent)]
    Cuda(#[from] cuda_interop::Error),
}

impl ConsumerError {
    /// Whether the connection is over (dropped, closed or given up): the
    /// receiver holds nothing and must connect again.
    pub fn is_disconnected(&self) -> bool {
        matches!(
            self,
            ConsumerError::Closed | ConsumerError::Dropped(_) | ConsumerError::GivenUp(_)
        )
    }
}

/// Why a message could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The send timeout passed with the socket still full.
    #[error("the sender did not take a message within the send timeout")]
    Timeout,
    /// Only part of the packet went.
    #[error("sent {sent} of {len} bytes of a message to the sender")]
    Short {
        /// Bytes sent.
        sent: usize,
        /// Bytes of the packet.
        len: usize,
    },
    /// The socket refused it (the sender left: `EPIPE`, `ECONNRESET`).
    #[error("cannot send a message to the sender: {0}")]
    Failed(std::io::Error),
}

/// Connects with `connect(2)` bounded by `timeout` (`SO_SNDTIMEO`: how long
/// a full backlog is waited on), then wraps the socket as a [`Connection`]
/// (peer check, default send timeout).
pub fn connect(path: &str, timeout: Duration) -> Result<Connection, ConsumerError> {
    use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let failed = |call: &'static str, e: Errno| ConsumerError::Connect {
        path: path.to_owned(),
        call,
        source: std::io::Error::from(e),
    };
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| failed("socket(AF_UNIX, SOCK_SEQPACKET)", e))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| failed("a Unix socket path", e))?;
    // SO_SNDTIMEO of zero means "forever": the shortest bound it can express.
    let bound = timeout.max(Duration::from_micros(1));
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, Some(bound))
        .map_err(|e| failed("setsockopt(SO_SNDTIMEO)", e))?;
    match net::connect(&fd, &addr) {
        Ok(()) => {}
        Err(Errno::AGAIN | Errno::INPROGRESS) => {
            return Err(ConsumerError::ConnectTimeout {
                path: path.to_owned(),
                timeout,
            })
        }
        Err(e) => return Err(failed("connect", e)),
    }
    Ok(Connection::from_fd(fd)?)
}

/// The time left until `deadline`.
pub fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A deadline `timeout` from now; a year from now for bounds too large to
/// add ("no bound" enough).
pub fn deadline_after(timeout: Duration) -> Instant {
    Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600))
}

/// `poll` on `conn` for `flags`, at most until `deadline`; the events seen
/// (empty on a timeout).
fn poll_until(
    conn: &Connection,
    flags: PollFlags,
    deadline: Instant,
) -> Result<PollFlags, ConsumerError> {
    loop {
        let rest = left(deadline);
        let ts = rustix::event::Timespec {
            tv_sec: i64::try_from(rest.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(rest.subsec_nanos()),
        };
        let mut fds = [PollFd::new(conn, flags)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => return Ok(PollFlags::empty()),
            Ok(_) => return Ok(fds[0].revents()),
            Err(Errno::INTR) if !rest.is_zero() => continue,
            Err(Errno::INTR) => return Ok(PollFlags::empty()),
            Err(e) => return Err(ConsumerError::Poll(std::io::Error::from(e))),
        }
    }
}

/// Waits at most until `deadline` for `conn` to be readable (a message or
/// a hang-up); whether it is.
pub(crate) fn poll_readable(conn: &Connection, deadline: Instant) -> Result<bool, ConsumerError> {
    Ok(!poll_until(conn, PollFlags::IN, deadline)?.is_empty())
}

/// Whether the sender shut this connection down or closed it, now,
/// without waiting (see the module contract).
pub fn hung_up(conn: &Connection) -> Result<bool, ConsumerError> {
    let seen = poll_until(
        conn,
        PollFlags::RDHUP,
        Instant::now(), // a zero timeout
    )?;
    Ok(seen.intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR))
}

/// What a peek at the next message found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextMessage {
    /// A frame-protocol packet (magic "CIFR").
    Packet,
    /// Anything else: left for `Connection::recv` (a wire message, garbage,
    /// or the end of the stream).
    Other,
}

/// Waits (bounded) for the next message and says whether it is a packet,
/// without taking it; `timeout` is what the caller asked for, for the
/// error.
pub fn peek(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> Result<NextMessage, ConsumerError> {
    if poll_until(conn, PollFlags::IN, deadline)?.is_empty() {
        return Err(ConsumerError::Timeout(timeout));
    }
    let mut head = [0u8; 4];
    match rustix::net::recv(
        conn.as_fd(),
        &mut head,
        RecvFlags::PEEK | RecvFlags::DONTWAIT,
    ) {
        Ok((4, _)) if head == MAGIC => Ok(NextMessage::Packet),
        _ => Ok(NextMessage::Other),
    }
}

/// Receives one message, waiting at most until `deadline` (`timeout` is
/// the caller's, for the error). Fds sent with it (none are expected) are
/// closed by the kernel.
pub fn recv_message(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> Result<Message, ConsumerError> {
    loop {
        if poll_until(conn, PollFlags::IN, deadline)?.is_empty() {
            return Err(ConsumerError::Timeout(timeout));
        }
        match try_recv_message(conn)? {
            Some(message) => return Ok(message),
            None if left(deadline).is_zero() => return Err(ConsumerError::Timeout(timeout)),
            None => continue,
        }
    }
}

/// Receives one message if one is queued, without waiting.
pub fn try_recv_message(conn: &Connection) -> Result<Option<Message>, ConsumerError> {
    let mut buf = [0u8; PACKET_LEN + 16];
    match rustix::net::recv(
        conn.as_fd(),
        &mut buf,
        RecvFlags::TRUNC | RecvFlags::DONTWAIT,
    ) {
        Ok((_, 0)) => Err(ConsumerError::Closed),
        Ok((_, full)) if full == PACKET_LEN => Ok(Some(Message::decode(&buf[..PACKET_LEN])?)),
        Ok((_, full)) => Err(PacketError::Length(full).into()),
        Err(Errno::AGAIN | Errno::INTR) => Ok(None),
        Err(e) => Err(ConsumerError::Recv(std::io::Error::from(e))),
    }
}

/// Sends one message, waiting for room at most until `deadline` (a sender
/// that stops reading cannot hold a receiver's call past its timeout).
pub(crate) fn send_message_until(
    conn: &Connection,
    message: &Message,
    deadline: Instant,
) -> Result<(), SendError> {
    let bytes = message.encode();
    loop {
        match rustix::net::send(
            conn.as_fd(),
            &bytes,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(SendError::Short {
                    sent: n,
                    len: bytes.len(),
                })
            }
            Err(Errno::AGAIN | Errno::INTR) => match poll_until(conn, PollFlags::OUT, deadline) {
                Ok(seen) if seen.is_empty() => return Err(SendError::Timeout),
                Ok(_) => continue,
                Err(_) => return Err(SendError::Timeout),
            },
            Err(e) => return Err(SendError::Failed(std::io::Error::from(e))),
        }
    }
}

/// Sends one message (bounded by the connection's send timeout).
pub fn send_message(conn: &Connection, message: &Message) -> Result<(), SendError> {
    let bytes = message.encode();
    match rustix::net::send(conn.as_fd(), &bytes, SendFlags::NOSIGNAL) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(SendError::Short {
            sent: n,
            len: bytes.len(),
        }),
        Err(Errno::AGAIN) => Err(SendError::Timeout),
        Err(e) => Err(SendError::Failed(std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Delivery;

    fn pair() -> (Connection, Connection) {
        Connection::pair().expect("a socket pair")
    }

    #[test]
    fn messages_round_trip_and_waits_are_bounded() {
        let (a, b) = pair();
        send_message(&a, &Message::Subscribe(Delivery::Latest)).unwrap();
        let got = recv_message(
            &b,
            deadline_after(Duration::from_secs(5)),
            Duration::from_secs(5),
        );
        assert_eq!(got.unwrap(), Message::Subscribe(Delivery::Latest));
        assert!(try_recv_message(&b).unwrap().is_none());
        let t = Duration::from_millis(20);
        assert!(matches!(
            recv_message(&b, deadline_after(t), t),
            Err(ConsumerError::Timeout(_))
        ));
        assert!(matches!(
            peek(&b, deadline_after(t), t),
            Err(ConsumerError::Timeout(_))
        ));
    }

    #[test]
    fn a_hang_up_is_seen_with_messages_still_queued() {
        let (a, b) = pair();
        assert!(!hung_up(&b).unwrap());
        let frame = Message::Frame {
            slot: 0,
            sequence: 1,
            timestamp_ns: 1,
        };
        send_message(&a, &frame).unwrap();
        rustix::net::shutdown(&a, rustix::net::Shutdown::Both).unwrap();
        // The frame is still queued, and the hang-up is visible before it
        // is taken.
        assert!(hung_up(&b).unwrap());
        assert_eq!(try_recv_message(&b).unwrap(), Some(frame));
        assert!(matches!(try_recv_message(&b), Err(ConsumerError::Closed)));
        // A closed peer likewise.
        let (c, d) = pair();
        drop(c);
        assert!(hung_up(&d).unwrap());
    }

    #[test]
    fn garbage_is_refused_typed() {
        let (a, b) = pair();
        rustix::net::send(&a, b"short", SendFlags::NOSIGNAL).unwrap();
        assert!(matches!(
            try_recv_message(&b),
            Err(ConsumerError::Packet(PacketError::Length(5)))
        ));
        let mut bytes = Message::Acquire.encode();
        bytes[0] = b'X';
        rustix::net::send(&a, &bytes, SendFlags::NOSIGNAL).unwrap();
        assert!(matches!(
            try_recv_message(&b),
            Err(ConsumerError::Packet(PacketError::Magic(_)))
        ));
    }

    #[test]
    fn connect_errors_are_typed() {
        let e = connect("/nonexistent/cuda-interop.sock", Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(
                e,
                ConsumerError::Connect {
                    call: "connect",
                    ..
                }
            ),
            "{e}"
        );
    }
}
