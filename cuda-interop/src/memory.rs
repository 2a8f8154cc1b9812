//! Imported Vulkan memory, its mappings, and what borrows what.
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
//!   through a [`MappedBuffer`], a [`DeviceSlice`] or a [`LevelArray`] is
//!   recorded as a use of the [`ExternalMemory`] behind it. The mapped
//!   buffer's, the mipmapped array's and the import's destructors wait for
//!   those uses (at most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT)) before
//!   they free anything, so `mem::forget` of a mapping cannot let the import
//!   be destroyed under a pending copy. If the uses do not complete in time,
//!   the import is leaked and its Vulkan resource with it (Vulkan never frees
//!   memory the GPU may still read), and the leak is reported through
//!   [`drop_errors`](crate::drop_errors).
//! * Copies to or from host memory wait for the stream to drain first
//!   (bounded by the stream's timeout), as [`Stream`] documents.
//! * Sizes from records are checked, never truncated: byte counts are
//!   computed with checked arithmetic and refused with
//!   [`Error::InvalidArgument`] when they overflow.

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_interop_sys::{
    self as sys, CUarray, CUarray_format, CUdevice_attribute, CUdeviceptr, CUexternalMemory,
    CUexternalMemoryHandleType, CUmemorytype, CUmipmappedArray, CUresourcetype, CUsurfObject,
    CUtexObject, CUDA_ARRAY3D_COLOR_ATTACHMENT, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED,
    CUDA_ARRAY3D_SURFACE_LDST, CUDA_EXTERNAL_MEMORY_DEDICATED,
};
use vk_export::ash::vk;
use vk_export::format::{ChannelType, Format};
use vk_export::markers::{MemoryLocation, Tiling, Usage};
use vk_export::{
    BufferRecord, ExportableBuffer, ExportableImage, ImageInfo, ImageRecord, KeepAlive,
    ReceivedBuffer, ReceivedImage,
};

use crate::device::CudaDevice;
use crate::dlpack::{DLDataType, DLDevice, ManagedTensor, DL_CUDA};
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, ImportError, Result};
use crate::last_use::{report_leak, LastUse, DROP_WAIT_LIMIT};
use crate::markers::{ArrayMemory, ArrayTiling, BufferTiling, SurfaceUsage};
use crate::stream::Stream;

// Every size below is a u32 from a record widened to usize with `as`, which
// is lossless on every target with at least 32-bit pointers; refuse others.
const _: () = assert!(
    usize::BITS >= u32::BITS,
    "cuda-interop needs 32-bit or wider usize"
);

/// A record's u32 (an extent, a layer count) as a `usize`: lossless, see the
/// assertion above.
fn widen(value: u32) -> usize {
    value as usize
}

/// One `cuImportExternalMemory` import; destroyed when dropped, after the
/// GPU's last recorded use of it has completed (or leaked, with its Vulkan
/// resource, if that does not happen within
/// [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT)).
#[derive(Debug)]
pub struct ExternalMemory {
    device: CudaDevice,
    handle: CUexternalMemory,
    size: u64,
    last_use: LastUse,
    vulkan: Option<KeepAlive>,
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
    memory: ExternalMemory,
    record: ImageRecord<F, T, M, U>,
}

/// A Vulkan buffer imported into CUDA.
#[derive(Debug)]
pub struct ImportedBuffer<M> {
    memory: ExternalMemory,
    size: u64,
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
    /// with ([`Context::verify_image`](vk_export::Context::verify_image): both UUIDs, memory type, and the
    /// size, alignment, dedicated flag and pitches that device derives), so
    /// the device must come from [`CudaDevice::for_vulkan`]. On failure the fd
    /// comes back in the error.
    pub fn import_received_image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        received: ReceivedImage<F, T, M, U>,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| ctx.verify_image(&record)) {
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
        if let Err(error) = self.verify_with_vulkan(|ctx| ctx.verify_buffer(&record)) {
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

fn map_buffer(
    memory: &ExternalMemory,
    offset: u64,
    size: u64,
    row_pitch: Option<u64>,
) -> Result<MappedBuffer<'_>> {
    let _guard = memory.device.enter()?;
    let desc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset,
        size,
        ..Default::default()
    };
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: a zeroed descriptor (flags 0) whose range lies within the live
    // import (callers pass the record's sizes); the context is current;
    // writes one device address, freed by MappedBuffer::drop.
    unsafe {
        cu!(cuExternalMemoryGetMappedBuffer(
            &mut ptr,
            memory.handle,
            &desc
        ))
    }?;
    Ok(MappedBuffer {
        memory,
        ptr,
        len: size,
        row_pitch,
    })
}

