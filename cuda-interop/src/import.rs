//! Imports: Vulkan memory brought into CUDA as an [`ExternalMemory`] (the
//! `external` module), typed as the [`ImportedImage`] or [`ImportedBuffer`]
//! it came from, and the mappings each type offers (`map`, `map_buffer`, `map_array`,
//! `into_dlpack`), made of the `linear` and `array` modules' pieces. The
//! typed methods stay with their types, so a recipe that does not compile
//! is reported on `ImportedImage::map_array` itself.
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
//!   through a [`MappedBuffer`], a [`DeviceSlice`](crate::DeviceSlice) or a
//!   [`LevelArray`](crate::LevelArray) is recorded as a use of the
//!   [`ExternalMemory`] behind it. The mapped buffer's, the mipmapped
//!   array's and the import's destructors wait for those uses (at most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT)) before
//!   they free anything, so `mem::forget` of a mapping cannot let the import
//!   be destroyed under a pending copy. If the uses do not complete in time,
//!   the import is leaked and its Vulkan resource with it (Vulkan never frees
//!   memory the GPU may still read), and the leak is reported through
//!   [`drop_errors`](crate::drop_errors).

use std::marker::PhantomData;
use std::os::fd::OwnedFd;

use cuda_interop_sys::{
    self as sys, CUdevice_attribute, CUdeviceptr, CUmipmappedArray, CUDA_ARRAY3D_SURFACE_LDST,
};
use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Tiling, Usage};
use vk_export::{
    BufferRecord, ExportableBuffer, ExportableImage, ImageInfo, ImageRecord, KeepAlive,
    ReceivedBuffer, ReceivedImage,
};

use crate::array::{array_descriptor, CopySurfaces, MappedArray};
use crate::context::CudaDevice;
use crate::dlpack::{DLDataType, DLDevice, ManagedTensor, DL_CUDA};
use crate::driver::cu;
use crate::error::{Error, ImportError, Result};
use crate::external::{import_memory, ExternalMemory, SizeCheck};
use crate::linear::{free_mapping, map_buffer, MappedBuffer};
use crate::markers::{ArrayMemory, ArrayTiling, BufferTiling};

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
        self.import_image_inner(
            image.record(),
            fd,
            Some(image.keep_alive()),
            SizeCheck::Trusted,
        )
        .map_err(ImportError::into_error)
    }

    /// Imports an image received over a socket (record and fd arrived
    /// together from a peer). Before CUDA sees the fd, the record is verified
    /// on the Vulkan device this CUDA device was paired with
    /// ([`Context::verify_image`](vk_export::Context::verify_image): both
    /// UUIDs, memory type, and the size, alignment, dedicated flag and
    /// pitches that device derives for the described image), so the device
    /// must come from [`CudaDevice::for_vulkan`]. Right after
    /// `cuImportExternalMemory`, a mapping of the record's whole size is
    /// made and freed: the driver refuses it when the memory behind the fd
    /// is smaller, and the import is then undone. What stays the peer's word
    /// is the layout: a peer that describes other memory of the same size
    /// makes CUDA read garbled texels, within the allocation. On failure the
    /// fd comes back in the error.
    pub fn import_received_image<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        received: ReceivedImage<F, T, M, U>,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| ctx.verify_image(&record)) {
            return Err(ImportError { error, fd });
        }
        self.import_image_inner(record, fd, None, SizeCheck::Probe)
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
        self.import_image_inner(record, fd, None, SizeCheck::Trusted)
    }

    pub(crate) fn import_image_inner<F, T, M, U>(
        &self,
        record: ImageRecord<F, T, M, U>,
        fd: OwnedFd,
        keep: Option<KeepAlive>,
        check: SizeCheck,
    ) -> Result<ImportedImage<F, T, M, U>, ImportError> {
        let info = record.info();
        if let Err(error) = self.check_resource_device(&info.device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let memory = import_memory(
            self,
            fd,
            info.allocation_size(),
            info.dedicated(),
            keep,
            check,
        )?;
        Ok(ImportedImage { memory, record })
    }

    /// Imports a buffer of this process; keeps the Vulkan buffer alive.
    pub fn import_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
    ) -> Result<ImportedBuffer<M>> {
        self.check_resource_device(&buffer.info().device_uuid())?;
        let fd = buffer.export_fd()?;
        self.import_buffer_inner(
            buffer.record(),
            fd,
            Some(buffer.keep_alive()),
            SizeCheck::Trusted,
        )
        .map_err(ImportError::into_error)
    }

    /// Imports a buffer received over a socket, verified on the paired
    /// Vulkan device and size-checked by CUDA like
    /// [`CudaDevice::import_received_image`].
    pub fn import_received_buffer<M: MemoryLocation>(
        &self,
        received: ReceivedBuffer<M>,
    ) -> Result<ImportedBuffer<M>, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = self.verify_with_vulkan(|ctx| ctx.verify_buffer(&record)) {
            return Err(ImportError { error, fd });
        }
        self.import_buffer_inner(record, fd, None, SizeCheck::Probe)
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
        self.import_buffer_inner(record, fd, None, SizeCheck::Trusted)
    }

    fn import_buffer_inner<M>(
        &self,
        record: BufferRecord<M>,
        fd: OwnedFd,
        keep: Option<KeepAlive>,
        check: SizeCheck,
    ) -> Result<ImportedBuffer<M>, ImportError> {
        let info = record.into_info();
        if let Err(error) = self.check_resource_device(&info.device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let memory = import_memory(
            self,
            fd,
            info.allocation_size(),
            info.dedicated(),
            keep,
            check,
        )?;
        Ok(ImportedBuffer {
            memory,
            size: info.size(),
            alignment: info.alignment(),
            _types: PhantomData,
        })
    }
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

/// An imported image mapped as a CUDA mipmapped array, both owned together
/// ([`ImportedImage::into_mapped_array`]): for a struct that keeps image
/// slots (a receiver's ring), where [`MappedArray`]'s borrow of its import
/// cannot be named. Drops the array, then the import.
pub struct OwnedArray<F, T, M, U> {
    // Declared first, so dropped first: it borrows `image`.
    array: MappedArray<'static, F, U>,
    // Behind an `Arc`, so that moving an `OwnedArray` never moves the
    // import, and never asserts unique access to it (as moving a `Box`
    // would) while `array` points into it; no clone of it leaves this type.
    image: std::sync::Arc<ImportedImage<F, T, M, U>>,
}

impl<F, T, M, U> std::fmt::Debug for OwnedArray<F, T, M, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedArray")
            .field("array", &self.array.handle)
            .field("extent", &self.image.record.info().extent())
            .finish_non_exhaustive()
    }
}

