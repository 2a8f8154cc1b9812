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

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

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
};

use crate::device::CudaDevice;
use crate::driver::cu;
use crate::error::{Error, ImportError, Result};
use crate::markers::{ArrayMemory, ArrayTiling, BufferTiling, SurfaceUsage};
use crate::stream::{DeviceBuffer, Stream};

/// One `cuImportExternalMemory` import; destroyed when dropped.
#[derive(Debug)]
pub struct ExternalMemory {
    device: CudaDevice,
    handle: CUexternalMemory,
    size: u64,
    _vulkan: Option<KeepAlive>,
}

// SAFETY: the handle is usable from any thread with the context current.
unsafe impl Send for ExternalMemory {}
// SAFETY: mapping calls are thread-safe in the driver.
unsafe impl Sync for ExternalMemory {}

impl Drop for ExternalMemory {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: every mapping borrowed `self` and was freed before this
            // runs; destroyed once.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuDestroyExternalMemory(self.handle))
            })());
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
    let guard = match device.enter() {
        Ok(g) => g,
        Err(error) => return Err(ImportError { error, fd }),
    };
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
    desc.handle.fd = fd.as_raw_fd();
    let mut handle: CUexternalMemory = std::ptr::null_mut();
    let result = (|| -> Result<()> {
        // SAFETY: a zeroed descriptor with an fd we own; the context is current.
        cu!(cuImportExternalMemory(&mut handle, &desc))
    })();
    drop(guard);
    match result {
        Ok(()) => {
            // The driver owns the fd now: give up ours without closing it.
            let _ = fd.into_raw_fd();
            Ok(ExternalMemory {
                device: device.clone(),
                handle,
                size,
                _vulkan: vulkan,
            })
        }
        Err(error) => Err(ImportError { error, fd }),
    }
}

/// A Vulkan image imported into CUDA, typed like the image.
#[derive(Debug)]
pub struct ImportedImage<F, T, M, U> {
    memory: ExternalMemory,
    info: ImageInfo,
    _types: ImageMarkers<F, T, M, U>,
}

/// Carries an image's type parameters without owning any of them.
type ImageMarkers<F, T, M, U> = PhantomData<fn() -> (F, T, M, U)>;

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

    /// Imports an image from a record and fd received from another process.
    /// On failure the fd comes back in the error.
    pub fn import_image_fd<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
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
        let info = record.into_info();
        if let Err(error) = self.check_resource_device(&info.device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let memory = import_memory(self, fd, info.allocation_size(), info.dedicated(), keep)?;
        Ok(ImportedImage {
            memory,
            info,
            _types: PhantomData,
        })
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

    /// Imports a buffer from a received record and fd. On failure the fd
    /// comes back in the error.
    pub fn import_buffer_fd<M: MemoryLocation>(
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
    // SAFETY: a zeroed descriptor within the import (checked by callers); the
    // context is current.
    cu!(cuExternalMemoryGetMappedBuffer(
        &mut ptr,
        memory.handle,
        &desc
    ))?;
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

/// The CUDA array descriptor for an image, derived only from its record.
pub fn array_descriptor<F: Format>(info: &ImageInfo) -> sys::CUDA_ARRAY3D_DESCRIPTOR {
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
        Width: info.extent()[0] as usize,
        Height: info.extent()[1] as usize,
        Depth: depth as usize,
        Format: cuda_format(F::CHANNEL),
        NumChannels: F::CHANNELS,
        Flags: flags,
    }
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> ImportedImage<F, T, M, U> {
    /// The image's record.
    pub fn info(&self) -> &ImageInfo {
        &self.info
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
        let info = &self.info;
        let desc = array_descriptor::<F>(info);
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
        if info.extent()[0] as i64 > max_w as i64 || info.extent()[1] as i64 > max_h as i64 {
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
        // SAFETY: a zeroed descriptor derived from the image; the context is current.
        cu!(cuExternalMemoryGetMappedMipmappedArray(
            &mut handle,
            self.memory.handle,
            &mipmapped
        ))?;
        Ok(MappedArray {
            memory: &self.memory,
            handle,
            info,
            _types: PhantomData,
        })
    }

    /// Maps a linear image as a buffer; [`MappedBuffer::row_pitch`] gives the
    /// row pitch Vulkan reported. Only linear images compile.
    pub fn map_buffer(&mut self) -> Result<MappedBuffer<'_>>
    where
        T: BufferTiling,
    {
        map_buffer(
            &self.memory,
            0,
            self.info.allocation_size(),
            Some(self.info.row_pitch()),
        )
    }
}

/// A mapped range of imported memory: ordinary device memory; freed with
/// `cuMemFree` before the import is destroyed (it borrows the import).
#[derive(Debug)]
pub struct MappedBuffer<'i> {
    memory: &'i ExternalMemory,
    ptr: CUdeviceptr,
    len: u64,
    row_pitch: Option<u64>,
}

// SAFETY: a device address; usable from any thread with the context current.
unsafe impl Send for MappedBuffer<'_> {}
// SAFETY: shared access only reads the handle.
unsafe impl Sync for MappedBuffer<'_> {}

impl Drop for MappedBuffer<'_> {
    fn drop(&mut self) {
        if let Ok(_guard) = self.memory.device.enter() {
            // SAFETY: the mapped pointer is freed once, before the import (borrow).
            crate::driver::record_drop_error((|| -> Result<()> { cu!(cuMemFree(self.ptr)) })());
        }
    }
}

/// A bounds-checked range of a [`MappedBuffer`].
#[derive(Clone, Copy, Debug)]
pub struct DeviceSlice<'b> {
    ptr: CUdeviceptr,
    len: u64,
    _buffer: PhantomData<&'b ()>,
}