impl<M: MemoryLocation> ImportedBuffer<M> {
    /// Maps the whole buffer. `&mut self` makes a second, overlapping mapping
    /// impossible while this one lives (overlapping mappings may not alias).
    pub fn map(&mut self) -> Result<MappedBuffer<'_>> {
        map_buffer(&self.memory, 0, self.size, None)
    }
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

fn cuda_format(channel: ChannelType) -> CUarray_format {
    match channel {
        ChannelType::U8 => CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
        ChannelType::I8 => CUarray_format::CU_AD_FORMAT_SIGNED_INT8,
        ChannelType::U16 => CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16,
        ChannelType::I16 => CUarray_format::CU_AD_FORMAT_SIGNED_INT16,
        ChannelType::F16 => CUarray_format::CU_AD_FORMAT_HALF,
        ChannelType::U32 => CUarray_format::CU_AD_FORMAT_UNSIGNED_INT32,
        ChannelType::I32 => CUarray_format::CU_AD_FORMAT_SIGNED_INT32,
        ChannelType::F32 => CUarray_format::CU_AD_FORMAT_FLOAT,
    }
}

/// The CUDA array descriptor for an image, derived only from its typed
/// record: the format (channel type and count) from the record's `F`, which
/// `ImageInfo::typed` checked against the record's `VkFormat`; extent, layers,
/// cube and the surface/colour-attachment flags from the record's fields.
pub fn array_descriptor<F: Format, T, M, U>(
    record: &ImageRecord<F, T, M, U>,
) -> sys::CUDA_ARRAY3D_DESCRIPTOR {
    let info = record.info();
    let cube = info.is_cube();
    let three_d = info.image_type() == vk::ImageType::TYPE_3D;
    let layered = !three_d && (info.array_layers() > 1 && !(cube && info.array_layers() == 6));
    let mut flags = 0;
    if layered {
        flags |= CUDA_ARRAY3D_LAYERED;
    }
    if cube {
        flags |= CUDA_ARRAY3D_CUBEMAP;
    }
    if info.usage().contains(vk::ImageUsageFlags::STORAGE) {
        flags |= CUDA_ARRAY3D_SURFACE_LDST;
    }
    if info.usage().contains(vk::ImageUsageFlags::COLOR_ATTACHMENT) {
        flags |= CUDA_ARRAY3D_COLOR_ATTACHMENT;
    }
    let depth = if three_d {
        info.extent()[2]
    } else if info.array_layers() > 1 {
        info.array_layers()
    } else {
        0
    };
    sys::CUDA_ARRAY3D_DESCRIPTOR {
        Width: widen(info.extent()[0]),
        Height: widen(info.extent()[1]),
        Depth: widen(depth),
        Format: cuda_format(F::CHANNEL),
        NumChannels: F::CHANNELS,
        Flags: flags,
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

    /// Maps the image as a CUDA mipmapped array. Only optimal-tiled,
    /// device-local images compile; format, channels, extent, levels, layers,
    /// cube and the surface/colour-attachment flags all come from the image.
    pub fn map_array(&self) -> Result<MappedArray<'_, F, U>>
    where
        T: ArrayTiling,
        M: ArrayMemory,
    {
        let info = self.record.info();
        let desc = array_descriptor(&self.record);
        let surface = desc.Flags & CUDA_ARRAY3D_SURFACE_LDST != 0;
        let (w_attr, h_attr) = if surface {
            (
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT,
            )
        } else {
            (
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT,
            )
        };
        let device = &self.memory.device;
        let (max_w, max_h) = (device.attribute(w_attr)?, device.attribute(h_attr)?);
        if i64::from(info.extent()[0]) > i64::from(max_w)
            || i64::from(info.extent()[1]) > i64::from(max_h)
        {
            return Err(Error::Unsupported(format!(
                "a {}x{} array: this device allows at most {max_w}x{max_h}{}",
                info.extent()[0],
                info.extent()[1],
                if surface { " with surface access" } else { "" }
            )));
        }
        let mipmapped = sys::CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC {
            offset: info.offset(),
            arrayDesc: desc,
            numLevels: info.mip_levels(),
            ..Default::default()
        };
        let _guard = device.enter()?;
        let mut handle: CUmipmappedArray = std::ptr::null_mut();
        // SAFETY: a zeroed descriptor (flags 0) derived from the typed record
        // of the image this live import holds, within the device's limits
        // (checked above); the context is current; writes one handle,
        // destroyed by MappedArray::drop.
        unsafe {
            cu!(cuExternalMemoryGetMappedMipmappedArray(
                &mut handle,
                self.memory.handle,
                &mipmapped
            ))
        }?;
        Ok(MappedArray {
            memory: &self.memory,
            handle,
            info,
            surface_ldst: surface,
            copy_surfaces: CopySurfaces::default(),
            _types: PhantomData,
        })
    }

    /// Maps a linear image as a buffer; [`MappedBuffer::row_pitch`] gives the
    /// row pitch Vulkan reported. Only linear images compile.
    pub fn map_buffer(&mut self) -> Result<MappedBuffer<'_>>
    where
        T: BufferTiling,
    {
        let info = self.record.info();
        let (size, row_pitch) = (info.allocation_size(), info.row_pitch());
        map_buffer(&self.memory, 0, size, Some(row_pitch))
    }
}

/// A mapped range of imported memory: ordinary device memory; freed with
/// `cuMemFree` before the import is destroyed (it borrows the import), after
/// the copies recorded on the import have completed.
#[derive(Debug)]
pub struct MappedBuffer<'i> {
    memory: &'i ExternalMemory,
    ptr: CUdeviceptr,
    len: u64,
    row_pitch: Option<u64>,
}

