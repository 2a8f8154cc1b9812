//! Sending [`Message`]s with their fds over Unix domain sockets.
//!
//! Sockets are `SOCK_SEQPACKET`, so each message arrives whole, with its fds in
//! the same `sendmsg` (never split from its record). Receiving uses
//! `MSG_CMSG_CLOEXEC`, wraps every fd in an `OwnedFd` at once, and treats
//! `MSG_TRUNC`/`MSG_CTRUNC` and a wrong fd count as protocol errors; whatever
//! happens, every fd received is closed exactly once.
//!
//! A [`Listener`]'s socket file is `0600` and every connection's peer
//! credentials (`SO_PEERCRED`) are checked: only the same user is accepted
//! unless [`Listener::allow_uid`] says otherwise. (The file mode narrows who
//! can connect; the credential check is what is relied on, since it also
//! covers the moment between `bind` and `chmod`.) Connections made with
//! [`Connection::connect`] and [`Connection::from_fd`] check the other side
//! the same way. A pid of 0 from the kernel (a peer in another pid
//! namespace) is reported as an unknown pid.
//!
//! Every wait is bounded: [`Listener::accept`] and [`Connection::recv`] take
//! a timeout, sends and connects are bounded by `SO_SNDTIMEO`
//! ([`DEFAULT_SEND_TIMEOUT`], [`Connection::set_send_timeout`]), and both
//! types are [`AsFd`] for an event loop. With the `tokio` feature,
//! `Listener::accept_async` and `Connection::recv_async` are futures on
//! tokio's reactor, bounded and cancellation-safe: a message (with its fds)
//! or a connection is taken whole in one call or left in the socket.
//!
//! What travels is honest only as far as the sender: the safe
//! [`Connection::send_exported`] sends each resource's own record with a
//! fresh export of its own fd; [`Connection::send`] and
//! [`Connection::send_raw`], which take records and fds separately, are
//! `unsafe`.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{Error, Result};
pub use crate::received::PeerCredentials;
use crate::wire::{Message, Received, WireError, MAX_MESSAGE_LEN, MAX_RESOURCES};

#[cfg(feature = "tokio")]
mod tokio_io;

/// A listening socket at a filesystem path; removes the path when dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
    allowed_uids: Vec<u32>,
}

