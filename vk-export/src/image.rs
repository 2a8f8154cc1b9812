//! Exportable images: created, allocated and bound so that CUDA (or another
//! device or process) can import them, and imported from records.
//!
//! # Contract
//!
//! * **Export recipe.** Preflight with the exact external-memory query, then
//!   `VkExternalMemoryImageCreateInfo`, export allocate info, a dedicated
//!   allocation where the driver requires or prefers one, and a memory type
//!   of the exact class `M`. The record states what this produced.
//! * **Imports verify before the driver sees the fd.** The importer
//!   re-creates the image from the record and re-derives size, memory type
//!   bits and flags, alignment, dedicated requirement and (linear) pitches on
//!   its own device, and checks both UUIDs: a record that differs from what
//!   this device derives is [`Error::Record`], and the fd comes back.
//! * **Safe imports** are the ones the crate can vouch for: an image of this
//!   process ([`ExportableImage::import_from`]) and a received bundle
//!   ([`ExportableImage::import_received`]). A bare fd under a record is
//!   [`ExportableImage::import_fd`], `unsafe`.
//! * **Drop** waits (bounded) for this crate's last submission that used the
//!   image; if that never completes the image and memory are leaked rather
//!   than freed under the GPU.

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::{record_drop_error, Context, DROP_WAIT};
use crate::error::{unsupported, vk_error, Error, Result};
use crate::memory::{
    allocate_imported, allocation_differences, check_fits_heap, check_memory_type,
    check_record_fits_heap, check_same_device, export_memory_fd, import_dup,
};
use crate::ownership::Owner;
use crate::submit::LastUse;
use interop_share::fd::{check_export_fd, ImportError, ImportFailure, KeepAlive};
use interop_share::format::Format;
use interop_share::markers::{usage, DeviceLocal, MemoryLocation, Optimal, Tiling, Usage};
use interop_share::received::ReceivedImage;
use interop_share::record::{ImageFields, ImageInfo, ImageRecord};

use crate::MEMORY_HANDLE_TYPE;

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
        if self.cube
            && (self.width != self.height
                || !self.array_layers.is_multiple_of(6)
                || self.depth != 1)
        {
            return bad(format!(
                "a cube image needs width == height, depth 1 and layers a multiple of 6 (got {}x{}, {} layers)",
                self.width, self.height, self.array_layers
            ));
        }
        Ok(())
    }
}

pub(crate) struct ImageInner {
    pub(crate) ctx: Context,
    pub(crate) image: vk::Image,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) info: ImageInfo,
    pub(crate) owner: Mutex<Owner>,
    /// Per queue, the progress value of this crate's last submission that used the image.
    pub(crate) last_use: LastUse,
}

impl Drop for ImageInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.wait_used(&self.last_use, DROP_WAIT) {
            record_drop_error(format_args!(
                "an image and its memory are leaked: the submission that last used them did not complete ({e})"
            ));
            return;
        }
        let device = &self.ctx.inner.device;
        // SAFETY: created here; nothing else holds them (CUDA imports hold a
        // KeepAlive of this value); this crate's last use completed, and the
        // application's own submissions are covered by from_raw's contract.
        unsafe {
            device.destroy_image(self.image, None);
            device.free_memory(self.memory, None);
        }
    }
}

/// An image whose memory can be exported as an OPAQUE_FD, typed by format,
/// tiling, memory class and usage preset.
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
    /// The typed record, checked once when the image was made.
    record: ImageRecord<F, T, M, U>,
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> fmt::Debug for ExportableImage<F, T, M, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportableImage")
            .field("format", &F::NAME)
            .field("extent", &self.inner.info.extent())
            .field("tiling", &T::VK)
            .field("allocation_size", &self.inner.info.allocation_size())
            .field("dedicated", &self.inner.info.dedicated())
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

