//! Exportable two-plane 4:2:0 images (`G8_B8R8_2PLANE_420_UNORM`,
//! `G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16`), always **disjoint**: one
//! allocation per plane, each exported as an fd of its own, so that CUDA maps
//! each plane at offset 0 of its own memory as an array of the plane's format.
//!
//! # Contract
//!
//! * **Disjoint or nothing.** A non-disjoint (joint) multi-planar image is
//!   never made: its second plane maps into CUDA only at an offset the driver
//!   does not report (H100, `docs/probes/multiplanar.c`, run 23), and CUDA's
//!   own `NV12` array format gives wrong texels. `ExportableImage` of these
//!   formats does not compile (they are no
//!   [`Format`](interop_share::format::Format)); where the driver lacks
//!   `VK_FORMAT_FEATURE_DISJOINT_BIT` the preflight says so and points to
//!   the pitched NV12/P010 buffers.
//! * **Preflight first**, as for every image: even width and height
//!   (`VUID-VkImageCreateInfo-format-04712`/`-04713` for 4:2:0); the
//!   format's optimal-tiling features (a driver without the
//!   `samplerYcbcrConversion` feature, such as Mesa 22.3's lavapipe, gives
//!   none, and the error names that feature), `DISJOINT`
//!   (`VUID-VkImageCreateInfo-imageCreateFormatFeatures-02260`), the usage's
//!   features; then `vkGetPhysicalDeviceImageFormatProperties2` with
//!   `VK_IMAGE_CREATE_DISJOINT_BIT` and the OPAQUE_FD external info
//!   (exportable, importable, not dedicated-only: a disjoint image cannot
//!   have a dedicated allocation, `VUID-VkMemoryDedicatedAllocateInfo-image-01797`).
//!   A refusal is [`Error::Unsupported`] and nothing exists.
//! * **What the spec asks of these formats**, and no more: 2D, one level,
//!   one layer, one sample (`VUID-VkImageCreateInfo-format-06410` to
//!   `-06413`), all fixed here. The `samplerYcbcrConversion` feature is
//!   needed to *sample* through a Y′CbCr conversion
//!   (`vkCreateSamplerYcbcrConversion`), not to create, bind, copy or export
//!   the image, so the crate does not ask the device to have it enabled
//!   (an application that samples the image enables it on its own device).
//! * **Export recipe.** `VkExternalMemoryImageCreateInfo`, the plane's own
//!   requirements (`VkImagePlaneMemoryRequirementsInfo`), one exportable
//!   allocation per plane of exactly that size in a memory type of the exact
//!   class `M`, bound in one `vkBindImageMemory2` with
//!   `VkBindImagePlaneMemoryInfo`. The record ([`PlanarImageInfo`]) states
//!   each plane's size, memory type, alignment.
//! * **Verification** ([`Context::verify_planar_image`]) re-creates the image
//!   on this device and compares both planes' derived facts and both UUIDs
//!   with the record, as image records are verified.
//! * **Drop** waits (bounded) for this crate's last submission that used the
//!   image; if that never completes, the image and both allocations are
//!   leaked rather than freed under the GPU. CUDA imports hold a
//!   [`KeepAlive`] of it.
//! * **Sending** a two-plane image is sending its two planes
//!   (`planes_to_send`): two resources of one message, each with the whole
//!   record and its own plane's fd. Not yet: importing one into another
//!   Vulkan device.

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use ash::vk;

use crate::context::{record_drop_error, Context, DROP_WAIT};
use crate::error::{unsupported, vk_error, Error, Result};
use crate::image::{preflight as image_preflight, CreateParams};
use crate::memory::{
    allocation_differences, check_fits_heap, check_memory_type, check_same_device, export_memory_fd,
};
use crate::ownership::Owner;
use crate::submit::LastUse;
use crate::MEMORY_HANDLE_TYPE;
use interop_share::fd::KeepAlive;
use interop_share::format::{PlanarFormat, Plane};
use interop_share::markers::{DeviceLocal, MemoryLocation};
use interop_share::record::{
    PlanarImageFields, PlanarImageInfo, PlanarImageRecord, PlaneMemory, PLANAR_USAGE,
};

