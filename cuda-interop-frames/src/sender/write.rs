//! The guards an application writes a frame through: [`WriteSlot`] (a free
//! slot taken by `Sender::acquire`, presented with commands the crate
//! records, or by a copy of the application's own image) and [`OpenSlot`]
//! (a slot opened for the application's own submissions).
//!
//! # Contract
//!
//! * A guard borrows its sender mutably: one frame is written at a time.
//!   The non-borrowing shapes ([`RecordedFrame`], [`OpenedFrame`],
//!   [`LentSlot`]) carry their sender's id and slot; the sender takes them
//!   back (`present_*`, `abandon_*`) only if they are its own and the slot
//!   is out of its ring in that shape, else refuses them.
//! * A [`WriteSlot`] dropped unpresented leaves the slot free; an
//!   [`OpenSlot`] dropped unpresented is released to the external family
//!   (bounded, on the same queue) and no frame is numbered. An
//!   [`OpenedFrame`] is an [`OpenSlot`] detached from the borrow: its
//!   present and abandon rebuild the [`OpenSlot`] and run its close (one
//!   implementation of each); dropped, it leaves its slot out of the ring
//!   (the application's GPU work may still write it).
//! * The sender's bookkeeping (frame numbers, the slot's owner, the
//!   receivers' waits) is the sender's (`super`): the guards call it.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{HostVisible, MemoryLocation, Optimal, Usage};
use vk_export::{
    ExportableBuffer, ExportableImage, QueueRole, SourceImage, SourceSharing, TimelineSemaphore,
};

use super::{Outside, Sender, SenderError, SlotResource};

impl<M: MemoryLocation, R: SlotResource<M>> std::fmt::Debug for WriteSlot<'_, M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSlot")
            .field("slot", &self.slot)
            .finish()
    }
}

/// A slot taken for writing the next frame; [`WriteSlot::present_with`]
/// publishes it. Dropped unpresented, the slot stays free.
pub struct WriteSlot<'a, M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    pub(super) sender: &'a mut Sender<M, R>,
    pub(super) slot: u32,
}

impl<M: MemoryLocation> WriteSlot<'_, M, ExportableBuffer<M>> {
    /// The slot's buffer.
    pub fn buffer(&self) -> &ExportableBuffer<M> {
        &self.sender.slots[self.slot as usize]
    }
}

