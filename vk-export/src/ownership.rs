//! Queue-family ownership and layouts of shared resources, and the barriers
//! that move them (Vulkan spec, "resources-external-sharing").
//!
//! # Contract
//!
//! * Each image and buffer knows who owns it now ([`Owner`]): nobody yet, one
//!   of this context's queue families in a layout, or
//!   `VK_QUEUE_FAMILY_EXTERNAL` (CUDA, another device or process) after a
//!   release.
//! * A helper that touches a resource acquires it first for its queue's
//!   family: from `EXTERNAL` if it was released, from the context's other
//!   family by a release submitted on that family's queue first (the
//!   helper's submission waits for it), so Vulkan never reads memory another
//!   API or queue family still owns.
//! * Barriers are full (`ALL_COMMANDS`, all memory access): these helpers
//!   favour correctness over overlap.
//! * An image this crate did not create ([`SourceImage`]: an application's
//!   render target) is only ever copied from, on a queue of a family that
//!   may access it, and is left in the layout it was in, with its owner.
//!   An ownership transfer of it to the transfer family is the
//!   application's to start (the release must follow its last write, on
//!   its queue: only it can order that) and to finish (the acquire back):
//!   the crate records the halves in between
//!   ([`SourceSharing::ReleasedToTransfer`]). A depth attachment
//!   ([`DepthSource`]) is copied into a colour image of its texels' format,
//!   on the main queue only (a depth aspect is copied on a family with
//!   `GRAPHICS` only; [`DepthSource::check_copy`] refuses the others):
//!   through a buffer the caller gives (core Vulkan cannot copy between
//!   depth and colour formats with `vkCmdCopyImage`), or by one
//!   `vkCmdCopyImage` on a device with `VK_KHR_maintenance8` enabled
//!   ([`Context::copies_depth_to_color`]).

use std::marker::PhantomData;

use ash::vk;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::queues::QueueRole;
use interop_share::format::Format;

/// Who may touch a resource now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Never used: the first family that uses it owns it (its layout is
    /// `UNDEFINED`).
    Unused,
    /// Owned by this queue family of the context, in this layout (buffers:
    /// `UNDEFINED`).
    Family(u32, vk::ImageLayout),
    /// Released to `VK_QUEUE_FAMILY_EXTERNAL`, last in this layout.
    External(vk::ImageLayout),
}

impl Owner {
    /// The layout, whoever owns it.
    pub(crate) fn layout(self) -> vk::ImageLayout {
        match self {
            Owner::Unused => vk::ImageLayout::UNDEFINED,
            Owner::Family(_, l) | Owner::External(l) => l,
        }
    }

    /// The family that must release the resource before `family` can
    /// acquire it: another family of this context that owns it.
    pub(crate) fn other_family(self, family: u32) -> Option<u32> {
        match self {
            Owner::Family(f, _) if f != family => Some(f),
            _ => None,
        }
    }
}

/// A layout an image can be shared in: what an importer may assume when the
/// exporter released it ([`crate::Context::assume_image_released`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SharedLayout {
    /// `VK_IMAGE_LAYOUT_GENERAL`: what this crate's `release_image` uses, and
    /// the only layout CUDA can use.
    General,
    /// `VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL`.
    ShaderReadOnly,
    /// `VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL`.
    ColorAttachment,
    /// `VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL`.
    TransferSrc,
    /// `VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL`.
    TransferDst,
}

impl SharedLayout {
    /// The Vulkan layout.
    pub fn vk(self) -> vk::ImageLayout {
        match self {
            SharedLayout::General => vk::ImageLayout::GENERAL,
            SharedLayout::ShaderReadOnly => vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL,
            SharedLayout::ColorAttachment => vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
            SharedLayout::TransferSrc => vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
            SharedLayout::TransferDst => vk::ImageLayout::TRANSFER_DST_OPTIMAL,
        }
    }
}

const ALL_ACCESS: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::MEMORY_READ.as_raw() | vk::AccessFlags::MEMORY_WRITE.as_raw(),
);

/// Records a full image barrier (layout change and/or family transfer).
pub(crate) fn image_barrier(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    image: vk::Image,
    old: vk::ImageLayout,
    new: vk::ImageLayout,
    families: (u32, u32),
) {
    image_barrier_of(
        device,
        cmd,
        image,
        vk::ImageAspectFlags::COLOR,
        old,
        new,
        families,
    )
}