/// Where NV12/P010 goes when the driver cannot export disjoint planes.
const PITCHED_HINT: &str = "send NV12/P010 as pitched buffers instead (a frame ring's \
     `with_planar(Planar::Nv12 | Planar::P010)`, the guide's \"Planar video: NV12 and P010\")";

pub(crate) struct PlanarInner {
    pub(crate) ctx: Context,
    pub(crate) image: vk::Image,
    /// Plane 0's and plane 1's memory.
    pub(crate) memories: [vk::DeviceMemory; 2],
    pub(crate) info: PlanarImageInfo,
    pub(crate) owner: Mutex<Owner>,
    /// Per queue, the progress value of this crate's last submission that used the image.
    pub(crate) last_use: LastUse,
}

impl Drop for PlanarInner {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.wait_used(&self.last_use, DROP_WAIT) {
            record_drop_error(format_args!(
                "a two-plane image and its memory are leaked: the submission that last used them did not complete ({e})"
            ));
            return;
        }
        let device = &self.ctx.inner.device;
        // SAFETY: created here; nothing else holds them (CUDA imports hold a
        // KeepAlive of this value); this crate's last use completed, and the
        // application's own submissions are covered by from_raw's contract.
        // The image goes before the memory bound to it.
        unsafe {
            device.destroy_image(self.image, None);
            for memory in self.memories {
                device.free_memory(memory, None);
            }
        }
    }
}

/// A disjoint two-plane 4:2:0 image whose planes' memories can each be
/// exported as an OPAQUE_FD, typed by format (`Nv12Planes`, `P010Planes`)
/// and memory class. Optimal tiling, usage [`PLANAR_USAGE`] (transfers and
/// sampling: drivers give these formats no storage usage).
///
/// ```no_run
/// use vk_export::format::{Nv12Planes, Plane};
/// use vk_export::{Context, ExportablePlanarImage, HeadlessOptions};
/// let ctx = Context::headless(&HeadlessOptions::default())?;
/// let image = ExportablePlanarImage::<Nv12Planes>::new(&ctx, 1920, 1080)?;
/// let luma_fd = image.export_fd(Plane::Luma)?; // a new fd, owned by the caller
/// let size = image.info().plane(Plane::Chroma).allocation_size;
/// # let _ = (luma_fd, size);
/// # Ok::<(), vk_export::Error>(())
/// ```
pub struct ExportablePlanarImage<P, M = DeviceLocal> {
    pub(crate) inner: Arc<PlanarInner>,
    record: PlanarImageRecord<P, M>,
}

impl<P: PlanarFormat, M: MemoryLocation> fmt::Debug for ExportablePlanarImage<P, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportablePlanarImage")
            .field("format", &P::NAME)
            .field("extent", &self.inner.info.extent())
            .field("luma", &self.inner.info.plane(Plane::Luma))
            .field("chroma", &self.inner.info.plane(Plane::Chroma))
            .finish()
    }
}

/// The image in words, for messages.
fn what(name: &str, width: u32, height: u32) -> String {
    format!(
        "a disjoint two-plane {name} image ({width}x{height}, optimal tiling, usage {PLANAR_USAGE:?}, OPAQUE_FD)"
    )
}

fn params(format: vk::Format, width: u32, height: u32) -> CreateParams {
    CreateParams {
        format,
        image_type: vk::ImageType::TYPE_2D,
        extent: [width, height, 1],
        mip_levels: 1,
        array_layers: 1,
        flags: vk::ImageCreateFlags::DISJOINT,
        tiling: vk::ImageTiling::OPTIMAL,
        usage: PLANAR_USAGE,
    }
}

/// Whether the device offers the `samplerYcbcrConversion` feature.
fn offers_ycbcr_conversion(ctx: &Context) -> bool {
    let mut features11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut features11);
    // SAFETY: plain query on the context's live instance (Vulkan 1.2, so
    // vkGetPhysicalDeviceFeatures2 is core); the chain lives across the call.
    unsafe {
        ctx.inner
            .instance
            .get_physical_device_features2(ctx.inner.physical, &mut features)
    };
    features11.sampler_ycbcr_conversion == vk::TRUE
}

