//! Vulkan memory plumbing shared by images and buffers: exporting an
//! allocation as an fd, importing one (through the fd rule of
//! [`interop_share::fd`]), and the checks a record must pass on this device.
//!
//! # Contract
//!
//! * Every import goes through [`import_dup`]: the driver only ever gets a
//!   duplicate, and a failed import hands the caller's fd back.
//! * [`check_same_device`] and [`check_memory_type`] hold for every import.
//! * No `vkAllocateMemory` of this crate asks for more than the heap of its
//!   memory type holds ([`check_fits_heap`]): such a call is invalid usage
//!   (`VUID-vkAllocateMemory-pAllocateInfo-01713`), not an out-of-memory
//!   result, so it is refused before the driver.

use std::os::fd::{FromRawFd, OwnedFd};

use ash::vk;
use interop_share::fd::{import_with_duplicate, ImportError, ImportFailure};
use interop_share::markers::MemoryLocation;

use interop_share::uuid::{DeviceUuid, DriverUuid};

use crate::context::Context;
use crate::error::{vk_error, Error, Result};
use crate::MEMORY_HANDLE_TYPE;

/// Why no memory type of the class `M` is among `allowed`, and what to do:
/// a driver without device-local memory that is not host-visible (lavapipe
/// and other CPU drivers) cannot make `DeviceLocal` resources, but can make
/// `HostVisible` ones.
pub(crate) fn no_memory_type<M: MemoryLocation>(allowed: u32) -> String {
    let fix = if M::EXCLUDED.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
        "this driver has no device-local memory that is not host-visible (lavapipe and other \
         CPU drivers have none): make the resource `HostVisible` instead \
         (`ExportableImage<F, Optimal, HostVisible>`, `ExportableBuffer<HostVisible>`), or run \
         on a GPU's driver; `cargo xtask doctor` lists each device's memory types"
    } else {
        "pick a memory class this device has (`cargo xtask doctor` lists its memory types)"
    };
    format!(
        "no memory type of the class {} among the allowed types {allowed:#b}: {fix}",
        M::describe()
    )
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

/// Why an allocation of `size` bytes of memory type `memory_type_index`
/// cannot be asked for on this device: the type does not exist, or its heap
/// is smaller than `size` (`VUID-vkAllocateMemory-pAllocateInfo-01713`).
/// `Ok` when the driver may be asked (it may still answer out of memory).
pub(crate) fn check_fits_heap(
    ctx: &Context,
    size: u64,
    memory_type_index: u32,
) -> std::result::Result<(), String> {
    let props = &ctx.inner.memory_properties;
    if memory_type_index >= props.memory_type_count {
        return Err(format!(
            "memory type {memory_type_index} does not exist on this device"
        ));
    }
    let heap_index = props.memory_types[memory_type_index as usize].heap_index;
    let heap_size = props.memory_heaps[heap_index as usize].size;
    if size > heap_size {
        return Err(format!(
            "{size} bytes of memory heap {heap_index}, which holds {heap_size} bytes in all: \
             no allocation that large can exist on this device"
        ));
    }
    Ok(())
}

/// [`check_fits_heap`] for a record's allocation: an [`Error::Record`] (the
/// size is the peer's word). Imports call it before they duplicate the fd,
/// so that a refusal never leaves a duplicate behind.
pub(crate) fn check_record_fits_heap(
    ctx: &Context,
    size: u64,
    memory_type_index: u32,
) -> Result<()> {
    check_fits_heap(ctx, size, memory_type_index)
        .map_err(|why| Error::Record(format!("the record's allocation needs {why}")))
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
    let fd = unsafe { ctx.inner.memory_fd.get_memory_fd(&info) }.map_err(vk_error(
        "vkGetMemoryFdKHR",
        "too many open files, or out of memory",
    ))?;
    owned_export_fd("vkGetMemoryFdKHR", fd)
}

/// Takes ownership of the fd an export call returned with `VK_SUCCESS`. A
/// driver may report success and hand back -1 when the process has no fd
/// free (Mesa 22.3's lavapipe does not check its `dup` under `EMFILE`):
/// that is an error, never an `OwnedFd` (for which -1 is not a value).
pub(crate) fn owned_export_fd(call: &'static str, fd: i32) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(Error::Vulkan {
            call,
            result: vk::Result::ERROR_TOO_MANY_OBJECTS,
            hint: "the driver reported success but returned no fd (-1): the process is probably out of fds \
                   (EMFILE); close fds or raise RLIMIT_NOFILE",
        });
    }
    // SAFETY: a non-negative fd the export call returned as a new fd whose
    // ownership passes to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Both UUIDs of a record must be this device's: OPAQUE_FD handles only work
/// on the same device and driver.
pub(crate) fn check_same_device(
    ctx: &Context,
    device_uuid: &DeviceUuid,
    driver_uuid: &DriverUuid,
) -> Result<()> {
    let me = &ctx.inner.identity;
    if &me.device_uuid != device_uuid || &me.driver_uuid != driver_uuid {
        return Err(Error::Record(format!(
            "exported on device {} / driver {}, but this is device {} / driver {} ({}): OPAQUE_FD handles \
             only work on the same device and driver",
            device_uuid,
            driver_uuid,
            me.device_uuid,
            me.driver_uuid,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each allocation fact a record states is compared on its own: the
    /// memory type bits too, which an import's other checks would otherwise
    /// refuse first (issue 18 item 6).
    #[test]
    fn each_allocation_fact_is_compared() {
        let reqs = vk::MemoryRequirements {
            size: 4096,
            alignment: 256,
            memory_type_bits: 0b0110,
        };
        assert!(allocation_differences(&reqs, true, 4096, 1, 256, true).is_empty());
        let one = |d: Vec<String>, what: &str| {
            assert_eq!(d.len(), 1, "{d:?}");
            assert!(d[0].starts_with(what), "{d:?}");
        };
        one(
            allocation_differences(&reqs, true, 8192, 1, 256, true),
            "size",
        );
        one(
            allocation_differences(&reqs, true, 4096, 0, 256, true),
            "memory types",
        );
        one(
            allocation_differences(&reqs, true, 4096, 3, 256, true),
            "memory types",
        );
        one(
            allocation_differences(&reqs, true, 4096, 1, 512, true),
            "alignment",
        );
        one(
            allocation_differences(&reqs, true, 4096, 1, 256, false),
            "dedicated",
        );
    }
}