// SAFETY: a device address; usable from any thread with the context current.
unsafe impl Send for MappedBuffer<'_> {}
// SAFETY: shared access only reads the address, or records uses on the
// import (under the record's mutex).
unsafe impl Sync for MappedBuffer<'_> {}

impl Drop for MappedBuffer<'_> {
    fn drop(&mut self) {
        free_mapping(self.memory, self.ptr, self.len);
    }
}

/// Frees a mapping of `memory` (`cuMemFree`) once every recorded use of the
/// import has completed and no external wait could make the free block;
/// otherwise leaks it and reports the leak.
fn free_mapping(memory: &ExternalMemory, ptr: CUdeviceptr, len: u64) {
    let idle = memory.last_use.settle_before_device_wide_release();
    if let Err(why) = idle {
        report_leak(
            &format!("a mapping of {len} bytes of imported memory"),
            &why,
        );
        return;
    }
    if let Ok(_guard) = memory.device.enter() {
        // SAFETY: the address cuExternalMemoryGetMappedBuffer returned in
        // the current context, freed once, before the import is destroyed
        // (the mapping borrows it, or owns it and drops it afterwards) and
        // after every copy recorded on the import completed.
        record_drop_error(unsafe { cu!(cuMemFree(ptr)) });
    }
}

/// A whole-buffer mapping that owns its import: what a DLPack tensor keeps
/// alive. Drops the mapping, then the import (and the Vulkan buffer it keeps).
struct OwnedMapping {
    memory: ExternalMemory,
    ptr: CUdeviceptr,
    len: u64,
}

impl Drop for OwnedMapping {
    fn drop(&mut self) {
        free_mapping(&self.memory, self.ptr, self.len);
    }
}