impl WriteSlot<'_, HostVisible, ExportableBuffer<HostVisible>> {
    /// Publishes `data`, the frame's bytes from the start of the slot (at
    /// most its size), copied in by the host through a mapping of the
    /// slot: no device copy, no command buffer of pixels. One submission
    /// waits on the GPU for the receivers' releases of the slot, acquires
    /// it and makes earlier device accesses of it available to the host,
    /// and is waited for (bounded); the host copies `data` in; a second
    /// submission releases the slot and signals "produced", and is waited
    /// for; then the frame is announced. Returns its sequence number. For
    /// frames the CPU made (a decoder's output, a GStreamer buffer), the
    /// cheapest way into a host-visible ring. An empty or oversized `data`
    /// is [`SenderError::Vulkan`] with [`vk_export::Error::InvalidArgument`],
    /// the slot left free. A shorter `data` leaves the rest of the slot as
    /// an earlier frame wrote it: receivers read the layout's whole frame,
    /// so give every byte of it.
    pub fn present_bytes(self, timestamp_ns: u64, data: &[u8]) -> Result<u64, SenderError> {
        let size = self.buffer().size();
        if data.is_empty() || data.len() as u64 > size {
            return Err(vk_export::Error::InvalidArgument(format!(
                "a frame of {} bytes into a slot of {size}",
                data.len()
            ))
            .into());
        }
        let role = self.sender.opts.queue;
        let WriteSlot { sender, slot } = self;
        let ready = sender.open_for(slot, role, true)?;
        let family = sender.ctx.queue_family_of(role);
        let open = OpenSlot {
            sender,
            slot,
            role,
            family,
            ready,
            closed: false,
        };
        // SAFETY: `open_for` returned Ok: its submission waited on the GPU
        // for every receiver's release of the slot (their device reads of
        // it ran before), acquired it after this sender's last release of
        // it, made every earlier device access available to the host and
        // ordered before host writes, and completed. No device work of
        // this sender touches the slot until the release below, submitted
        // after this returns. (A receiver the sender dropped for holding
        // the slot past the hold timeout may still read it: it gets torn
        // bytes of a frame it no longer holds, and its read then fails
        // `check_held`; the copy is atomic, so no data race in this
        // process.)
        if let Err(e) = unsafe { open.resource().write_mapped(0, data) } {
            // Dropped: released unpresented, no frame numbered.
            return Err(e.into());
        }
        // The host's writes are visible to the release's submission
        // (HOST_COHERENT memory, written before vkQueueSubmit).
        open.close_and_announce(timestamp_ns, None)
    }

    /// Lends the slot to a host writer that cannot take a slice (a
    /// GStreamer element writing into memory the sink offered it): the
    /// slot opened for host writes as [`WriteSlot::present_bytes`] opens
    /// it (the receivers' releases waited for, acquired, earlier device
    /// accesses made available to the host, completed), then handed out as
    /// a [`LentSlot`] that does not borrow the sender. The writer writes
    /// the frame through [`LentSlot::as_mut_ptr`]; [`Sender::present_lent`]
    /// publishes it. Until then the slot is out of the ring; a `LentSlot`
    /// dropped unpresented gives it back, no frame numbered. A sender
    /// dropped first hands the slot's buffer to the `LentSlot`, so the
    /// pointer stays valid while the `LentSlot` lives: nothing leaks.
    pub fn lend(self) -> Result<LentSlot, SenderError> {
        let role = self.sender.opts.queue;
        let WriteSlot { sender, slot } = self;
        let s = slot as usize;
        // Mapped before the slot is opened: a mapping that fails leaves it
        // free as it was.
        let base = sender.slots[s].mapped_ptr()?;
        let size = sender.slots[s].size() as usize;
        let ready = sender.open_for(slot, role, true)?;
        let custody: Custody<ExportableBuffer<HostVisible>> = Arc::new(Mutex::new(None));
        sender.lent[s] = Some(Arc::clone(&custody));
        Ok(LentSlot {
            sender: sender.id,
            slot,
            role,
            ready,
            base,
            size,
            custody,
        })
    }
}

/// Where a lent slot's buffer goes if its sender is dropped before the
/// [`LentSlot`]: the sender and the `LentSlot` each hold the `Arc`.
pub(super) type Custody<R> = Arc<Mutex<Option<R>>>;

/// A host-visible slot lent to a host writer ([`WriteSlot::lend`]),
/// published with [`Sender::present_lent`]. Dropped unpresented, the slot
/// goes back into the ring (no frame numbered).
#[must_use = "present the frame (Sender::present_lent), or drop it to give the slot back"]
pub struct LentSlot {
    sender: u64,
    slot: u32,
    role: QueueRole,
    ready: u64,
    base: NonNull<u8>,
    size: usize,
    /// Keeps the slot's buffer (and so `base`'s mapping) alive if the
    /// sender goes first.
    custody: Custody<ExportableBuffer<HostVisible>>,
}

// SAFETY: `base` is an address in a mapping owned by the slot's buffer,
// which the sender or `custody` keeps alive on any thread (the buffer is
// `Send`); a `LentSlot` gives no access through it by itself.
unsafe impl Send for LentSlot {}

