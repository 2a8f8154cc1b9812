//! A Vulkan receiver of a multi-image ring (every slot several named
//! images: colour, depth, segmentation, ...), on the receiver's own
//! `VkDevice`: the multi-image twin of
//! [`VulkanReceiver`](crate::vulkan_receiver::VulkanReceiver), each part's
//! format, the memory class and the usage picked at run time from the
//! ring itself.
//!
//! # Contract
//!
//! * [`PartsReader::new`] takes a [`Session`] of a multi-image ring
//!   ([`Session::connect_named_any`] and its twins) and its setup message,
//!   and imports every slot's image of every part on `ctx`
//!   ([`ExportableImage::import_received`]: each record verified on this
//!   device; the session checked each record's format against its part
//!   and its size against the hello). Formats: any of
//!   `vk_export::format::SUPPORTED`; memory: device-local, or host-visible
//!   (as [`crate::image_reader`] decides it); usage: `usage::Storage` or
//!   `usage::Sampled`, the same for every image of the ring.
//! * All or none: [`PartsReader::read_parts`] reads every part of a frame
//!   this receiver holds (after "produced" reaches the frame's number,
//!   where the ring shares it; else the frame message orders the reads),
//!   each through `VulkanReceiver::read_pixels`' steps (taken from
//!   `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`, copied out, released back
//!   there, both waited for), and only then asks the session whether the
//!   frame is still held: `Ok` means every part's bytes are that one
//!   frame's, written by its one present; an error means none is to be
//!   used. The release needs no GPU signal.
//! * Every wait is bounded by the caller's timeout; a read that fails on
//!   the device releases the part's image behind it (unwaited) or closes
//!   the session, as `VulkanReceiver::read_pixels` does.

use std::time::Duration;

use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Optimal, Usage};
use vk_export::wire::{Received, Resource};
use vk_export::{Context, ExportableImage, SharedLayout, SubmitSync, TimelineSemaphore};

use crate::protocol::PartLayout;
use crate::session::{has_semaphores, Frame, Session};
use crate::transport::{deadline_after, left};
use crate::vulkan_receiver::VulkanReceiverError;

/// One imported image of a part, its type parameters erased.
trait PartImage: Send + Sync {
    fn raw(&self) -> vk::Image;
    /// # Safety
    /// As `Context::assume_image_released`.
    unsafe fn assume_released(&self, ctx: &Context) -> vk_export::Result<()>;
    fn read(&self, ctx: &Context, sync: SubmitSync<'_>) -> vk_export::Result<Vec<u8>>;
    fn release(&self, ctx: &Context, sync: SubmitSync<'_>) -> vk_export::Result<()>;
}

impl<F: Format, M: MemoryLocation, U: Usage> PartImage for ExportableImage<F, Optimal, M, U>
where
    ExportableImage<F, Optimal, M, U>: Send + Sync,
{
    fn raw(&self) -> vk::Image {
        ExportableImage::raw(self)
    }

    unsafe fn assume_released(&self, ctx: &Context) -> vk_export::Result<()> {
        // SAFETY: the caller's promise is the method's.
        unsafe { ctx.assume_image_released(self, SharedLayout::General) }
    }

    fn read(&self, ctx: &Context, sync: SubmitSync<'_>) -> vk_export::Result<Vec<u8>> {
        ctx.read_image(self, 0, 0, sync)
    }

    fn release(&self, ctx: &Context, sync: SubmitSync<'_>) -> vk_export::Result<()> {
        ctx.release_image(self, sync)
    }
}

/// Imports resource `index` of `setup` as an image of format `F`.
fn import<F: Format, M: MemoryLocation, U: Usage>(
    ctx: &Context,
    setup: &mut Received,
    index: usize,
) -> Result<Box<dyn PartImage>, VulkanReceiverError>
where
    ExportableImage<F, Optimal, M, U>: Send + Sync,
{
    let received = setup
        .take_image::<F, Optimal, M, U>(index)
        .map_err(|e| VulkanReceiverError::Ring(format!("resource {index}: {e}")))?;
    let image = ExportableImage::<F, Optimal, M, U>::import_received(ctx, received)
        .map_err(|e| e.into_error())?;
    Ok(Box::new(image))
}

/// [`import`] of the part's format, memory `M` and usage `U`.
fn import_part<M: MemoryLocation, U: Usage>(
    ctx: &Context,
    setup: &mut Received,
    index: usize,
    part: &PartLayout,
) -> Result<Box<dyn PartImage>, VulkanReceiverError> {
    let format = vk::Format::from_raw(part.vk_format as i32);
    with_format!(format, F => import::<F, M, U>(ctx, setup, index), _ => {
        Err(VulkanReceiverError::Ring(format!(
            "part {} is VkFormat {}, which is not one of vk_export::format::SUPPORTED",
            part.name, part.vk_format
        )))
    })
}

/// A Vulkan receiver of a multi-image ring (see the module contract).
pub struct PartsReader {
    // Dropped first: each image's drop waits (bounded) for this receiver's
    // last copy of it before the connection closes.
    slots: Vec<Vec<Box<dyn PartImage>>>,
    produced: Option<TimelineSemaphore>,
    ctx: Context,
    session: Session,
}

impl std::fmt::Debug for PartsReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartsReader")
            .field("parts", &self.session.parts())
            .field("slots", &self.slots.len())
            .field("semaphores", &self.produced.is_some())
            .field("session", &self.session)
            .finish()
    }
}

