//! A Vulkan receiver of an image ring, on the receiver's own `VkDevice`
//! (a [`Context`] of its own, headless or `from_raw`): the Vulkan-to-Vulkan
//! case. It imports the ring's images once, then takes frames through its
//! [`Session`] and reads their pixels back.
//!
//! # Contract
//!
//! * [`VulkanReceiver::new`] takes a [`Session`] of an image ring and its
//!   setup message, and imports each slot's image
//!   as an [`ExportableImage`] on `ctx` ([`ExportableImage::import_received`]:
//!   the record is verified on this device first); the hello's format must
//!   be `F`'s and every image must be the layout's size. The ring's
//!   "produced" timeline is imported when the sender shares one.
//! * [`VulkanReceiver::read_pixels`] reads a frame this receiver holds
//!   (and only such a frame: [`Session::check_held`]): it takes the image
//!   from `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`, where the sender released
//!   it, copies it out after "produced" reaches the frame's number (with
//!   semaphores; without, the sender announced it only after its writes
//!   completed, so the frame message orders it), and releases it back to the
//!   external family in `GENERAL` before returning. Both submissions are
//!   waited for, so the frame's release ([`VulkanReceiver::release`]) needs
//!   no GPU signal: this receiver has no GPU work on the image left when it
//!   gives the slot back. After the read it asks the session again: `Ok`
//!   pixels are the frame's; a receiver the sender dropped meanwhile gets
//!   the drop's error, never a later frame's pixels.
//! * Every wait is bounded by the caller's timeout. A
//!   [`VulkanReceiver::read_pixels`] that fails on the device (a timeout: its
//!   copy may still be pending) submits the image's release to the external
//!   family behind it on the same queue, unwaited, so the next read starts
//!   from a known owner (if even that fails, the session closes); the sender
//!   may then write the slot while that copy runs, which garbles only the
//!   read already reported as failed (the images' drops wait, bounded, for
//!   the copy).
//! * Several Vulkan receivers of one frame each move the image through
//!   `TRANSFER_SRC_OPTIMAL` and back on their own device at the same time;
//!   on drivers whose layout transitions rewrite image memory that would
//!   race (lavapipe's do not; see the guide's frame section).

use std::time::Duration;

use vk_export::format::Format;
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal, Usage};
use vk_export::{Context, ExportableImage, SharedLayout, SubmitSync, TimelineSemaphore};

use vk_export::wire::Received;

use crate::protocol::RingLayout;
use crate::session::{has_semaphores, Frame, Session};
use crate::transport::{deadline_after, left, ConsumerError};

/// Why a Vulkan receiver's call failed.
#[derive(Debug, thiserror::Error)]
pub enum VulkanReceiverError {
    /// The ring is not an image ring of `F` and this size, or the setup
    /// message was taken already.
    #[error("{0}")]
    Ring(String),
    /// Receiving or the protocol failed.
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    /// Importing or reading on this receiver's device failed.
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
}

/// A Vulkan receiver of an image ring of format `F` (see the module
/// contract).
pub struct VulkanReceiver<F: Format, M: MemoryLocation = DeviceLocal, U: Usage = usage::Storage> {
    // Dropped first: each image's drop waits (bounded) for this receiver's
    // last copy of it before the connection closes and the sender may
    // write the slot again.
    images: Vec<ExportableImage<F, Optimal, M, U>>,
    produced: Option<TimelineSemaphore>,
    ctx: Context,
    session: Session,
}

impl<F: Format, M: MemoryLocation, U: Usage> std::fmt::Debug for VulkanReceiver<F, M, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanReceiver")
            .field("format", &F::NAME)
            .field("slots", &self.images.len())
            .field("semaphores", &self.produced.is_some())
            .field("session", &self.session)
            .finish()
    }
}

fn ring_error(layout: &RingLayout, why: String) -> VulkanReceiverError {
    VulkanReceiverError::Ring(format!(
        "cannot receive the {}x{} ring of {} slots on Vulkan: {why}",
        layout.width, layout.height, layout.slots
    ))
}