impl LentSlot {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The slot's bytes (its buffer's size; the ring's layout says where
    /// the frame's rows go).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The start of the slot's bytes, mapped for the host: valid for
    /// [`LentSlot::size`] bytes while this `LentSlot` lives (also after the
    /// sender is dropped: then this `LentSlot` keeps the slot's buffer).
    /// Writing through it is the caller's `unsafe`: only while this
    /// `LentSlot` lives and before it is presented, from one writer at a
    /// time, and with no receiver of this ring in this process (a receiver
    /// dropped for holding a slot past the hold timeout may still read the
    /// slot with atomic loads, and a plain write beside them is a data race:
    /// receivers in other processes read their own mapping and see, at
    /// worst, torn bytes of a frame they no longer hold).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl std::fmt::Debug for LentSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentSlot")
            .field("slot", &self.slot)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Sender<HostVisible, ExportableBuffer<HostVisible>> {
    /// Publishes a lent slot's frame, written through
    /// [`LentSlot::as_mut_ptr`]: as [`WriteSlot::present_bytes`] after its
    /// copy (a submission releases the slot and signals "produced", waited
    /// for; then the frame is announced with `timestamp_ns`). Returns its
    /// sequence number. A slot of another sender is refused
    /// ([`vk_export::Error::InvalidArgument`]) and dropped, which gives it
    /// back to its own sender. On an error after that the slot is released
    /// unpresented, no frame announced.
    pub fn present_lent(&mut self, lent: LentSlot, timestamp_ns: u64) -> Result<u64, SenderError> {
        let s = lent.slot as usize;
        let ours = lent.sender == self.id
            && self
                .lent
                .get(s)
                .and_then(Option::as_ref)
                .is_some_and(|c| Arc::ptr_eq(c, &lent.custody));
        if !ours {
            return Err(vk_export::Error::InvalidArgument(format!(
                "a lent slot (slot {}) of another sender",
                lent.slot
            ))
            .into());
        }
        self.lent[s] = None;
        let family = self.ctx.queue_family_of(lent.role);
        let open = OpenSlot {
            sender: self,
            slot: lent.slot,
            role: lent.role,
            family,
            ready: lent.ready,
            closed: false,
        };
        // The writer's host writes are visible to the release's submission
        // (HOST_COHERENT memory, written before vkQueueSubmit).
        open.close_and_announce(timestamp_ns, None)
    }
}

impl<F: Format, M: MemoryLocation, U: Usage> WriteSlot<'_, M, ExportableImage<F, Optimal, M, U>> {
    /// The slot's image.
    pub fn image(&self) -> &ExportableImage<F, Optimal, M, U> {
        &self.sender.slots[self.slot as usize]
    }

    /// Publishes an image the application made without external memory
    /// (a render target: binding exportable memory to it after the fact
    /// would give another layout, garbled pixels) by a GPU copy into the
    /// slot: `vkCmdCopyImage` from `source` (its format is the ring's, by
    /// type; its region at its offset is the ring's extent, checked before
    /// anything is recorded), between the slot's ownership barriers, on the
    /// transfer queue for a `CONCURRENT` source, one the transfer family
    /// owns, or one the application released to it
    /// ([`vk_export::SourceSharing::ReleasedToTransfer`]: the crate
    /// records the acquire and the release back), else on the main queue
    /// of the family that owns it ([`SourceImage::check_copy`]); after a GPU wait for `wait`'s timeline
    /// value if given (the application's rendering signals it), and
    /// leaving the source in its layout. Then as
    /// [`WriteSlot::present_with`]: waits for the copy (bounded), announces
    /// the frame, returns its sequence number. A refused copy
    /// ([`SenderError::Vulkan`] with [`vk_export::Error::InvalidArgument`])
    /// leaves the slot free and the frame unnumbered.
    pub fn present_copy(
        self,
        timestamp_ns: u64,
        source: &SourceImage<F>,
        wait: Option<(&TimelineSemaphore, u64)>,
    ) -> Result<u64, SenderError> {
        let extent = [self.sender.opts.width, self.sender.opts.height];
        let role = source.check_copy(&self.sender.ctx, extent)?;
        self.sender.present(
            self.slot,
            timestamp_ns,
            role,
            wait,
            |device, cmd, target| {
                // SAFETY: check_copy returned `role` for this extent, and
                // this is the recording command buffer of that role's queue
                // (of `target.queue_family`); the slot's image is the
                // sender's, of format F with transfer usage (every preset),
                // of `extent`, in GENERAL owned by that family between the
                // acquire and release barriers around this closure, and it
                // outlives the submission (the sender's slots do; a timed-out
                // one is waited for by their drops); the source's facts are
                // `SourceImage::new`'s contract.
                unsafe {
                    source.record_copy_to(device, cmd, target.queue_family, target.image, extent)
                }
            },
        )
    }
}

