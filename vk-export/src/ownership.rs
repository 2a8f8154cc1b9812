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

use ash::vk;

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
    let barrier = vk::ImageMemoryBarrier::default()
        .src_access_mask(ALL_ACCESS)
        .dst_access_mask(ALL_ACCESS)
        .old_layout(old)
        .new_layout(new)
        .src_queue_family_index(families.0)
        .dst_queue_family_index(families.1)
        .image(image)
        .subresource_range(vk::ImageSubresourceRange {
            aspect_mask: vk::ImageAspectFlags::COLOR,
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