/// [`image_barrier`] of the image's `aspect` (a depth image's: `DEPTH`).
fn image_barrier_of(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    image: vk::Image,
    aspect: vk::ImageAspectFlags,
    old: vk::ImageLayout,
    new: vk::ImageLayout,
    families: (u32, u32),
) {
    let barrier = vk::ImageMemoryBarrier::default()
        .src_access_mask(ALL_ACCESS)
        .dst_access_mask(ALL_ACCESS)
        .old_layout(old)
        .new_layout(new)
        .src_queue_family_index(families.0)
        .dst_queue_family_index(families.1)
        .image(image)
        .subresource_range(vk::ImageSubresourceRange {
            aspect_mask: aspect,
            base_mip_level: 0,
            level_count: vk::REMAINING_MIP_LEVELS,
            base_array_layer: 0,
            layer_count: vk::REMAINING_ARRAY_LAYERS,
        });
    // SAFETY: recording into a command buffer in the recording state; the
    // image is a live image of this device (the caller borrows it).
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::DependencyFlags::empty(),
            &[],
            &[],
            &[barrier],
        )
    };
}

/// Records a full buffer barrier (and/or family transfer).
pub(crate) fn buffer_barrier(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    buffer: vk::Buffer,
    families: (u32, u32),
) {
    let barrier = vk::BufferMemoryBarrier::default()
        .src_access_mask(ALL_ACCESS)
        .dst_access_mask(ALL_ACCESS)
        .src_queue_family_index(families.0)
        .dst_queue_family_index(families.1)
        .buffer(buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    // SAFETY: recording into a command buffer in the recording state; the
    // buffer is a live buffer of this device (the caller borrows it).
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::DependencyFlags::empty(),
            &[],
            &[barrier],
            &[],
        )
    };
}

/// Records a memory barrier that makes every earlier device write visible
/// to host reads (after the submission's completion is waited for).
pub(crate) fn host_read_barrier(device: &ash::Device, cmd: vk::CommandBuffer) {
    let barrier = vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(vk::AccessFlags::HOST_READ);
    // SAFETY: recording into a command buffer in the recording state.
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::PipelineStageFlags::HOST,
            vk::DependencyFlags::empty(),
            &[barrier],
            &[],
            &[],
        )
    };
}