impl<F: Format, M: MemoryLocation, U: Usage> WriteSlot<'_, M, ExportableImage<F, Optimal, M, U>> {
    /// [`WriteSlot::record_into`] of a copy of `source` (as
    /// [`WriteSlot::present_copy`] records it: the region checked before
    /// anything is recorded, the source left in its layout): an engine's
    /// render texture published from inside its own command buffer. The
    /// source must be one the main queue family may copy (exclusively
    /// owned by it; refused otherwise, the slot left free).
    ///
    /// # Safety
    /// As [`WriteSlot::record_into`]; `source`'s facts
    /// ([`SourceImage::new`]) hold when the command buffer executes: its
    /// writes recorded into `cmd` before this call, or submitted earlier to
    /// the queue `cmd` goes to, or ordered before it by a semaphore or a
    /// host wait; a write recorded after the copy (in `cmd`, or later on
    /// the same queue) is ordered after it by the copy's closing barrier.
    pub unsafe fn record_copy_into(
        self,
        cmd: vk::CommandBuffer,
        source: &SourceImage<F>,
    ) -> Result<RecordedFrame, SenderError> {
        let extent = [self.sender.opts.width, self.sender.opts.height];
        let main = self.sender.ctx.queue_family();
        source.check_copy(&self.sender.ctx, extent)?;
        match source.sharing() {
            SourceSharing::Concurrent => {}
            SourceSharing::Exclusive(f) if f == main => {}
            other => {
                return Err(vk_export::Error::InvalidArgument(format!(
                    "a copy source {other:?} recorded into a command buffer of the main queue \
                     family {main}: only a source that family owns (SourceSharing::Exclusive of \
                     it) or a CONCURRENT one can be copied there"
                ))
                .into())
            }
        }
        // SAFETY: the caller's promises; check_copy accepted the region,
        // and the source is CONCURRENT or owned by the main family, which
        // `cmd` and the closure's family are; the closure gets the slot's
        // image in GENERAL, owned by that family (record_into's barriers
        // around it).
        Ok(unsafe {
            self.record_into(cmd, |device, cmd, target| {
                source.record_copy_to(device, cmd, target.queue_family, target.image, extent)
            })
        })
    }
}

impl<'a, M: MemoryLocation, R: SlotResource<M>> WriteSlot<'a, M, R> {
    /// Records the frame into the application's own command buffer `cmd`
    /// instead of a submission of the crate's: the slot's acquire by the
    /// main family, `record`'s commands (given the device, `cmd` and the
    /// slot, as [`WriteSlot::present_with`]), the release to the external
    /// family. Nothing is submitted or waited for: the receivers' releases
    /// of the slot were reached on the host before it was handed out (a
    /// read finished before a write needs no more), and the application
    /// submits `cmd` with its own work. Returns the frame to present with
    /// [`Sender::present_recorded`] once `cmd` completed; until then the
    /// slot is out of the ring and the sender is free for other frames.
    ///
    /// # Safety
    /// * `cmd` is a primary command buffer of the sender's device in the
    ///   recording state, outside a render pass, for a queue of the
    ///   context's main family ([`vk_export::Context::queue_family`]), and
    ///   `record` records only valid commands there that leave the slot in
    ///   `GENERAL`, and uses the slot it is given only in those commands;
    /// * no submission of this sender that timed out may still run (after
    ///   a [`vk_export::Error::Timeout`] from it, the context's queues were
    ///   idle since);
    /// * the application submits `cmd` at most once, to a queue of that
    ///   family, and presents or abandons the frame as those functions
    ///   require.
    pub unsafe fn record_into(
        self,
        cmd: vk::CommandBuffer,
        record: impl FnOnce(&vk_export::ash::Device, vk::CommandBuffer, R::Target),
    ) -> RecordedFrame {
        let WriteSlot { sender, slot } = self;
        let s = slot as usize;
        let family = sender.ctx.queue_family();
        let was_released = sender.released_to_external[s];
        let resource = &sender.slots[s];
        let device = sender.ctx.device();
        // SAFETY: the caller's promises on `cmd`; the slot lives until the
        // sender drops, which leaks a recorded slot rather than destroying
        // it; `was_released` is its owner now (a release to the external
        // family ordered before, or nothing: its first frame).
        unsafe { resource.record_acquire(device, cmd, family, was_released) };
        record(device, cmd, resource.target(family));
        // SAFETY: as above.
        unsafe { resource.record_release(device, cmd, family) };
        // Its old frame is gone (acquire already took it out of `newest`),
        // the receivers' promises spent; released when `cmd` runs.
        sender.receivers.written(s);
        sender.released_to_external[s] = true;
        sender.outside[s] = Some(Outside::Recorded);
        RecordedFrame {
            sender: sender.id,
            slot,
            was_released,
        }
    }

    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The sequence number the frame gets when presented.
    pub fn sequence(&self) -> u64 {
        self.sender.stats.presented + 1
    }

