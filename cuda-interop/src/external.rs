//! The import handle: one `cuImportExternalMemory` as an
//! [`ExternalMemory`], and the fd rule every CUDA import shares
//! (`CudaDevice::import_fd_with`: refuse fds that are no export, import a
//! duplicate, hand the caller's fd back on failure).
//!
//! # Contract
//!
//! * The import is destroyed only after the GPU's last recorded use of it
//!   (copies through its mappings, kernels listing them) has completed, at
//!   most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT); past that it is
//!   leaked with the Vulkan resource it keeps alive, and the leak reported
//!   through [`drop_errors`](crate::drop_errors).
//! * A failed import returns the caller's fd open, inside [`ImportError`].

use std::os::fd::OwnedFd;

use cuda_interop_sys::{
    self as sys, CUexternalMemory, CUexternalMemoryHandleType, CUDA_EXTERNAL_MEMORY_DEDICATED,
};
use vk_export::KeepAlive;

use crate::context::CudaDevice;
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, ImportError, Result};
use crate::events::report_leak;
use crate::last_use::LastUse;

/// One `cuImportExternalMemory` import; destroyed when dropped, after the
/// GPU's last recorded use of it has completed (or leaked, with its Vulkan
/// resource, if that does not happen within
/// [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT)).
#[derive(Debug)]
pub struct ExternalMemory {
    pub(crate) device: CudaDevice,
    pub(crate) handle: CUexternalMemory,
    pub(crate) size: u64,
    pub(crate) last_use: LastUse,
    pub(crate) vulkan: Option<KeepAlive>,
    /// Why CUDA must not write this memory's arrays, where a GPU run showed
    /// such writes read back wrong by Vulkan (`None`: writes allowed).
    pub(crate) cuda_write_refusal: Option<&'static str>,
}

// SAFETY: the handle is usable from any thread with the context current
// (every use enters it); the last-use record is Send and Sync.
unsafe impl Send for ExternalMemory {}
// SAFETY: mapping calls are thread-safe in the driver; shared access records
// uses under the record's mutex.
unsafe impl Sync for ExternalMemory {}

impl Drop for ExternalMemory {
    fn drop(&mut self) {
        let idle = self.last_use.settle_before_device_wide_release();
        if let Err(why) = idle {
            // Vulkan must not free the memory either while the GPU may still
            // use it: its keep-alive is leaked with the import.
            std::mem::forget(self.vulkan.take());
            // A copy kernel may still run: its module must stay loaded.
            self.device.inner.copy_kernels.keep_loaded();
            self.device.inner.convert_kernels.keep_loaded();
            report_leak(
                &format!(
                    "an import of {} bytes of Vulkan memory (and the Vulkan resource it keeps alive)",
                    self.size
                ),
                &why,
            );
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live import of the current context, destroyed once.
            // Every mapping borrowed it and was freed before this runs (or was
            // forgotten and is never freed), and every copy recorded on it has
            // completed (waited for above).
            record_drop_error(unsafe { cu!(cuDestroyExternalMemory(self.handle)) });
        }
    }
}

impl ExternalMemory {
    /// The imported size (`VkMemoryRequirements.size`).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// The raw handle.
    pub fn raw(&self) -> CUexternalMemory {
        self.handle
    }
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.device
    }
    pub(crate) fn last_use(&self) -> &LastUse {
        &self.last_use
    }
}

/// Whether an import checks, with CUDA itself, that the memory behind the
/// fd is as large as the record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeCheck {
    /// A resource of this process: its own record.
    Trusted,
    /// A received record (a peer's word): right after the import, a mapping
    /// of `[0, size)` is made and freed. `cuImportExternalMemory` accepts a
    /// record larger than its allocation (H200, driver 580), the mapping
    /// does not, so the import is refused before anything can use it.
    /// (Not a Vulkan import of a duplicate: on that driver, a Vulkan import
    /// of memory the process has imported into CUDA before fails.)
    Probe,
}