impl DeviceSlice<'_> {
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
    /// `len` bytes at `offset`, checked against the mapping.
    pub fn slice(&self, offset: u64, len: u64) -> Result<DeviceSlice<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceSlice {
                ptr: self.ptr + offset,
                len,
                _buffer: PhantomData,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} of a {}-byte mapping",
                self.len
            ))),
        }
    }
    /// Copies the first `dst.len()` bytes to the host (waits for the copy).
    pub fn copy_to_host(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        let s = self.slice(0, dst.len() as u64)?;
        let _guard = self.memory.device.enter()?;
        // SAFETY: both ranges hold dst.len() bytes; synchronised below.
        cu!(cuMemcpyDtoHAsync(
            dst.as_mut_ptr().cast(),
            s.ptr,
            dst.len(),
            stream.raw()
        ))?;
        stream.synchronize()
    }
    /// Copies `src` to the start of the mapping (waits for the copy).
    pub fn copy_from_host(&self, stream: &Stream, src: &[u8]) -> Result<()> {
        let s = self.slice(0, src.len() as u64)?;
        let _guard = self.memory.device.enter()?;
        // SAFETY: both ranges hold src.len() bytes; synchronised below.
        cu!(cuMemcpyHtoDAsync(
            s.ptr,
            src.as_ptr().cast(),
            src.len(),
            stream.raw()
        ))?;
        stream.synchronize()
    }
}

/// An imported image mapped as a CUDA mipmapped array; destroyed
/// (`cuMipmappedArrayDestroy`) before the import, which it borrows.
#[derive(Debug)]
pub struct MappedArray<'i, F, U> {
    memory: &'i ExternalMemory,
    handle: CUmipmappedArray,
    info: &'i ImageInfo,
    _types: PhantomData<fn() -> (F, U)>,
}

// SAFETY: usable from any thread with the context current.
unsafe impl<F, U> Send for MappedArray<'_, F, U> {}
// SAFETY: getting levels is thread-safe.
unsafe impl<F, U> Sync for MappedArray<'_, F, U> {}

impl<F, U> Drop for MappedArray<'_, F, U> {
    fn drop(&mut self) {
        if let Ok(_guard) = self.memory.device.enter() {
            // SAFETY: level arrays and their objects borrowed `self` and are
            // gone; the mipmapped array owns the levels and is destroyed once.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuMipmappedArrayDestroy(self.handle))
            })());
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
        // SAFETY: a live mipmapped array; level is in range.
        cu!(cuMipmappedArrayGetLevel(&mut array, self.handle, level))?;
        let depth = if self.info.image_type() == vk::ImageType::TYPE_3D {
            e[2]
        } else {
            self.info.array_layers()
        };
        Ok(LevelArray {
            device: &self.memory.device,
            array,
            extent: [e[0], e[1], depth],
            _types: PhantomData,
        })
    }
    /// Mip levels.
    pub fn levels(&self) -> u32 {
        self.info.mip_levels()
    }
}