impl<F: Format, T: ArrayTiling, M: ArrayMemory, U: Usage> ImportedImage<F, T, M, U> {
    /// Maps the image as [`ImportedImage::map_array`] does, into a value that
    /// owns the import too (no borrow to name).
    ///
    /// ```no_run
    /// # use cuda_interop::{ImportedImage, OwnedArray};
    /// # use vk_export::format::Rgba8Unorm;
    /// # use vk_export::markers::{usage, DeviceLocal, Optimal};
    /// struct Slots {
    ///     arrays: Vec<OwnedArray<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>>,
    /// }
    /// # fn demo(imports: Vec<ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>>)
    /// #     -> cuda_interop::Result<()> {
    /// let slots = Slots {
    ///     arrays: imports
    ///         .into_iter()
    ///         .map(ImportedImage::into_mapped_array)
    ///         .collect::<cuda_interop::Result<_>>()?,
    /// };
    /// let level = slots.arrays[0].array().level(0)?;
    /// # drop(level); Ok(()) }
    /// ```
    pub fn into_mapped_array(self) -> Result<OwnedArray<F, T, M, U>> {
        let image = std::sync::Arc::new(self);
        // SAFETY: the import lives in the `Arc`'s allocation, which neither
        // moves nor is freed while the array exists: the `Arc` is stored
        // beside the array, never cloned out, and dropped after it (field
        // order); only shared references to the import are ever made, so
        // the array's borrow is never invalidated. The `'static` lifetime is
        // never seen outside: `OwnedArray::array` shortens it to its own
        // borrow.
        let borrowed: &'static ImportedImage<F, T, M, U> =
            unsafe { &*std::sync::Arc::as_ptr(&image) };
        let array = borrowed.map_array()?;
        Ok(OwnedArray { array, image })
    }
}

impl<F, T, M, U> OwnedArray<F, T, M, U> {
    /// The mipmapped array, borrowed from this value.
    pub fn array(&self) -> &MappedArray<'_, F, U> {
        &self.array
    }

    /// The import the array is mapped from.
    pub fn image(&self) -> &ImportedImage<F, T, M, U> {
        &self.image
    }
}