/// The preflight of a two-plane image: the checks of the format's own
/// features first (each naming what is missing), then the image one.
fn preflight(ctx: &Context, name: &str, format: vk::Format, width: u32, height: u32) -> Result<()> {
    if width == 0 || height == 0 || !width.is_multiple_of(2) || !height.is_multiple_of(2) {
        return Err(Error::InvalidArgument(format!(
            "a {width}x{height} {name} image: 4:2:0 planes need an even, non-zero width and height"
        )));
    }
    let p = params(format, width, height);
    // SAFETY: plain query on the context's live instance and physical device.
    let props = unsafe {
        ctx.inner
            .instance
            .get_physical_device_format_properties(ctx.inner.physical, format)
    };
    let features = props.optimal_tiling_features;
    if features.is_empty() {
        let why = if offers_ycbcr_conversion(ctx) {
            "the device offers the samplerYcbcrConversion feature but no format features for it"
        } else {
            "the device does not offer the samplerYcbcrConversion feature (Vulkan 1.1, \
             VK_KHR_sampler_ycbcr_conversion), which multi-planar formats come with; Mesa 22.3's \
             lavapipe has neither"
        };
        return Err(unsupported(
            what(name, width, height),
            format!("the driver gives {name} no format features with optimal tiling: {why}; {PITCHED_HINT}"),
        ));
    }
    if !features.contains(vk::FormatFeatureFlags::DISJOINT) {
        return Err(unsupported(
            what(name, width, height),
            format!(
                "the driver gives {name} the optimal-tiling features {features:?}, without DISJOINT: \
                 its planes cannot have memory of their own, and a non-disjoint image's second plane \
                 maps into CUDA only at an offset the driver does not report; {PITCHED_HINT}"
            ),
        ));
    }
    let capability = image_preflight(ctx, &p)?;
    if capability.dedicated_only {
        return Err(unsupported(
            what(name, width, height),
            format!(
                "the driver exports OPAQUE_FD memory of such an image only as a dedicated \
                 allocation, which a disjoint image cannot have \
                 (VUID-VkMemoryDedicatedAllocateInfo-image-01797); {PITCHED_HINT}"
            ),
        ));
    }
    Ok(())
}

/// Creates the disjoint image (external-memory info, initial layout
/// UNDEFINED) and returns it with each plane's memory requirements.
fn create_image(
    ctx: &Context,
    format: vk::Format,
    width: u32,
    height: u32,
) -> Result<(vk::Image, [vk::MemoryRequirements; 2])> {
    let device = &ctx.inner.device;
    let mut external =
        vk::ExternalMemoryImageCreateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
    let info = vk::ImageCreateInfo::default()
        .flags(vk::ImageCreateFlags::DISJOINT)
        .image_type(vk::ImageType::TYPE_2D)
        .format(format)
        .extent(vk::Extent3D {
            width,
            height,
            depth: 1,
        })
        .mip_levels(1)
        .array_layers(1)
        .samples(vk::SampleCountFlags::TYPE_1)
        .tiling(vk::ImageTiling::OPTIMAL)
        .usage(PLANAR_USAGE)
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .initial_layout(vk::ImageLayout::UNDEFINED)
        .push_next(&mut external);
    // SAFETY: the create info and its chain live across the call; the
    // parameters were preflighted (DISJOINT among the format's features).
    let image = unsafe { device.create_image(&info, None) }.map_err(vk_error(
        "vkCreateImage",
        "out of memory, or parameters the preflight did not cover",
    ))?;
    let requirements = Plane::ALL.map(|plane| {
        let mut plane_info =
            vk::ImagePlaneMemoryRequirementsInfo::default().plane_aspect(plane.aspect());
        let mut reqs = vk::MemoryRequirements2::default();
        // SAFETY: the image was just created on this device with
        // DISJOINT, so each plane's requirements are asked for with its
        // aspect (as the spec requires of a disjoint image); the chains
        // live across the call.
        unsafe {
            device.get_image_memory_requirements2(
                &vk::ImageMemoryRequirementsInfo2::default()
                    .image(image)
                    .push_next(&mut plane_info),
                &mut reqs,
            )
        };
        reqs.memory_requirements
    });
    Ok((image, requirements))
}

