//! Multi-image slots: a ring whose every slot holds several named images
//! ([`ImageSet`], one per [`ImagePart`]: a frame's colour, depth,
//! segmentation, ...) presented together as one frame
//! ([`MultiImageSender`]).
//!
//! # Contract
//!
//! * One state machine: an [`ImageSet`] is one [`SlotResource`]; the
//!   sender's acquire, present, open, record and release paths treat it as
//!   one slot, so its images share the slot's sequence number, timestamp,
//!   "produced" value and receivers' "released" values, and every barrier
//!   the sender records around a frame covers all of them (each image
//!   acquired before the application's commands, each released to the
//!   external family in `GENERAL` after them, in one submission).
//! * The parts are the options' ([`SenderOptions::with_parts`]): 1 to
//!   [`MAX_PARTS`], names unique, each any format of
//!   `vk_export::format::SUPPORTED`, all the ring's width and height; the
//!   hello and part messages announce them ([`crate::protocol`]).
//! * [`WriteSlot::present_copy`] of an image set takes one [`PartSource`]
//!   per part, in part order: an application image of the part's format
//!   ([`vk_export::SourceImage`]), or a depth attachment
//!   ([`vk_export::DepthSource`]) for a part of its colour twin
//!   (`D32_SFLOAT` into `R32_SFLOAT`, `D16_UNORM` into `R16_UNORM`). A
//!   frame with a depth part is copied on the main queue (Vulkan copies a
//!   depth aspect on a graphics family only: `DepthSource::check_copy`);
//!   each depth part by one `vkCmdCopyImage` where the context copies depth
//!   to colour ([`Context::copies_depth_to_color`]: `VK_KHR_maintenance8`),
//!   else through a buffer of the slot (core Vulkan cannot copy between
//!   depth and colour formats). Every source is checked (count, format,
//!   region, queue family) before anything is recorded; then all copies go
//!   into the one submission of the frame, depth parts first.

use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{usage, MemoryLocation, Optimal, Usage};
use vk_export::socket::Exported;
use vk_export::{
    Context, DepthSource, ExportableBuffer, ExportableImage, ImageDesc, QueueRole, SourceImage,
    SourceSharing, TimelineSemaphore,
};

use super::{Sender, SenderError, SenderOptions, SlotResource, WriteSlot};
use crate::discovery::SlotKind;
use crate::protocol::{check_parts, PacketError, PartLayout, PartName, RingLayout, MAX_PARTS};

/// One named image of a multi-image ring's slots, as the sender's options
/// give it ([`SenderOptions::with_parts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImagePart {
    layout: PartLayout,
}

impl ImagePart {
    /// A part named `name` of format `F` (a depth attachment goes into
    /// `R32Sfloat` or `R16Unorm`: see [`vk_export::DepthSource`]).
    pub fn new<F: Format>(name: &str) -> Result<ImagePart, PacketError> {
        Ok(ImagePart {
            layout: PartLayout {
                name: PartName::new(name)?,
                vk_format: F::VK.as_raw() as u32,
                texel_bytes: F::TEXEL_BYTES,
            },
        })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        self.layout.name.as_str()
    }

    /// Its format.
    pub fn vk_format(&self) -> vk::Format {
        vk::Format::from_raw(self.layout.vk_format as i32)
    }

    /// What its part message announces.
    pub fn layout(&self) -> PartLayout {
        self.layout
    }
}

/// Whether a part of `format` may be filled from a depth attachment (it is
/// the colour twin of a [`vk_export::DepthFormat`]), and so has a staging
/// range in its slot.
fn depth_target(format: vk::Format) -> bool {
    matches!(format, vk::Format::R32_SFLOAT | vk::Format::R16_UNORM)
}

/// One image of a slot, its format erased.
trait PartImage: Send + Sync {
    fn raw(&self) -> vk::Image;
    fn exported(&self) -> &dyn Exported;
    /// As [`SlotResource::record_acquire`].
    ///
    /// # Safety
    /// As [`SlotResource::record_acquire`].
    unsafe fn acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    );
    /// As [`SlotResource::record_release`].
    ///
    /// # Safety
    /// As [`SlotResource::record_release`].
    unsafe fn release(&self, device: &vk_export::ash::Device, cmd: vk::CommandBuffer, family: u32);
}