impl PartsReader {
    /// Imports `session`'s multi-image ring (its setup message) on `ctx`.
    pub fn new(
        ctx: &Context,
        session: Session,
        mut setup: Received,
    ) -> Result<PartsReader, VulkanReceiverError> {
        let layout = *session.layout();
        if !layout.is_multi_image() {
            return Err(VulkanReceiverError::Ring(format!(
                "the sender's {}x{} ring has one image or buffer a slot, not named parts: a \
                 VulkanReceiver (or image_reader::ImageReader) takes it",
                layout.width, layout.height
            )));
        }
        let (usage_flags, memory) = match setup.message().resources.first() {
            Some(Resource::Image(info)) => (info.usage(), info.memory_flags()),
            _ => (usage::Storage::VK, vk::MemoryPropertyFlags::DEVICE_LOCAL),
        };
        let device_local = DeviceLocal::admits(memory) || !HostVisible::admits(memory);
        let semaphores = has_semaphores(&layout, &setup);
        let parts = session.parts().to_vec();
        let mut slots = Vec::with_capacity(layout.slots as usize);
        for slot in 0..layout.slots {
            let mut images = Vec::with_capacity(parts.len());
            for (p, part) in (0u32..).zip(&parts) {
                let i = layout.resource_of(slot, p);
                let image = match (device_local, usage_flags) {
                    (true, f) if f == usage::Storage::VK => {
                        import_part::<DeviceLocal, usage::Storage>(ctx, &mut setup, i, part)
                    }
                    (false, f) if f == usage::Storage::VK => {
                        import_part::<HostVisible, usage::Storage>(ctx, &mut setup, i, part)
                    }
                    (true, f) if f == usage::Sampled::VK => {
                        import_part::<DeviceLocal, usage::Sampled>(ctx, &mut setup, i, part)
                    }
                    (false, f) if f == usage::Sampled::VK => {
                        import_part::<HostVisible, usage::Sampled>(ctx, &mut setup, i, part)
                    }
                    (_, f) => Err(VulkanReceiverError::Ring(format!(
                        "the sender's images have usage {f:?}: a parts reader takes the storage \
                         or sampled preset"
                    ))),
                }
                .map_err(|e| match e {
                    VulkanReceiverError::Ring(why) => {
                        VulkanReceiverError::Ring(format!("slot {slot}, part {}: {why}", part.name))
                    }
                    e => e,
                })?;
                images.push(image);
            }
            slots.push(images);
        }
        let produced = if semaphores {
            let received = setup.take_semaphore(layout.produced_index())?;
            Some(TimelineSemaphore::import_received(ctx, received).map_err(|e| e.into_error())?)
        } else {
            None
        };
        Ok(PartsReader {
            slots,
            produced,
            ctx: ctx.clone(),
            session,
        })
    }