    /// Records `record`'s commands (given the device, the command buffer
    /// and the slot: its buffer, or an [`ImageTarget`](super::ImageTarget) for an image ring)
    /// between the crate's ownership barriers,
    /// submits them (waiting on the GPU for receivers' releases of the slot),
    /// waits for them (bounded), and announces the frame with
    /// `timestamp_ns` ([`monotonic_ns`](super::monotonic_ns) for "now"). Returns its sequence
    /// number.
    pub fn present_with(
        self,
        timestamp_ns: u64,
        record: impl FnOnce(&vk_export::ash::Device, vk::CommandBuffer, R::Target),
    ) -> Result<u64, SenderError> {
        let role = self.sender.opts.queue;
        self.sender
            .present(self.slot, timestamp_ns, role, None, record)
    }

    /// Opens the slot for the application's own submissions (another
    /// queue of `role`'s family, as wgpu's or an engine's: commands this
    /// crate does not record): one submission on `role`'s queue waits on
    /// the GPU for the receivers' releases of the slot and acquires it for
    /// that family (an image in `GENERAL`), and is waited for (bounded).
    /// The application's work then waits for [`OpenSlot::ready`] on the
    /// GPU, writes the slot on a queue of [`OpenSlot::queue_family`]
    /// (leaving an image in `GENERAL`), signals a timeline of this context,
    /// and [`OpenSlot::present`] publishes the frame after it.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use cuda_interop_frames::sender::{monotonic_ns, ImageSender};
    /// # use vk_export::{format::Rgba8Unorm, markers::DeviceLocal, QueueRole, TimelineSemaphore};
    /// # fn f(sender: &mut ImageSender<Rgba8Unorm, DeviceLocal>, done: &TimelineSemaphore, n: u64)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let slot = sender.acquire(Duration::from_millis(100))?.open(QueueRole::Main)?;
    /// let (opened, value) = slot.ready();
    /// // ... the application's submission: waits (opened, value), writes
    /// // slot.resource() on a queue of slot.queue_family(), signals (done, n) ...
    /// # let _ = (opened, value);
    /// let sequence = slot.present(monotonic_ns(), (done, n))?;
    /// # let _ = sequence; Ok(()) }
    /// ```
    pub fn open(self, role: QueueRole) -> Result<OpenSlot<'a, M, R>, SenderError> {
        let WriteSlot { sender, slot } = self;
        let ready = sender.open(slot, role)?;
        let family = sender.ctx.queue_family_of(role);
        Ok(OpenSlot {
            sender,
            slot,
            role,
            family,
            ready,
            closed: false,
        })
    }

    /// [`WriteSlot::open`] without the borrow: the slot is opened the same
    /// way (acquired for `role`'s family after a GPU wait for the
    /// receivers' releases, the submission waited for, bounded) and handed
    /// back as an [`OpenedFrame`], so that the sender is free meanwhile
    /// (other frames, serving receivers) and the frame can cross an API
    /// that cannot hold a borrow (the C ABI's `ci_sender_open`). The slot is
    /// out of the ring until [`Sender::present_opened`] publishes it or
    /// [`Sender::abandon_opened`] releases it unpresented; dropped instead,
    /// it stays out for the sender's life. A sender dropped with an opened
    /// frame out leaks that slot (its image or buffer and memory, which the
    /// application's submission may still write), the "opened" timeline
    /// (which it may wait for) and with them the context's device objects:
    /// present or abandon every opened frame before dropping the sender
    /// where the device is to be destroyed.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use cuda_interop_frames::sender::{monotonic_ns, ImageSender};
    /// # use vk_export::{format::Rgba8Unorm, markers::DeviceLocal, QueueRole, TimelineSemaphore};
    /// # fn f(sender: &mut ImageSender<Rgba8Unorm, DeviceLocal>, done: &TimelineSemaphore, n: u64)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let frame = sender.acquire(Duration::from_millis(100))?.open_detached(QueueRole::Main)?;
    /// let image = sender.images()[frame.index() as usize].raw();
    /// let (opened, value) = frame.ready();
    /// // ... the application's submission: waits (opened, value), writes
    /// // `image` on a queue of frame.queue_family(), signals (done, n) ...
    /// # let _ = (opened, value, image);
    /// let sequence = sender.present_opened(frame, monotonic_ns(), (done, n))?;
    /// # let _ = sequence; Ok(()) }
    /// ```
    pub fn open_detached(self, role: QueueRole) -> Result<OpenedFrame, SenderError> {
        let open = self.open(role)?;
        // Out of the ring from here; the guard's drop must not release it.
        let mut open = std::mem::ManuallyDrop::new(open);
        let s = open.slot as usize;
        open.sender.outside[s] = Some(Outside::Opened);
        let opened = open.sender.opened.clone().expect("made by open");
        Ok(OpenedFrame {
            sender: open.sender.id,
            slot: open.slot,
            role: open.role,
            family: open.family,
            ready: open.ready,
            opened,
        })
    }
}