impl<F: Format, M: MemoryLocation, U: Usage> PartImage for ExportableImage<F, Optimal, M, U>
where
    ExportableImage<F, Optimal, M, U>: Send + Sync,
{
    fn raw(&self) -> vk::Image {
        ExportableImage::raw(self)
    }

    fn exported(&self) -> &dyn Exported {
        self
    }

    unsafe fn acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        // SAFETY: the caller's guarantees are the method's.
        unsafe { self.record_acquire_from_external(device, cmd, family, from_external) };
    }

    unsafe fn release(&self, device: &vk_export::ash::Device, cmd: vk::CommandBuffer, family: u32) {
        // SAFETY: as in acquire.
        unsafe { self.record_release_to_external(device, cmd, family) };
    }
}

/// One slot of a multi-image ring: an OPTIMAL exportable image per part
/// (memory `M`, usage `U`), and, where a part may be filled from a depth
/// attachment, a buffer the copy goes through.
pub struct ImageSet<M: MemoryLocation, U: Usage = usage::Storage> {
    images: Vec<Box<dyn PartImage>>,
    names: Vec<PartName>,
    /// Per part, its range of `staging` (depth-target parts only).
    staging_at: Vec<Option<u64>>,
    staging: Option<ExportableBuffer<M>>,
    _usage: std::marker::PhantomData<fn() -> U>,
}