pub(crate) fn import_memory(
    device: &CudaDevice,
    fd: OwnedFd,
    size: u64,
    dedicated: bool,
    vulkan: Option<KeepAlive>,
    check: SizeCheck,
) -> Result<ExternalMemory, ImportError> {
    if size == 0 {
        return Err(ImportError {
            error: Error::InvalidArgument("an import of 0 bytes".into()),
            fd,
        });
    }
    let mut desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
        type_: CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
        size,
        flags: if dedicated {
            CUDA_EXTERNAL_MEMORY_DEDICATED
        } else {
            0
        },
        ..Default::default()
    };
    let mut handle: CUexternalMemory = std::ptr::null_mut();
    let import = |raw| {
        desc.handle.fd = raw;
        // SAFETY: a zeroed descriptor (reserved fields 0) naming an open fd
        // this crate owns, with the size and dedicated flag of a verified
        // record; the device's context is current; writes one handle.
        unsafe { cu!(cuImportExternalMemory(&mut handle, &desc)) }
            .map_err(vk_export::ImportFailure::from)?;
        if check == SizeCheck::Probe {
            if let Err(error) = probe_size(handle, size) {
                // SAFETY: the import made just above, unused (the probe's
                // mapping failed, so none exists), destroyed once; the
                // driver releases its fd with it.
                record_drop_error(unsafe { cu!(cuDestroyExternalMemory(handle)) });
                return Err(vk_export::ImportFailure {
                    error,
                    driver_took_fd: true,
                });
            }
        }
        Ok(())
    };
    // SAFETY: `import` gives the duplicate to exactly one
    // cuImportExternalMemory call.
    unsafe { device.import_fd_with(fd, "memory", import) }?;
    Ok(ExternalMemory {
        device: device.clone(),
        handle,
        size,
        last_use: LastUse::new(device),
        vulkan,
        cuda_write_refusal: None,
    })
}

/// Maps `[0, size)` of a fresh import and frees the mapping: the driver
/// refuses the mapping when the allocation behind the fd is smaller.
fn probe_size(handle: CUexternalMemory, size: u64) -> Result<()> {
    let desc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset: 0,
        size,
        ..Default::default()
    };
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: a zeroed descriptor (flags 0) over a live import of the
    // current context; writes one device address, freed below.
    let mapped = unsafe { cu!(cuExternalMemoryGetMappedBuffer(&mut ptr, handle, &desc)) };
    if let Err(e) = mapped {
        return Err(Error::InvalidArgument(format!(
            "the received record describes {size} bytes, but the memory behind its fd is smaller \
             (a mapping of the whole range failed: {e}); the sender's record does not match its fd"
        )));
    }
    // SAFETY: the address the mapping above returned, unused, freed once.
    record_drop_error(unsafe { cu!(cuMemFree(ptr)) });
    Ok(())
}

impl CudaDevice {
    /// The fd handling every CUDA import shares: refuses fds that are no
    /// export (pipes, sockets, eventfds...), makes the context current, and
    /// gives `import` a duplicate, so that a failed import hands the
    /// caller's fd back open (CUDA keeps the fd with the caller on failure).
    ///
    /// # Safety
    /// `import` gives the raw fd it gets to exactly one CUDA import call
    /// (which owns it on success only), does nothing else with it, and sets
    /// `driver_took_fd` on a failure after that call succeeded (having
    /// undone the import, which releases the driver's fd).
    pub(crate) unsafe fn import_fd_with(
        &self,
        fd: OwnedFd,
        what: &str,
        import: impl FnOnce(i32) -> Result<(), vk_export::ImportFailure<Error>>,
    ) -> Result<(), ImportError> {
        if let Err(e) = vk_export::check_export_fd(&fd, what) {
            return Err(ImportError {
                error: e.into(),
                fd,
            });
        }
        let _guard = match self.enter() {
            Ok(g) => g,
            Err(error) => return Err(ImportError { error, fd }),
        };
        let dup_failed = |e| Error::InvalidArgument(format!("the fd cannot be duplicated: {e}"));
        // SAFETY: forwarded from the caller (who reports a failure after a
        // successful import as `driver_took_fd`); CUDA never closes the fd
        // of a failed import.
        unsafe { vk_export::import_with_duplicate(fd, false, dup_failed, import) }
            .map_err(|(error, fd)| ImportError { error, fd })
    }
}