impl<M: MemoryLocation> ImportedBuffer<M> {
    /// Maps the whole buffer and hands it to a DLPack consumer as a tensor
    /// of `dtype` with `shape` and element `strides` (row-major when `None`),
    /// on the CUDA device of this import. The tensor keeps the mapping, the
    /// import and the Vulkan buffer alive until the consumer's deleter runs.
    /// Work the consumer enqueues is its own to order (see the DLPack
    /// protocol's `stream` argument).
    pub fn into_dlpack(
        self,
        dtype: DLDataType,
        shape: &[i64],
        strides: Option<&[i64]>,
        read_only: bool,
    ) -> Result<ManagedTensor> {
        let ptr = map_buffer(&self.memory, 0, self.size, None).map(|m| {
            let ptr = m.ptr;
            // The mapping's ownership moves to the OwnedMapping below.
            std::mem::forget(m);
            ptr
        })?;
        let device = DLDevice {
            device_type: DL_CUDA,
            device_id: self.memory.device.ordinal(),
        };
        let len = self.size;
        let owner = OwnedMapping {
            memory: self.memory,
            ptr,
            len,
        };
        // SAFETY: `ptr` maps the whole `len`-byte buffer on this CUDA device
        // and stays valid while `owner` (which frees it last) lives.
        unsafe {
            ManagedTensor::new(
                Box::new(owner),
                ptr,
                len,
                device,
                dtype,
                shape,
                strides,
                read_only,
            )
        }
    }
}

/// A bounds-checked range of a [`MappedBuffer`]; copies through it are
/// recorded as uses of the import behind it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'b> {
    memory: &'b ExternalMemory,
    ptr: CUdeviceptr,
    len: u64,
}

impl<'b> DeviceSlice<'b> {
    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The import the slice's mapping belongs to.
    pub fn external_memory(&self) -> &'b ExternalMemory {
        self.memory
    }
}

impl MappedBuffer<'_> {
    /// The device address of the whole mapping.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the mapping is empty (never: imports are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A linear image's row pitch in bytes (`None` for buffers).
    pub fn row_pitch(&self) -> Option<u64> {
        self.row_pitch
    }
    /// The import the mapping belongs to.
    pub(crate) fn external(&self) -> &ExternalMemory {
        self.memory
    }
    /// `len` bytes at `offset`, checked against the mapping.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSlice<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceSlice {
                memory: self.memory,
                ptr: self.ptr + offset,
                len,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} of a {}-byte mapping",
                self.len
            ))),
        }
    }

    fn host_range(&self, len: usize) -> Result<DeviceSlice<'_>> {
        let len = u64::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("a host range of {len} bytes")))?;
        self.slice(0, len)
    }

    /// Copies the first `dst.len()` bytes of the mapping to the host and
    /// waits for the copy.
    ///
    /// First waits, bounded by the stream's [timeout](Stream::timeout), for
    /// the work already on the stream: a copy into pageable memory blocks
    /// inside the driver until it is done, so one queued behind a semaphore
    /// wait nobody signals would never return. If the stream does not drain
    /// in time this returns [`Error::Timeout`] and enqueues nothing. Then it
    /// enqueues the copy, records it as a use of the import, and waits for
    /// it until it is done (it has nothing ahead of it; `dst` is not handed
    /// back while the copy may still write it).
    pub fn copy_to_host(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        let source = self.host_range(dst.len())?;
        stream.check_device(&self.memory.device)?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: the mapped range holds dst.len() bytes (checked against
            // the mapping) and `dst` is a writable host range of that length,
            // kept borrowed until the copy is done; the stream and the mapping
            // belong to the current context.
            unsafe {
                cu!(cuMemcpyDtoHAsync(
                    dst.as_mut_ptr().cast(),
                    source.ptr,
                    dst.len(),
                    stream.raw()
                ))
            }
        })
    }

    /// Copies `src` to the start of the mapping and waits for the copy.
    ///
    /// Waits for the stream to drain first, bounded by its
    /// [timeout](Stream::timeout) ([`Error::Timeout`], nothing enqueued), as
    /// [`MappedBuffer::copy_to_host`] does; then enqueues the copy, records
    /// it as a use of the import, and waits for it.
    pub fn copy_from_host(&self, stream: &Stream, src: &[u8]) -> Result<()> {
        let destination = self.host_range(src.len())?;
        stream.check_device(&self.memory.device)?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: the mapped range holds src.len() bytes (checked against
            // the mapping) and `src` is a readable host range of that length,
            // kept borrowed until the copy is done; the stream and the mapping
            // belong to the current context.
            unsafe {
                cu!(cuMemcpyHtoDAsync(
                    destination.ptr,
                    src.as_ptr().cast(),
                    src.len(),
                    stream.raw()
                ))
            }
        })
    }
}