    /// The session (layout, parts, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The ring's parts, in slot order.
    pub fn parts(&self) -> &[PartLayout] {
        self.session.parts()
    }

    /// Slot `slot`'s imported image of part `part` (owned by the external
    /// family in `GENERAL` between reads), if the ring has them.
    pub fn image(&self, slot: u32, part: usize) -> Option<vk::Image> {
        Some(self.slots.get(slot as usize)?.get(part)?.raw())
    }

    /// Whether the ring shares a "produced" timeline.
    pub fn has_semaphores(&self) -> bool {
        self.produced.is_some()
    }

    /// The next frame ([`Session::next`]): every part of one present.
    pub fn next(&self, timeout: Duration) -> Result<Frame, VulkanReceiverError> {
        Ok(self.session.next(timeout)?)
    }

    /// Waits on the host, within `timeout`, until the sender's writes of
    /// every part of `frame` completed (as
    /// `VulkanReceiver::wait_produced`).
    pub fn wait_produced(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<(), VulkanReceiverError> {
        self.session.check_held(frame)?;
        if let Some(produced) = &self.produced {
            produced.wait(
                frame.sequence(),
                timeout,
                vk_export::WaitStrategy::default(),
            )?;
        }
        Ok(())
    }

    /// Every part of `frame`, in part order, as tightly packed rows of its
    /// format's texels, or an error and none (see the module contract); all
    /// of it within `timeout`.
    pub fn read_parts(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, VulkanReceiverError> {
        let deadline = deadline_after(timeout);
        self.session.check_held(frame)?;
        let images = &self.slots[frame.slot() as usize];
        let mut out = Vec::with_capacity(images.len());
        for image in images {
            // SAFETY: this receiver holds the frame, so the sender's last
            // use of each of the slot's images was its release to the
            // external family in GENERAL (one submission releases them all,
            // crate::protocol), ordered before this use by "produced" or,
            // without semaphores, by the frame message sent after that
            // submission completed; the sender does not touch the slot again
            // before this receiver's release or its drop, which the check
            // after the reads detects. This receiver's own last use of the
            // image ended with its release (GENERAL, external family),
            // waited for, or failed before submitting.
            unsafe { image.assume_released(&self.ctx)? };
            let mut sync = SubmitSync::new().timeout(left(deadline));
            if let Some(produced) = &self.produced {
                sync = sync.wait_timeline(produced, frame.sequence());
            }
            let read = image.read(&self.ctx, sync).and_then(|pixels| {
                image
                    .release(&self.ctx, SubmitSync::new().timeout(left(deadline)))
                    .map(|()| pixels)
            });
            match read {
                Ok(pixels) => out.push(pixels),
                Err(e) => {
                    // The release goes behind a copy that may still run,
                    // unwaited; if it cannot, the session closes.
                    let back = image.release(&self.ctx, SubmitSync::new().timeout(Duration::ZERO));
                    if !matches!(back, Ok(()) | Err(vk_export::Error::Timeout(_))) {
                        self.session
                            .close(&format!("a read of frame {} failed: {e}", frame.sequence()));
                    }
                    return Err(e.into());
                }
            }
        }
        // All or none: every part read, the frame still this receiver's.
        self.session.check_held(frame)?;
        Ok(out)
    }

    /// Gives `frame` back (no GPU signal: [`PartsReader::read_parts`]
    /// leaves no GPU work on the images).
    pub fn release(&self, frame: Frame) -> Result<(), VulkanReceiverError> {
        Ok(self.session.release(frame, false)?)
    }
}
