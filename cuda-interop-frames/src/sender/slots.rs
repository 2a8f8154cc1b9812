//! What a ring's slots are ([`SlotResource`]: exportable buffers or
//! OPTIMAL exportable images), and which of `vk-export`'s external-family
//! barriers the sender records around each frame's commands.
//!
//! # Contract
//!
//! * Sealed: only this crate's two kinds are slots; their barriers are
//!   `vk-export`'s (`record_acquire_from_external`,
//!   `record_release_to_external` of the exportable types).
//! * A slot is acquired by the recording family from
//!   `VK_QUEUE_FAMILY_EXTERNAL` (in `GENERAL` for an image) after its first
//!   frame, from nothing (`UNDEFINED`) on its first; it is released to the
//!   external family (an image in `GENERAL`) after every write. Barriers
//!   are full (all commands, all memory access).

use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{usage, MemoryLocation, Optimal, Usage};
use vk_export::socket::Exported;
use vk_export::{Context, ExportableBuffer, ExportableImage, ImageDesc};

use super::{Sender, SenderError, SenderOptions};
use crate::discovery::SlotKind;
use crate::protocol::RingLayout;

mod sealed {
    pub trait Sealed {}
    impl<M: vk_export::markers::MemoryLocation> Sealed for vk_export::ExportableBuffer<M> {}
    impl<F, M, U> Sealed for vk_export::ExportableImage<F, vk_export::markers::Optimal, M, U> {}
    impl<M: vk_export::markers::MemoryLocation, U: vk_export::markers::Usage> Sealed
        for super::super::parts::ImageSet<M, U>
    {
    }
}

/// What a ring's slots are: [`ExportableBuffer`]s (pitched RGBA8 frames,
/// the default) or OPTIMAL [`ExportableImage`]s of one format and usage
/// ([`ImageSender`]). Sealed: the crate records each kind's ownership
/// barriers itself.
pub trait SlotResource<M: MemoryLocation>: sealed::Sealed + Sized {
    /// What [`WriteSlot::present_with`](super::WriteSlot::present_with)'s closure records into.
    type Target: Copy;
    /// What discovery lists.
    const KIND: SlotKind;
    /// The layout of a ring of these slots for `opts`, checked.
    fn layout(opts: &SenderOptions) -> Result<RingLayout, SenderError>;
    /// The format name discovery lists.
    fn format_name(opts: &SenderOptions) -> String;
    /// One slot for `opts`.
    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError>;
    /// The closure's view of the slot, recorded on `family`.
    fn target(&self, family: u32) -> Self::Target;
    /// Appends the slot's exported resources to `out`, in the setup
    /// message's order (its buffer or image; a multi-image slot's images,
    /// part by part).
    fn exported<'a>(&'a self, out: &mut Vec<&'a dyn Exported>);
    /// Records the slot's acquisition by `family`: from
    /// `VK_QUEUE_FAMILY_EXTERNAL` if `from_external` (it was released
    /// there by an earlier frame), else from nothing (its first frame).
    ///
    /// # Safety
    /// `cmd` is a command buffer of `device` in the recording state, for a
    /// queue of `family`; the slot outlives the commands; if
    /// `from_external`, the slot's last use was a release to the external
    /// family (an image in `GENERAL`) ordered before these commands, and if
    /// not, nothing uses it.
    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    );
    /// Records the release of the slot by `family` to
    /// `VK_QUEUE_FAMILY_EXTERNAL`, after every earlier command's writes.
    ///
    /// # Safety
    /// As [`SlotResource::record_acquire`].
    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    );
}

/// Refuses parts for a ring of one buffer or image a slot.
fn no_parts(opts: &SenderOptions) -> Result<(), SenderError> {
    if opts.parts.is_empty() {
        return Ok(());
    }
    Err(SenderError::Options(format!(
        "{} parts given to a sender of one buffer or image a slot: make a MultiImageSender",
        opts.parts.len()
    )))
}

impl<M: MemoryLocation> SlotResource<M> for ExportableBuffer<M> {
    type Target = vk::Buffer;
    const KIND: SlotKind = SlotKind::Buffer;