impl<M: MemoryLocation, U: Usage> std::fmt::Debug for ImageSet<M, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageSet")
            .field("parts", &self.names)
            .field(
                "images",
                &self.images.iter().map(|i| i.raw()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<M: MemoryLocation, U: Usage> ImageSet<M, U> {
    /// The images, in part order.
    pub fn images(&self) -> Vec<vk::Image> {
        self.images.iter().map(|i| i.raw()).collect()
    }

    /// The image of the part named `name`.
    pub fn image(&self, name: &str) -> Option<vk::Image> {
        let i = self.names.iter().position(|n| n.as_str() == name)?;
        Some(self.images[i].raw())
    }
}

/// What a multi-image ring's [`WriteSlot::present_with`] closure records
/// into: every part's image, owned by `queue_family` in `GENERAL` when the
/// closure runs (as [`super::ImageTarget`] for one image), to be left in
/// `GENERAL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartTargets {
    images: [vk::Image; MAX_PARTS as usize],
    names: [Option<PartName>; MAX_PARTS as usize],
    count: usize,
    /// The family of the queue the commands run on.
    pub queue_family: u32,
}

impl PartTargets {
    /// The images, in part order.
    pub fn images(&self) -> &[vk::Image] {
        &self.images[..self.count]
    }

    /// The image of the part named `name`.
    pub fn image(&self, name: &str) -> Option<vk::Image> {
        let i = self.names[..self.count]
            .iter()
            .position(|n| n.is_some_and(|n| n.as_str() == name))?;
        Some(self.images[i])
    }
}

/// A sender of a multi-image ring: every slot an [`ImageSet`] of the
/// options' parts ([`SenderOptions::with_parts`]), in memory `M` with usage
/// `U` (default: storage and sampled; sRGB parts need `usage::Sampled`).
pub type MultiImageSender<M, U = usage::Storage> = Sender<M, ImageSet<M, U>>;

impl<M: MemoryLocation, U: Usage> SlotResource<M> for ImageSet<M, U> {
    type Target = PartTargets;
    const KIND: SlotKind = SlotKind::Image;

    fn layout(opts: &SenderOptions) -> Result<RingLayout, SenderError> {
        if opts.parts.is_empty() || opts.parts.len() > MAX_PARTS as usize {
            return Err(SenderError::Options(format!(
                "a multi-image sender needs 1 to {MAX_PARTS} parts (SenderOptions::with_parts), \
                 not {}",
                opts.parts.len()
            )));
        }
        let parts: Vec<PartLayout> = opts.parts.iter().map(ImagePart::layout).collect();
        let layout = RingLayout::multi_image(opts.slots, opts.width, opts.height, &parts);
        check_parts(&layout, &parts)?;
        Ok(layout)
    }

    fn format_name(opts: &SenderOptions) -> String {
        opts.parts
            .iter()
            .map(|p| {
                let name = vk_export::format::describe(p.vk_format())
                    .map_or(format!("vk_format_{}", p.layout.vk_format), |d| {
                        d.0.to_ascii_lowercase()
                    });
                format!("{}:{name}", p.name())
            })
            .collect::<Vec<_>>()
            .join("+")
    }

    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError> {
        Self::layout(opts)?;
        let desc = ImageDesc::new_2d(opts.width, opts.height);
        let mut images: Vec<Box<dyn PartImage>> = Vec::with_capacity(opts.parts.len());
        let mut staging_at = Vec::with_capacity(opts.parts.len());
        let mut staging_bytes = 0u64;
        for part in &opts.parts {
            let image: Box<dyn PartImage> = with_format!(part.vk_format(), F => {
                Box::new(ExportableImage::<F, Optimal, M, U>::new(ctx, desc)?)
            }, _ => {
                return Err(SenderError::Options(format!(
                    "part {} has VkFormat {}, which is not one of vk_export::format::SUPPORTED",
                    part.name(),
                    part.layout.vk_format
                )))
            });
            images.push(image);
            staging_at.push(depth_target(part.vk_format()).then(|| {
                let at = staging_bytes;
                staging_bytes += part.layout.row_bytes(opts.width) * u64::from(opts.height);
                staging_bytes = staging_bytes.next_multiple_of(16);
                at
            }));
        }
        let staging = if staging_bytes > 0 {
            Some(ExportableBuffer::<M>::new(ctx, staging_bytes)?)
        } else {
            None
        };
        Ok(ImageSet {
            images,
            names: opts.parts.iter().map(|p| p.layout.name).collect(),
            staging_at,
            staging,
            _usage: std::marker::PhantomData,
        })
    }

    fn target(&self, family: u32) -> PartTargets {
        let mut t = PartTargets {
            images: [vk::Image::null(); MAX_PARTS as usize],
            names: [None; MAX_PARTS as usize],
            count: self.images.len(),
            queue_family: family,
        };
        for (i, (image, name)) in self.images.iter().zip(&self.names).enumerate() {
            t.images[i] = image.raw();
            t.names[i] = Some(*name);
        }
        t
    }

    fn exported<'a>(&'a self, out: &mut Vec<&'a dyn Exported>) {
        out.extend(self.images.iter().map(|i| i.exported()));
    }

    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        for image in &self.images {
            // SAFETY: the caller's guarantees are the method's, for each of
            // the slot's images (one slot: one owner, one history).
            unsafe { image.acquire(device, cmd, family, from_external) };
        }
    }

    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        for image in &self.images {
            // SAFETY: as in record_acquire.
            unsafe { image.release(device, cmd, family) };
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl<F: vk_export::format::Format> Sealed for vk_export::SourceImage<F> {}
    impl Sealed for vk_export::DepthSource {}
}

/// What fills one part in a multi-image [`WriteSlot::present_copy`]: an
/// application image of the part's format ([`SourceImage`]) or a depth
/// attachment for the part of its colour twin ([`DepthSource`]). Sealed.
pub trait PartSource: sealed::Sealed {
    /// The format of the part it fills.
    fn part_format(&self) -> vk::Format;
    /// [`SourceImage::check_copy`].
    fn check_copy(&self, ctx: &Context, extent: [u32; 2]) -> vk_export::Result<QueueRole>;
    /// Who may access it.
    fn sharing(&self) -> SourceSharing;
    /// Whether it is a depth attachment: copied directly where the context
    /// allows it, else through the slot's staging buffer.
    #[doc(hidden)]
    fn is_depth(&self) -> bool;
    /// Records the copy into `dst`.
    ///
    /// # Safety
    /// [`SourceImage::record_copy_to`]'s; for a depth source with
    /// `staging`, [`DepthSource::record_copy_via`]'s (its buffer and
    /// offset), and without, [`DepthSource::record_copy_direct`]'s.
    #[doc(hidden)]
    unsafe fn record(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        dst: vk::Image,
        extent: [u32; 2],
        staging: Option<(vk::Buffer, u64)>,
    );
}