/// An imported image mapped as a CUDA mipmapped array; destroyed
/// (`cuMipmappedArrayDestroy`) before the import, which it borrows, after the
/// copies recorded on the import have completed.
#[derive(Debug)]
pub struct MappedArray<'i, F, U> {
    memory: &'i ExternalMemory,
    handle: CUmipmappedArray,
    info: &'i ImageInfo,
    /// Mapped with `CUDA_ARRAY3D_SURFACE_LDST`.
    surface_ldst: bool,
    /// Surface objects of its levels for kernel copies ([`crate::copy`]),
    /// made on a level's first one and destroyed with the array.
    copy_surfaces: CopySurfaces,
    _types: PhantomData<fn() -> (F, U)>,
}

/// The surface objects kernel copies use, one per level array, made on
/// first use; destroyed by [`MappedArray`]'s drop after the import's recorded
/// uses (every kernel copy among them) have completed, or leaked with it.
#[derive(Debug, Default)]
struct CopySurfaces(Mutex<Vec<(CUarray, CUsurfObject)>>);

impl CopySurfaces {
    fn lock(&self) -> MutexGuard<'_, Vec<(CUarray, CUsurfObject)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: usable from any thread with the context current.
unsafe impl<F, U> Send for MappedArray<'_, F, U> {}
// SAFETY: getting levels is thread-safe.
unsafe impl<F, U> Sync for MappedArray<'_, F, U> {}

impl<F, U> Drop for MappedArray<'_, F, U> {
    fn drop(&mut self) {
        let idle = self.memory.last_use.settle_before_device_wide_release();
        if let Err(why) = idle {
            report_leak("a mipmapped array mapped from imported memory", &why);
            return;
        }
        if let Ok(_guard) = self.memory.device.enter() {
            for (_, surface) in std::mem::take(&mut *self.copy_surfaces.lock()) {
                // SAFETY: a surface object LevelArray::copy_surface created
                // on a level of this array in the current context, destroyed
                // once, after every kernel copy using it (each recorded as a
                // use of the import) has completed (waited for above).
                record_drop_error(unsafe { cu!(cuSurfObjectDestroy(surface)) });
            }
            // SAFETY: the handle cuExternalMemoryGetMappedMipmappedArray
            // returned in the current context, destroyed once: its level
            // arrays and their surface and texture objects borrowed `self`
            // and are gone, and every copy recorded on the import completed.
            record_drop_error(unsafe { cu!(cuMipmappedArrayDestroy(self.handle)) });
        }
    }
}

impl<F: Format, U: Usage> MappedArray<'_, F, U> {
    /// Mip level `level` as a CUDA array (a view owned by this array).
    pub fn level(&self, level: u32) -> Result<LevelArray<'_, F, U>> {
        let Some(e) = self.info.level_extent(level) else {
            return Err(Error::InvalidArgument(format!(
                "level {level} of an image with {} levels",
                self.info.mip_levels()
            )));
        };
        let _guard = self.memory.device.enter()?;
        let mut array: CUarray = std::ptr::null_mut();
        // SAFETY: a live mipmapped array of the current context and a level
        // below its level count (level_extent checked it); writes one handle.
        unsafe { cu!(cuMipmappedArrayGetLevel(&mut array, self.handle, level)) }?;
        let depth = if self.info.image_type() == vk::ImageType::TYPE_3D {
            e[2]
        } else {
            self.info.array_layers()
        };
        Ok(LevelArray {
            memory: self.memory,
            array,
            extent: [e[0], e[1], depth],
            surface_ldst: self.surface_ldst,
            plain_2d: self.info.image_type() == vk::ImageType::TYPE_2D
                && self.info.array_layers() == 1,
            copy_surfaces: &self.copy_surfaces,
            _types: PhantomData,
        })
    }
    /// Mip levels.
    pub fn levels(&self) -> u32 {
        self.info.mip_levels()
    }
}