/// The family pair of a barrier that acquires a resource owned by `owner`
/// for `family` (for another family of the context: the acquire half, after
/// that family's release).
pub(crate) fn acquire_families(owner: Owner, family: u32) -> (u32, u32) {
    match owner {
        Owner::Unused => (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
        Owner::Family(f, _) if f == family => (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
        Owner::Family(f, _) => (f, family),
        Owner::External(_) => (vk::QUEUE_FAMILY_EXTERNAL, family),
    }
}

/// Which queue families may access a [`SourceImage`] now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceSharing {
    /// Created with `VK_SHARING_MODE_CONCURRENT` over families that include
    /// every family of the context ([`Context::queues`]): no ownership
    /// transfer is needed; the copy runs on the transfer queue (a
    /// [`DepthSource`]'s on the main one: see [`DepthSource::check_copy`]).
    Concurrent,
    /// `VK_SHARING_MODE_EXCLUSIVE`, owned now by this family. The copy runs
    /// on the context's queue of that family (its transfer queue if that is
    /// the family, else its main queue); a family the context has no queue
    /// of is refused.
    Exclusive(u32),
    /// `VK_SHARING_MODE_EXCLUSIVE`, owned by family `from`, which has
    /// released it to the context's transfer family
    /// ([`Context::queue_family_of`] of [`QueueRole::Transfer`]) by an
    /// image barrier with both layouts the source's layout over the whole
    /// image (`subresourceRange`: colour, base level 0,
    /// `VK_REMAINING_MIP_LEVELS`, base layer 0, `VK_REMAINING_ARRAY_LAYERS`,
    /// exactly these values: the two halves of a transfer must match field
    /// for field), recorded and submitted by the application after its last
    /// write, on a queue of `from`. The copy runs on the transfer queue: it
    /// records the acquire half of that transfer, and after the copy the
    /// release back to `from` (layouts unchanged, the same whole-image
    /// range), whose acquire half the application records on a queue of
    /// `from` before its next use of the image. `from` equal to the
    /// transfer family is no transfer (refused: that is
    /// [`SourceSharing::Exclusive`]).
    ReleasedToTransfer {
        /// The family that owned the image and released it.
        from: u32,
    },
}

/// An application's own image (one this crate did not create: no external
/// memory, any layout its renderer uses) to copy from, of format `F`, with
/// what only the application knows about it. Made per copy: its layout and
/// owner are the image's state at that copy.
#[derive(Debug)]
pub struct SourceImage<F> {
    image: vk::Image,
    extent: [u32; 2],
    offset: [u32; 2],
    layout: vk::ImageLayout,
    sharing: SourceSharing,
    _format: PhantomData<fn() -> F>,
}

impl<F: Format> SourceImage<F> {
    /// Describes `image` (level 0, layer 0) as a copy source of
    /// `extent` texels, now in `layout` and accessible as `sharing` says.
    /// `UNDEFINED` and `PREINITIALIZED` are refused (nothing to copy; a
    /// barrier cannot go back to them).
    ///
    /// # Safety
    /// For every copy made from the returned value (this crate cannot query
    /// any of it of a foreign `VkImage`):
    /// * `image` is a live 2D image of the context's device, of format
    ///   `F::VK`, one sample, created with `VK_IMAGE_USAGE_TRANSFER_SRC_BIT`,
    ///   whose level 0 is at least `extent`;
    /// * it is in `layout` (its aspect is colour, all its levels and layers
    ///   in that layout) and `sharing` is true of it;
    /// * every write to it (the GPU work that rendered it), and for
    ///   [`SourceSharing::ReleasedToTransfer`] the release, happens before
    ///   the copy: submitted earlier on the queue the copy runs on (or by
    ///   this crate on the context's other queue), waited for on the host,
    ///   or signalling a timeline value the copy waits for;
    /// * nothing writes it, changes its layout or destroys it until the copy
    ///   completed: when the copy call returned `Ok` it has; after an error
    ///   it may still run, until the context's queues are idle.
    pub unsafe fn new(
        image: vk::Image,
        extent: [u32; 2],
        layout: vk::ImageLayout,
        sharing: SourceSharing,
    ) -> Result<Self> {
        if matches!(
            layout,
            vk::ImageLayout::UNDEFINED | vk::ImageLayout::PREINITIALIZED
        ) {
            return Err(Error::InvalidArgument(format!(
                "a copy source in {layout:?}: its texels are undefined (and a barrier \
                 cannot return it there); give the layout it was rendered into"
            )));
        }
        if image == vk::Image::null() || extent.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "a copy source with a null handle or an empty extent {extent:?}"
            )));
        }
        Ok(SourceImage {
            image,
            extent,
            offset: [0, 0],
            layout,
            sharing,
            _format: PhantomData,
        })
    }

    /// Copies the region that starts at `offset` (texels) instead of the
    /// image's corner; the region is the destination's extent.
    pub fn with_offset(mut self, offset: [u32; 2]) -> Self {
        self.offset = offset;
        self
    }

    /// The image.
    pub fn raw(&self) -> vk::Image {
        self.image
    }

    /// The layout it is in (and is left in after a copy).
    pub fn layout(&self) -> vk::ImageLayout {
        self.layout
    }

    /// Which queue families may access it, as the application said.
    pub fn sharing(&self) -> SourceSharing {
        self.sharing
    }

    /// Checks a copy of this source into a destination of `dst_extent`
    /// on `ctx`: the region fits the source, and a queue of the context
    /// may access it. Returns the queue the copy runs on. Nothing Vulkan is
    /// called.
    pub fn check_copy(&self, ctx: &Context, dst_extent: [u32; 2]) -> Result<QueueRole> {
        check_source(ctx, self.offset, self.extent, self.sharing, dst_extent)
    }

    /// Records the copy into `dst` (level 0, layer 0, in `GENERAL`, owned
    /// by `family`) of `dst_extent`: a barrier into a copy layout
    /// (`TRANSFER_SRC_OPTIMAL`, unless the source is in `GENERAL` or
    /// already there), `vkCmdCopyImage`, and a barrier back into the
    /// source's layout; for [`SourceSharing::ReleasedToTransfer`], the
    /// acquire half of the application's transfer first and the release
    /// back last. Full barriers: earlier writes of the queue to both images
    /// are visible to the copy, and the copy's accesses are done before
    /// later commands'.
    ///
    /// # Safety
    /// [`SourceImage::check_copy`] returned `Ok(role)` for `ctx` and
    /// `dst_extent`; `cmd` is a command buffer of `ctx`'s device in the
    /// recording state, for a queue of `family`, which is
    /// `ctx.queue_family_of(role)`, or any family of the context for a
    /// source `CONCURRENT` or exclusively owned by `family`; `dst` is a live image of that device of format `F`, one
    /// sample, with transfer destination usage, at least `dst_extent`, in
    /// `GENERAL` and owned by `family` when the copy runs; both images
    /// outlive the commands.
    pub unsafe fn record_copy_to(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        dst: vk::Image,
        dst_extent: [u32; 2],
    ) {
        let color = vk::ImageAspectFlags::COLOR;
        let region = vk::ImageCopy {
            src_subresource: layers_of(color),
            src_offset: offset_of(self.offset),
            dst_subresource: layers_of(color),
            dst_offset: vk::Offset3D::default(),
            extent: extent_of(dst_extent),
        };
        let source = (self.image, color, self.layout, self.sharing);
        record_source_copy(device, cmd, family, source, |copy_layout| {
            // SAFETY: forwarded from the caller: a recording command buffer
            // of this device; the source is in `copy_layout` after
            // record_source_copy's barrier, the destination in GENERAL; the
            // region fits both (check_copy, and the caller's extents); same
            // format F.
            unsafe {
                device.cmd_copy_image(
                    cmd,
                    self.image,
                    copy_layout,
                    dst,
                    vk::ImageLayout::GENERAL,
                    &[region],
                )
            }
        })
    }
}

