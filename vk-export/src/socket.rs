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
//! covers the moment between `bind` and `chmod`.)

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{Error, Result};
use crate::wire::{Message, Received, WireError, MAX_MESSAGE_LEN, MAX_RESOURCES};

/// A listening socket at a filesystem path; removes the path when dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
    allowed_uids: Vec<u32>,
}

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// Peer's process id.
    pub pid: i32,
    /// Peer's user id.
    pub uid: u32,
    /// Peer's group id.
    pub gid: u32,
}

fn peer_credentials(fd: BorrowedFd<'_>) -> Result<PeerCredentials> {
    let cred =
        net::sockopt::socket_peercred(fd).map_err(Error::socket("getsockopt(SO_PEERCRED)"))?;
    Ok(PeerCredentials {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
    })
}

impl Listener {
    /// Binds and listens at `path`, which must not exist yet.
    pub fn bind(path: impl AsRef<Path>) -> Result<Listener> {
        let path = path.as_ref().to_path_buf();
        let fd = net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
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

    /// Waits for a connection; a peer whose user is not allowed is
    /// disconnected and reported as [`Error::PeerRefused`].
    pub fn accept(&self) -> Result<Connection> {
        let fd =
            net::accept_with(&self.fd, SocketFlags::CLOEXEC).map_err(Error::socket("accept"))?;
        let peer = peer_credentials(fd.as_fd())?;
        if !self.allowed_uids.contains(&peer.uid) {
            drop(fd);
            return Err(Error::PeerRefused {
                pid: peer.pid,
                uid: peer.uid,
            });
        }
        Ok(Connection { fd })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One end of a connection.
#[derive(Debug)]
pub struct Connection {
    fd: OwnedFd,
}

impl Connection {
    /// Connects to a [`Listener`] at `path`.
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
        net::connect(&fd, &addr).map_err(Error::socket("connect"))?;
        Ok(Connection { fd })
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
        Ok((Connection { fd: a }, Connection { fd: b }))
    }

    /// Wraps an already connected `SOCK_SEQPACKET` socket.
    pub fn from_fd(fd: OwnedFd) -> Connection {
        Connection { fd }
    }

    /// The socket.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// The peer's credentials.
    pub fn peer(&self) -> Result<PeerCredentials> {
        peer_credentials(self.fd.as_fd())
    }

    /// Sends `message` with `fds` (fd `i` belongs to resource `i`). The fds
    /// are closed here once the kernel has duplicated them into the message.
    pub fn send(&self, message: &Message, fds: Vec<OwnedFd>) -> Result<()> {
        if fds.len() != message.resources.len() {
            return Err(WireError::FdCount {
                expected: message.resources.len(),
                received: fds.len(),
            }
            .into());
        }
        let bytes = message.encode()?;
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        self.send_raw(&bytes, &borrowed)
    }

    /// Sends arbitrary bytes and fds: for testing peers against malformed input.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
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
        .map_err(Error::socket("sendmsg"))?;
        if sent != bytes.len() {
            return Err(Error::Socket {
                call: "sendmsg",
                source: std::io::Error::other(format!("sent {sent} of {} bytes", bytes.len())),
            });
        }
        Ok(())
    }

    /// Receives one message, validated, with its fds.
    pub fn recv(&self) -> Result<Received> {
        self.recv_with_fd_capacity(MAX_RESOURCES)
    }

    /// As [`Connection::recv`], with room for at most `max_fds` fds; more make
    /// the kernel truncate the control data, which is an error.
    pub fn recv_with_fd_capacity(&self, max_fds: usize) -> Result<Received> {
        let mut buf = vec![0u8; MAX_MESSAGE_LEN + 1];
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = net::recvmsg(
            &self.fd,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(Error::socket("recvmsg"))?;
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
            return Err(WireError::Closed.into());
        }
        let message = Message::decode(&buf[..msg.bytes])?;
        Ok(Received::new(message, fds)?)
    }
}
