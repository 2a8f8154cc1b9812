//! A Vulkan receiver of an image ring, on the receiver's own `VkDevice`
//! (a [`Context`] of its own, headless or `from_raw`): the Vulkan-to-Vulkan
//! case. It imports the ring's images once, then takes frames through a
//! [`FrameReceiver`] and reads their pixels back.
//!
//! # Contract
//!
//! * [`VulkanReceiver::new`] takes a connected [`FrameReceiver`] of an
//!   image ring ([`crate::protocol::HELLO_IMAGES`]) and imports each slot's image
//!   as an [`ExportableImage`] on `ctx` ([`ExportableImage::import_received`]:
//!   the record is verified on this device first); the hello's format must
//!   be `F`'s and every image must be the hello's size. The ring's
//!   "produced" timeline is imported when the sender shares one.
//! * [`VulkanReceiver::read_pixels`] reads a frame this receiver holds
//!   (and only such a frame: [`FrameReceiver::holds`]): it takes the image
//!   from `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`, where the sender released
//!   it, copies it out after "produced" reaches the frame's number (with
//!   semaphores; without, the sender announced it only after its writes
//!   completed, so the frame packet orders it), and releases it back to the
//!   external family in `GENERAL` before returning. Both submissions are
//!   waited for, so the frame's release ([`VulkanReceiver::release`]) needs
//!   no GPU signal: this receiver has no GPU work on the image left when it
//!   gives the slot back.
//! * Every wait is bounded by the caller's timeout. After a failed
//!   [`VulkanReceiver::read_pixels`] its copy may still be pending; the
//!   sender may then write the slot while it runs once the frame is
//!   released, which garbles only this receiver's read-back (the images'
//!   drops wait, bounded, for that copy before the connection closes).
//! * Several Vulkan receivers of one frame each move the image through
//!   `TRANSFER_SRC_OPTIMAL` and back on their own device at the same time;
//!   on drivers whose layout transitions rewrite image memory that would
//!   race (lavapipe's do not; see the guide's frame section).

use std::time::Duration;

use vk_export::format::Format;
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal, Usage};
use vk_export::{Context, ExportableImage, SharedLayout, SubmitSync, TimelineSemaphore};

use crate::consumer::{ConsumerError, SendError};
use crate::protocol::Packet;
use crate::receiver::{FrameInfo, FrameReceiver};

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
    /// A release could not be sent.
    #[error(transparent)]
    Send(#[from] SendError),
    /// [`VulkanReceiver::read_pixels`] of a frame this receiver does not
    /// hold (released already, or another receiver's).
    #[error("frame {sequence} of slot {slot} is not held by this receiver: read a frame between next_frame and release")]
    NotHeld {
        /// The frame's slot.
        slot: u32,
        /// Its sequence number.
        sequence: u64,
    },
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
    rx: FrameReceiver,
}

impl<F: Format, M: MemoryLocation, U: Usage> std::fmt::Debug for VulkanReceiver<F, M, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanReceiver")
            .field("format", &F::NAME)
            .field("slots", &self.images.len())
            .field("semaphores", &self.produced.is_some())
            .field("receiver", &self.rx)
            .finish()
    }
}

fn ring_error(hello: &Packet, why: String) -> VulkanReceiverError {
    VulkanReceiverError::Ring(format!(
        "cannot receive the {}x{} ring of {} slots on Vulkan: {why}",
        hello.width, hello.height, hello.slot
    ))
}

impl<F: Format, M: MemoryLocation, U: Usage> VulkanReceiver<F, M, U> {
    /// Imports `rx`'s ring (its setup message) on `ctx`.
    pub fn new(ctx: &Context, mut rx: FrameReceiver) -> Result<Self, VulkanReceiverError> {
        let hello = *rx.layout();
        if !hello.is_image_ring() {
            return Err(ring_error(
                &hello,
                "the sender shares pitched buffers, not images (a CUDA receiver, \
                 consumer::Ring::import, takes those)"
                    .into(),
            ));
        }
        if hello.format != F::VK.as_raw() as u32 {
            let named = vk_export::format::describe(vk_export::ash::vk::Format::from_raw(
                hello.format as i32,
            ))
            .map_or(format!("VkFormat {}", hello.format), |d| d.0.to_string());
            return Err(ring_error(
                &hello,
                format!(
                    "its images are {named}, this receiver's type is {}",
                    F::NAME
                ),
            ));
        }
        let mut setup = rx
            .take_setup()
            .ok_or_else(|| ring_error(&hello, "its setup message was taken already".into()))?;
        let n = hello.slot as usize;
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
                        "slot {i}'s image is {}x{}, not the hello's size",
                        extent[0], extent[1]
                    ),
                ));
            }
            images.push(image);
        }
        let produced = if setup.message().resources.len() > n {
            let received = setup.take_semaphore(n)?;
            Some(TimelineSemaphore::import_received(ctx, received).map_err(|e| e.into_error())?)
        } else {
            None
        };
        Ok(VulkanReceiver {
            images,
            produced,
            ctx: ctx.clone(),
            rx,
        })
    }

    /// The protocol handle (layout, delivery, statistics).
    pub fn receiver(&self) -> &FrameReceiver {
        &self.rx
    }

    /// The imported images, slot by slot (owned by the external family
    /// between reads).
    pub fn images(&self) -> &[ExportableImage<F, Optimal, M, U>] {
        &self.images
    }

    /// The next frame ([`FrameReceiver::next_frame`]).
    pub fn next_frame(&mut self, timeout: Duration) -> Result<FrameInfo, VulkanReceiverError> {
        Ok(self.rx.next_frame(timeout)?)
    }

    /// The frame's pixels, tightly packed rows of `F` texels (see the
    /// module contract); each submission waits at most `timeout`.
    pub fn read_pixels(
        &self,
        frame: &FrameInfo,
        timeout: Duration,
    ) -> Result<Vec<u8>, VulkanReceiverError> {
        if !self.rx.holds(frame) {
            return Err(VulkanReceiverError::NotHeld {
                slot: frame.slot,
                sequence: frame.sequence,
            });
        }
        let image = &self.images[frame.slot as usize];
        // SAFETY: this receiver holds the frame, so the sender's last use of
        // the image was its release to the external family in GENERAL (the
        // sender's contract, protocol::HELLO_IMAGES), ordered before this
        // use by "produced" or, without semaphores, by the frame packet
        // sent after that submission completed; the sender does not touch
        // the slot again before this receiver's release packet. This
        // receiver's own last use ended with release_image (GENERAL,
        // external family), waited for, or failed before submitting.
        unsafe {
            self.ctx
                .assume_image_released(image, SharedLayout::General)?
        };
        let mut sync = SubmitSync::new().timeout(timeout);
        if let Some(produced) = &self.produced {
            sync = sync.wait_timeline(produced, frame.sequence);
        }
        let pixels = self.ctx.read_image(image, 0, 0, sync)?;
        self.ctx
            .release_image(image, SubmitSync::new().timeout(timeout))?;
        Ok(pixels)
    }

    /// Gives `frame` back (no GPU signal: [`VulkanReceiver::read_pixels`]
    /// leaves no GPU work on the image).
    pub fn release(&mut self, frame: FrameInfo) -> Result<(), VulkanReceiverError> {
        Ok(self.rx.release(frame, false)?)
    }
}
