//! The fd table: what this process has open, which file an fd is, fds that
//! are closed or are not GPU exports, and the lock that makes process-wide
//! fd comparisons exact.
//!
//! # Contract
//!
//! * A test that compares the whole table ([`fd_table`], [`open_fd_count`],
//!   [`eventfds`]) before and after holds [`FdLock`] ([`lock`]) across both
//!   readings, and so does every test of the same binary that opens or closes
//!   fds: the table is process-wide, and another test thread opening a file
//!   in between is not a leak. A test binary either takes the lock in every
//!   test or checks only the fds it made itself ([`identity`], [`still_open`]).
//! * [`closed_fd_number`] is a number far above what this process opens,
//!   checked closed when it is handed out.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Held by a test while it opens fds or compares the fd table: one such test
/// of a binary at a time.
pub type FdLock = MutexGuard<'static, ()>;

/// Takes the process-wide fd lock (see the module contract); a test that
/// panicked while holding it does not poison it for the others.
pub fn lock() -> FdLock {
    static FDS: Mutex<()> = Mutex::new(());
    FDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open fds of this process (`/proc/self/fd`), less the one used to list them.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// The process's open fds and what each refers to (`/proc/self/fd`), less
/// the one the listing itself uses.
pub fn fd_table() -> BTreeMap<i32, PathBuf> {
    let listing = PathBuf::from(format!("/proc/{}/fd", std::process::id()));
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (target != listing).then_some((n, target))
        })
        .collect()
}

/// How many eventfds this process has open (completions' signals).
pub fn eventfds() -> usize {
    fd_table()
        .values()
        .filter(|target| target.to_string_lossy() == "anon_inode:[eventfd]")
        .count()
}

/// `(st_dev, st_ino)`: which open file an fd is.
pub fn identity(fd: impl AsFd) -> (u64, u64) {
    let st = rustix::fs::fstat(fd).unwrap();
    (st.st_dev, st.st_ino)
}

/// The identity of the file open as number `raw` now, or `None` if `raw` is
/// closed. Only an fstat: nothing is taken or closed.
pub fn identity_of_number(raw: i32) -> Option<(u64, u64)> {
    // SAFETY: `raw` is only borrowed for the fstat; if it is closed, the
    // call fails with EBADF.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    rustix::fs::fstat(borrowed)
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// Whether every `(number, identity)` in `fds` is still open as the same
/// file: the exact check for "closed none of the fds this test made".
pub fn still_open(fds: &[(i32, (u64, u64))]) -> bool {
    fds.iter().all(|&(n, id)| identity_of_number(n) == Some(id))
}

/// Closes `raw` after a raw driver call refused it, unless the driver
/// closed it already: only if it is still open as the file it was.
pub fn close_if_still(raw: i32, was: (u64, u64)) {
    if identity_of_number(raw) == Some(was) {
        // SAFETY: the fd is open and still the file this test duplicated and
        // handed to a driver call that failed (so did not take it); nothing
        // else owns the number.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
    }
}

/// An fd number that is closed now: high above anything this process opens,
/// so that no other thread gets it meanwhile.
pub fn closed_fd_number() -> i32 {
    let n = 1000;
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{n}")).is_err(),
        "fd {n} is open; pick another"
    );
    n
}

/// An `OwnedFd` for the closed number `n`: the fault under test.
///
/// # Safety
///
/// `n` is closed (see [`closed_fd_number`]), and the value is never closed,
/// read or written through: the caller hands it to an import that refuses
/// it and takes the number back with `into_raw_fd`.
pub unsafe fn owned_closed_fd(n: i32) -> OwnedFd {
    // SAFETY: deliberately not a valid fd: `n` is closed, which is the fault
    // being injected; the caller's contract (above) keeps it from ever being
    // closed or used through this value.
    unsafe { OwnedFd::from_raw_fd(n) }
}

/// Fds that are not GPU exports: an eventfd, `/dev/null`, a pipe, a regular
/// file, a socket and a directory, named.
pub fn not_exports(file: &Path) -> Vec<(&'static str, OwnedFd)> {
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let (socket, _peer) = vk_export::socket::Connection::pair().unwrap();
    vec![
        // Not 0: Mesa's lavapipe reads from the fd it imports, and a read of
        // an eventfd whose counter is 0 blocks for ever (see the table,
        // case 3).
        (
            "an eventfd",
            rustix::event::eventfd(1, rustix::event::EventfdFlags::CLOEXEC).unwrap(),
        ),
        (
            "/dev/null",
            std::fs::File::open("/dev/null").unwrap().into(),
        ),
        ("a pipe", pipe_r),
        ("a regular file", std::fs::File::open(file).unwrap().into()),
        ("a socket", socket.into_fd()),
        (
            "a directory",
            std::fs::File::open(std::env::temp_dir()).unwrap().into(),
        ),
    ]
}

/// [`not_exports`] less the directory (the CUDA-side cases).
pub fn not_exports_but_a_directory(file: &Path) -> Vec<(&'static str, OwnedFd)> {
    not_exports(file)
        .into_iter()
        .filter(|(what, _)| *what != "a directory")
        .collect()
}

/// Whether `fd` is readable within `within`.
pub fn readable_within(fd: impl AsFd, within: Duration) -> bool {
    let timeout = rustix::event::Timespec {
        tv_sec: within.as_secs() as i64,
        tv_nsec: within.subsec_nanos().into(),
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() == 1
}
