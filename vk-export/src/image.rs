use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::format::Format;
use crate::markers::{usage, DeviceLocal, MemoryLocation, Optimal, Tiling, Usage};
use crate::record::{ImageInfo, ImageRecord, TypeMarkers};
use crate::MEMORY_HANDLE_TYPE;

/// Keeps a Vulkan resource (and its device) alive; the CUDA side holds one per
/// import so the exporter cannot be destroyed first by accident.
#[derive(Clone)]
pub struct KeepAlive(
    #[allow(dead_code, reason = "held only for its Drop")] Arc<dyn Any + Send + Sync>,
);

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeepAlive")
    }
}

impl KeepAlive {
    pub(crate) fn new<T: Any + Send + Sync>(value: Arc<T>) -> KeepAlive {
        KeepAlive(value)
    }
}

/// The shape of an image to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageDesc {
    /// Width in texels.
    pub width: u32,
    /// Height in texels.
    pub height: u32,
    /// Depth in texels: 1 for 2D images, more for a 3D image.
    pub depth: u32,
    /// Mip levels (at least 1).
    pub mip_levels: u32,
    /// Array layers (at least 1; a multiple of 6 for cube images).
    pub array_layers: u32,
    /// Cube-compatible (`VK_IMAGE_CREATE_CUBE_COMPATIBLE_BIT`).
    pub cube: bool,
}

impl ImageDesc {
    /// A 2D image with one level and one layer.
    pub const fn new_2d(width: u32, height: u32) -> ImageDesc {
        ImageDesc {
            width,
            height,
            depth: 1,
            mip_levels: 1,
            array_layers: 1,
            cube: false,
        }
    }
    /// A 3D image with one level.
    pub const fn new_3d(width: u32, height: u32, depth: u32) -> ImageDesc {
        ImageDesc {
            depth,
            ..ImageDesc::new_2d(width, height)
        }
    }
    /// With `levels` mip levels.
    pub const fn mip_levels(self, levels: u32) -> ImageDesc {
        ImageDesc {
            mip_levels: levels,
            ..self
        }
    }
    /// With `layers` array layers.
    pub const fn array_layers(self, layers: u32) -> ImageDesc {
        ImageDesc {
            array_layers: layers,
            ..self
        }
    }
    /// A cube map (6 layers per cube; `layers` must be a multiple of 6).
    pub const fn cube(self, layers: u32) -> ImageDesc {
        ImageDesc {
            cube: true,
            array_layers: layers,
            ..self
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.width == 0 || self.height == 0 || self.depth == 0 {
            return bad(format!(
                "extent {}x{}x{} has a zero side",
                self.width, self.height, self.depth
            ));
        }
        if self.mip_levels == 0 || self.array_layers == 0 {
            return bad("mip_levels and array_layers must be at least 1".into());
        }
        let max_levels = 32 - self.width.max(self.height).max(self.depth).leading_zeros();
        if self.mip_levels > max_levels {
            return bad(format!(
                "{} mip levels for {}x{}x{}: at most {max_levels}",
                self.mip_levels, self.width, self.height, self.depth
            ));
        }
        if self.depth > 1 && self.array_layers > 1 {
            return bad("a 3D image cannot have array layers".into());
        }
        if self.cube && (self.width != self.height || self.array_layers % 6 != 0 || self.depth != 1)
        {
            return bad(format!(
                "a cube image needs width == height, depth 1 and layers a multiple of 6 (got {}x{}, {} layers)",
                self.width, self.height, self.array_layers
            ));
        }
        Ok(())
    }
}

/// Who may touch a resource now (queue-family ownership, Vulkan spec
/// "resources-external-sharing").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Owned by this context's queue family, in this layout.
    Vulkan(vk::ImageLayout),
    /// Released to `VK_QUEUE_FAMILY_EXTERNAL`, last in this layout.
    External(vk::ImageLayout),
}

pub(crate) struct ImageInner {
    pub(crate) ctx: Context,
    pub(crate) image: vk::Image,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) info: ImageInfo,
    pub(crate) owner: Mutex<Owner>,
}