/// A slot opened for the application's own submissions without a borrow
/// of its sender ([`WriteSlot::open_detached`]): acquired for
/// [`OpenedFrame::queue_family`] until [`Sender::present_opened`] releases
/// it and publishes the frame, or [`Sender::abandon_opened`] releases it
/// unpresented. Dropped instead, its slot stays out of the ring for the
/// sender's life (it is never released under the application's writes).
#[must_use = "present the frame (Sender::present_opened) or abandon it (Sender::abandon_opened)"]
pub struct OpenedFrame {
    sender: u64,
    slot: u32,
    role: QueueRole,
    family: u32,
    ready: u64,
    /// The sender's "opened" timeline (kept alive for `ready`).
    opened: Arc<TimelineSemaphore>,
}

impl OpenedFrame {
    /// The slot's index ([`Sender::resources`] has its buffer or image).
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The queue family the slot is acquired for: the application writes
    /// it on a queue of this family only.
    pub fn queue_family(&self) -> u32 {
        self.family
    }

    /// The role whose queue opened the slot, and releases it.
    pub fn role(&self) -> QueueRole {
        self.role
    }

    /// The timeline value the application's writes wait for on the GPU
    /// (reached already when the slot was opened; waiting for it orders
    /// the acquire's memory dependency before the writes on another
    /// queue). `raw()` of the semaphore is the `VkSemaphore` to name in a
    /// submission; it stays valid while this frame lives.
    pub fn ready(&self) -> (&TimelineSemaphore, u64) {
        (&self.opened, self.ready)
    }
}

