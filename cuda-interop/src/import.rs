//! Imports: Vulkan memory brought into CUDA as an [`ExternalMemory`], typed
//! as the [`ImportedImage`] or [`ImportedBuffer`] it came from; what is
//! mapped from them is the `linear` and `array` modules'.
//!
//! ```text
//! CudaDevice ─┬─ ImportedImage ── MappedArray<'i> ── LevelArray<'m> ─┬─ Surface<'l>
//!             │                                                       └─ Texture<'l>
//!             └─ ImportedBuffer ── MappedBuffer<'i> ── DeviceSlice<'b>
//! ```
//!
//! Each arrow is a borrow, so drops happen in the driver's order: surface and
//! texture objects, then the mipmapped array (`cuMipmappedArrayDestroy`; its
//! level arrays are views it owns, never destroyed on their own) or the
//! mapped buffer (`cuMemFree`), then the external memory
//! (`cuDestroyExternalMemory`), then the Vulkan image (kept alive by the
//! import), then the device.
//!
//! # Contract
//!
//! * **Last use, not borrows, decides when the GPU is done.** Every copy
//!   through a [`MappedBuffer`](crate::MappedBuffer), a [`DeviceSlice`](crate::DeviceSlice) or a [`LevelArray`](crate::LevelArray) is
//!   recorded as a use of the [`ExternalMemory`] behind it. The mapped
//!   buffer's, the mipmapped array's and the import's destructors wait for
//!   those uses (at most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT)) before
//!   they free anything, so `mem::forget` of a mapping cannot let the import
//!   be destroyed under a pending copy. If the uses do not complete in time,
//!   the import is leaked and its Vulkan resource with it (Vulkan never frees
//!   memory the GPU may still read), and the leak is reported through
//!   [`drop_errors`](crate::drop_errors).

use std::marker::PhantomData;
use std::os::fd::OwnedFd;

use cuda_interop_sys::{
    self as sys, CUexternalMemory, CUexternalMemoryHandleType, CUDA_EXTERNAL_MEMORY_DEDICATED,
};
use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Tiling, Usage};
use vk_export::{
    BufferRecord, ExportableBuffer, ExportableImage, ImageInfo, ImageRecord, KeepAlive,
    ReceivedBuffer, ReceivedImage,
};

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

fn import_memory(
    device: &CudaDevice,
    fd: OwnedFd,
    size: u64,
    dedicated: bool,
    vulkan: Option<KeepAlive>,
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
    })
}

/// A Vulkan image imported into CUDA, typed like the image.
#[derive(Debug)]
pub struct ImportedImage<F, T, M, U> {
    pub(crate) memory: ExternalMemory,
    pub(crate) record: ImageRecord<F, T, M, U>,
}

/// A Vulkan buffer imported into CUDA.
#[derive(Debug)]
pub struct ImportedBuffer<M> {
    pub(crate) memory: ExternalMemory,
    pub(crate) size: u64,
    alignment: u64,
    _types: PhantomData<fn() -> M>,
}