impl Drop for ImageInner {
    fn drop(&mut self) {
        let device = &self.ctx.inner.device;
        // SAFETY: the image and memory were created here; nothing else holds
        // them (CUDA imports hold a KeepAlive of this value). Wait for idle so
        // no submitted work still uses them.
        unsafe {
            let _ = device.device_wait_idle();
            device.destroy_image(self.image, None);
            device.free_memory(self.memory, None);
        }
    }
}

/// An image whose memory can be exported as an OPAQUE_FD, typed by format,
/// tiling, memory location and usage preset.
///
/// ```no_run
/// use vk_export::{Context, ExportableImage, HeadlessOptions, ImageDesc};
/// use vk_export::format::Rgba8Unorm;
/// let ctx = Context::headless(&HeadlessOptions::default())?;
/// let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(1920, 1080))?;
/// let fd = image.export_fd()?; // a new fd, owned by the caller
/// println!("import {} bytes", image.info().allocation_size());
/// # Ok::<(), vk_export::Error>(())
/// ```
pub struct ExportableImage<F, T = Optimal, M = DeviceLocal, U = usage::Storage> {
    pub(crate) inner: Arc<ImageInner>,
    _types: TypeMarkers<F, T, M, U>,
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> fmt::Debug for ExportableImage<F, T, M, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportableImage")
            .field("format", &F::NAME)
            .field("extent", &self.inner.info.extent)
            .field("tiling", &T::VK)
            .field("allocation_size", &self.inner.info.allocation_size)
            .field("dedicated", &self.inner.info.dedicated)
            .finish()
    }
}

/// What the driver said about exporting an image of this kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageCapability {
    /// The handle type may only be used with dedicated allocations.
    pub dedicated_only: bool,
    /// `VkImageFormatProperties::maxExtent`.
    pub max_extent: [u32; 3],
    /// `VkImageFormatProperties::maxMipLevels`.
    pub max_mip_levels: u32,
    /// `VkImageFormatProperties::maxArrayLayers`.
    pub max_array_layers: u32,
}

struct CreateParams {
    format: vk::Format,
    image_type: vk::ImageType,
    extent: [u32; 3],
    mip_levels: u32,
    array_layers: u32,
    flags: vk::ImageCreateFlags,
    tiling: vk::ImageTiling,
    usage: vk::ImageUsageFlags,
}

impl CreateParams {
    fn what(&self) -> String {
        format!(
            "an exportable {:?} image ({:?}, {:?} tiling, usage {:?}, {}x{}x{}, {} levels, {} layers)",
            self.image_type,
            self.format,
            self.tiling,
            self.usage,
            self.extent[0],
            self.extent[1],
            self.extent[2],
            self.mip_levels,
            self.array_layers
        )
    }
}

fn preflight(ctx: &Context, p: &CreateParams) -> Result<ImageCapability> {
    let mut external =
        vk::PhysicalDeviceExternalImageFormatInfo::default().handle_type(MEMORY_HANDLE_TYPE);
    let info = vk::PhysicalDeviceImageFormatInfo2::default()
        .format(p.format)
        .ty(p.image_type)
        .tiling(p.tiling)
        .usage(p.usage)
        .flags(p.flags)
        .push_next(&mut external);
    let mut external_props = vk::ExternalImageFormatProperties::default();
    let mut props = vk::ImageFormatProperties2::default().push_next(&mut external_props);
    // SAFETY: plain query; both chains live across the call.
    let result = unsafe {
        ctx.inner
            .instance
            .get_physical_device_image_format_properties2(ctx.inner.physical, &info, &mut props)
    };
    match result {
        Ok(()) => {}
        Err(vk::Result::ERROR_FORMAT_NOT_SUPPORTED) => return Err(Error::unsupported(
            p.what(),
            "vkGetPhysicalDeviceImageFormatProperties2 returned VK_ERROR_FORMAT_NOT_SUPPORTED for \
                 OPAQUE_FD; try optimal tiling, another format or fewer usage flags",
        )),
        Err(e) => {
            return Err(Error::Vulkan {
                call: "vkGetPhysicalDeviceImageFormatProperties2",
                result: e,
                hint: "the capability query itself failed",
            })
        }
    }
    let limits = props.image_format_properties;
    let features = external_props
        .external_memory_properties
        .external_memory_features;
    let need =
        vk::ExternalMemoryFeatureFlags::EXPORTABLE | vk::ExternalMemoryFeatureFlags::IMPORTABLE;
    if !features.contains(need) {
        return Err(Error::unsupported(
            p.what(),
            format!("the driver reports external memory features {features:?}; exportable and importable are both needed"),
        ));
    }
    let max_extent = [
        limits.max_extent.width,
        limits.max_extent.height,
        limits.max_extent.depth,
    ];
    if p.extent.iter().zip(max_extent).any(|(e, m)| *e > m)
        || p.mip_levels > limits.max_mip_levels
        || p.array_layers > limits.max_array_layers
    {
        return Err(Error::unsupported(
            p.what(),
            format!(
                "the driver's limits for it are extent {max_extent:?}, {} levels, {} layers",
                limits.max_mip_levels, limits.max_array_layers
            ),
        ));
    }
    Ok(ImageCapability {
        dedicated_only: features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY),
        max_extent,
        max_mip_levels: limits.max_mip_levels,
        max_array_layers: limits.max_array_layers,
    })
}