/// One mip level of a [`MappedArray`]; borrows it and is never destroyed on
/// its own. Copies to and from it are recorded as uses of the import.
#[derive(Debug)]
pub struct LevelArray<'m, F, U> {
    memory: &'m ExternalMemory,
    array: CUarray,
    extent: [u32; 3],
    /// Whether the array was mapped with `CUDA_ARRAY3D_SURFACE_LDST`.
    surface_ldst: bool,
    /// Whether the level is a plain 2-D CUDA array (a 2-D image of one
    /// layer), the only kind the copy kernels' 2-D surface accesses address.
    plain_2d: bool,
    /// The mipmapped array's surface objects for kernel copies.
    copy_surfaces: &'m CopySurfaces,
    _types: PhantomData<fn() -> (F, U)>,
}

/// Which way a copy between a level and linear memory goes.
#[derive(Clone, Copy)]
pub(crate) enum Direction {
    IntoLevel,
    OutOfLevel,
}

/// The linear side of a copy with a level.
#[derive(Clone, Copy)]
pub(crate) enum Linear {
    Host(*mut std::ffi::c_void),
    Device(CUdeviceptr),
}

impl<F: Format, U: Usage> LevelArray<'_, F, U> {
    /// The `CUarray`.
    pub fn raw(&self) -> CUarray {
        self.array
    }
    /// Width, height, and depth or layers.
    pub fn extent(&self) -> [u32; 3] {
        self.extent
    }
    /// The import the level belongs to.
    pub(crate) fn external(&self) -> &ExternalMemory {
        self.memory
    }
    /// Whether the array was mapped with `CUDA_ARRAY3D_SURFACE_LDST`
    /// (storage usage), so that a surface object can be made on it.
    pub(crate) fn surface_ldst(&self) -> bool {
        self.surface_ldst
    }

    /// Whether the level is a plain 2-D CUDA array (a 2-D image of one layer).
    pub(crate) fn is_plain_2d(&self) -> bool {
        self.plain_2d
    }

    /// The level's surface object for kernel copies, made on first use and
    /// destroyed with the mipmapped array (after the import's recorded uses).
    pub(crate) fn copy_surface(&self) -> Result<CUsurfObject> {
        let mut surfaces = self.copy_surfaces.lock();
        if let Some(&(_, surface)) = surfaces.iter().find(|(array, _)| *array == self.array) {
            return Ok(surface);
        }
        if !self.surface_ldst {
            return Err(Error::Unsupported(
                "a surface object needs an image with storage usage".into(),
            ));
        }
        let res = self.resource();
        let _guard = self.memory.device.enter()?;
        let mut handle: CUsurfObject = 0;
        // SAFETY: a zeroed resource descriptor naming a live level of the
        // current context, mapped with SURFACE_LDST (checked above); writes
        // one handle, destroyed by MappedArray::drop.
        unsafe { cu!(cuSurfObjectCreate(&mut handle, &res)) }?;
        surfaces.push((self.array, handle));
        Ok(handle)
    }

    fn too_large(&self) -> Error {
        Error::InvalidArgument(format!(
            "level {:?} of {} has more bytes than this platform can address",
            self.extent,
            F::NAME
        ))
    }

    /// Bytes of the whole level, tightly packed (all layers); computed with
    /// checked arithmetic, [`Error::InvalidArgument`] if it overflows.
    pub fn byte_len(&self) -> Result<usize> {
        let bytes = self
            .extent
            .iter()
            .try_fold(u64::from(F::TEXEL_BYTES), |acc, &e| {
                acc.checked_mul(u64::from(e))
            });
        bytes
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| self.too_large())
    }

    /// Bytes of one tightly packed row.
    fn row_bytes(&self) -> Result<usize> {
        u64::from(self.extent[0])
            .checked_mul(u64::from(F::TEXEL_BYTES))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| self.too_large())
    }

    /// The parameters of a copy of the whole level to or from `linear`,
    /// whose rows are `pitch` bytes apart (at least a row) and which must
    /// hold every row (`pitch * (rows - 1) + row` bytes).
    pub(crate) fn copy_params(
        &self,
        direction: Direction,
        linear: Linear,
        pitch: usize,
    ) -> Result<sys::CUDA_MEMCPY3D> {
        let row = self.row_bytes()?;
        let height = widen(self.extent[1]);
        let mut p = sys::CUDA_MEMCPY3D {
            WidthInBytes: row,
            Height: height,
            Depth: widen(self.extent[2]),
            ..Default::default()
        };
        let (linear_type, host, device) = match linear {
            Linear::Host(ptr) => (CUmemorytype::CU_MEMORYTYPE_HOST, ptr, 0),
            Linear::Device(ptr) => (
                CUmemorytype::CU_MEMORYTYPE_DEVICE,
                std::ptr::null_mut(),
                ptr,
            ),
        };
        match direction {
            Direction::IntoLevel => {
                p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                p.dstArray = self.array;
                p.srcMemoryType = linear_type;
                p.srcHost = host.cast_const();
                p.srcDevice = device;
                p.srcPitch = pitch;
                p.srcHeight = height;
            }
            Direction::OutOfLevel => {
                p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
                p.srcArray = self.array;
                p.dstMemoryType = linear_type;
                p.dstHost = host;
                p.dstDevice = device;
                p.dstPitch = pitch;
                p.dstHeight = height;
            }
        }
        Ok(p)
    }

    /// Copies the level to the host, tightly packed, and waits for the copy.
    ///
    /// First waits, bounded by the stream's [timeout](Stream::timeout), for
    /// the work already on the stream: a copy into pageable memory blocks
    /// inside the driver until it is done, so one queued behind a semaphore
    /// wait nobody signals would never return. If the stream does not drain
    /// in time this returns [`Error::Timeout`] and enqueues nothing. Then it
    /// enqueues the copy, records it as a use of the import, and waits for
    /// it until it is done (`dst` is not handed back while the copy may still
    /// write it).
    pub fn copy_to_host(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        self.check_len(dst.len())?;
        stream.check_device(&self.memory.device)?;
        let params = self.copy_params(
            Direction::OutOfLevel,
            Linear::Host(dst.as_mut_ptr().cast()),
            self.row_bytes()?,
        )?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: `params` copies the whole live level into `dst`, a
            // writable host range of exactly byte_len() bytes (check_len),
            // kept borrowed until the copy is done; the stream and the level
            // belong to the current context.
            unsafe { cu!(cuMemcpy3DAsync(&params, stream.raw())) }
        })
    }

    /// Copies tightly packed texels from the host into the level and waits
    /// for the copy.
    ///
    /// Waits for the stream to drain first, bounded by its
    /// [timeout](Stream::timeout) ([`Error::Timeout`], nothing enqueued), as
    /// [`LevelArray::copy_to_host`] does; then enqueues the copy, records it
    /// as a use of the import, and waits for it.
    pub fn copy_from_host(&self, stream: &Stream, src: &[u8]) -> Result<()> {
        self.check_len(src.len())?;
        stream.check_device(&self.memory.device)?;
        // The driver only reads through the host pointer of a copy into the
        // level; the parameter block's field is `const`.
        let params = self.copy_params(
            Direction::IntoLevel,
            Linear::Host(src.as_ptr().cast_mut().cast()),
            self.row_bytes()?,
        )?;
        stream.copy_with_host_memory(&[&self.memory.last_use], || {
            let _guard = self.memory.device.enter()?;
            // SAFETY: `params` copies `src`, a readable host range of exactly
            // byte_len() bytes (check_len) kept borrowed until the copy is
            // done, into the whole live level; the stream and the level
            // belong to the current context.
            unsafe { cu!(cuMemcpy3DAsync(&params, stream.raw())) }
        })
    }

    fn check_len(&self, len: usize) -> Result<()> {
        let needed = self.byte_len()?;
        if len != needed {
            return Err(Error::InvalidArgument(format!(
                "level {:?} of {} needs {needed} bytes, got {len}",
                self.extent,
                F::NAME,
            )));
        }
        Ok(())
    }

    fn resource(&self) -> sys::CUDA_RESOURCE_DESC {
        let mut res = sys::CUDA_RESOURCE_DESC {
            resType: CUresourcetype::CU_RESOURCE_TYPE_ARRAY,
            ..Default::default()
        };
        res.res.array.hArray = self.array;
        res
    }

    /// A surface object for reading and writing the level in kernels. Only
    /// images with storage usage compile.
    pub fn surface(&self) -> Result<Surface<'_>>
    where
        U: SurfaceUsage,
    {
        let res = self.resource();
        let device = &self.memory.device;
        let _guard = device.enter()?;
        let mut handle: CUsurfObject = 0;
        // SAFETY: a zeroed resource descriptor naming a live level of the
        // current context, mapped with SURFACE_LDST (U: SurfaceUsage); writes
        // one handle, destroyed by Surface::drop.
        unsafe { cu!(cuSurfObjectCreate(&mut handle, &res)) }?;
        Ok(Surface {
            memory: self.memory,
            handle,
            last_use: LastUse::new(device),
        })
    }

    /// A texture object (point sampling, clamped, unnormalised coordinates,
    /// element-type reads) for reading the level in kernels.
    pub fn texture(&self) -> Result<Texture<'_>> {
        let res = self.resource();
        let tex = sys::CUDA_TEXTURE_DESC {
            addressMode: [sys::CUaddress_mode::CU_TR_ADDRESS_MODE_CLAMP; 3],
            filterMode: sys::CUfilter_mode::CU_TR_FILTER_MODE_POINT,
            flags: sys::CU_TRSF_READ_AS_INTEGER,
            ..Default::default()
        };
        let device = &self.memory.device;
        let _guard = device.enter()?;
        let mut handle: CUtexObject = 0;
        // SAFETY: zeroed resource and texture descriptors naming a live level
        // of the current context, no view descriptor (null is allowed);
        // writes one handle, destroyed by Texture::drop.
        unsafe { cu!(cuTexObjectCreate(&mut handle, &res, &tex, std::ptr::null())) }?;
        Ok(Texture {
            memory: self.memory,
            handle,
            last_use: LastUse::new(device),
        })
    }
}