/// [`SourceImage::check_copy`] and [`DepthSource::check_copy`]: the region
/// of `dst_extent` at `offset` fits a source of `extent`, and a queue of
/// the context may access a source shared as `sharing`.
fn check_source(
    ctx: &Context,
    offset: [u32; 2],
    extent: [u32; 2],
    sharing: SourceSharing,
    dst_extent: [u32; 2],
) -> Result<QueueRole> {
    for axis in 0..2 {
        if i32::try_from(offset[axis]).is_err() {
            return Err(Error::InvalidArgument(format!(
                "a copy source offset {:?} beyond 2^31",
                offset
            )));
        }
        let end = u64::from(offset[axis]) + u64::from(dst_extent[axis]);
        if end > u64::from(extent[axis]) {
            return Err(Error::InvalidArgument(format!(
                "a {}x{} region at {:?} of a {}x{} source does not fit it",
                dst_extent[0], dst_extent[1], offset, extent[0], extent[1]
            )));
        }
    }
    let transfer = ctx.queue_family_of(QueueRole::Transfer);
    match sharing {
        SourceSharing::Concurrent => Ok(QueueRole::Transfer),
        SourceSharing::Exclusive(f) if f == transfer => Ok(QueueRole::Transfer),
        SourceSharing::Exclusive(f) if f == ctx.queue_family() => Ok(QueueRole::Main),
        SourceSharing::ReleasedToTransfer { from } if from == transfer => {
            Err(Error::InvalidArgument(format!(
                "a copy source released from queue family {from} to {transfer}, the same \
                     family: no transfer took place; describe it as SourceSharing::Exclusive"
            )))
        }
        SourceSharing::ReleasedToTransfer { .. } => Ok(QueueRole::Transfer),
        SourceSharing::Exclusive(f) => Err(Error::InvalidArgument(format!(
            "the copy source is owned by queue family {f}, and this context has queues of \
                 family {} (main) and {transfer} (transfer) only: release it to one of them \
                 (and say so), or create it CONCURRENT",
            ctx.queue_family()
        ))),
    }
}

/// The depth formats a [`DepthSource`] may have, each with the colour
/// format its texels are copied into (the same bits: CUDA and DLPack cannot
/// see a depth format, so depth travels in a colour image).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DepthFormat {
    /// `VK_FORMAT_D32_SFLOAT`, copied into `VK_FORMAT_R32_SFLOAT`.
    D32Sfloat,
    /// `VK_FORMAT_D16_UNORM`, copied into `VK_FORMAT_R16_UNORM`.
    D16Unorm,
}