/// Creates the image (always with the external-memory info, initial layout
/// UNDEFINED) and returns it with its requirements and whether it must or
/// should be dedicated.
fn create_image(
    ctx: &Context,
    p: &CreateParams,
) -> Result<(vk::Image, vk::MemoryRequirements, bool)> {
    let device = &ctx.inner.device;
    let mut external =
        vk::ExternalMemoryImageCreateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
    let info = vk::ImageCreateInfo::default()
        .flags(p.flags)
        .image_type(p.image_type)
        .format(p.format)
        .extent(vk::Extent3D {
            width: p.extent[0],
            height: p.extent[1],
            depth: p.extent[2],
        })
        .mip_levels(p.mip_levels)
        .array_layers(p.array_layers)
        .samples(vk::SampleCountFlags::TYPE_1)
        .tiling(p.tiling)
        .usage(p.usage)
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .initial_layout(vk::ImageLayout::UNDEFINED)
        .push_next(&mut external);
    // SAFETY: the create info and its chain live across the call; parameters were preflighted.
    let image = unsafe { device.create_image(&info, None) }.map_err(Error::vk(
        "vkCreateImage",
        "out of memory, or parameters the preflight did not cover",
    ))?;
    let mut dedicated = vk::MemoryDedicatedRequirements::default();
    let mut reqs = vk::MemoryRequirements2::default().push_next(&mut dedicated);
    // SAFETY: the image was just created on this device.
    unsafe {
        device.get_image_memory_requirements2(
            &vk::ImageMemoryRequirementsInfo2::default().image(image),
            &mut reqs,
        )
    };
    let memory_requirements = reqs.memory_requirements;
    let wants_dedicated = dedicated.requires_dedicated_allocation == vk::TRUE
        || dedicated.prefers_dedicated_allocation == vk::TRUE;
    Ok((image, memory_requirements, wants_dedicated))
}