    fn layout(opts: &SenderOptions) -> Result<RingLayout, SenderError> {
        no_parts(opts)?;
        let (slots, width, height, pitch) = (opts.slots, opts.width, opts.height, opts.row_pitch);
        let layout = match opts.planar {
            None => RingLayout::buffers(slots, width, height, pitch),
            Some(planar) => RingLayout::planar(slots, width, height, pitch, planar),
        };
        layout.check()?;
        Ok(layout)
    }

    fn format_name(opts: &SenderOptions) -> String {
        match opts.planar {
            None => "r8g8b8a8_unorm".into(),
            Some(planar) => planar.name().into(),
        }
    }

    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError> {
        let layout = Self::layout(opts)?;
        let frame_bytes = layout.checked_frame_bytes()?;
        // Whole rows: a reader may address a plane's last row at the pitch.
        let rows = match layout.planar_format() {
            None => u64::from(opts.height) * opts.row_pitch,
            Some((_, chroma)) => chroma + u64::from(opts.height / 2) * opts.row_pitch,
        };
        Ok(ExportableBuffer::<M>::new(ctx, rows.max(frame_bytes))?)
    }

    fn target(&self, _family: u32) -> vk::Buffer {
        self.raw()
    }

    fn exported<'a>(&'a self, out: &mut Vec<&'a dyn Exported>) {
        out.push(self);
    }

    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        // SAFETY: the caller's guarantees are the method's.
        unsafe { self.record_acquire_from_external(device, cmd, family, from_external) };
    }

    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        // SAFETY: as in record_acquire.
        unsafe { self.record_release_to_external(device, cmd, family) };
    }
}

/// The slot an image ring's [`WriteSlot::present_with`](super::WriteSlot::present_with) closure records
/// into: when the closure runs, `image` is owned by `queue_family` (the
/// family of the command buffer) in `VK_IMAGE_LAYOUT_GENERAL`, every earlier
/// access to it is done, and the closure must leave it in `GENERAL` (its
/// own barriers may move it to other layouts in between). The crate then
/// releases it to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTarget {
    /// The slot's image: one level, one layer, colour.
    pub image: vk::Image,
    /// The family of the queue the commands run on.
    pub queue_family: u32,
}

/// A sender of a ring of OPTIMAL images of format `F` in memory `M` with
/// usage `U` (default: storage and sampled, which CUDA surfaces and
/// textures need; every preset has transfer source and destination, which
/// Vulkan receivers' read-backs need).
pub type ImageSender<F, M, U = usage::Storage> = Sender<M, ExportableImage<F, Optimal, M, U>>;

impl<F: Format, M: MemoryLocation, U: Usage> SlotResource<M> for ExportableImage<F, Optimal, M, U> {
    type Target = ImageTarget;
    const KIND: SlotKind = SlotKind::Image;

    fn layout(opts: &SenderOptions) -> Result<RingLayout, SenderError> {
        no_parts(opts)?;
        let layout = RingLayout::images(
            opts.slots,
            opts.width,
            opts.height,
            F::VK.as_raw() as u32,
            F::TEXEL_BYTES,
        );
        layout.check()?;
        Ok(layout)
    }

    fn format_name(_opts: &SenderOptions) -> String {
        F::NAME.to_ascii_lowercase()
    }

    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError> {
        Ok(ExportableImage::new(
            ctx,
            ImageDesc::new_2d(opts.width, opts.height),
        )?)
    }

    fn target(&self, family: u32) -> ImageTarget {
        ImageTarget {
            image: self.raw(),
            queue_family: family,
        }
    }

    fn exported<'a>(&'a self, out: &mut Vec<&'a dyn Exported>) {
        out.push(self);
    }

    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        // SAFETY: the caller's guarantees are the method's.
        unsafe { self.record_acquire_from_external(device, cmd, family, from_external) };
    }

    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        // SAFETY: as in record_acquire.
        unsafe { self.record_release_to_external(device, cmd, family) };
    }
}
