//! Image memory as CUDA arrays: an import mapped as a [`MappedArray`]
//! (`cuMipmappedArrayDestroy`), its [`LevelArray`]s, and the [`Surface`]
//! and [`Texture`] objects made on a level; the array descriptor derived
//! from the image's typed record ([`array_descriptor`]).
//!
//! # Contract
//!
//! * Only the working recipe compiles:
//!   [`ImportedImage::map_array`](crate::ImportedImage::map_array) exists
//!   for optimal-tiled, device-local images; format, channels, extent,
//!   levels, layers, cube and the surface/colour-attachment flags all come
//!   from the image (see [`markers`](crate::markers)).
//! * Borrows give the destruction order: surfaces and textures, then the
//!   mipmapped array (its level arrays are views it owns, never destroyed
//!   on their own), then the import. Copies through a level and kernels
//!   launched with a surface or texture are recorded as uses, which the
//!   destructors wait for (the last-use rule).
//! * Sizes from records are checked, never truncated: byte counts are
//!   computed with checked arithmetic and refused with
//!   [`Error::InvalidArgument`] when they overflow.
//! * Copies to or from host memory wait for the stream to drain first
//!   (bounded by the stream's timeout), by the rule of the `last_use`
//!   module (`Stream::copy_with_host_memory`).

use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_interop_sys::{
    self as sys, CUarray, CUarray_format, CUdeviceptr, CUmemorytype, CUmipmappedArray,
    CUresourcetype, CUsurfObject, CUtexObject, CUDA_ARRAY3D_COLOR_ATTACHMENT, CUDA_ARRAY3D_CUBEMAP,
    CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SURFACE_LDST,
};
use vk_export::ash::vk;
use vk_export::format::{ChannelType, Format};
use vk_export::markers::Usage;
use vk_export::{ImageInfo, ImageRecord};

use crate::driver::{cu, record_drop_error};
use crate::error::{Error, Result};
use crate::events::{report_leak, DROP_WAIT_LIMIT};
use crate::external::ExternalMemory;
use crate::last_use::LastUse;
use crate::markers::SurfaceUsage;
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

/// An imported image mapped as a CUDA mipmapped array; destroyed
/// (`cuMipmappedArrayDestroy`) before the import, which it borrows, after the
/// copies recorded on the import have completed.
#[derive(Debug)]
pub struct MappedArray<'i, F, U> {
    pub(crate) memory: &'i ExternalMemory,
    pub(crate) handle: CUmipmappedArray,
    pub(crate) info: &'i ImageInfo,
    /// Mapped with `CUDA_ARRAY3D_SURFACE_LDST`.
    pub(crate) surface_ldst: bool,
    /// Surface objects of its levels for kernel copies ([`crate::copy`]),
    /// made on a level's first one and destroyed with the array.
    pub(crate) copy_surfaces: CopySurfaces,
    pub(crate) _types: PhantomData<fn() -> (F, U)>,
}

/// The surface objects kernel copies use, one per level array, made on
/// first use; destroyed by [`MappedArray`]'s drop after the import's recorded
/// uses (every kernel copy among them) have completed, or leaked with it.
#[derive(Debug, Default)]
pub(crate) struct CopySurfaces(Mutex<Vec<(CUarray, CUsurfObject)>>);

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

impl<'m, F: Format, U: Usage> LevelArray<'m, F, U> {
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
        self.check_writable()?;
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

    /// `Ok` unless CUDA's writes into this level are refused (an NV12
    /// image's luma plane: see [`crate::planar`]).
    pub(crate) fn check_writable(&self) -> Result<()> {
        match self.memory.cuda_write_refusal {
            Some(why) => Err(Error::Unsupported(why.into())),
            None => Ok(()),
        }
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
    /// images with storage usage compile. It borrows the mapped array, not
    /// this view of one level: it may outlive the view.
    pub fn surface(&self) -> Result<Surface<'m>>
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
    /// element-type reads) for reading the level in kernels. Like
    /// [`LevelArray::surface`], it borrows the mapped array.
    pub fn texture(&self) -> Result<Texture<'m>> {
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