fn params_from_desc<F: Format, T: Tiling, U: Usage>(desc: &ImageDesc) -> CreateParams {
    CreateParams {
        format: F::VK,
        image_type: if desc.depth > 1 {
            vk::ImageType::TYPE_3D
        } else {
            vk::ImageType::TYPE_2D
        },
        extent: [desc.width, desc.height, desc.depth],
        mip_levels: desc.mip_levels,
        array_layers: desc.array_layers,
        flags: if desc.cube {
            vk::ImageCreateFlags::CUBE_COMPATIBLE
        } else {
            vk::ImageCreateFlags::empty()
        },
        tiling: T::VK,
        usage: U::VK,
    }
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> ExportableImage<F, T, M, U> {
    /// Asks the driver whether such an image can be exported and imported,
    /// creating nothing.
    pub fn preflight(ctx: &Context, desc: &ImageDesc) -> Result<ImageCapability> {
        desc.check()?;
        preflight(ctx, &params_from_desc::<F, T, U>(desc))
    }

    /// Creates, allocates (exportable, dedicated where required or preferred)
    /// and binds a new image.
    pub fn new(ctx: &Context, desc: ImageDesc) -> Result<Self> {
        desc.check()?;
        let params = params_from_desc::<F, T, U>(&desc);
        let capability = preflight(ctx, &params)?;
        let (image, reqs, wants_dedicated) = create_image(ctx, &params)?;
        let dedicated = wants_dedicated || capability.dedicated_only;
        let device = &ctx.inner.device;
        let destroy_image = || {
            // SAFETY: the image was created above and is not bound or used.
            unsafe { device.destroy_image(image, None) }
        };
        let Some(memory_type_index) =
            ctx.memory_type(reqs.memory_type_bits, M::REQUIRED, M::EXCLUDED)
        else {
            destroy_image();
            return Err(Error::unsupported(
                params.what(),
                format!(
                    "no memory type with {:?} among the allowed types {:#b}",
                    M::REQUIRED,
                    reqs.memory_type_bits
                ),
            ));
        };
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().image(image);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(memory_type_index)
            .push_next(&mut export);
        if dedicated {
            alloc = alloc.push_next(&mut dedicated_info);
        }
        // SAFETY: the allocate info and its chain live across the call.
        let memory = match unsafe { device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy_image();
                return Err(Error::Vulkan {
                    call: "vkAllocateMemory",
                    result: e,
                    hint: "out of device memory for the exportable allocation",
                });
            }
        };
        Self::finish(
            ctx,
            image,
            memory,
            params,
            reqs,
            memory_type_index,
            dedicated,
        )
    }

    fn finish(
        ctx: &Context,
        image: vk::Image,
        memory: vk::DeviceMemory,
        params: CreateParams,
        reqs: vk::MemoryRequirements,
        memory_type_index: u32,
        dedicated: bool,
    ) -> Result<Self> {
        let device = &ctx.inner.device;
        // SAFETY: image and memory are fresh; offset 0 satisfies any alignment.
        if let Err(e) = unsafe { device.bind_image_memory(image, memory, 0) } {
            // SAFETY: neither is in use.
            unsafe {
                device.destroy_image(image, None);
                device.free_memory(memory, None);
            }
            return Err(Error::Vulkan {
                call: "vkBindImageMemory",
                result: e,
                hint: "the memory does not fit the image (a record from a different image?)",
            });
        }
        let (row_pitch, array_pitch) = if params.tiling == vk::ImageTiling::LINEAR {
            // SAFETY: a linear image's subresource layout may be queried.
            let layout = unsafe {
                device.get_image_subresource_layout(
                    image,
                    vk::ImageSubresource {
                        aspect_mask: vk::ImageAspectFlags::COLOR,
                        mip_level: 0,
                        array_layer: 0,
                    },
                )
            };
            (layout.row_pitch, layout.array_pitch)
        } else {
            (0, 0)
        };
        let identity = &ctx.inner.identity;
        let info = ImageInfo {
            format: params.format,
            image_type: params.image_type,
            extent: params.extent,
            mip_levels: params.mip_levels,
            array_layers: params.array_layers,
            flags: params.flags,
            tiling: params.tiling,
            usage: params.usage,
            allocation_size: reqs.size,
            memory_type_index,
            memory_flags: ctx.memory_type_flags(memory_type_index).unwrap_or_default(),
            dedicated,
            alignment: reqs.alignment,
            offset: 0,
            row_pitch,
            array_pitch,
            device_uuid: identity.device_uuid,
            driver_uuid: identity.driver_uuid,
        };
        Ok(ExportableImage {
            inner: Arc::new(ImageInner {
                ctx: ctx.clone(),
                image,
                memory,
                info,
                owner: Mutex::new(Owner::Vulkan(vk::ImageLayout::UNDEFINED)),
            }),
            _types: PhantomData,
        })
    }

    /// Imports an exported image into `ctx`: the image is created from the
    /// record, so its parameters are the exporter's by construction.
    ///
    /// The record is checked against this device first (UUIDs, memory type,
    /// capability). `fd` is consumed on success and closed on failure.
    pub fn import(ctx: &Context, record: &ImageRecord<F, T, M, U>, fd: OwnedFd) -> Result<Self> {
        let info = &record.info;
        check_same_device(ctx, &info.device_uuid, &info.driver_uuid)?;
        let desc = ImageDesc {
            width: info.extent[0],
            height: info.extent[1],
            depth: info.extent[2],
            mip_levels: info.mip_levels,
            array_layers: info.array_layers,
            cube: info.is_cube(),
        };
        desc.check().map_err(|e| Error::Record(e.to_string()))?;
        let params = CreateParams {
            format: info.format,
            image_type: info.image_type,
            extent: info.extent,
            mip_levels: info.mip_levels,
            array_layers: info.array_layers,
            flags: info.flags,
            tiling: info.tiling,
            usage: info.usage,
        };
        let capability = preflight(ctx, &params)?;
        if capability.dedicated_only && !info.dedicated {
            return Err(Error::Record(
                "the driver requires dedicated allocations, but the record's is not".into(),
            ));
        }
        check_memory_type(ctx, info.memory_type_index, info.memory_flags)?;
        let (image, reqs, _) = create_image(ctx, &params)?;
        let device = &ctx.inner.device;
        if reqs.size != info.allocation_size
            || reqs.memory_type_bits & (1 << info.memory_type_index) == 0
        {
            // SAFETY: the image was created above and is unused.
            unsafe { device.destroy_image(image, None) };
            return Err(Error::Record(format!(
                "this device needs {} bytes in memory types {:#b} for the described image, but the record says \
                 {} bytes in type {}: not the same image",
                reqs.size, reqs.memory_type_bits, info.allocation_size, info.memory_type_index
            )));
        }
        let dedicated_to = info
            .dedicated
            .then(|| vk::MemoryDedicatedAllocateInfo::default().image(image));
        let memory = match allocate_imported(
            ctx,
            fd,
            info.allocation_size,
            info.memory_type_index,
            dedicated_to,
        ) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: unused image.
                unsafe { device.destroy_image(image, None) };
                return Err(e);
            }
        };
        Self::finish(
            ctx,
            image,
            memory,
            params,
            reqs,
            info.memory_type_index,
            info.dedicated,
        )
    }

    /// Exports the memory as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_memory_fd(&self.inner.ctx, self.inner.memory)
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> ImageRecord<F, T, M, U> {
        ImageRecord {
            info: self.inner.info.clone(),
            _types: PhantomData,
        }
    }

    /// The plain record.
    pub fn info(&self) -> &ImageInfo {
        &self.inner.info
    }

    /// The context this image belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The `VkImage`. Do not destroy it; record commands on it only while no
    /// helper of this crate uses it.
    pub fn raw(&self) -> vk::Image {
        self.inner.image
    }

    /// The `VkDeviceMemory` it is bound to.
    pub fn raw_memory(&self) -> vk::DeviceMemory {
        self.inner.memory
    }

    /// A handle that keeps this image (and its device) alive.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.inner.clone())
    }
}