impl CudaDevice {
    /// Imports an image of this process. Size and dedicated flag come from
    /// the image; the import keeps the Vulkan image alive.
    pub fn import_image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
    ) -> Result<ImportedImage<F, T, M, U>> {
        self.check_resource_device(&image.info().device_uuid())?;
        let fd = image.export_fd()?;
        self.import_image_inner(image.record(), fd, Some(image.keep_alive()))
            .map_err(ImportError::into_error)
    }

    /// Imports an image received over a socket (record and fd arrived
    /// together from a checked peer). Before the driver sees the fd, the
    /// record is verified on the Vulkan device this CUDA device was paired
    /// with ([`ImageRecord::verify_on`]: both UUIDs, memory type, and the
    /// size, alignment, dedicated flag and pitches that device derives), so
    /// the device must come from [`CudaDevice::for_vulkan`]. On failure the fd
    /// comes back in the error.
    pub fn import_received_image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        received: ReceivedImage<F, T, M, U>,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| record.verify_on(ctx)) {
            return Err(ImportError { error, fd });
        }
        self.import_image_inner(record, fd, None)
    }

    /// Imports an image from a record and an fd that did not travel together
    /// through this crate. Only the device UUID is checked; nothing else of
    /// the record can be.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of the memory of the image `record`
    /// describes, and `record` is that image's own, unmodified record (a
    /// record that misstates size, dedicated flag or shape makes CUDA read
    /// and write memory laid out for another image). On success the fd is
    /// consumed; on failure it comes back in the error.
    pub unsafe fn import_image_fd<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        record: ImageRecord<F, T, M, U>,
        fd: OwnedFd,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        self.import_image_inner(record, fd, None)
    }

    fn import_image_inner<F, T, M, U>(
        &self,
        record: ImageRecord<F, T, M, U>,
        fd: OwnedFd,
        keep: Option<KeepAlive>,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        let info = record.info();
        if let Err(error) = self.check_resource_device(&info.device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let memory = import_memory(self, fd, info.allocation_size(), info.dedicated(), keep)?;
        Ok(ImportedImage { memory, record })
    }

    /// Imports a buffer of this process; keeps the Vulkan buffer alive.
    pub fn import_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
    ) -> Result<ImportedBuffer<M>> {
        self.check_resource_device(&buffer.info().device_uuid())?;
        let fd = buffer.export_fd()?;
        self.import_buffer_inner(buffer.record(), fd, Some(buffer.keep_alive()))
            .map_err(ImportError::into_error)
    }

    /// Imports a buffer received over a socket, verified first on the
    /// paired Vulkan device like [`CudaDevice::import_received_image`].
    pub fn import_received_buffer<M: MemoryLocation>(
        &self,
        received: ReceivedBuffer<M>,
    ) -> Result<ImportedBuffer<M>, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| record.verify_on(ctx)) {
            return Err(ImportError { error, fd });
        }
        self.import_buffer_inner(record, fd, None)
    }

    /// Imports a buffer from a record and an fd that did not travel together
    /// through this crate.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of the memory of the buffer `record`
    /// describes, and `record` is that buffer's own, unmodified record. On
    /// success the fd is consumed; on failure it comes back in the error.
    pub unsafe fn import_buffer_fd<M: MemoryLocation>(
        &self,
        record: BufferRecord<M>,
        fd: OwnedFd,
    ) -> Result<ImportedBuffer<M>, ImportError> {
        self.import_buffer_inner(record, fd, None)
    }

    fn import_buffer_inner<M>(
        &self,
        record: BufferRecord<M>,
        fd: OwnedFd,
        keep: Option<KeepAlive>,
    ) -> Result<ImportedBuffer<M>, ImportError> {
        let info = record.into_info();
        if let Err(error) = self.check_resource_device(&info.device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let memory = import_memory(self, fd, info.allocation_size(), info.dedicated(), keep)?;
        Ok(ImportedBuffer {
            memory,
            size: info.size(),
            alignment: info.alignment(),
            _types: PhantomData,
        })
    }
}

impl CudaDevice {
    /// The fd handling every CUDA import shares: refuses fds that are no
    /// export (pipes, sockets, eventfds...), makes the context current, and
    /// gives `import` a duplicate, so that a failed import hands the
    /// caller's fd back open (CUDA keeps the fd with the caller on failure).
    ///
    /// # Safety
    /// `import` gives the raw fd it gets to exactly one CUDA import call
    /// (which owns it on success only) and does nothing else with it.
    pub(crate) unsafe fn import_fd_with(
        &self,
        fd: OwnedFd,
        what: &str,
        import: impl FnOnce(i32) -> Result<()>,
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
        let import = |raw| import(raw).map_err(vk_export::ImportFailure::from);
        // SAFETY: forwarded from the caller; CUDA never closes the fd of a
        // failed import.
        unsafe { vk_export::import_with_duplicate(fd, false, dup_failed, import) }
            .map_err(|(error, fd)| ImportError { error, fd })
    }
}

impl<M: MemoryLocation> ImportedBuffer<M> {
    /// The buffer's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `VkMemoryRequirements::alignment`.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The import.
    pub fn external_memory(&self) -> &ExternalMemory {
        &self.memory
    }
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> ImportedImage<F, T, M, U> {
    /// The image's record.
    pub fn info(&self) -> &ImageInfo {
        self.record.info()
    }

    /// The import.
    pub fn external_memory(&self) -> &ExternalMemory {
        &self.memory
    }
}