/// A surface object on a level; destroyed before the level's array, and
/// after the kernels launched with it through
/// [`Stream::launch_tracked`](crate::Stream::launch_tracked) have completed.
#[derive(Debug)]
pub struct Surface<'l> {
    memory: &'l ExternalMemory,
    handle: CUsurfObject,
    /// Tracked launches that use the surface.
    last_use: LastUse,
}

impl Surface<'_> {
    /// The handle to pass to a kernel (`cudaSurfaceObject_t`).
    pub fn raw(&self) -> CUsurfObject {
        self.handle
    }
}

impl Surface<'_> {
    /// The import behind the level, and the surface's own tracked uses.
    pub(crate) fn tracking(&self) -> (&ExternalMemory, &LastUse) {
        (self.memory, &self.last_use)
    }
}

impl Drop for Surface<'_> {
    fn drop(&mut self) {
        if let Err(why) = self.last_use.wait_before_release(DROP_WAIT_LIMIT) {
            report_leak("a surface object", &why);
            return;
        }
        if let Ok(_guard) = self.memory.device.enter() {
            // SAFETY: a surface object created in the current context,
            // destroyed once, after its tracked launches completed (an
            // untracked one, Stream::launch, is its launcher's concern).
            record_drop_error(unsafe { cu!(cuSurfObjectDestroy(self.handle)) });
        }
    }
}