/// Allocates memory that imports `fd`: consumed on success, closed on failure
/// (a failed import leaves the fd with the caller, which is this function).
pub(crate) fn allocate_imported(
    ctx: &Context,
    fd: OwnedFd,
    size: u64,
    memory_type_index: u32,
    dedicated_to: Option<vk::MemoryDedicatedAllocateInfo<'static>>,
) -> Result<vk::DeviceMemory> {
    let raw_fd = fd.into_raw_fd();
    let mut import = vk::ImportMemoryFdInfoKHR::default()
        .handle_type(MEMORY_HANDLE_TYPE)
        .fd(raw_fd);
    let mut dedicated_info = dedicated_to.unwrap_or_default();
    let mut alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(size)
        .memory_type_index(memory_type_index)
        .push_next(&mut import);
    if dedicated_to.is_some() {
        alloc = alloc.push_next(&mut dedicated_info);
    }
    // SAFETY: the chain lives across the call; on success Vulkan owns the fd.
    unsafe { ctx.inner.device.allocate_memory(&alloc, None) }.map_err(|e| {
        // SAFETY: a failed import does not take ownership: the fd is still
        // ours, and nothing else refers to this number.
        drop(unsafe { OwnedFd::from_raw_fd(raw_fd) });
        Error::Vulkan {
            call: "vkAllocateMemory (import)",
            result: e,
            hint: "the fd is not an OPAQUE_FD export from this device, or the record does not match it",
        }
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
            crate::context::format_uuid(device_uuid),
            crate::context::format_uuid(driver_uuid),
            me.device_uuid_string(),
            crate::context::format_uuid(&me.driver_uuid),
            me.name
        )));
    }
    Ok(())
}

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