impl std::fmt::Debug for OpenedFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedFrame")
            .field("slot", &self.slot)
            .field("queue_family", &self.family)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> Sender<M, R> {
    /// Publishes an opened frame ([`WriteSlot::open_detached`]) as
    /// [`OpenSlot::present`] does (the same close): one submission on the
    /// opening role's queue waits on the GPU for `written` (the
    /// application's timeline value, signalled after its last write of the
    /// slot; a timeline of this sender's context), releases the slot to
    /// the external family, signals "produced", and is waited for
    /// (bounded); then the frame is announced with `timestamp_ns`. Returns
    /// its sequence number; frames are numbered in the order they are
    /// presented.
    ///
    /// Refused ([`vk_export::Error::InvalidArgument`]) and spent: a frame
    /// of another sender (this sender is unchanged; the other keeps that
    /// slot out of its ring). Refused ([`vk_export::Error::ForeignResource`])
    /// before anything is submitted: `written` of another context; the
    /// frame is spent and its slot stays out of the ring (the
    /// application's writes may be pending: nothing releases it under
    /// them). A present that times out keeps its number (the release still
    /// runs once `written` arrives, and receivers count the gap); another
    /// error releases the slot unnumbered, as [`OpenSlot::present`] does.
    pub fn present_opened(
        &mut self,
        frame: OpenedFrame,
        timestamp_ns: u64,
        written: (&TimelineSemaphore, u64),
    ) -> Result<u64, SenderError> {
        let s = self.check_outside(frame.sender, frame.slot, Outside::Opened)?;
        if !self.ctx.is_same(written.0.context()) {
            return Err(vk_export::Error::ForeignResource(format!(
                "the written timeline of opened slot {} belongs to another Context: signal a \
                 timeline of the sender's context; the slot stays out of the ring",
                frame.slot
            ))
            .into());
        }
        self.outside[s] = None;
        frame.reopen(self).present(timestamp_ns, written)
    }

    /// Releases an opened frame's slot unpresented, as an [`OpenSlot`]
    /// dropped unpresented is (the same close: a release to the external
    /// family on the opening role's queue, bounded), and puts it back into
    /// the ring; no frame is numbered. A frame of another sender is
    /// refused and spent, as in [`Sender::present_opened`].
    ///
    /// # Safety
    /// No submission of the application that writes the slot is pending:
    /// none was submitted, or every one has completed (the application
    /// knows it from its fence or its timeline's value). The release does
    /// not wait for the application's work; a write still running would
    /// race the release and the next frame written into the slot.
    pub unsafe fn abandon_opened(&mut self, frame: OpenedFrame) -> Result<(), SenderError> {
        let s = self.check_outside(frame.sender, frame.slot, Outside::Opened)?;
        self.outside[s] = None;
        frame.reopen(self).release_unpresented()
    }
}

impl OpenedFrame {
    /// The [`OpenSlot`] this frame was, on `sender` (checked by the
    /// caller to be its own, and taken back into the ring's bookkeeping).
    fn reopen<M: MemoryLocation, R: SlotResource<M>>(
        self,
        sender: &mut Sender<M, R>,
    ) -> OpenSlot<'_, M, R> {
        OpenSlot {
            sender,
            slot: self.slot,
            role: self.role,
            family: self.family,
            ready: self.ready,
            closed: false,
        }
    }
}

/// A frame recorded into the application's command buffer
/// ([`WriteSlot::record_into`]), presented with
/// [`Sender::present_recorded`] once that command buffer completed (or
/// abandoned with [`Sender::abandon_recorded`] if it is never submitted).
/// Dropped instead, its slot stays out of the ring for the sender's life.
#[must_use = "present the frame (Sender::present_recorded) once its command buffer completed"]
#[derive(Debug)]
pub struct RecordedFrame {
    pub(super) sender: u64,
    pub(super) slot: u32,
    /// The slot's owner before the recording (what abandoning restores).
    pub(super) was_released: bool,
}

impl RecordedFrame {
    /// The slot's index.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

/// A slot opened for the application's own submissions
/// ([`WriteSlot::open`]): acquired for [`OpenSlot::queue_family`] until
/// [`OpenSlot::present`] releases it and publishes the frame. Dropped
/// without presenting, it is released (bounded, on the same queue) and
/// left free with no frame numbered: work the application submitted that
/// writes it must have completed by then (it would write a later frame).
pub struct OpenSlot<'a, M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    sender: &'a mut Sender<M, R>,
    slot: u32,
    role: QueueRole,
    family: u32,
    ready: u64,
    /// Released to the external family (or its release submitted).
    closed: bool,
}