pub(crate) struct CreateParams {
    pub(crate) format: vk::Format,
    pub(crate) image_type: vk::ImageType,
    pub(crate) extent: [u32; 3],
    pub(crate) mip_levels: u32,
    pub(crate) array_layers: u32,
    pub(crate) flags: vk::ImageCreateFlags,
    pub(crate) tiling: vk::ImageTiling,
    pub(crate) usage: vk::ImageUsageFlags,
}

impl CreateParams {
    pub(crate) fn what(&self) -> String {
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

/// The format features each usage flag needs of the format with the
/// image's tiling (Vulkan's valid usage of `VkImageCreateInfo::usage`).
const USAGE_FEATURES: [(vk::ImageUsageFlags, vk::FormatFeatureFlags, &str); 5] = [
    (
        vk::ImageUsageFlags::STORAGE,
        vk::FormatFeatureFlags::STORAGE_IMAGE,
        "STORAGE_IMAGE",
    ),
    (
        vk::ImageUsageFlags::SAMPLED,
        vk::FormatFeatureFlags::SAMPLED_IMAGE,
        "SAMPLED_IMAGE",
    ),
    (
        vk::ImageUsageFlags::COLOR_ATTACHMENT,
        vk::FormatFeatureFlags::COLOR_ATTACHMENT,
        "COLOR_ATTACHMENT",
    ),
    (
        vk::ImageUsageFlags::TRANSFER_SRC,
        vk::FormatFeatureFlags::TRANSFER_SRC,
        "TRANSFER_SRC",
    ),
    (
        vk::ImageUsageFlags::TRANSFER_DST,
        vk::FormatFeatureFlags::TRANSFER_DST,
        "TRANSFER_DST",
    ),
];

/// The format features `usage` needs that `features` lacks, by name.
fn missing_features(
    usage: vk::ImageUsageFlags,
    features: vk::FormatFeatureFlags,
) -> Vec<&'static str> {
    USAGE_FEATURES
        .iter()
        .filter(|(u, f, _)| usage.contains(*u) && !features.contains(*f))
        .map(|(_, _, name)| *name)
        .collect()
}

/// Refuses usage flags the format's features (`vkGetPhysicalDeviceFormatProperties`
/// for the tiling) do not grant, naming them: the sRGB formats have no
/// `STORAGE_IMAGE` on most drivers, and a bare `ERROR_FORMAT_NOT_SUPPORTED`
/// would not say so.
fn check_format_features(ctx: &Context, p: &CreateParams) -> Result<()> {
    // SAFETY: plain query on the context's live instance and physical device.
    let props = unsafe {
        ctx.inner
            .instance
            .get_physical_device_format_properties(ctx.inner.physical, p.format)
    };
    let features = if p.tiling == vk::ImageTiling::LINEAR {
        props.linear_tiling_features
    } else {
        props.optimal_tiling_features
    };
    let missing = missing_features(p.usage, features);
    if missing.is_empty() {
        return Ok(());
    }
    let hint = if missing == ["STORAGE_IMAGE"] {
        "; CUDA needs storage usage only for a surface and the copy kernel: make the image \
         usage::Sampled or usage::ColorAttachment (a texture, driver copies)"
    } else {
        ""
    };
    Err(unsupported(
        p.what(),
        format!(
            "the driver gives {:?} with {:?} tiling the format features {features:?}, without {}, \
             which the usage needs{hint}",
            p.format,
            p.tiling,
            missing.join(" and ")
        ),
    ))
}

pub(crate) fn preflight(ctx: &Context, p: &CreateParams) -> Result<ImageCapability> {
    check_format_features(ctx, p)?;
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
        Err(vk::Result::ERROR_FORMAT_NOT_SUPPORTED) => return Err(unsupported(
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
        return Err(unsupported(
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
        return Err(unsupported(
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

/// What this device derives for an image of given create parameters: the
/// facts an export records and an import must find again.
struct Derived {
    requirements: vk::MemoryRequirements,
    /// Required or preferred dedicated allocation (or a dedicated-only handle type).
    dedicated: bool,
    /// Row and array pitch of level 0, layer 0 (linear tiling), else 0.
    pitches: (u64, u64),
}

/// Creates the image (always with the external-memory info, initial layout
/// UNDEFINED) and returns it with what the device derives for it.
fn create_image(
    ctx: &Context,
    p: &CreateParams,
    capability: &ImageCapability,
) -> Result<(vk::Image, Derived)> {
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
    let image = unsafe { device.create_image(&info, None) }.map_err(vk_error(
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
    let pitches = if p.tiling == vk::ImageTiling::LINEAR {
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
    Ok((
        image,
        Derived {
            requirements: reqs.memory_requirements,
            dedicated: capability.dedicated_only
                || dedicated.requires_dedicated_allocation == vk::TRUE
                || dedicated.prefers_dedicated_allocation == vk::TRUE,
            pitches,
        },
    ))
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

fn params_from_info(info: &ImageInfo) -> CreateParams {
    CreateParams {
        format: info.format(),
        image_type: info.image_type(),
        extent: info.extent(),
        mip_levels: info.mip_levels(),
        array_layers: info.array_layers(),
        flags: info.flags(),
        tiling: info.tiling(),
        usage: info.usage(),
    }
}

/// Compares what this device derives for the record's image with the record.
fn check_derived(ctx: &Context, info: &ImageInfo, derived: &Derived) -> Result<()> {
    let mut differences = allocation_differences(
        &derived.requirements,
        derived.dedicated,
        info.allocation_size(),
        info.memory_type_index(),
        info.alignment(),
        info.dedicated(),
    );
    if derived.pitches != (info.row_pitch(), info.array_pitch()) {
        differences.push(format!(
            "row/array pitch {:?} (record: {:?})",
            derived.pitches,
            (info.row_pitch(), info.array_pitch())
        ));
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(Error::Record(format!(
        "the record does not describe the image it claims: for {}x{}x{} {:?}, {} levels, {} layers, {} derives {}; \
         not the same image (or another driver)",
        info.extent()[0],
        info.extent()[1],
        info.extent()[2],
        info.format(),
        info.mip_levels(),
        info.array_layers(),
        ctx.identity().name,
        differences.join(", ")
    )))
}

/// The checks a received image record must pass on `ctx`, leaving the image
/// created from it (for an import) or destroying it (for a check alone).
fn verified_image(ctx: &Context, info: &ImageInfo) -> Result<(vk::Image, Derived)> {
    check_same_device(ctx, &info.device_uuid(), &info.driver_uuid())?;
    check_memory_type(ctx, info.memory_type_index(), info.memory_flags())?;
    let params = params_from_info(info);
    let capability = preflight(ctx, &params)?;
    let (image, derived) = create_image(ctx, &params, &capability)?;
    if let Err(e) = check_derived(ctx, info, &derived) {
        // SAFETY: the image was created above and is unused.
        unsafe { ctx.inner.device.destroy_image(image, None) };
        return Err(e);
    }
    Ok((image, derived))
}

impl Context {
    /// Checks an image record against this device as an import would,
    /// creating nothing that outlives the call: both UUIDs, the memory type
    /// and its flags, and the size, memory type bits, alignment, dedicated
    /// requirement and pitches that this device derives for the described
    /// image. The CUDA side runs this before `cuImportExternalMemory`.
    pub fn verify_image<F, T, M, U>(&self, record: &ImageRecord<F, T, M, U>) -> Result<()> {
        let (image, _) = verified_image(self, record.info())?;
        // SAFETY: created by verified_image for this check and unused.
        unsafe { self.inner.device.destroy_image(image, None) };
        Ok(())
    }
}

impl<F: Format, T: Tiling, M: MemoryLocation, U: Usage> ExportableImage<F, T, M, U> {
    /// Asks the driver whether such an image can be exported and imported,
    /// creating nothing.
    pub fn preflight(ctx: &Context, desc: &ImageDesc) -> Result<ImageCapability> {
        desc.check()?;
        preflight(ctx, &params_from_desc::<F, T, U>(desc))
    }

    /// Creates, allocates (exportable, dedicated where required or preferred,
    /// in a memory type of the exact class `M`) and binds a new image.
    pub fn new(ctx: &Context, desc: ImageDesc) -> Result<Self> {
        desc.check()?;
        let params = params_from_desc::<F, T, U>(&desc);
        let capability = preflight(ctx, &params)?;
        let (image, derived) = create_image(ctx, &params, &capability)?;
        let device = &ctx.inner.device;
        let destroy_image = || {
            // SAFETY: the image was created above and is not bound or used.
            unsafe { device.destroy_image(image, None) }
        };
        let reqs = derived.requirements;
        let Some(memory_type_index) =
            ctx.memory_type(reqs.memory_type_bits, M::REQUIRED, M::EXCLUDED)
        else {
            destroy_image();
            return Err(unsupported(
                params.what(),
                crate::memory::no_memory_type::<M>(reqs.memory_type_bits),
            ));
        };
        if let Err(why) = check_fits_heap(ctx, reqs.size, memory_type_index) {
            destroy_image();
            return Err(Error::InvalidArgument(format!(
                "{} needs an allocation of {why}",
                params.what()
            )));
        }
        let mut export = vk::ExportMemoryAllocateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().image(image);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(memory_type_index)
            .push_next(&mut export);
        if derived.dedicated {
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
        let identity = &ctx.inner.identity;
        let info = ImageInfo::from_fields(ImageFields {
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
            dedicated: derived.dedicated,
            alignment: reqs.alignment,
            offset: 0,
            row_pitch: derived.pitches.0,
            array_pitch: derived.pitches.1,
            device_uuid: identity.device_uuid,
            driver_uuid: identity.driver_uuid,
        })
        .map_err(|e| {
            Error::Record(format!(
                "this driver produced a record outside the wire rules: {e}"
            ))
        });
        Self::bind(ctx, image, memory, info)
    }

    /// Binds `memory` to `image` and wraps them; on failure destroys both.
    fn bind(
        ctx: &Context,
        image: vk::Image,
        memory: vk::DeviceMemory,
        info: Result<ImageInfo>,
    ) -> Result<Self> {
        let device = &ctx.inner.device;
        let bound = info.and_then(|info| {
            let record = info.typed::<F, T, M, U>()?;
            // SAFETY: image and memory are fresh; offset 0 satisfies any alignment.
            unsafe { device.bind_image_memory(image, memory, 0) }.map_err(vk_error(
                "vkBindImageMemory",
                "the memory does not fit the image",
            ))?;
            Ok(record)
        });
        let record = match bound {
            Ok(record) => record,
            Err(e) => {
                // SAFETY: neither is in use.
                unsafe {
                    device.destroy_image(image, None);
                    device.free_memory(memory, None);
                }
                return Err(e);
            }
        };
        Ok(ExportableImage {
            inner: Arc::new(ImageInner {
                ctx: ctx.clone(),
                image,
                memory,
                info: record.info().clone(),
                owner: Mutex::new(Owner::Unused),
                last_use: LastUse::default(),
            }),
            record,
        })
    }

    /// Imports `exporter` (an image of this process, on another device or
    /// the same one) into `ctx`: the record and fd come straight from it.
    pub fn import_from(ctx: &Context, exporter: &ExportableImage<F, T, M, U>) -> Result<Self> {
        let fd = exporter.export_fd()?;
        // SAFETY: `fd` is a fresh export of `exporter`'s memory, and the
        // record is `exporter`'s own.
        unsafe { Self::import_fd(ctx, &exporter.record(), fd) }.map_err(ImportError::into_error)
    }

    /// Imports an image received over a socket (record and fd arrived
    /// together from a peer). The record is verified on this device
    /// first; on failure the fd comes back in the error.
    pub fn import_received(
        ctx: &Context,
        received: ReceivedImage<F, T, M, U>,
    ) -> Result<Self, ImportError> {
        let (record, fd, _peer) = received.into_parts();
        // SAFETY: not "the peer is honest": any process that can reach the
        // socket can pair any record with any fd. What holds instead: the
        // record satisfies the shape rules (decoder), import_fd checks the fd
        // kind and every fact of the record this device derives before the
        // driver sees the fd, and the driver's import (vkAllocateMemory with
        // the record's size and memory type) refuses memory smaller than the
        // record (tests/tests/forged_bundle.rs shows it on each driver CI and
        // the GPU bundle run). What stays the peer's word is the layout of
        // memory that is as large as claimed: garbled texels, no access
        // outside the allocation (the guide's "Trust boundary").
        unsafe { Self::import_fd(ctx, &record, fd) }
    }

    /// Imports an exported image from a record and an fd that did not travel
    /// together through this crate. The image is created from the record and
    /// verified against this device like [`Context::verify_image`]; `fd` is
    /// consumed on success and comes back in the error on failure.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of the memory of the image that `record`
    /// describes, and `record` is that image's own, unmodified record. (A
    /// record of another image whose facts happen to match would make the
    /// import read memory laid out for another image.)
    pub unsafe fn import_fd(
        ctx: &Context,
        record: &ImageRecord<F, T, M, U>,
        fd: OwnedFd,
    ) -> Result<Self, ImportError> {
        let info = record.info();
        let (image, _) = match check_export_fd(&fd, "memory")
            .and_then(|()| {
                check_record_fits_heap(ctx, info.allocation_size(), info.memory_type_index())
            })
            .and_then(|()| verified_image(ctx, info))
        {
            Ok(v) => v,
            Err(error) => return Err(ImportError { error, fd }),
        };
        let dedicated_to = info
            .dedicated()
            .then(|| vk::MemoryDedicatedAllocateInfo::default().image(image));
        import_dup(ctx, fd, |raw| {
            let memory = allocate_imported(
                ctx,
                raw,
                info.allocation_size(),
                info.memory_type_index(),
                dedicated_to,
            )
            .inspect_err(|_| {
                // SAFETY: the image was created above and is unused.
                unsafe { ctx.inner.device.destroy_image(image, None) }
            })?;
            // `bind` destroys the image and frees the memory (and with it the
            // driver's fd) on failure.
            Self::bind(ctx, image, memory, Ok(info.clone())).map_err(|error| ImportFailure {
                error,
                driver_took_fd: true,
            })
        })
    }

    /// Exports the memory as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        export_memory_fd(&self.inner.ctx, self.inner.memory)
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> ImageRecord<F, T, M, U> {
        self.record.clone()
    }

    /// The plain record.
    pub fn info(&self) -> &ImageInfo {
        &self.inner.info
    }

    /// The context this image belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// The `VkImage`, for the application's own command buffers: do not
    /// destroy it, and see [`Context::from_raw`]'s contract on tracking.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_usage_flag_needs_its_format_feature() {
        use vk::FormatFeatureFlags as F;
        use vk::ImageUsageFlags as U;
        let srgb = F::SAMPLED_IMAGE | F::COLOR_ATTACHMENT | F::TRANSFER_SRC | F::TRANSFER_DST;
        assert_eq!(
            missing_features(U::STORAGE | U::SAMPLED | U::TRANSFER_SRC, srgb),
            ["STORAGE_IMAGE"]
        );
        assert!(
            missing_features(U::COLOR_ATTACHMENT | U::SAMPLED | U::TRANSFER_DST, srgb).is_empty()
        );
        assert_eq!(
            missing_features(U::COLOR_ATTACHMENT | U::TRANSFER_DST, F::empty()),
            ["COLOR_ATTACHMENT", "TRANSFER_DST"]
        );
    }
}