/// One mip level of a [`MappedArray`]; borrows it and is never destroyed on
/// its own.
#[derive(Debug)]
pub struct LevelArray<'m, F, U> {
    device: &'m CudaDevice,
    array: CUarray,
    extent: [u32; 3],
    _types: PhantomData<fn() -> (F, U)>,
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
    /// Bytes of the whole level, tightly packed (all layers).
    pub fn byte_len(&self) -> usize {
        self.extent.iter().map(|&e| e as usize).product::<usize>() * F::TEXEL_BYTES as usize
    }

    fn copy(
        &self,
        stream: &Stream,
        to_array: bool,
        host: *mut u8,
        device: CUdeviceptr,
    ) -> Result<()> {
        let row = self.extent[0] as usize * F::TEXEL_BYTES as usize;
        let mut p = sys::CUDA_MEMCPY3D {
            WidthInBytes: row,
            Height: self.extent[1] as usize,
            Depth: self.extent[2] as usize,
            ..Default::default()
        };
        let linear_type = if host.is_null() {
            CUmemorytype::CU_MEMORYTYPE_DEVICE
        } else {
            CUmemorytype::CU_MEMORYTYPE_HOST
        };
        if to_array {
            p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
            p.dstArray = self.array;
            p.srcMemoryType = linear_type;
            p.srcHost = host.cast_const().cast();
            p.srcDevice = device;
            p.srcPitch = row;
            p.srcHeight = self.extent[1] as usize;
        } else {
            p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
            p.srcArray = self.array;
            p.dstMemoryType = linear_type;
            p.dstHost = host.cast();
            p.dstDevice = device;
            p.dstPitch = row;
            p.dstHeight = self.extent[1] as usize;
        }
        let _guard = self.device.enter()?;
        // SAFETY: the linear side holds byte_len() bytes (checked by callers);
        // the array is a live level; synchronised by callers when host memory is used.
        cu!(cuMemcpy3DAsync(&p, stream.raw()))
    }

    /// Copies the level to the host, tightly packed (waits for the copy).
    pub fn copy_to_host(&self, stream: &Stream, dst: &mut [u8]) -> Result<()> {
        self.check_len(dst.len())?;
        self.copy(stream, false, dst.as_mut_ptr(), 0)?;
        stream.synchronize()
    }
    /// Copies tightly packed texels from the host into the level (waits).
    pub fn copy_from_host(&self, stream: &Stream, src: &[u8]) -> Result<()> {
        self.check_len(src.len())?;
        self.copy(stream, true, src.as_ptr().cast_mut(), 0)?;
        stream.synchronize()
    }
    /// Copies the level into linear device memory, tightly packed (waits, so
    /// neither side can be freed while the copy runs).
    pub fn copy_to_device(&self, stream: &Stream, dst: &mut DeviceBuffer) -> Result<()> {
        if dst.len() < self.byte_len() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes for a {}-byte level",
                dst.len(),
                self.byte_len()
            )));
        }
        self.copy(stream, false, std::ptr::null_mut(), dst.device_ptr())?;
        stream.synchronize()
    }
    /// Copies tightly packed linear device memory into the level (waits).
    pub fn copy_from_device(&self, stream: &Stream, src: &DeviceBuffer) -> Result<()> {
        if src.len() < self.byte_len() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes for a {}-byte level",
                src.len(),
                self.byte_len()
            )));
        }
        self.copy(stream, true, std::ptr::null_mut(), src.device_ptr())?;
        stream.synchronize()
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len != self.byte_len() {
            return Err(Error::InvalidArgument(format!(
                "level {:?} of {} needs {} bytes, got {len}",
                self.extent,
                F::NAME,
                self.byte_len()
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
        let _guard = self.device.enter()?;
        let mut handle: CUsurfObject = 0;
        // SAFETY: a zeroed resource naming a live level mapped with SURFACE_LDST.
        cu!(cuSurfObjectCreate(&mut handle, &res))?;
        Ok(Surface {
            device: self.device,
            handle,
            _level: PhantomData,
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
        let _guard = self.device.enter()?;
        let mut handle: CUtexObject = 0;
        // SAFETY: zeroed descriptors naming a live level.
        cu!(cuTexObjectCreate(&mut handle, &res, &tex, std::ptr::null()))?;
        Ok(Texture {
            device: self.device,
            handle,
            _level: PhantomData,
        })
    }
}

/// A surface object on a level; destroyed before the level's array.
#[derive(Debug)]
pub struct Surface<'l> {
    device: &'l CudaDevice,
    handle: CUsurfObject,
    _level: PhantomData<&'l ()>,
}

impl Surface<'_> {
    /// The handle to pass to a kernel (`cudaSurfaceObject_t`).
    pub fn raw(&self) -> CUsurfObject {
        self.handle
    }
}

impl Drop for Surface<'_> {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: created here, destroyed once.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuSurfObjectDestroy(self.handle))
            })());
        }
    }
}

/// A texture object on a level; destroyed before the level's array.
#[derive(Debug)]
pub struct Texture<'l> {
    device: &'l CudaDevice,
    handle: CUtexObject,
    _level: PhantomData<&'l ()>,
}

impl Texture<'_> {
    /// The handle to pass to a kernel (`cudaTextureObject_t`).
    pub fn raw(&self) -> CUtexObject {
        self.handle
    }
}

impl Drop for Texture<'_> {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: created here, destroyed once.
            crate::driver::record_drop_error((|| -> Result<()> {
                cu!(cuTexObjectDestroy(self.handle))
            })());
        }
    }
}