impl DepthFormat {
    /// The depth format.
    pub fn vk(self) -> vk::Format {
        match self {
            DepthFormat::D32Sfloat => vk::Format::D32_SFLOAT,
            DepthFormat::D16Unorm => vk::Format::D16_UNORM,
        }
    }

    /// The colour format of the same texels it is copied into.
    pub fn color_format(self) -> vk::Format {
        match self {
            DepthFormat::D32Sfloat => vk::Format::R32_SFLOAT,
            DepthFormat::D16Unorm => vk::Format::R16_UNORM,
        }
    }

    /// Bytes of one texel (of both formats).
    pub fn texel_bytes(self) -> u32 {
        match self {
            DepthFormat::D32Sfloat => 4,
            DepthFormat::D16Unorm => 2,
        }
    }
}

/// An application's own depth image (a depth attachment: no external
/// memory, any layout its renderer uses) to copy into a colour image of
/// [`DepthFormat::color_format`], as [`SourceImage`] is for colour images.
/// In core Vulkan `vkCmdCopyImage` between a depth and a colour format is
/// not allowed (their formats must match for depth/stencil images), so the
/// copy goes through a buffer ([`DepthSource::record_copy_via`]):
/// `vkCmdCopyImageToBuffer` of the depth aspect, then
/// `vkCmdCopyBufferToImage` into the colour image, the layouts and texel
/// bits the spec defines for both (D32_SFLOAT: 4-byte floats; D16_UNORM:
/// 2-byte integers). `VK_KHR_maintenance8` allows the one copy
/// ([`DepthSource::record_copy_direct`], where
/// [`Context::copies_depth_to_color`]); on an H100 (driver 580) it took
/// ~11 µs for a 1080p `D32_SFLOAT` image, against ~200 µs for the two
/// copies through a buffer. Either way the copy runs on a queue family
/// with `GRAPHICS`, the main one ([`DepthSource::check_copy`]). Made per
/// copy: its layout and owner are the image's state at that copy.
#[derive(Debug)]
pub struct DepthSource {
    image: vk::Image,
    format: DepthFormat,
    extent: [u32; 2],
    offset: [u32; 2],
    layout: vk::ImageLayout,
    sharing: SourceSharing,
}