/// A texture object on a level; destroyed before the level's array, and
/// after the kernels launched with it through
/// [`Stream::launch_tracked`](crate::Stream::launch_tracked) have completed.
#[derive(Debug)]
pub struct Texture<'l> {
    memory: &'l ExternalMemory,
    handle: CUtexObject,
    /// Tracked launches that use the texture.
    last_use: LastUse,
}

impl Texture<'_> {
    /// The handle to pass to a kernel (`cudaTextureObject_t`).
    pub fn raw(&self) -> CUtexObject {
        self.handle
    }
}

impl Texture<'_> {
    /// The import behind the level, and the texture's own tracked uses.
    pub(crate) fn tracking(&self) -> (&ExternalMemory, &LastUse) {
        (self.memory, &self.last_use)
    }
}

impl Drop for Texture<'_> {
    fn drop(&mut self) {
        if let Err(why) = self.last_use.wait_before_release(DROP_WAIT_LIMIT) {
            report_leak("a texture object", &why);
            return;
        }
        if let Ok(_guard) = self.memory.device.enter() {
            // SAFETY: a texture object created in the current context,
            // destroyed once, after its tracked launches completed (an
            // untracked one, Stream::launch, is its launcher's concern).
            record_drop_error(unsafe { cu!(cuTexObjectDestroy(self.handle)) });
        }
    }
}