impl<F: Format> PartSource for SourceImage<F> {
    fn part_format(&self) -> vk::Format {
        F::VK
    }

    fn check_copy(&self, ctx: &Context, extent: [u32; 2]) -> vk_export::Result<QueueRole> {
        SourceImage::check_copy(self, ctx, extent)
    }

    fn sharing(&self) -> SourceSharing {
        SourceImage::sharing(self)
    }

    fn is_depth(&self) -> bool {
        false
    }

    unsafe fn record(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        dst: vk::Image,
        extent: [u32; 2],
        _staging: Option<(vk::Buffer, u64)>,
    ) {
        // SAFETY: forwarded.
        unsafe { self.record_copy_to(device, cmd, family, dst, extent) }
    }
}

impl PartSource for DepthSource {
    fn part_format(&self) -> vk::Format {
        self.format().color_format()
    }

    fn check_copy(&self, ctx: &Context, extent: [u32; 2]) -> vk_export::Result<QueueRole> {
        DepthSource::check_copy(self, ctx, extent)
    }

    fn sharing(&self) -> SourceSharing {
        DepthSource::sharing(self)
    }

    fn is_depth(&self) -> bool {
        true
    }

    unsafe fn record(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        dst: vk::Image,
        extent: [u32; 2],
        staging: Option<(vk::Buffer, u64)>,
    ) {
        match staging {
            // SAFETY: forwarded; the staging range is the slot's for this part.
            Some((buffer, offset)) => unsafe {
                self.record_copy_via(device, cmd, family, buffer, offset, dst, extent)
            },
            // SAFETY: forwarded; without a range, the caller promised
            // record_copy_direct's conditions (present_copy: `direct`).
            None => unsafe { self.record_copy_direct(device, cmd, family, dst, extent) },
        }
    }
}

/// Which queue a multi-image present's copies run on and whether its depth
/// parts are copied directly, from each source's `(sharing, the queue its
/// check_copy answered, is a depth attachment)`; `direct_allowed` is
/// [`Context::copies_depth_to_color`], `families` the context's (main,
/// transfer) families. The main queue where a source needs it (every depth
/// source does: `DepthSource::check_copy`), else the transfer queue; depth
/// parts directly where allowed (the main queue then). `Err((i, queue))`:
/// source `i` cannot be copied on that queue.
fn copy_plan(
    direct_allowed: bool,
    (main, transfer): (u32, u32),
    sources: &[(SourceSharing, QueueRole, bool)],
) -> Result<(QueueRole, bool), (usize, QueueRole)> {
    let role = match sources.iter().any(|s| s.1 == QueueRole::Main) {
        true => QueueRole::Main,
        false => QueueRole::Transfer,
    };
    let family = match role {
        QueueRole::Main => main,
        QueueRole::Transfer => transfer,
    };
    let may_copy_on = |&(sharing, own, _): &(SourceSharing, QueueRole, bool)| {
        own == role
            || match sharing {
                SourceSharing::Concurrent => true,
                SourceSharing::Exclusive(f) => f == family,
                SourceSharing::ReleasedToTransfer { .. } => false,
            }
    };
    if let Some(i) = sources.iter().position(|s| !may_copy_on(s)) {
        return Err((i, role));
    }
    let direct = direct_allowed && sources.iter().any(|s| s.2);
    Ok((role, direct))
}