impl DepthSource {
    /// Describes `image` (level 0, layer 0, its depth aspect) as a copy
    /// source of `extent` texels of `format`, now in `layout` and accessible
    /// as `sharing` says. `UNDEFINED` and `PREINITIALIZED` are refused.
    ///
    /// # Safety
    /// As [`SourceImage::new`], with: `image` is of format `format.vk()`
    /// (its only aspect is depth), created with
    /// `VK_IMAGE_USAGE_TRANSFER_SRC_BIT`; for
    /// [`SourceSharing::ReleasedToTransfer`] the application's release
    /// barrier names the depth aspect (`VK_IMAGE_ASPECT_DEPTH_BIT`) over the
    /// same whole-image range.
    pub unsafe fn new(
        image: vk::Image,
        format: DepthFormat,
        extent: [u32; 2],
        layout: vk::ImageLayout,
        sharing: SourceSharing,
    ) -> Result<Self> {
        if matches!(
            layout,
            vk::ImageLayout::UNDEFINED | vk::ImageLayout::PREINITIALIZED
        ) {
            return Err(Error::InvalidArgument(format!(
                "a depth copy source in {layout:?}: its texels are undefined (and a barrier \
                 cannot return it there); give the layout it was rendered into"
            )));
        }
        if image == vk::Image::null() || extent.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "a depth copy source with a null handle or an empty extent {extent:?}"
            )));
        }
        Ok(DepthSource {
            image,
            format,
            extent,
            offset: [0, 0],
            layout,
            sharing,
        })
    }

    /// Copies the region that starts at `offset` (texels) instead of the
    /// image's corner; the region is the destination's extent.
    pub fn with_offset(mut self, offset: [u32; 2]) -> Self {
        self.offset = offset;
        self
    }

    /// The image.
    pub fn raw(&self) -> vk::Image {
        self.image
    }

    /// Its depth format.
    pub fn format(&self) -> DepthFormat {
        self.format
    }

    /// The layout it is in (and is left in after a copy).
    pub fn layout(&self) -> vk::ImageLayout {
        self.layout
    }

    /// Which queue families may access it, as the application said.
    pub fn sharing(&self) -> SourceSharing {
        self.sharing
    }

    /// As [`SourceImage::check_copy`]: the region fits, a queue of the
    /// context may access it. The copy runs on the main queue, which must
    /// have `GRAPHICS`: without `VK_KHR_maintenance10` (which this crate
    /// does not enable; NVIDIA's driver 580 does not offer it) Vulkan copies
    /// a depth aspect on a graphics family only
    /// (`VUID-vkCmdCopyImageToBuffer-commandBuffer-10216`,
    /// `VUID-vkCmdCopyImage-commandBuffer-10218`). So a source released to
    /// the transfer family, or owned by a family other than the main one,
    /// is refused; a `CONCURRENT` one is copied on the main queue.
    pub fn check_copy(&self, ctx: &Context, dst_extent: [u32; 2]) -> Result<QueueRole> {
        let graphics_only = "Vulkan copies a depth aspect only on a queue family with GRAPHICS \
             (VUID-vkCmdCopyImageToBuffer-commandBuffer-10216, without VK_KHR_maintenance10)";
        if let SourceSharing::ReleasedToTransfer { from } = self.sharing {
            return Err(Error::InvalidArgument(format!(
                "a depth copy source released from queue family {from} to the transfer family: \
                 {graphics_only}; keep it owned by the main family (SourceSharing::Exclusive) \
                 or create it CONCURRENT"
            )));
        }
        check_source(ctx, self.offset, self.extent, self.sharing, dst_extent)?;
        let main = ctx.queue_family();
        if !ctx.main_has_graphics() {
            return Err(Error::InvalidArgument(format!(
                "a depth copy source on a context whose main queue family {main} has no \
                 GRAPHICS: {graphics_only}; wrap a graphics queue as the main one"
            )));
        }
        match self.sharing {
            SourceSharing::Exclusive(f) if f != main => Err(Error::InvalidArgument(format!(
                "a depth copy source owned by queue family {f}, not the main family {main}: \
                 {graphics_only}; release it to the main family (and say so) or create it \
                 CONCURRENT"
            ))),
            _ => Ok(QueueRole::Main),
        }
    }

    /// Bytes of the buffer a copy of a `dst_extent` region goes through.
    pub fn staging_bytes(&self, dst_extent: [u32; 2]) -> u64 {
        u64::from(dst_extent[0]) * u64::from(dst_extent[1]) * u64::from(self.format.texel_bytes())
    }

    /// Records the copy of the region into `dst` (level 0, layer 0, of
    /// [`DepthFormat::color_format`], in `GENERAL`, owned by `family`) of
    /// `dst_extent` through `staging` at `staging_offset`: a barrier into a
    /// copy layout (`TRANSFER_SRC_OPTIMAL` unless the source is in
    /// `GENERAL` or there already), `vkCmdCopyImageToBuffer` of the depth
    /// aspect, a buffer barrier, `vkCmdCopyBufferToImage`, and a barrier
    /// back into the source's layout; the halves of a
    /// [`SourceSharing::ReleasedToTransfer`] transfer as
    /// [`SourceImage::record_copy_to`] records them. Full barriers.
    ///
    /// # Safety
    /// As [`SourceImage::record_copy_to`] (with `dst` of the colour format);
    /// `family` has `GRAPHICS` (where [`DepthSource::check_copy`] accepted
    /// the source, the context's main family); `staging` is a live buffer
    /// of the device with transfer source and destination usage, of at
    /// least `staging_offset + self.staging_bytes(dst_extent)` bytes,
    /// `staging_offset` a multiple of 4, that nothing else uses until the
    /// commands completed.
    #[allow(clippy::too_many_arguments, reason = "one copy's facts")]
    pub unsafe fn record_copy_via(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        staging: vk::Buffer,
        staging_offset: u64,
        dst: vk::Image,
        dst_extent: [u32; 2],
    ) {
        let out = vk::BufferImageCopy {
            buffer_offset: staging_offset,
            buffer_row_length: 0,
            buffer_image_height: 0,
            image_subresource: layers_of(vk::ImageAspectFlags::DEPTH),
            image_offset: offset_of(self.offset),
            image_extent: extent_of(dst_extent),
        };
        let into = vk::BufferImageCopy {
            image_subresource: layers_of(vk::ImageAspectFlags::COLOR),
            image_offset: vk::Offset3D::default(),
            ..out
        };
        let ignored = (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED);
        record_source_copy(device, cmd, family, self.state(), |copy_layout| {
            // SAFETY: forwarded from the caller: a recording command buffer
            // of this device; the source in `copy_layout` (record_source_copy's
            // barrier), its region inside it (check_copy); the staging range
            // is the caller's, large enough and 4-aligned (a depth copy's
            // rule); the buffer barrier orders the copy out before the copy
            // in; the destination is of the colour format of the same texel
            // size, in GENERAL, at least `dst_extent`.
            unsafe {
                device.cmd_copy_image_to_buffer(cmd, self.image, copy_layout, staging, &[out]);
                buffer_barrier(device, cmd, staging, ignored);
                device.cmd_copy_buffer_to_image(
                    cmd,
                    staging,
                    dst,
                    vk::ImageLayout::GENERAL,
                    &[into],
                );
            }
        })
    }

    /// As [`DepthSource::record_copy_via`], with one `vkCmdCopyImage` of the
    /// depth aspect into `dst`'s colour aspect and no buffer
    /// (`VK_KHR_maintenance8`'s copy between a depth format and its colour
    /// twin).
    ///
    /// # Safety
    /// As [`SourceImage::record_copy_to`] (with `dst` of the colour
    /// format); the device was created with `VK_KHR_maintenance8` and its
    /// `maintenance8` feature enabled, and `family` has `GRAPHICS` (both
    /// hold where [`Context::copies_depth_to_color`] is true and `family`
    /// is that context's main family).
    pub unsafe fn record_copy_direct(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        dst: vk::Image,
        dst_extent: [u32; 2],
    ) {
        let region = vk::ImageCopy {
            src_subresource: layers_of(vk::ImageAspectFlags::DEPTH),
            src_offset: offset_of(self.offset),
            dst_subresource: layers_of(vk::ImageAspectFlags::COLOR),
            dst_offset: vk::Offset3D::default(),
            extent: extent_of(dst_extent),
        };
        record_source_copy(device, cmd, family, self.state(), |copy_layout| {
            // SAFETY: forwarded from the caller: a recording command buffer
            // of this device; the source in `copy_layout` (record_source_copy's
            // barrier), its region inside it (check_copy); the destination
            // of the colour twin (the same texel bits), in GENERAL, at least
            // `dst_extent`; maintenance8 enabled and a graphics family (the
            // caller's promise) allow a depth aspect into a colour one.
            unsafe {
                device.cmd_copy_image(
                    cmd,
                    self.image,
                    copy_layout,
                    dst,
                    vk::ImageLayout::GENERAL,
                    &[region],
                )
            }
        })
    }

    /// What [`record_source_copy`] needs of it.
    fn state(
        &self,
    ) -> (
        vk::Image,
        vk::ImageAspectFlags,
        vk::ImageLayout,
        SourceSharing,
    ) {
        (
            self.image,
            vk::ImageAspectFlags::DEPTH,
            self.layout,
            self.sharing,
        )
    }
}

