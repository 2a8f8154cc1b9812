//! Reading a buffer ring on the host, without CUDA: the ring's host-visible
//! buffers imported into a Vulkan device of the receiver's own, each frame
//! copied out into bytes the caller owns (what a NumPy receiver on a
//! machine without the NVIDIA driver gets: CI's lavapipe, a laptop).
//!
//! # Contract
//!
//! * [`HostReceiver::from_session`] takes a session of a buffer ring of
//!   host-visible buffers, with or without the ring's semaphores, and
//!   imports each buffer on a headless [`Context`] of the device whose
//!   `deviceUUID` the records name (verified there, as every import is).
//!   An image ring, or a ring in device-local memory, is refused with an
//!   error that says which receiver reads it.
//! * [`HostReceiver::read`] (or [`HostReceiver::read_into`], into memory
//!   the caller reuses) copies a frame's rows out through a host mapping of
//!   the slot, with no device copy, after one submission on that device's
//!   transfer queue acquired the slot, waited for the "produced" timeline
//!   to reach the frame's number (when the sender shares it; without, the
//!   sender announced the frame after its writes completed, so the frame
//!   message orders the read) and made the writes visible to the host,
//!   waited for within the caller's timeout. It then asks the session
//!   whether the frame is still this receiver's ([`Session::check_held`]):
//!   `Ok` bytes are the frame's pixels; a receiver the sender dropped
//!   during the read gets the drop's error, never a later frame's pixels.
//! * [`HostReceiver::read_in_place`] makes the same submissions and hands
//!   out the start of the frame's bytes in this receiver's mapping instead
//!   of copying them: for a reader that passes them on while it holds the
//!   frame (a GStreamer buffer over the slot). Reading through it is the
//!   caller's `unsafe`, under the rules its docs state.
//! * When `read` returns `Ok`, this receiver has no GPU work on the slot
//!   left, so the frame is released without a GPU signal. A read whose
//!   submission fails (a timeout: it may still run; nothing was copied)
//!   submits the buffer's release to the external family behind it on the
//!   same queue, unwaited, so the next read starts from a known owner (if
//!   even that fails, the session closes).

use std::time::Duration;

use vk_export::markers::HostVisible;
use vk_export::wire::{Received, Resource};
use vk_export::{Context, ExportableBuffer, HeadlessOptions, SubmitSync, TimelineSemaphore};

use crate::discovery::Directory;
use crate::protocol::{Delivery, RingLayout};
use crate::session::{has_semaphores, ConnectError, Frame, Session};
use crate::transport::{deadline_after, left, ConsumerError};

/// A host reader of a buffer ring (see the module contract).
pub struct HostReceiver {
    // Dropped first: each buffer's drop waits (bounded) for its last copy.
    buffers: Vec<ExportableBuffer<HostVisible>>,
    produced: Option<TimelineSemaphore>,
    ctx: Context,
    frame_bytes: u64,
    session: Session,
}

impl std::fmt::Debug for HostReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostReceiver")
            .field("session", &self.session)
            .field("semaphores", &self.produced.is_some())
            .field("frame_bytes", &self.frame_bytes)
            .finish_non_exhaustive()
    }
}

fn refused(layout: &RingLayout, why: &str) -> ConsumerError {
    ConsumerError::Protocol(format!(
        "cannot read the {}x{} ring of {} slots on the host: {why}",
        layout.width, layout.height, layout.slots
    ))
}