impl<F: Format, M: MemoryLocation, U: Usage> VulkanReceiver<F, M, U> {
    /// Imports `session`'s ring (its setup message) on `ctx`.
    pub fn new(
        ctx: &Context,
        session: Session,
        mut setup: Received,
    ) -> Result<Self, VulkanReceiverError> {
        session.refuse_multi_image()?;
        let hello = *session.layout();
        let Some(format) = hello.vk_format() else {
            return Err(ring_error(
                &hello,
                "the sender shares pitched buffers, not images (a CUDA receiver, \
                 cuda_receiver::CudaReceiver, or a host one, host_receiver::HostReceiver, takes \
                 those)"
                    .into(),
            ));
        };
        if format != F::VK.as_raw() as u32 {
            let named =
                vk_export::format::describe(vk_export::ash::vk::Format::from_raw(format as i32))
                    .map_or(format!("VkFormat {format}"), |d| d.0.to_string());
            return Err(ring_error(
                &hello,
                format!(
                    "its images are {named}, this receiver's type is {}",
                    F::NAME
                ),
            ));
        }
        // The hello's rows are the peer's claim: a pitch that is not the
        // format's texel size times the width would have readers lay the
        // pixels out as something they are not.
        if hello.row_pitch != u64::from(hello.width) * u64::from(F::TEXEL_BYTES) {
            return Err(ring_error(
                &hello,
                format!(
                    "its rows of {} texels are announced as {} bytes, {} makes {}",
                    hello.width,
                    hello.row_pitch,
                    F::NAME,
                    u64::from(hello.width) * u64::from(F::TEXEL_BYTES)
                ),
            ));
        }
        let semaphores = has_semaphores(&hello, &setup);
        let n = hello.slots as usize;
        let mut images = Vec::with_capacity(n);
        for i in 0..n {
            let received = setup
                .take_image::<F, Optimal, M, U>(i)
                .map_err(|e| ring_error(&hello, format!("slot {i}: {e}")))?;
            let image =
                ExportableImage::import_received(ctx, received).map_err(|e| e.into_error())?;
            let extent = image.info().extent();
            if extent != [hello.width, hello.height, 1] {
                return Err(ring_error(
                    &hello,
                    format!(
                        "slot {i}'s image is {}x{}, not the layout's size",
                        extent[0], extent[1]
                    ),
                ));
            }
            images.push(image);
        }
        let produced = if semaphores {
            let received = setup.take_semaphore(n)?;
            Some(TimelineSemaphore::import_received(ctx, received).map_err(|e| e.into_error())?)
        } else {
            None
        };
        Ok(VulkanReceiver {
            images,
            produced,
            ctx: ctx.clone(),
            session,
        })
    }

    /// The session (layout, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The imported images, slot by slot (owned by the external family
    /// between reads).
    pub fn images(&self) -> &[ExportableImage<F, Optimal, M, U>] {
        &self.images
    }

    /// The next frame ([`Session::next`]).
    pub fn next(&self, timeout: Duration) -> Result<Frame, VulkanReceiverError> {
        Ok(self.session.next(timeout)?)
    }

    /// Waits on the host, within `timeout`, until the sender's writes of
    /// `frame` completed: its "produced" timeline reached the frame's
    /// number, where the ring shares one (otherwise the frame message,
    /// sent after the writes completed, already orders them). For an
    /// application that reads [`VulkanReceiver::images`] itself.
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

    /// The frame's pixels, tightly packed rows of `F` texels, or an error
    /// (see the module contract); all of it within `timeout`.
    pub fn read_pixels(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<u8>, VulkanReceiverError> {
        let deadline = deadline_after(timeout);
        self.session.check_held(frame)?;
        let image = &self.images[frame.slot() as usize];
        // SAFETY: this receiver holds the frame, so the sender's last use of
        // the image was its release to the external family in GENERAL (the
        // sender's contract, crate::protocol), ordered before this use by
        // "produced" or, without semaphores, by the frame message sent
        // after that submission completed; the sender does not touch the
        // slot again before this receiver's release or its drop, which
        // the check after the read detects. This receiver's own last use
        // ended with release_image (GENERAL, external family), waited for,
        // or failed before submitting.
        unsafe {
            self.ctx
                .assume_image_released(image, SharedLayout::General)?
        };
        let mut sync = SubmitSync::new().timeout(left(deadline));
        if let Some(produced) = &self.produced {
            sync = sync.wait_timeline(produced, frame.sequence());
        }
        let read = self.ctx.read_image(image, 0, 0, sync).and_then(|pixels| {
            self.ctx
                .release_image(image, SubmitSync::new().timeout(left(deadline)))
                .map(|()| pixels)
        });
        let pixels = match read {
            Ok(pixels) => pixels,
            Err(e) => {
                // As in `HostReceiver::read`: the release goes behind a copy
                // that may still run, unwaited; if it cannot, the session
                // closes.
                let back = self
                    .ctx
                    .release_image(image, SubmitSync::new().timeout(Duration::ZERO));
                if !matches!(back, Ok(()) | Err(vk_export::Error::Timeout(_))) {
                    self.session
                        .close(&format!("a read of frame {} failed: {e}", frame.sequence()));
                }
                return Err(e.into());
            }
        };
        self.session.check_held(frame)?;
        Ok(pixels)
    }

    /// Gives `frame` back (no GPU signal: [`VulkanReceiver::read_pixels`]
    /// leaves no GPU work on the image).
    pub fn release(&self, frame: Frame) -> Result<(), VulkanReceiverError> {
        Ok(self.session.release(frame, false)?)
    }
}
