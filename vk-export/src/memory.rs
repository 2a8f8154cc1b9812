//! Memory plumbing shared by images and buffers: exporting an allocation as
//! an fd, importing one, and the checks a record must pass on this device.
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
//! * [`check_same_device`] and [`check_memory_type`] hold for every import.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use ash::vk;

use crate::context::{format_uuid, Context};
use crate::error::{Error, Result};
use crate::MEMORY_HANDLE_TYPE;

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
    pub(crate) fn new<T: std::any::Any + Send + Sync>(value: Arc<T>) -> KeepAlive {
        KeepAlive(value)
    }
}

/// A failed import: why, and the caller's fd, open and unchanged (a failed
/// import never consumes or closes it), to retry, send elsewhere or drop.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ImportError {
    /// Why the import failed.
    #[source]
    pub error: Error,
    /// The fd that was passed in.
    pub fd: OwnedFd,
}

impl ImportError {
    /// Drops (closes) the fd and keeps the error.
    pub fn into_error(self) -> Error {
        self.error
    }
}

/// The file type of an fd, if it can be read.
fn file_type(fd: &OwnedFd) -> Option<rustix::fs::FileType> {
    rustix::fs::fstat(fd)
        .ok()
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
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
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if NOT_EXPORTS.iter().any(|k| link.starts_with(k)) {
        return refuse(format!("an {link}"));
    }
    Ok(())
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

/// [`import_with_duplicate`] with this crate's error types.
pub(crate) fn import_dup<T>(
    ctx: &Context,
    fd: OwnedFd,
    import: impl FnOnce(i32) -> Result<T, ImportFailure<Error>>,
) -> Result<T, ImportError> {
    // Mesa's lavapipe closes the fd of a failed import itself (seen: the
    // debug build's IO-safety abort on the second close).
    let closes = ctx.identity().driver_id == vk::DriverId::MESA_LLVMPIPE;
    // SAFETY: every caller in this crate gives the raw fd to exactly one
    // vkAllocateMemory / vkImportSemaphoreFdKHR call and reports a failure
    // after a successful import (a failed bind) as `driver_took_fd`; the
    // driver rule is the one observed above.
    unsafe {
        import_with_duplicate(
            fd,
            closes,
            |source| Error::Socket {
                call: "fcntl(F_DUPFD_CLOEXEC)",
                source,
            },
            import,
        )
    }
    .map_err(|(error, fd)| ImportError { error, fd })
}

/// Allocates memory that imports `raw` (a duplicate, see
/// [`import_with_duplicate`]).
pub(crate) fn allocate_imported(
    ctx: &Context,
    raw: i32,
    size: u64,
    memory_type_index: u32,
    dedicated_to: Option<vk::MemoryDedicatedAllocateInfo<'static>>,
) -> Result<vk::DeviceMemory> {
    let mut import = vk::ImportMemoryFdInfoKHR::default()
        .handle_type(MEMORY_HANDLE_TYPE)
        .fd(raw);
    let mut dedicated_info = dedicated_to.unwrap_or_default();
    let mut alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(size)
        .memory_type_index(memory_type_index)
        .push_next(&mut import);
    if dedicated_to.is_some() {
        alloc = alloc.push_next(&mut dedicated_info);
    }
    // SAFETY: the chain lives across the call; `raw` is an fd this crate
    // owns (a duplicate) and gives to the driver on success.
    unsafe { ctx.inner.device.allocate_memory(&alloc, None) }.map_err(|e| Error::Vulkan {
        call: "vkAllocateMemory (import)",
        result: e,
        hint: "the fd is not an OPAQUE_FD export from this device, or the record does not match it",
    })
}

pub(crate) fn export_memory_fd(ctx: &Context, memory: vk::DeviceMemory) -> Result<OwnedFd> {
    let info = vk::MemoryGetFdInfoKHR::default()
        .memory(memory)
        .handle_type(MEMORY_HANDLE_TYPE);
    // SAFETY: the memory was allocated with OPAQUE_FD export info.
    let fd = unsafe { ctx.inner.memory_fd.get_memory_fd(&info) }.map_err(Error::vk(
        "vkGetMemoryFdKHR",
        "too many open files, or out of memory",
    ))?;
    // SAFETY: vkGetMemoryFdKHR returns a new fd whose ownership passes to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Both UUIDs of a record must be this device's: OPAQUE_FD handles only work
/// on the same device and driver.
pub(crate) fn check_same_device(
    ctx: &Context,
    device_uuid: &[u8; 16],
    driver_uuid: &[u8; 16],
) -> Result<()> {
    let me = &ctx.inner.identity;
    if &me.device_uuid != device_uuid || &me.driver_uuid != driver_uuid {
        return Err(Error::Record(format!(
            "exported on device {} / driver {}, but this is device {} / driver {} ({}): OPAQUE_FD handles \
             only work on the same device and driver",
            format_uuid(device_uuid),
            format_uuid(driver_uuid),
            me.device_uuid_string(),
            format_uuid(&me.driver_uuid),
            me.name
        )));
    }
    Ok(())
}

/// What the allocation facts this device derived (`reqs`, `dedicated`)
/// differ in from a record's (size, memory type, alignment, dedicated), one
/// phrase each: empty when they agree. Images and buffers verify with it.
pub(crate) fn allocation_differences(
    reqs: &vk::MemoryRequirements,
    dedicated: bool,
    allocation_size: u64,
    memory_type_index: u32,
    alignment: u64,
    record_dedicated: bool,
) -> Vec<String> {
    let mut differences = Vec::new();
    if reqs.size != allocation_size {
        differences.push(format!("size {} (record: {allocation_size})", reqs.size));
    }
    if reqs.memory_type_bits & (1 << memory_type_index) == 0 {
        differences.push(format!(
            "memory types {:#b} (record: type {memory_type_index})",
            reqs.memory_type_bits
        ));
    }
    if reqs.alignment != alignment {
        differences.push(format!(
            "alignment {} (record: {alignment})",
            reqs.alignment
        ));
    }
    if dedicated != record_dedicated {
        differences.push(format!(
            "dedicated allocation {dedicated} (record: {record_dedicated})"
        ));
    }
    differences
}

/// The record's memory type must exist here with exactly the record's flags.
pub(crate) fn check_memory_type(
    ctx: &Context,
    index: u32,
    flags: vk::MemoryPropertyFlags,
) -> Result<()> {
    match ctx.memory_type_flags(index) {
        Some(f) if f == flags => Ok(()),
        Some(f) => Err(Error::Record(format!(
            "memory type {index} has flags {f:?} here, but {flags:?} in the record"
        ))),
        None => Err(Error::Record(format!(
            "memory type {index} does not exist on this device"
        ))),
    }
}