impl HostReceiver {
    /// Connects to the sender at socket `path` and imports its buffers.
    pub fn connect(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<HostReceiver, ConsumerError> {
        let (session, setup) = Session::connect(path, delivery, timeout)?;
        HostReceiver::from_session(session, setup)
    }

    /// Connects to the sender named `name` in the default directory
    /// ([`Directory::from_env`]), waiting up to `timeout` for it to appear.
    pub fn connect_named(
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<HostReceiver, ConnectError> {
        let directory = Directory::from_env()?;
        let (session, setup) = Session::connect_named(&directory, name, delivery, timeout)?;
        Ok(HostReceiver::from_session(session, setup)?)
    }

    /// Imports the buffers (and "produced", if shared) of `session`'s ring
    /// from its setup message.
    pub fn from_session(
        session: Session,
        mut setup: Received,
    ) -> Result<HostReceiver, ConsumerError> {
        let layout = *session.layout();
        let frame_bytes = layout.checked_frame_bytes()?;
        if layout.is_image_ring() {
            return Err(refused(
                &layout,
                "the sender shares OPTIMAL images, which only a GPU API reads: from Rust, \
                 a Vulkan receiver on any driver (vulkan_receiver::VulkanReceiver, the \
                 vulkan_client example); CUDA and Python need the sender's semaphores too (a \
                 GPU driver that exports them, such as NVIDIA's)",
            ));
        }
        let n = layout.slots as usize;
        let uuid = match &setup.message().resources[0] {
            Resource::Buffer(info) => info.device_uuid(),
            _ => return Err(refused(&layout, "its first resource is not a buffer")),
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
                    &layout,
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
                    &layout,
                    &format!(
                        "slot {i}'s buffer has {} bytes; a frame needs {frame_bytes}",
                        buffer.size()
                    ),
                ));
            }
            buffers.push(buffer);
        }
        let produced = if has_semaphores(&layout, &setup) {
            let received = setup.take_semaphore(n)?;
            Some(TimelineSemaphore::import_received(&ctx, received).map_err(|e| e.into_error())?)
        } else {
            None
        };
        Ok(HostReceiver {
            buffers,
            produced,
            ctx,
            frame_bytes,
            session,
        })
    }

    /// The session (layout, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Bytes of one frame ([`RingLayout::frame_bytes`]): what
    /// [`HostReceiver::read`] returns.
    pub fn frame_bytes(&self) -> u64 {
        self.frame_bytes
    }

    /// Whether the sender shares the "produced" timeline.
    pub fn has_semaphores(&self) -> bool {
        self.produced.is_some()
    }

    /// The next frame ([`Session::next`]).
    pub fn next(&self, timeout: Duration) -> Result<Frame, ConsumerError> {
        self.session.next(timeout)
    }

    /// `frame`'s bytes, rows as the layout lays them out, or an error (see
    /// the module contract). Each read takes the buffer over from the
    /// sender (`VK_QUEUE_FAMILY_EXTERNAL`) and gives it back, both waited
    /// for within `timeout`. [`HostReceiver::read_into`] reads into memory
    /// the caller keeps.
    pub fn read(&self, frame: &Frame, timeout: Duration) -> Result<Vec<u8>, ConsumerError> {
        let mut bytes = vec![0u8; self.frame_bytes as usize];
        self.read_into(frame, &mut bytes, timeout)?;
        Ok(bytes)
    }

    /// As [`HostReceiver::read`], into `out`, which must hold exactly
    /// [`HostReceiver::frame_bytes`] bytes (else
    /// [`ConsumerError::Protocol`], nothing read): memory reused from frame
    /// to frame (a pool's buffer) saves an allocation and its first-touch
    /// page faults per frame.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use cuda_interop_frames::host_receiver::HostReceiver;
    /// # fn f(rx: &HostReceiver) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut bytes = vec![0u8; rx.frame_bytes() as usize];
    /// loop {
    ///     let frame = rx.next(Duration::from_secs(1))?;
    ///     let read = rx.read_into(&frame, &mut bytes, Duration::from_secs(1));
    ///     rx.release(frame)?;
    ///     read?;
    ///     // ... use `bytes`
    /// }
    /// # }
    /// ```
    pub fn read_into(
        &self,
        frame: &Frame,
        out: &mut [u8],
        timeout: Duration,
    ) -> Result<(), ConsumerError> {
        if out.len() as u64 != self.frame_bytes {
            return Err(ConsumerError::Protocol(format!(
                "a frame of {} bytes read into {} bytes: size the memory by frame_bytes()",
                self.frame_bytes,
                out.len()
            )));
        }
        let deadline = deadline_after(timeout);
        let buffer = self.host_readable(frame, deadline)?;
        // The host reads the slot's memory through a mapping: no device
        // copy (the ring is host-visible by construction).
        buffer.read_mapped(0, out)?;
        // The read is complete: if the sender had not dropped this
        // receiver by now, it had not written the slot during the read.
        self.session.check_held(frame)?;
        Ok(())
    }

    /// Makes `frame`'s bytes readable in place, through this receiver's
    /// mapping of its slot, with no copy at all: the same submissions as
    /// [`HostReceiver::read_into`] (the slot taken over from the sender,
    /// the device's writes made visible to the host, the slot given back),
    /// waited for within `timeout`, then the start of the frame's
    /// [`HostReceiver::frame_bytes`] bytes, rows as the layout lays them
    /// out. For a reader that hands the bytes on without copying them (a
    /// GStreamer buffer over the slot).
    ///
    /// Getting the pointer is safe; reading through it is the caller's
    /// `unsafe`: only while `frame` is held (before its release) and this
    /// receiver lives, and where no other thread of this process writes
    /// the slot (a sender of the ring in this process writes its own
    /// mapping of the same memory with atomic stores: read with atomic
    /// loads then, as `read_into` does). The sender writes the slot again
    /// only after the release, or after dropping this receiver for holding
    /// the frame past its hold timeout: the bytes may then change under
    /// the reader, and [`Session::check_held`] after the read tells.
    pub fn read_in_place(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<*const u8, ConsumerError> {
        let buffer = self.host_readable(frame, deadline_after(timeout))?;
        Ok(buffer.mapped_ptr()?.as_ptr().cast_const())
    }

    /// Takes `frame`'s slot over from the sender, makes the device's writes
    /// visible to the host and gives the slot back, waited for by
    /// `deadline`: the slot's buffer, readable through its mapping while
    /// the frame is held.
    fn host_readable(
        &self,
        frame: &Frame,
        deadline: std::time::Instant,
    ) -> Result<&ExportableBuffer<HostVisible>, ConsumerError> {
        self.session.check_held(frame)?;
        let buffer = &self.buffers[frame.slot() as usize];
        // SAFETY: the sender releases each slot to VK_QUEUE_FAMILY_EXTERNAL
        // after writing it (the crate's contract, `Sender::present_with`),
        // and this read is ordered after that release: by the "produced"
        // wait below, or (without semaphores) by the frame message the
        // sender sends only after its submission completed.
        unsafe { self.ctx.assume_buffer_released(buffer) }?;
        let mut sync = SubmitSync::new().timeout(left(deadline));
        if let Some(produced) = &self.produced {
            sync = sync.wait_timeline(produced, frame.sequence());
        }
        let made = self
            .ctx
            .make_buffer_host_readable(buffer, sync)
            .and_then(|()| {
                // Back to the sender before the slot is released, as it
                // acquires the slot from VK_QUEUE_FAMILY_EXTERNAL for its
                // next write. (A host read after the release still reads
                // the frame: an ownership transfer leaves a buffer's bytes
                // as they are, and the sender writes again only after the
                // frame's release.)
                self.ctx
                    .release_buffer(buffer, SubmitSync::new().timeout(left(deadline)))
            });
        if let Err(e) = made {
            // A wait that timed out may still run: the release back to
            // the external family goes on the same queue after it, and
            // is not waited for (a later read's acquire follows it in
            // queue order). If even that cannot be submitted, the
            // buffer's owner is unknown: this session reads no more.
            let back = self
                .ctx
                .release_buffer(buffer, SubmitSync::new().timeout(Duration::ZERO));
            if !matches!(back, Ok(()) | Err(vk_export::Error::Timeout(_))) {
                self.session
                    .close(&format!("a read of frame {} failed: {e}", frame.sequence()));
            }
            return Err(e.into());
        }
        Ok(buffer)
    }

    /// Gives `frame` back ([`Session::release`]; no GPU signal: a read
    /// leaves no GPU work on the slot).
    pub fn release(&self, frame: Frame) -> Result<(), ConsumerError> {
        self.session.release(frame, false)
    }
}
