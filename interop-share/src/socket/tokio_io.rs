//! Async receives and accepts on tokio's reactor (feature `tokio`).
//!
//! # Contract
//!
//! * **Readiness only.** The futures wait on a [`tokio::io::unix::AsyncFd`]
//!   for the socket to be readable, then take what is waiting with the same
//!   non-blocking call as the blocking API ([`Connection::try_recv`],
//!   [`Listener::try_accept`]) within one poll of the future: a message and
//!   its fds come out of one `recvmsg` and are owned (`OwnedFd`) before the
//!   poll returns, a connection out of one `accept`. Readiness that another
//!   thread or task consumed first is cleared and waited for again.
//! * **Cancellation-safe.** The only await point is that readiness wait, and
//!   nothing has been received when it is pending: a future dropped there
//!   leaves the message (with its fds) or the connection in the socket for
//!   the next receive or accept. Dropping deregisters the fd and closes the
//!   duplicate registered (below); nothing else is left behind.
//! * **A duplicate is registered.** Each future registers a fresh duplicate
//!   of the socket (`F_DUPFD_CLOEXEC`): epoll keys registrations by fd and
//!   file, so several futures may wait on one socket at once (tasks sharing
//!   a listener), and an application may keep its own registration of the
//!   socket's fd ([`AsFd`]). The duplicate lives only as long as the future.
//! * **Bounded.** Every future takes a timeout ([`Error::Timeout`], with the
//!   caller's bound) on tokio's clock ([`tokio::time::timeout`]).
//! * **Needs a tokio runtime with I/O and time enabled**
//!   (`Builder::enable_all`, as `#[tokio::main]` does): tokio panics when the
//!   future is polled outside one.

use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::{Connection, Listener};
use crate::error::{Error, Result};
use crate::wire::{Received, MAX_RESOURCES};

/// Waits (at most `timeout`) until `fd` is readable and `take` returns
/// something; `take` is called only when tokio reports the fd readable and
/// returns `None` when what made it readable was taken elsewhere.
async fn when_readable<T>(
    fd: BorrowedFd<'_>,
    timeout: Duration,
    mut take: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let duplicate: OwnedFd = fd.try_clone_to_owned().map_err(|source| Error::Socket {
        call:
            "fcntl(F_DUPFD_CLOEXEC) (a socket's duplicate for tokio; close fds or raise ulimit -n)",
        source,
    })?;
    // SAFETY: the AsyncFd owns `duplicate`, an open fd that nothing else
    // closes or replaces: it stays open, the same file, until the AsyncFd
    // drops (tokio's condition for a registration).
    let registered = unsafe { AsyncFd::register_with_interest(duplicate, Interest::READABLE) }
        .map_err(|e| Error::Socket {
            call: "epoll_ctl (registering a socket with the tokio reactor)",
            source: e.into(),
        })?;
    let wait = async {
        loop {
            let mut ready = registered
                .readable()
                .await
                .map_err(|source| Error::Socket {
                    call: "tokio AsyncFd::readable",
                    source,
                })?;
            // No await between here and the return: what `take` received is
            // returned by this very poll.
            match take()? {
                Some(value) => return Ok(value),
                None => ready.clear_ready(),
            }
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_elapsed| Error::Timeout(timeout))?
}

impl Listener {
    /// As [`Listener::accept`], as a future on tokio's reactor: waits up to
    /// `timeout` for a connection ([`Error::Timeout`]); a peer whose user is
    /// not allowed is disconnected and reported as [`Error::PeerRefused`].
    ///
    /// Cancellation-safe: dropped before it completes, it has accepted
    /// nothing (a waiting connection stays in the backlog) and leaves no fd
    /// open. Several may wait on one listener at once; each connection goes
    /// to one of them. Needs a tokio runtime with I/O and time enabled.
    ///
    /// ```no_run
    /// # async fn serve() -> Result<(), interop_share::Error> {
    /// use std::time::Duration;
    /// use interop_share::socket::Listener;
    /// let listener = Listener::bind("/tmp/example.sock")?;
    /// let connection = listener.accept_async(Duration::from_secs(10)).await?;
    /// let message = connection.recv_async(Duration::from_secs(10)).await?;
    /// # drop(message); Ok(()) }
    /// ```
    pub fn accept_async(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Connection>> + Send + '_ {
        when_readable(self.fd.as_fd(), timeout, move || self.try_accept())
    }
}

impl Connection {
    /// As [`Connection::recv`], as a future on tokio's reactor: waits up to
    /// `timeout` ([`Error::Timeout`]) for one message and receives it,
    /// validated, with its fds bound to their records.
    ///
    /// Cancellation-safe: a message is received whole, with all its fds, in
    /// one `recvmsg` inside one poll, or not at all; dropped before it
    /// completes, the future has received nothing (the message stays in the
    /// socket for the next receive) and leaves no fd open. Needs a tokio
    /// runtime with I/O and time enabled.
    pub fn recv_async(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Received>> + Send + '_ {
        self.recv_async_with_fd_capacity(MAX_RESOURCES, timeout)
    }

    /// As [`Connection::recv_async`], with room for at most `max_fds` fds,
    /// as in [`Connection::recv_with_fd_capacity`].
    pub fn recv_async_with_fd_capacity(
        &self,
        max_fds: usize,
        timeout: Duration,
    ) -> impl Future<Output = Result<Received>> + Send + '_ {
        when_readable(self.fd.as_fd(), timeout, move || self.try_recv(max_fds))
    }
}