/// Records `copy(copy_layout)` of a copy source (`image`'s `aspect`, now in
/// `layout`, accessible as `sharing` says) between the barriers every copy
/// of one needs: the acquire half of a [`SourceSharing::ReleasedToTransfer`]
/// transfer (the same layouts as the application's release), a barrier
/// into a copy layout (`TRANSFER_SRC_OPTIMAL` unless the source is in
/// `GENERAL` or there already), and after the copy a barrier back into
/// `layout` and the release back to `from` (whose acquire half is the
/// application's). Full barriers, into `cmd` (recording, for a queue of
/// `family`: the callers' promise).
fn record_source_copy(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    family: u32,
    (image, aspect, layout, sharing): (
        vk::Image,
        vk::ImageAspectFlags,
        vk::ImageLayout,
        SourceSharing,
    ),
    copy: impl FnOnce(vk::ImageLayout),
) {
    let copy_layout = match layout {
        vk::ImageLayout::GENERAL | vk::ImageLayout::TRANSFER_SRC_OPTIMAL => layout,
        _ => vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
    };
    let ignored = (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED);
    let transferred = match sharing {
        SourceSharing::ReleasedToTransfer { from } => Some(from),
        _ => None,
    };
    if let Some(from) = transferred {
        image_barrier_of(device, cmd, image, aspect, layout, layout, (from, family));
    }
    image_barrier_of(device, cmd, image, aspect, layout, copy_layout, ignored);
    copy(copy_layout);
    image_barrier_of(device, cmd, image, aspect, copy_layout, layout, ignored);
    if let Some(from) = transferred {
        image_barrier_of(device, cmd, image, aspect, layout, layout, (family, from));
    }
}