impl<M: MemoryLocation, R: SlotResource<M>> OpenSlot<'_, M, R> {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The slot's buffer or image.
    pub fn resource(&self) -> &R {
        &self.sender.slots[self.slot as usize]
    }

    /// The queue family the slot is acquired for: the application writes
    /// it on a queue of this family only.
    pub fn queue_family(&self) -> u32 {
        self.family
    }

    /// The timeline value the application's writes wait for on the GPU
    /// (already reached when `open` returned; waiting for it orders the
    /// acquire's memory dependency before the writes on another queue).
    pub fn ready(&self) -> (&TimelineSemaphore, u64) {
        (
            self.sender.opened.as_deref().expect("made by open"),
            self.ready,
        )
    }

    /// The sequence number the frame gets when presented.
    pub fn sequence(&self) -> u64 {
        self.sender.stats.presented + 1
    }

    /// Publishes the frame: one submission on the opening role's queue
    /// waits on the GPU for `written` (the application's timeline value,
    /// signalled after its last write; a timeline of the sender's context),
    /// releases the slot to the external family, signals "produced", and is
    /// waited for (bounded); then the frame is announced with
    /// `timestamp_ns`. Returns its sequence number. A present whose
    /// submission timed out keeps its number (receivers count the gap);
    /// one refused before anything was submitted (a `written` timeline of
    /// another context, [`vk_export::Error::ForeignResource`]; a call from
    /// inside `Context::with_queue`; a failed submission) waited for
    /// nothing, and the application's writes may still be running: the slot
    /// is not released under them but kept out of the ring for the
    /// sender's life (and leaked at its drop, as an opened frame's is).
    pub fn present(
        mut self,
        timestamp_ns: u64,
        written: (&TimelineSemaphore, u64),
    ) -> Result<u64, SenderError> {
        if !self.sender.ctx.is_same(written.0.context()) {
            self.sender.outside[self.slot as usize] = Some(Outside::Opened);
            self.closed = true;
            return Err(vk_export::Error::ForeignResource(format!(
                "the written timeline of opened slot {} belongs to another Context: signal a \
                 timeline of the sender's context; the slot stays out of the ring",
                self.slot
            ))
            .into());
        }
        self.close_and_announce(timestamp_ns, Some(written))
    }

    /// Releases the slot (after a GPU wait for `written`, if given),
    /// signals "produced" and announces the frame.
    fn close_and_announce(
        mut self,
        timestamp_ns: u64,
        written: Option<(&TimelineSemaphore, u64)>,
    ) -> Result<u64, SenderError> {
        let f = self.sender.stats.presented + 1;
        let closed = self.sender.close(self.slot, self.role, written, Some(f));
        // Released (or its release submitted): the drop must not release
        // it again.
        self.closed = self.sender.released_to_external[self.slot as usize];
        if closed.is_err() && !self.closed && written.is_some() {
            // Nothing submitted, so nothing waited for `written`: the
            // application's writes may still run. The drop would release
            // the slot under them; it is kept out of the ring instead (for
            // the sender's life, as for a timeline of another context).
            self.sender.outside[self.slot as usize] = Some(Outside::Opened);
            self.closed = true;
        }
        closed?;
        self.sender.announce(self.slot, f, timestamp_ns);
        Ok(f)
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> OpenSlot<'_, M, R> {
    /// Releases the slot unpresented (once: nothing after a close), no
    /// frame numbered: what the drop does.
    fn release_unpresented(&mut self) -> Result<(), SenderError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.sender.close(self.slot, self.role, None, None)
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> Drop for OpenSlot<'_, M, R> {
    fn drop(&mut self) {
        if let Err(e) = self.release_unpresented() {
            self.sender.note(format!(
                "slot {} opened and dropped unpresented: its release failed: {e}",
                self.slot
            ));
        }
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> std::fmt::Debug for OpenSlot<'_, M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSlot")
            .field("slot", &self.slot)
            .field("queue_family", &self.family)
            .field("ready", &self.ready)
            .finish()
    }
}
