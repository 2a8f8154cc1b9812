//! Fd ownership across an import, for the Vulkan and the CUDA side alike:
//! the one [`ImportError`], the duplicate-and-settle rule, the cheap fd
//! checks, and [`KeepAlive`].
//!
//! # Contract
//!
//! * **An import never hands the driver the caller's only fd.** The driver
//!   gets a duplicate. On success the driver owns the duplicate and the
//!   caller's fd is closed here, once. On failure the caller's fd comes back,
//!   open and unchanged, inside [`ImportError`]; the duplicate is closed here
//!   unless the driver is one known to close it itself on failure (Mesa's
//!   lavapipe, against the spec). The decision never looks at the fd number
//!   again (another thread may own it by then), so no fd is closed twice.
//! * Cheap checks on the fd come first: a pipe, socket or directory is not a
//!   memory export and never reaches the driver.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use crate::error::{Error, Result};

/// Keeps a Vulkan resource (and its device) alive; the CUDA side holds one per
/// import so the exporter cannot be destroyed first by accident.
#[derive(Clone)]
pub struct KeepAlive(
    #[allow(dead_code, reason = "held only for its Drop")] Arc<dyn std::any::Any + Send + Sync>,
);

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeepAlive")
    }
}

impl KeepAlive {
    /// Keeps `value` alive as long as this (or a clone) lives.
    pub fn new<T: std::any::Any + Send + Sync>(value: Arc<T>) -> KeepAlive {
        KeepAlive(value)
    }
}

/// A failed import: why, and the caller's fd, open and unchanged (a failed
/// import never consumes or closes it), to retry, send elsewhere or drop.
/// One type for both sides: `E` is this crate's [`Error`] for Vulkan imports
/// and `cuda_interop::Error` for CUDA ones (`cuda_interop::ImportError`).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ImportError<E = Error> {
    /// Why the import failed.
    #[source]
    pub error: E,
    /// The fd that was passed in.
    pub fd: OwnedFd,
}

impl<E> ImportError<E> {
    /// Drops (closes) the fd and keeps the error.
    pub fn into_error(self) -> E {
        self.error
    }
}

/// The file type of an fd, if it can be read.
fn file_type(fd: &OwnedFd) -> Option<rustix::fs::FileType> {
    rustix::fs::fstat(fd)
        .ok()
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
}