/// Level 0, layer 0 of `aspect_mask`.
fn layers_of(aspect_mask: vk::ImageAspectFlags) -> vk::ImageSubresourceLayers {
    vk::ImageSubresourceLayers {
        aspect_mask,
        mip_level: 0,
        base_array_layer: 0,
        layer_count: 1,
    }
}

/// A source region's corner (`check_copy` refused offsets beyond i32).
fn offset_of(offset: [u32; 2]) -> vk::Offset3D {
    vk::Offset3D {
        x: offset[0] as i32,
        y: offset[1] as i32,
        z: 0,
    }
}

fn extent_of(extent: [u32; 2]) -> vk::Extent3D {
    vk::Extent3D {
        width: extent[0],
        height: extent[1],
        depth: 1,
    }
}

/// The barriers of a resource handed back and forth with
/// `VK_QUEUE_FAMILY_EXTERNAL` by commands the application records itself
/// (a frame sender's slots): the crate's own helpers track ownership in
/// `Owner`; these record the two halves where the caller tracks it.
impl<M: crate::markers::MemoryLocation> crate::ExportableBuffer<M> {
    /// Records the acquisition of the buffer by `family` from
    /// `VK_QUEUE_FAMILY_EXTERNAL` (after a release there; nothing to record
    /// for a buffer never released: `from_external` false).
    ///
    /// # Safety
    ///
    /// `cmd` is a command buffer of this buffer's device in the recording
    /// state, for a queue of `family`; the buffer outlives the commands; if
    /// `from_external`, the buffer's last use was a release to the external
    /// family, ordered before these commands.
    pub unsafe fn record_acquire_from_external(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        if from_external {
            buffer_barrier(device, cmd, self.raw(), (vk::QUEUE_FAMILY_EXTERNAL, family));
        }
    }

    /// Records the release of the buffer by `family` to
    /// `VK_QUEUE_FAMILY_EXTERNAL`, after every earlier command's access.
    ///
    /// # Safety
    ///
    /// As [`Self::record_acquire_from_external`]; `family` owns the buffer.
    pub unsafe fn record_release_to_external(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        buffer_barrier(device, cmd, self.raw(), (family, vk::QUEUE_FAMILY_EXTERNAL));
    }
}

impl<F: Format, M: crate::markers::MemoryLocation, U: crate::markers::Usage>
    crate::ExportableImage<F, crate::markers::Optimal, M, U>
{
    /// Records the acquisition of the image by `family` in `GENERAL`: from
    /// `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` if `from_external` (every
    /// release to the external family of these halves leaves it there), else
    /// from `UNDEFINED` (its first use: nothing to keep).
    ///
    /// # Safety
    ///
    /// `cmd` is a command buffer of this image's device in the recording
    /// state, for a queue of `family`; the image outlives the commands; if
    /// `from_external`, its last use was a release to the external family in
    /// `GENERAL`, ordered before these commands; if not, nothing uses it.
    pub unsafe fn record_acquire_from_external(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        let general = vk::ImageLayout::GENERAL;
        if from_external {
            image_barrier(
                device,
                cmd,
                self.raw(),
                general,
                general,
                (vk::QUEUE_FAMILY_EXTERNAL, family),
            );
        } else {
            image_barrier(
                device,
                cmd,
                self.raw(),
                vk::ImageLayout::UNDEFINED,
                general,
                (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
            );
        }
    }

    /// Records the release of the image by `family` to
    /// `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` (the layout CUDA uses and a
    /// Vulkan receiver acquires from), after every earlier command's access.
    ///
    /// # Safety
    ///
    /// As [`Self::record_acquire_from_external`]; `family` owns the image,
    /// in `GENERAL`.
    pub unsafe fn record_release_to_external(
        &self,
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        let general = vk::ImageLayout::GENERAL;
        image_barrier(
            device,
            cmd,
            self.raw(),
            general,
            general,
            (family, vk::QUEUE_FAMILY_EXTERNAL),
        );
    }
}
