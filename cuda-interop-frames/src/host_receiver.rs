//! Reading a buffer ring on the host, without CUDA: the ring's host-visible
//! buffers imported into a Vulkan device of the receiver's own, each frame
//! copied out into bytes the caller owns (what a NumPy consumer on a
//! machine without the NVIDIA driver gets: CI's lavapipe, a laptop).
//!
//! # Contract
//!
//! * [`HostBuffers::import`] takes the setup message of a buffer ring of
//!   host-visible buffers, with or without the ring's semaphores, and
//!   imports each buffer on a headless [`Context`] of the device whose
//!   `deviceUUID` the records name (verified there, as every import is).
//!   An image ring, or a ring in device-local memory, is refused with an
//!   error that says which receiver reads it.
//! * [`HostBuffers::read`] copies a frame's rows out on that device's
//!   transfer queue, after the "produced" timeline reached the frame's
//!   number (when the sender shares it; without, the sender announced the
//!   frame after its writes completed, so the frame packet orders the
//!   read), and waits for the copy, bounded by the caller's timeout: when
//!   it returns `Ok`, this receiver has no GPU work on the slot left, so the
//!   frame can be released at once without a GPU signal.
//! * Uses `protocol` and `consumer` (errors) of this crate.

use std::time::Duration;

use vk_export::markers::HostVisible;
use vk_export::wire::{Received, Resource};
use vk_export::{Context, ExportableBuffer, HeadlessOptions, SubmitSync, TimelineSemaphore};

use crate::consumer::{frame_bytes_of, ConsumerError};
use crate::protocol::{Packet, SETUP_TAG};

/// A buffer ring imported on a Vulkan device of this process, for reading
/// frames on the host (see the module contract).
pub struct HostBuffers {
    // Dropped first: each buffer's drop waits (bounded) for its last copy.
    buffers: Vec<ExportableBuffer<HostVisible>>,
    produced: Option<TimelineSemaphore>,
    ctx: Context,
    frame_bytes: u64,
}

impl std::fmt::Debug for HostBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffers")
            .field("slots", &self.buffers.len())
            .field("semaphores", &self.produced.is_some())
            .field("frame_bytes", &self.frame_bytes)
            .finish_non_exhaustive()
    }
}

fn refused(hello: &Packet, why: &str) -> ConsumerError {
    ConsumerError::Protocol(format!(
        "cannot read the {}x{} ring of {} slots on the host: {why}",
        hello.width, hello.height, hello.slot
    ))
}

impl HostBuffers {
    /// Imports the buffers (and "produced", if shared) of the ring `hello`
    /// announced, from its setup message.
    pub fn import(hello: &Packet, mut setup: Received) -> Result<HostBuffers, ConsumerError> {
        let frame_bytes = frame_bytes_of(hello)?;
        if hello.is_image_ring() {
            return Err(refused(
                hello,
                "the sender shares OPTIMAL images, which only a GPU API reads: from Rust, \
                 a Vulkan receiver on any driver (vulkan_receiver::VulkanReceiver); CUDA \
                 and Python need the sender's semaphores too (a GPU driver that exports \
                 them, such as NVIDIA's)",
            ));
        }
        let n = hello.slot as usize;
        let (tag, count) = (setup.message().tag, setup.message().resources.len());
        if tag != SETUP_TAG || (count != n && count != 2 * n + 1) {
            return Err(refused(
                hello,
                &format!(
                    "the setup message must be tagged {SETUP_TAG:#x} with {n} buffers (and \
                     the ring's {} semaphores); got tag {tag:#x} with {count} resources",
                    n + 1
                ),
            ));
        }
        let uuid = match &setup.message().resources[0] {
            Resource::Buffer(info) => info.device_uuid(),
            _ => return Err(refused(hello, "its first resource is not a buffer")),
        };
        let ctx = Context::headless(&HeadlessOptions {
            device_uuid: Some(uuid),
            ..HeadlessOptions::default()
        })?;
        let mut buffers = Vec::with_capacity(n);
        for i in 0..n {
            let received = setup.take_buffer::<HostVisible>(i)?;
            let buffer = ExportableBuffer::import_received(&ctx, received).map_err(|e| {
                let e = e.into_error();
                refused(
                    hello,
                    &format!(
                        "slot {i}'s buffer does not import as host-visible memory ({e}): a \
                         ring in device-local memory is read by a CUDA receiver (the NVIDIA \
                         driver's libcuda.so.1), or run the sender with host-visible slots \
                         (frame_server --host-visible)"
                    ),
                )
            })?;
            if buffer.size() < frame_bytes {
                return Err(refused(
                    hello,
                    &format!(
                        "slot {i}'s buffer has {} bytes; a frame needs {frame_bytes}",
                        buffer.size()
                    ),
                ));
            }
            buffers.push(buffer);
        }
        let produced = if count > n {
            let received = setup.take_semaphore(n)?;
            Some(TimelineSemaphore::import_received(&ctx, received).map_err(|e| e.into_error())?)
        } else {
            None
        };
        Ok(HostBuffers {
            buffers,
            produced,
            ctx,
            frame_bytes,
        })
    }

    /// Bytes of one frame ([`Packet::frame_bytes`]): what [`Self::read`]
    /// returns.
    pub fn frame_bytes(&self) -> u64 {
        self.frame_bytes
    }

    /// Whether the sender shares the "produced" timeline.
    pub fn has_semaphores(&self) -> bool {
        self.produced.is_some()
    }

    /// Frame `frame`'s bytes in `slot`, rows as the hello lays them out.
    ///
    /// `frame` must be the frame this receiver holds in `slot` (received
    /// and not yet released: the sender does not write the slot meanwhile).
    /// With the ring's "produced" timeline the read waits on the GPU for
    /// `frame`; without it the sender announced the frame after its writes
    /// completed, and the bytes are whatever the slot holds now. Each read
    /// takes the buffer over from the sender (`VK_QUEUE_FAMILY_EXTERNAL`)
    /// and gives it back, both waited for within `timeout`.
    pub fn read(&self, slot: u32, frame: u64, timeout: Duration) -> Result<Vec<u8>, ConsumerError> {
        let buffer = self.buffers.get(slot as usize).ok_or_else(|| {
            ConsumerError::Protocol(format!(
                "slot {slot} is not a slot of this ring (it has {}: 0 to {}); read the slot \
                 of a frame this receiver holds",
                self.buffers.len(),
                self.buffers.len().saturating_sub(1)
            ))
        })?;
        // SAFETY: the sender releases each slot to VK_QUEUE_FAMILY_EXTERNAL
        // after writing it (the crate's contract, `Sender::present_with`),
        // and this read is ordered after that release: by the "produced"
        // wait below, or (without semaphores) by the frame packet the
        // sender sends only after its submission completed.
        unsafe { self.ctx.assume_buffer_released(buffer) }?;
        let mut sync = SubmitSync::new().timeout(timeout);
        if let Some(produced) = &self.produced {
            sync = sync.wait_timeline(produced, frame);
        }
        let bytes = self.ctx.read_buffer(buffer, self.frame_bytes, sync)?;
        // Back to the sender before the slot is released, as it acquires
        // the slot from VK_QUEUE_FAMILY_EXTERNAL for its next write.
        self.ctx
            .release_buffer(buffer, SubmitSync::new().timeout(timeout))?;
        Ok(bytes)
    }
}