/// What `/proc/self/fd/N` names for `fd` (`anon_inode:[eventfd]`, a path,
/// ...), or "" where it cannot be read.
fn fd_link(fd: &OwnedFd) -> String {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Anonymous-inode kinds that are never a GPU export; a driver may even
/// block reading one (lavapipe on an eventfd whose counter is 0).
const NOT_EXPORTS: &[&str] = &[
    "anon_inode:[eventfd]",
    "anon_inode:[signalfd]",
    "anon_inode:[timerfd]",
    "anon_inode:[eventpoll]",
    "anon_inode:[pidfd]",
    "anon_inode:inotify",
    "anon_inode:[fanotify]",
];

/// Refuses fds that cannot be a memory or semaphore export before any driver
/// sees them: pipes, sockets, directories, and event, signal, timer, epoll,
/// pid and notify fds. Used by the CUDA imports too.
pub fn check_export_fd(fd: &OwnedFd, what: &str) -> Result<()> {
    use rustix::fs::FileType;
    let refuse = |kind: String| {
        Err(Error::Record(format!(
            "fd {} is {kind}, not an exported {what}",
            fd.as_raw_fd()
        )))
    };
    match file_type(fd) {
        Some(t @ (FileType::Fifo | FileType::Socket | FileType::Directory | FileType::Symlink)) => {
            return refuse(format!("a {t:?}"))
        }
        None => return refuse("not inspectable (fstat failed)".into()),
        Some(_) => {}
    }
    let link = fd_link(fd);
    if NOT_EXPORTS.iter().any(|k| link.starts_with(k)) {
        return refuse(format!("an {link}"));
    }
    Ok(())
}

/// Refuses an fd that is not a sync file (`anon_inode:sync_file`, what a
/// SYNC_FD export and the kernel's dma-fence exports are) before any driver
/// sees it: `/dev/null`, a pipe or an eventfd is no fence.
pub fn check_sync_file(fd: &OwnedFd) -> Result<()> {
    let link = fd_link(fd);
    if link == "anon_inode:sync_file" {
        return Ok(());
    }
    let what = if link.is_empty() {
        "not inspectable (readlink failed)".to_string()
    } else {
        link
    };
    Err(Error::Record(format!(
        "fd {} is {what}, not a sync file (a SYNC_FD export)",
        fd.as_raw_fd()
    )))
}

/// Why an import through [`import_with_duplicate`] failed, and whether the
/// driver had already taken the duplicate (a step after a successful import
/// failed, and undoing it released the driver's fd).
#[derive(Debug)]
pub struct ImportFailure<E> {
    /// Why.
    pub error: E,
    /// The driver owned the duplicate when the failure happened.
    pub driver_took_fd: bool,
}

impl<E> From<E> for ImportFailure<E> {
    /// A failure of the import call itself: the duplicate is not the driver's.
    fn from(error: E) -> ImportFailure<E> {
        ImportFailure {
            error,
            driver_took_fd: false,
        }
    }
}

/// Hands `import` a duplicate of `fd` and settles ownership as this module's
/// contract says: `Ok` consumes `fd`; `Err` returns it, open and unchanged,
/// with the error (`dup_failed` makes the error when `fd` cannot be
/// duplicated). After a failed import the duplicate is closed here unless
/// `driver_closes_on_failure` says the driver already closed it (Mesa's
/// lavapipe does, against the spec): it is never inspected by number, since
/// a closed number may already belong to another thread's new fd. The CUDA
/// side imports through this too (CUDA leaves the fd with the caller on
/// failure, as the spec says).
///
/// # Safety
/// `import` passes the raw fd it gets to at most one driver import call
/// (which owns it on success), never closes or keeps it otherwise, and sets
/// [`ImportFailure::driver_took_fd`] truthfully; `driver_closes_on_failure`
/// is true exactly for drivers that close the fd of a failed import.
pub unsafe fn import_with_duplicate<T, E>(
    fd: OwnedFd,
    driver_closes_on_failure: bool,
    dup_failed: impl FnOnce(std::io::Error) -> E,
    import: impl FnOnce(i32) -> Result<T, ImportFailure<E>>,
) -> Result<T, (E, OwnedFd)> {
    let duplicate = match fd.try_clone() {
        Ok(d) => d,
        Err(e) => return Err((dup_failed(e), fd)),
    };
    let raw = duplicate.into_raw_fd();
    match import(raw) {
        Ok(value) => {
            // The driver owns `raw` now; ours is no longer needed.
            drop(fd);
            Ok(value)
        }
        Err(failure) => {
            if !failure.driver_took_fd && !driver_closes_on_failure {
                // SAFETY: the failed import left `raw` with us (the driver
                // neither took it nor closes it on failure), and nothing
                // else refers to this number.
                drop(unsafe { OwnedFd::from_raw_fd(raw) });
            }
            Err((failure.error, fd))
        }
    }
}

#[cfg(test)]
mod tests {
    //! The fd rules observed directly, not through a driver that would
    //! refuse the same fds anyway (issue 18 item 6).
    use std::os::fd::AsFd;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// What `/proc/self/fd/N` names: a number may be reused by another test
    /// thread, the name of a memfd made by [`memfd`] may not.
    fn link(raw: i32) -> String {
        std::fs::read_link(format!("/proc/self/fd/{raw}"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// A memfd with a name no other fd of this process has.
    fn memfd() -> OwnedFd {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "interop-share-test-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC).unwrap()
    }

    #[test]
    fn fds_that_cannot_be_exports_are_refused_by_kind() {
        let (pipe, _w) = rustix::pipe::pipe().unwrap();
        let (socket, _peer) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let dir = rustix::fs::open(
            "/",
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let event = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        for (what, fd) in [
            ("a Fifo", pipe),
            ("a Socket", socket),
            ("a Directory", dir),
            ("an anon_inode:[eventfd]", event),
        ] {
            match check_export_fd(&fd, "memory") {
                Err(Error::Record(m)) => assert!(m.contains(what), "{what}: {m}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        check_export_fd(&memfd(), "memory").unwrap();
        let (pipe, _w) = rustix::pipe::pipe().unwrap();
        assert!(check_sync_file(&pipe).is_err());
    }

    #[test]
    fn a_failed_import_closes_the_duplicate_unless_the_driver_did() {
        for driver_closes in [false, true] {
            let fd = memfd();
            let mine = link(fd.as_raw_fd());
            let mut duplicate = -1;
            let failed: std::result::Result<(), _> =
                // SAFETY: the closure gives the raw fd to no driver; it
                // closes it itself exactly when it says the driver does.
                unsafe {
                    import_with_duplicate(
                        fd,
                        driver_closes,
                        |e| e.to_string(),
                        |raw| {
                            duplicate = raw;
                            if driver_closes {
                                drop(OwnedFd::from_raw_fd(raw));
                            }
                            Err(ImportFailure::from("refused".to_string()))
                        },
                    )
                };
            let (error, back) = failed.unwrap_err();
            assert_eq!(error, "refused");
            assert_eq!(
                link(back.as_fd().as_raw_fd()),
                mine,
                "the caller's fd comes back"
            );
            // The duplicate's number is closed now (or another thread's fd).
            assert_ne!(
                link(duplicate),
                mine,
                "driver_closes={driver_closes}: the duplicate was leaked"
            );
        }
    }
}