/// Reads `SO_PEERCRED` without trusting the kernel's pid to be non-zero (it
/// is 0 for a peer in another pid namespace).
fn peer_credentials(fd: BorrowedFd<'_>) -> Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of a `ucred`, the size
    // `len` says; the fd is a live socket borrowed for the call.
    let status = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if status != 0 {
        return Err(Error::Socket {
            call: "getsockopt(SO_PEERCRED)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(PeerCredentials {
        pid: (cred.pid != 0).then_some(cred.pid),
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Waits until `fd` is readable, up to `timeout`.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration, what: &'static str) -> Result<()> {
    let deadline = Deadline::after(timeout);
    loop {
        let left = deadline.left();
        let ts = rustix::event::Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => return Err(Error::Timeout(timeout)),
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
            Err(e) => return Err(Error::socket(what)(e)),
        }
    }
}

/// A point in time a wait ends at; `None` when the bound is too large to
/// add to now (`Duration::MAX`): that wait ends only when its event comes.
#[derive(Clone, Copy)]
struct Deadline(Option<Instant>);

impl Deadline {
    fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }
    fn left(self) -> Duration {
        self.0.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }
}

/// The default bound of a send (and of a connect while the listener's
/// backlog is full), set as `SO_SNDTIMEO` on every connection.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Reports a timeout with the caller's whole bound, not what was left of it.
fn timeout_of(e: Error, timeout: Duration) -> Error {
    match e {
        Error::Timeout(_) => Error::Timeout(timeout),
        other => other,
    }
}

/// Sets `SO_SNDTIMEO` (a zero timeout would mean "none": at least 1 µs).
fn set_send_timeout(fd: &OwnedFd, timeout: Duration) -> Result<()> {
    rustix::net::sockopt::set_socket_timeout(
        fd,
        rustix::net::sockopt::Timeout::Send,
        Some(timeout.max(Duration::from_micros(1))),
    )
    .map_err(Error::socket("setsockopt(SO_SNDTIMEO)"))
}

fn check_same_user(peer: PeerCredentials, allowed: &[u32]) -> Result<()> {
    if allowed.contains(&peer.uid) {
        Ok(())
    } else {
        Err(Error::PeerRefused {
            pid: peer.pid,
            uid: peer.uid,
        })
    }
}

impl Listener {
    /// Binds and listens at `path`, which must not exist yet.
    pub fn bind(path: impl AsRef<Path>) -> Result<Listener> {
        let path = path.as_ref().to_path_buf();
        // Non-blocking, so that accept after a poll never blocks when another
        // thread took the connection first.
        let fd = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(Error::socket("socket(AF_UNIX, SOCK_SEQPACKET)"))?;
        let addr = SocketAddrUnix::new(&path)
            .map_err(Error::socket("a Unix socket path (at most 107 bytes)"))?;
        net::bind(&fd, &addr).map_err(Error::socket("bind"))?;
        let listener = Listener {
            fd,
            path,
            allowed_uids: vec![rustix::process::getuid().as_raw()],
        };
        rustix::fs::chmod(&listener.path, rustix::fs::Mode::from_raw_mode(0o600))
            .map_err(Error::socket("chmod 0600"))?;
        net::listen(&listener.fd, 8).map_err(Error::socket("listen"))?;
        Ok(listener)
    }

    /// Also accept connections from processes of user `uid`.
    ///
    /// Safe: the credential check narrows who can connect, but no import
    /// relies on the peer being this user (any process of this user can send
    /// any record with any fd, too); imports rest on their own checks and
    /// the importing driver's (see the guide's "Trust boundary").
    pub fn allow_uid(&mut self, uid: u32) {
        self.allowed_uids.push(uid);
    }

    /// Replaces the allowed users (the default is this process's user only).
    pub fn set_allowed_uids(&mut self, uids: Vec<u32>) {
        self.allowed_uids = uids;
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for a connection ([`Error::Timeout`] if none
    /// came); a peer whose user is not allowed is disconnected and reported
    /// as [`Error::PeerRefused`].
    pub fn accept(&self, timeout: Duration) -> Result<Connection> {
        let deadline = Deadline::after(timeout);
        loop {
            let left = deadline.left();
            wait_readable(self.fd.as_fd(), left, "poll (accept)")
                .map_err(|e| timeout_of(e, timeout))?;
            if let Some(connection) = self.try_accept()? {
                return Ok(connection);
            }
        }
    }

    /// Accepts a waiting connection without blocking; `None` when none is
    /// waiting (another thread or task took it first). A connection is
    /// accepted whole or not at all: nothing is held between calls.
    pub(crate) fn try_accept(&self) -> Result<Option<Connection>> {
        let fd = loop {
            match net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Ok(fd) => break fd,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::socket("accept")(e)),
            }
        };
        let peer = peer_credentials(fd.as_fd())?;
        check_same_user(peer, &self.allowed_uids)?;
        set_send_timeout(&fd, DEFAULT_SEND_TIMEOUT)?;
        Ok(Some(Connection { fd, peer }))
    }
}

impl AsFd for Listener {
    /// The listening socket, to poll for readiness (readable: a connection
    /// is waiting) with epoll, mio or tokio.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One end of a connection to a peer of this user (checked with
/// `SO_PEERCRED` when the connection is made).
#[derive(Debug)]
pub struct Connection {
    fd: OwnedFd,
    peer: PeerCredentials,
}

impl Connection {
    /// Connects to a [`Listener`] at `path`; the listening process must run
    /// as this user.
    pub fn connect(path: impl AsRef<Path>) -> Result<Connection> {
        let fd = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(Error::socket("socket(AF_UNIX, SOCK_SEQPACKET)"))?;
        let addr =
            SocketAddrUnix::new(path.as_ref()).map_err(Error::socket("a Unix socket path"))?;
        // A full backlog makes connect wait: bounded by the send timeout.
        set_send_timeout(&fd, DEFAULT_SEND_TIMEOUT)?;
        net::connect(&fd, &addr).map_err(|e| match e {
            rustix::io::Errno::AGAIN | rustix::io::Errno::INPROGRESS => {
                Error::Timeout(DEFAULT_SEND_TIMEOUT)
            }
            e => Error::socket("connect")(e),
        })?;
        Connection::from_fd(fd)
    }

    /// A connected pair (for threads, or a child that inherits one end).
    pub fn pair() -> Result<(Connection, Connection)> {
        let (a, b) = net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(Error::socket("socketpair"))?;
        Ok((Connection::from_fd(a)?, Connection::from_fd(b)?))
    }

    /// Wraps an already connected `SOCK_SEQPACKET` socket whose peer runs as
    /// this user ([`Error::PeerRefused`] otherwise).
    pub fn from_fd(fd: OwnedFd) -> Result<Connection> {
        // A stream socket has no message boundaries: a record could arrive
        // in pieces or run into the next one, its fds apart from it.
        let kind =
            rustix::net::sockopt::socket_type(&fd).map_err(Error::socket("getsockopt(SO_TYPE)"))?;
        if kind != SocketType::SEQPACKET {
            return Err(Error::InvalidArgument(format!(
                "a connection needs a SOCK_SEQPACKET socket (each message whole, its fds with it), not \
                 {kind:?}: make both ends with SocketType::SEQPACKET"
            )));
        }
        let peer = peer_credentials(fd.as_fd())?;
        check_same_user(peer, &[rustix::process::getuid().as_raw()])?;
        set_send_timeout(&fd, DEFAULT_SEND_TIMEOUT)?;
        Ok(Connection { fd, peer })
    }

    /// How long a send may wait for room in the socket (a peer that does not
    /// read): [`Error::Timeout`] after it. [`DEFAULT_SEND_TIMEOUT`] unless set.
    pub fn set_send_timeout(&self, timeout: Duration) -> Result<()> {
        set_send_timeout(&self.fd, timeout)
    }

    /// The socket.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// The peer's credentials, as read when the connection was made.
    pub fn peer(&self) -> PeerCredentials {
        self.peer
    }

    /// Sends `resources` of this process, each record with a fresh export
    /// of its own fd, in one message tagged `tag`: what the receiver takes as
    /// a bundle is, by construction, a record with the fd it describes.
    pub fn send_exported(&self, tag: u64, resources: &[&dyn Exported]) -> Result<()> {
        let mut message = Message {
            tag,
            resources: Vec::with_capacity(resources.len()),
        };
        let mut fds = Vec::with_capacity(resources.len());
        for r in resources {
            message.resources.push(r.resource());
            fds.push(r.export_fd()?);
        }
        // SAFETY: fd `i` is a fresh export of the resource whose own record is
        // resource `i` (the contract of the `unsafe trait Exported`).
        unsafe { self.send(&message, fds) }
    }

    /// Sends `message` with `fds` (fd `i` belongs to resource `i`). The fds
    /// are closed here once the kernel has duplicated them into the message.
    ///
    /// # Safety
    /// Fd `i` exports exactly what resource `i`'s record describes: the
    /// receiver imports the pair as a bundle, which is only as honest as its
    /// sender ([`Connection::send_exported`] makes the pairs itself).
    pub unsafe fn send(&self, message: &Message, fds: Vec<OwnedFd>) -> Result<()> {
        if fds.len() != message.resources.len() {
            return Err(WireError::FdCount {
                expected: message.resources.len(),
                received: fds.len(),
            }
            .into());
        }
        let bytes = message.encode()?;
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.send_raw(&bytes, &borrowed) }
    }

    /// Sends arbitrary bytes and fds (a peer's view of malformed input).
    ///
    /// # Safety
    /// As for [`Connection::send`]: every record the bytes decode to is
    /// honest about the fd sent with it, or the receiver is known not to
    /// import what it receives (a test of the receiver's refusals).
    pub unsafe fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(Error::InvalidArgument(format!(
                "{} fds do not fit one control message",
                fds.len()
            )));
        }
        let sent = net::sendmsg(
            &self.fd,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .map_err(|e| match e {
            rustix::io::Errno::AGAIN => Error::Timeout(
                rustix::net::sockopt::socket_timeout(&self.fd, rustix::net::sockopt::Timeout::Send)
                    .ok()
                    .flatten()
                    .unwrap_or(DEFAULT_SEND_TIMEOUT),
            ),
            e => Error::socket("sendmsg")(e),
        })?;
        if sent != bytes.len() {
            return Err(Error::Socket {
                call: "sendmsg",
                source: std::io::Error::other(format!("sent {sent} of {} bytes", bytes.len())),
            });
        }
        Ok(())
    }

    /// Waits up to `timeout` for one message and receives it, validated,
    /// with its fds bound to their records.
    pub fn recv(&self, timeout: Duration) -> Result<Received> {
        self.recv_with_fd_capacity(MAX_RESOURCES, timeout)
    }

    /// As [`Connection::recv`], with room for at most `max_fds` fds (at most
    /// [`MAX_RESOURCES`]); more make the kernel truncate the control data,
    /// which is an error.
    pub fn recv_with_fd_capacity(&self, max_fds: usize, timeout: Duration) -> Result<Received> {
        let deadline = Deadline::after(timeout);
        loop {
            let left = deadline.left();
            wait_readable(self.fd.as_fd(), left, "poll (recv)")
                .map_err(|e| timeout_of(e, timeout))?;
            if let Some(received) = self.try_recv(max_fds)? {
                return Ok(received);
            }
        }
    }

    /// Receives one waiting message without blocking; `None` when none is
    /// waiting (another thread or task took it first). The message and its
    /// fds come out of one `recvmsg`, and every fd is owned at once, so a
    /// message is received whole or not at all: nothing is held between
    /// calls.
    pub(crate) fn try_recv(&self, max_fds: usize) -> Result<Option<Received>> {
        let max_fds = max_fds.clamp(1, MAX_RESOURCES);
        let mut buf = vec![0u8; MAX_MESSAGE_LEN + 1];
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            // DONTWAIT: another thread may have taken the message after the poll.
            match net::recvmsg(
                &self.fd,
                &mut [IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            ) {
                Ok(msg) => break msg,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::socket("recvmsg")(e)),
            }
        };
        // Own every fd before looking at anything else, so each is closed once.
        let mut fds: Vec<OwnedFd> = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        // The control buffer is rounded up to alignment, so it may hold a few
        // more fds than asked for: the limit is ours, not the kernel's.
        if msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() > max_fds {
            return Err(WireError::ControlTruncated.into());
        }
        if msg.flags.contains(ReturnFlags::TRUNC) || msg.bytes > MAX_MESSAGE_LEN {
            return Err(WireError::MessageTruncated.into());
        }
        if msg.bytes == 0 && fds.is_empty() {
            // End of stream, or an empty message from a peer still there.
            let mut poll = [PollFd::new(&self.fd, PollFlags::IN | PollFlags::RDHUP)];
            let zero = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            let _ = rustix::event::poll(&mut poll, Some(&zero));
            let hung_up = poll[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP);
            return Err(if hung_up {
                WireError::Closed
            } else {
                WireError::TooShort(0)
            }
            .into());
        }
        let message = Message::decode(&buf[..msg.bytes])?;
        Ok(Some(Received::new(message, fds, self.peer)?))
    }
}

impl AsFd for Connection {
    /// The socket, to poll for readiness (readable: a message or hang-up is
    /// waiting) with epoll, mio or tokio.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A resource that [`Connection::send_exported`] can send: its own record
/// and a fresh export of its fd, always together. `vk-export`'s exportable
/// images, buffers and semaphores implement it.
///
/// # Safety
/// [`Exported::export_fd`] returns a new fd that exports exactly the
/// resource [`Exported::resource`] describes (the same allocation or
/// semaphore, of the recorded size and kind): a receiver imports the pair
/// as a bundle.
pub unsafe trait Exported {
    /// The resource's own record.
    fn resource(&self) -> crate::wire::Resource;
    /// A fresh export of its fd.
    fn export_fd(&self) -> Result<OwnedFd>;
}