impl<M: MemoryLocation, U: Usage> WriteSlot<'_, M, ImageSet<M, U>> {
    /// The slot's images ([`ImageSet`]).
    pub fn images(&self) -> &ImageSet<M, U> {
        &self.sender.slots[self.slot as usize]
    }

    /// Publishes a frame of every part by GPU copies, one `sources[i]` per
    /// part `i` (see the module contract): all checked first (count,
    /// formats, regions of the ring's size, queue families: the copies run
    /// on one queue: the main one where a source needs it or a depth part
    /// is copied directly, else the transfer queue), then recorded into the frame's one submission (after a GPU
    /// wait for `wait`, if given), the sources left in their layouts and
    /// with their owners. Returns the frame's sequence number; a refused
    /// frame leaves the slot free and numbers nothing.
    pub fn present_copy(
        self,
        timestamp_ns: u64,
        sources: &[&dyn PartSource],
        wait: Option<(&TimelineSemaphore, u64)>,
    ) -> Result<u64, SenderError> {
        let sender = &*self.sender;
        let extent = [sender.opts.width, sender.opts.height];
        let parts = &sender.opts.parts;
        let invalid =
            |why: String| -> SenderError { vk_export::Error::InvalidArgument(why).into() };
        if sources.len() != parts.len() {
            return Err(invalid(format!(
                "{} copy sources for a ring of {} parts ({}): one per part, in order",
                sources.len(),
                parts.len(),
                parts
                    .iter()
                    .map(ImagePart::name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut roles = Vec::with_capacity(sources.len());
        for (source, part) in sources.iter().zip(parts) {
            if source.part_format() != part.vk_format() {
                return Err(invalid(format!(
                    "the copy source of part {} fills {:?}, the part is {:?}",
                    part.name(),
                    source.part_format(),
                    part.vk_format()
                )));
            }
            roles.push(source.check_copy(&sender.ctx, extent)?);
        }
        let facts: Vec<(SourceSharing, QueueRole, bool)> = sources
            .iter()
            .zip(&roles)
            .map(|(s, r)| (s.sharing(), *r, s.is_depth()))
            .collect();
        let families = (
            sender.ctx.queue_family_of(QueueRole::Main),
            sender.ctx.queue_family_of(QueueRole::Transfer),
        );
        let (role, direct) = copy_plan(sender.ctx.copies_depth_to_color(), families, &facts)
            .map_err(|(i, role)| {
                invalid(format!(
                    "the copy source of part {} ({:?}) cannot be copied on the {role:?} queue \
                     (family {}) that another part's source needs: give every part a source \
                     that queue's family may access",
                    parts[i].name(),
                    sources[i].sharing(),
                    sender.ctx.queue_family_of(role),
                ))
            })?;
        let slot = &sender.slots[self.slot as usize];
        let staging = slot.staging.as_ref().map(|b| b.raw());
        let ranges: Vec<Option<(vk::Buffer, u64)>> = slot
            .staging_at
            .iter()
            .map(|at| if direct { None } else { staging.zip(*at) })
            .collect();
        for ((source, part), range) in sources.iter().zip(parts).zip(&ranges) {
            // Every R32_SFLOAT and R16_UNORM part has its range (create):
            // a depth source of any other part was refused by format above.
            if source.is_depth() && !direct && range.is_none() {
                return Err(invalid(format!(
                    "part {} has no staging range for a depth copy",
                    part.name()
                )));
            }
        }
        // Depth parts first: on the H100 (driver 580) the colour copies
        // that follow a depth-to-colour copy on the graphics queue ran at
        // shader speed (~11 us a 1080p RGBA8 part), where alone they took
        // the copy engine (~158 us). The parts are distinct images: the
        // order changes no result.
        let mut order: Vec<usize> = (0..sources.len()).collect();
        order.sort_by_key(|&i| !sources[i].is_depth());
        self.sender.present(
            self.slot,
            timestamp_ns,
            role,
            wait,
            |device, cmd, target: PartTargets| {
                for &i in &order {
                    let source = sources[i];
                    // SAFETY: every source's check_copy accepted this
                    // extent, and this command buffer is for a queue of
                    // `role`'s family, which each source may be copied on
                    // (checked above: its own role's, or CONCURRENT, or
                    // owned by that family); the part's image is the
                    // sender's, of the source's part format (checked), with
                    // transfer usage (every preset), of the ring's size, in
                    // GENERAL owned by that family between the acquire and
                    // release barriers around this closure, alive beyond
                    // the submission (the sender's slots; a timed-out one
                    // is waited for by their drops); a depth part's staging
                    // range is its own in the slot's buffer, 16-aligned,
                    // of its size, used by this frame alone (the present
                    // waits for the submission), or, with none, `direct`
                    // holds: maintenance8 is enabled; a depth source makes
                    // `role` Main (its check_copy answers Main, having
                    // checked that family has GRAPHICS, which both depth
                    // copies need); the sources' facts are their `new`s'
                    // contracts.
                    unsafe {
                        source.record(
                            device,
                            cmd,
                            target.queue_family,
                            target.images[i],
                            extent,
                            ranges[i],
                        )
                    };
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: u32 = 0;
    const TRANSFER: u32 = 1;
    const FAMILIES: (u32, u32) = (MAIN, TRANSFER);
    /// The facts `present_copy` gives `copy_plan`, as each source's
    /// `check_copy` answers them (a depth source answers Main).
    fn colour(sharing: SourceSharing) -> (SourceSharing, QueueRole, bool) {
        let role = match sharing {
            SourceSharing::Exclusive(MAIN) => QueueRole::Main,
            _ => QueueRole::Transfer,
        };
        (sharing, role, false)
    }
    fn depth(sharing: SourceSharing) -> (SourceSharing, QueueRole, bool) {
        (sharing, QueueRole::Main, true)
    }
    use SourceSharing::{Concurrent, Exclusive, ReleasedToTransfer};

    #[test]
    fn colour_sources_the_transfer_family_may_read_are_copied_there() {
        let sources = [colour(Concurrent), colour(Exclusive(TRANSFER))];
        for allowed in [false, true] {
            assert_eq!(
                copy_plan(allowed, FAMILIES, &sources),
                Ok((QueueRole::Transfer, false))
            );
        }
        let released = [
            colour(ReleasedToTransfer { from: MAIN }),
            colour(Concurrent),
        ];
        assert_eq!(
            copy_plan(true, FAMILIES, &released),
            Ok((QueueRole::Transfer, false))
        );
    }

    #[test]
    fn a_depth_part_puts_the_frame_on_the_main_queue_directly_where_allowed() {
        let sources = [colour(Concurrent), depth(Concurrent), colour(Concurrent)];
        assert_eq!(
            copy_plan(true, FAMILIES, &sources),
            Ok((QueueRole::Main, true))
        );
        assert_eq!(
            copy_plan(false, FAMILIES, &sources),
            Ok((QueueRole::Main, false))
        );
        let owned = [colour(Exclusive(MAIN)), depth(Exclusive(MAIN))];
        assert_eq!(
            copy_plan(true, FAMILIES, &owned),
            Ok((QueueRole::Main, true))
        );
    }

    #[test]
    fn a_source_the_chosen_queue_may_not_read_is_named() {
        // A colour source released to the transfer family beside a depth
        // part, which needs the main queue.
        let sources = [
            colour(ReleasedToTransfer { from: MAIN }),
            depth(Exclusive(MAIN)),
        ];
        assert_eq!(
            copy_plan(true, FAMILIES, &sources),
            Err((0, QueueRole::Main))
        );
        assert_eq!(
            copy_plan(false, FAMILIES, &sources),
            Err((0, QueueRole::Main))
        );
        // One owned by the transfer family beside one owned by the main.
        let split = [colour(Exclusive(MAIN)), colour(Exclusive(TRANSFER))];
        assert_eq!(
            copy_plan(false, FAMILIES, &split),
            Err((1, QueueRole::Main))
        );
    }

    #[test]
    fn without_a_depth_part_nothing_is_direct() {
        let sources = [colour(Exclusive(MAIN)), colour(Concurrent)];
        assert_eq!(
            copy_plan(true, FAMILIES, &sources),
            Ok((QueueRole::Main, false))
        );
    }
}