/// An image and the plane memories made for it so far, destroyed and freed
/// on drop unless [`Unbound::finish`] took them.
struct Unbound<'c> {
    ctx: &'c Context,
    image: vk::Image,
    memories: Vec<vk::DeviceMemory>,
}

impl Unbound<'_> {
    fn finish(mut self) -> (vk::Image, [vk::DeviceMemory; 2]) {
        let memories = std::mem::take(&mut self.memories);
        let image = std::mem::replace(&mut self.image, vk::Image::null());
        let memories = <[vk::DeviceMemory; 2]>::try_from(memories)
            .expect("finish is called with both planes' memories");
        (image, memories)
    }
}

impl Drop for Unbound<'_> {
    fn drop(&mut self) {
        let device = &self.ctx.inner.device;
        // SAFETY: made by ExportablePlanarImage::new and never used by the
        // GPU (nothing was submitted); image before memory.
        unsafe {
            if self.image != vk::Image::null() {
                device.destroy_image(self.image, None);
            }
            for memory in self.memories.drain(..) {
                device.free_memory(memory, None);
            }
        }
    }
}

/// Compares what this device derives for the record's image (both planes)
/// with the record.
fn check_derived(
    ctx: &Context,
    info: &PlanarImageInfo,
    requirements: &[vk::MemoryRequirements; 2],
) -> Result<()> {
    let mut differences = Vec::new();
    for plane in Plane::ALL {
        let m = info.plane(plane);
        differences.extend(
            allocation_differences(
                &requirements[plane.index()],
                false,
                m.allocation_size,
                m.memory_type_index,
                m.alignment,
                m.dedicated,
            )
            .into_iter()
            .map(|d| format!("{plane:?} plane: {d}")),
        );
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(Error::Record(format!(
        "the record does not describe the two-plane image it claims: for {}x{} {:?}, {} derives {}; \
         not the same image (or another driver)",
        info.extent()[0],
        info.extent()[1],
        info.format(),
        ctx.identity().name,
        differences.join(", ")
    )))
}

impl Context {
    /// Checks a two-plane image record against this device, creating
    /// nothing that outlives the call: both UUIDs, each plane's memory type
    /// and its flags, the preflight, and each plane's size, memory type
    /// bits and alignment this device derives for the described image
    /// (never dedicated). What a receiver runs before it imports the planes'
    /// fds of a record that came from elsewhere.
    pub fn verify_planar_image<P, M>(&self, record: &PlanarImageRecord<P, M>) -> Result<()> {
        let info = record.info();
        check_same_device(self, &info.device_uuid(), &info.driver_uuid())?;
        for plane in Plane::ALL {
            let m = info.plane(plane);
            check_memory_type(self, m.memory_type_index, m.memory_flags)?;
        }
        let name = format!("{:?}", info.format());
        let [width, height] = info.extent();
        preflight(self, &name, info.format(), width, height)?;
        let (image, requirements) = create_image(self, info.format(), width, height)?;
        let checked = check_derived(self, info, &requirements);
        // SAFETY: created above for this check, never bound or used.
        unsafe { self.inner.device.destroy_image(image, None) };
        checked
    }
}

impl<P: PlanarFormat, M: MemoryLocation> ExportablePlanarImage<P, M> {
    /// Asks the driver whether a `width` x `height` disjoint image of `P`
    /// can be made and its planes exported and imported, creating nothing.
    /// [`Error::InvalidArgument`] for an odd or zero side,
    /// [`Error::Unsupported`] naming what the driver lacks.
    pub fn preflight(ctx: &Context, width: u32, height: u32) -> Result<()> {
        preflight(ctx, P::NAME, P::VK, width, height)
    }

    /// Creates the disjoint image, allocates each plane's memory
    /// (exportable, of the plane's own size, in a memory type of the exact
    /// class `M`; never dedicated) and binds both.
    pub fn new(ctx: &Context, width: u32, height: u32) -> Result<Self> {
        preflight(ctx, P::NAME, P::VK, width, height)?;
        let what = || what(P::NAME, width, height);
        let (image, requirements) = create_image(ctx, P::VK, width, height)?;
        let device = &ctx.inner.device;
        let mut made = Unbound {
            ctx,
            image,
            memories: Vec::with_capacity(2),
        };
        let mut planes = Vec::with_capacity(2);
        for plane in Plane::ALL {
            let reqs = requirements[plane.index()];
            let Some(memory_type_index) =
                ctx.memory_type(reqs.memory_type_bits, M::REQUIRED, M::EXCLUDED)
            else {
                return Err(unsupported(
                    what(),
                    crate::memory::no_memory_type::<M>(reqs.memory_type_bits),
                ));
            };
            if let Err(why) = check_fits_heap(ctx, reqs.size, memory_type_index) {
                return Err(Error::InvalidArgument(format!(
                    "{}'s {plane:?} plane needs an allocation of {why}",
                    what()
                )));
            }
            let mut export =
                vk::ExportMemoryAllocateInfo::default().handle_types(MEMORY_HANDLE_TYPE);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(reqs.size)
                .memory_type_index(memory_type_index)
                .push_next(&mut export);
            // SAFETY: the allocate info and its chain live across the call;
            // no dedicated info (the image is disjoint).
            let memory =
                unsafe { device.allocate_memory(&alloc, None) }.map_err(|e| Error::Vulkan {
                    call: "vkAllocateMemory",
                    result: e,
                    hint: "out of device memory for a plane's exportable allocation",
                })?;
            made.memories.push(memory);
            planes.push(PlaneMemory {
                allocation_size: reqs.size,
                memory_type_index,
                memory_flags: ctx.memory_type_flags(memory_type_index).unwrap_or_default(),
                alignment: reqs.alignment,
                dedicated: false,
            });
        }
        let identity = &ctx.inner.identity;
        let planes: [PlaneMemory; 2] = planes
            .try_into()
            .expect("one PlaneMemory per plane was pushed");
        let record = PlanarImageInfo::from_fields(PlanarImageFields {
            format: P::VK,
            extent: [width, height],
            usage: PLANAR_USAGE,
            planes,
            device_uuid: identity.device_uuid,
            driver_uuid: identity.driver_uuid,
        })
        .map_err(|e| {
            Error::Record(format!(
                "this driver produced a record outside the wire rules: {e}"
            ))
        })?
        .typed::<P, M>()?;
        let mut plane_infos = Plane::ALL
            .map(|plane| vk::BindImagePlaneMemoryInfo::default().plane_aspect(plane.aspect()));
        let [luma_plane, chroma_plane] = &mut plane_infos;
        let binds = [
            vk::BindImageMemoryInfo::default()
                .image(image)
                .memory(made.memories[0])
                .memory_offset(0)
                .push_next(luma_plane),
            vk::BindImageMemoryInfo::default()
                .image(image)
                .memory(made.memories[1])
                .memory_offset(0)
                .push_next(chroma_plane),
        ];
        // SAFETY: a fresh disjoint image and two fresh allocations of each
        // plane's required size from an allowed type; offset 0 satisfies any
        // alignment; each bind names its plane (a disjoint image's binds must);
        // the infos and their chains live across the call.
        unsafe { device.bind_image_memory2(&binds) }.map_err(vk_error(
            "vkBindImageMemory2",
            "the memory does not fit the plane",
        ))?;
        let (image, memories) = made.finish();
        Ok(ExportablePlanarImage {
            inner: Arc::new(PlanarInner {
                ctx: ctx.clone(),
                image,
                memories,
                info: record.info().clone(),
                owner: Mutex::new(Owner::Unused),
                last_use: LastUse::default(),
            }),
            record,
        })
    }

    /// Exports `plane`'s memory as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self, plane: Plane) -> Result<OwnedFd> {
        export_memory_fd(&self.inner.ctx, self.inner.memories[plane.index()])
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> PlanarImageRecord<P, M> {
        self.record.clone()
    }

    /// The plain record.
    pub fn info(&self) -> &PlanarImageInfo {
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

    /// The `VkDeviceMemory` `plane` is bound to.
    pub fn raw_memory(&self, plane: Plane) -> vk::DeviceMemory {
        self.inner.memories[plane.index()]
    }

    /// A handle that keeps this image (both planes' memory, and its device)
    /// alive.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.inner.clone())
    }
}
