//! Blocking helpers that fill, clear and read back resources with one-shot
//! submissions, release them to `VK_QUEUE_FAMILY_EXTERNAL`, and signal
//! binary semaphores.
//!
//! # Contract
//!
//! * **Identity.** A resource or semaphore of another [`Context`] is
//!   [`Error::ForeignResource`]; nothing is submitted.
//! * **Borrowed synchronisation.** [`SubmitSync`] borrows its semaphores for
//!   as long as it lives, so a submission can never name a destroyed one;
//!   binary waits take a [`BinarySignal`] token of the same payload.
//! * **Bounded.** Each helper waits for its submission at most
//!   [`SubmitSync::timeout`]; on [`Error::Timeout`] the submission may still
//!   run later, the resources it uses stay alive until it does (their `Drop`
//!   waits for it), and the context stays usable, though later submissions
//!   queue behind the stuck one until what it waits for arrives.
//!   [`Context::signal_binary`] submits nothing until its timeline waits are
//!   reached, so no binary wait can ever depend on a signal nobody submitted.
//! * **No self-deadlock.** A helper or [`Context::with_queue`] called from
//!   inside `with_queue` or a `submit_and_wait` recording closure of the same
//!   context is refused ([`Error::InvalidArgument`]).
//! * **Timeline values.** A submitted signal must be above the current value
//!   and every value this crate submitted before; a host signal is refused
//!   while a signal this crate submitted is pending.
//! * **Tracked.** Every resource and semaphore a helper uses records the
//!   submission's progress value (see [`crate::submit`]).
//!
//! These are conveniences for tools, tests and simple pipelines. A renderer
//! records the same barriers into its own command buffers instead
//! ([`ExportableImage::raw`] gives the handle).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ash::vk;

use crate::buffer::ExportableBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::image::ExportableImage;
use crate::ownership::{
    acquire_families, buffer_barrier, host_read_barrier, image_barrier, Owner, SharedLayout,
    SourceImage,
};
use crate::planar::ExportablePlanarImage;
use crate::queues::QueueRole;
use crate::semaphore::{Binary, Semaphore, SignalGuard, Timeline};
use crate::submit::{Completion, LastUse, RawSync};
use crate::wait::WaitStrategy;
use interop_share::format::{Format, Plane};
use interop_share::markers::{HostVisible, MemoryLocation, Tiling, Usage};
use interop_share::token::BinarySignal;

/// A semaphore wait of a submission.
#[derive(Debug)]
enum Wait<'a> {
    Timeline(&'a Semaphore<Timeline>, u64),
    Binary(&'a Semaphore<Binary>, BinarySignal),
}

/// Semaphores a helper's submission waits for and signals, and how long the
/// helper waits for the submission. Borrows every semaphore it names.
///
/// ```no_run
/// # use vk_export::*;
/// # fn f(ctx: &Context, image: &ExportableImage<format::Rgba8Unorm>, t: &TimelineSemaphore) -> Result<()> {
/// // Wait for CUDA's value 1, clear, then tell CUDA with value 2.
/// let sync = SubmitSync::new().wait_timeline(t, 1).signal_timeline(t, 2);
/// ctx.clear_image(image, ash::vk::ClearColorValue::default(), sync)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SubmitSync<'a> {
    waits: Vec<Wait<'a>>,
    signals: Vec<(&'a Semaphore<Timeline>, u64)>,
    timeout: Duration,
    host_wait: WaitStrategy,
}

impl Default for SubmitSync<'_> {
    fn default() -> Self {
        SubmitSync::new()
    }
}

impl<'a> SubmitSync<'a> {
    /// How long a helper waits for its submission unless told otherwise.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// No semaphores, [`SubmitSync::DEFAULT_TIMEOUT`].
    pub fn new() -> Self {
        SubmitSync {
            waits: Vec::new(),
            signals: Vec::new(),
            timeout: Self::DEFAULT_TIMEOUT,
            host_wait: WaitStrategy::Block,
        }
    }

    /// Waits (at all stages) until `semaphore` reaches `value`.
    pub fn wait_timeline(mut self, semaphore: &'a Semaphore<Timeline>, value: u64) -> Self {
        self.waits.push(Wait::Timeline(semaphore, value));
        self
    }

    /// Waits for the binary signal `signal` of `semaphore` and consumes it.
    pub fn wait_binary(mut self, semaphore: &'a Semaphore<Binary>, signal: BinarySignal) -> Self {
        self.waits.push(Wait::Binary(semaphore, signal));
        self
    }

    /// Signals `value` on `semaphore` when the commands complete.
    pub fn signal_timeline(mut self, semaphore: &'a Semaphore<Timeline>, value: u64) -> Self {
        self.signals.push((semaphore, value));
        self
    }

    /// Waits at most `timeout` for the submission.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How the host waits for the submission ([`WaitStrategy::Block`] by
    /// default: `vkWaitForFences`, no CPU, the driver's wake-up latency;
    /// [`WaitStrategy::Poll`] reads the fence's status, spinning first,
    /// for the lowest latency at some CPU).
    pub fn host_wait(mut self, strategy: WaitStrategy) -> Self {
        self.host_wait = strategy;
        self
    }

    /// Checks identity and tokens, and lays out the raw arrays.
    fn raw(&self, ctx: &Context) -> Result<RawSync> {
        let mut raw = RawSync::default();
        for wait in &self.waits {
            let (semaphore, value) = match wait {
                Wait::Timeline(s, v) => (s.raw(), *v),
                Wait::Binary(s, signal) => {
                    ctx.check_owns(s.context(), "a binary semaphore to wait for")?;
                    s.payload().check_on(signal, s.handle_id)?;
                    (s.raw(), 0)
                }
            };
            if let Wait::Timeline(s, _) = wait {
                ctx.check_owns(s.context(), "a timeline semaphore to wait for")?;
            }
            raw.wait_semaphores.push(semaphore);
            raw.wait_values.push(value);
        }
        for (s, value) in &self.signals {
            ctx.check_owns(s.context(), "a timeline semaphore to signal")?;
            raw.signal_semaphores.push(s.raw());
            raw.signal_values.push(*value);
        }
        Ok(raw)
    }

    /// Waits on the host, within the timeout (all of it, not each), until
    /// every timeline value this submission waits for has been reached.
    fn wait_timelines_on_host(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        for wait in &self.waits {
            if let Wait::Timeline(s, value) = wait {
                let left = deadline.saturating_duration_since(Instant::now());
                s.wait(*value, left, WaitStrategy::default())
                    .map_err(|e| match e {
                        Error::Timeout(_) => Error::Timeout(self.timeout),
                        e => e,
                    })?;
            }
        }
        Ok(())
    }

    /// Locks every semaphore this submission signals (each once) and checks
    /// its value, so that no other signal of this process can slip between
    /// the check and the submission.
    fn lock_signals(&self) -> Result<Vec<SignalGuard<'a>>> {
        crate::semaphore::lock_signals(self.signals.iter().map(|(s, v)| (*s, *v)))
    }

    /// After a successful submission on `lane`: every semaphore records it,
    /// and binary tokens are consumed (their waits are now submitted).
    fn submitted(self, lane: usize, value: u64) {
        for wait in self.waits {
            match wait {
                Wait::Timeline(s, _) => s.last_use.note(lane, value),
                Wait::Binary(s, signal) => {
                    s.last_use.note(lane, value);
                    // SAFETY: the submission that waits for this signal was
                    // just submitted successfully. `raw` checked the token.
                    let _ = unsafe { s.payload().consume(signal) };
                }
            }
        }
        for (s, signalled) in self.signals {
            s.last_use.note(lane, value);
            s.last_submitted_signal
                .fetch_max(signalled, Ordering::AcqRel);
        }
    }
}

/// Where a helper's bytes go or come from.
enum Staged<'d> {
    None,
    Upload(&'d [u8]),
    Download(u64),
}

/// The Vulkan handle of a tracked resource.
#[derive(Clone, Copy)]
enum Handle {
    Image(vk::Image),
    Buffer(vk::Buffer),
}

/// The image or buffer a helper touches: its handle, ownership and uses.
struct Tracked<'r> {
    handle: Handle,
    owner: &'r Mutex<Owner>,
    last_use: &'r LastUse,
}

impl<'r, F, T, M, U> From<&'r ExportableImage<F, T, M, U>> for Tracked<'r> {
    fn from(image: &'r ExportableImage<F, T, M, U>) -> Self {
        Tracked {
            handle: Handle::Image(image.inner.image),
            owner: &image.inner.owner,
            last_use: &image.inner.last_use,
        }
    }
}

impl<'r, P, M> From<&'r ExportablePlanarImage<P, M>> for Tracked<'r> {
    fn from(image: &'r ExportablePlanarImage<P, M>) -> Self {
        Tracked {
            handle: Handle::Image(image.inner.image),
            owner: &image.inner.owner,
            last_use: &image.inner.last_use,
        }
    }
}

impl<'r, M> From<&'r ExportableBuffer<M>> for Tracked<'r> {
    fn from(buffer: &'r ExportableBuffer<M>) -> Self {
        Tracked {
            handle: Handle::Buffer(buffer.inner.buffer),
            owner: &buffer.inner.owner,
            last_use: &buffer.inner.last_use,
        }
    }
}

/// Which queue a helper submits to.
#[derive(Clone, Copy)]
enum Placement {
    /// `role`'s queue.
    Role(QueueRole),
    /// The queue of the family that owns the resource now, or `role`'s
    /// queue if no family of the context does (a release: recorded where
    /// the resource is, with no second family involved).
    WhereOwned(QueueRole),
}

/// A helper's access to its resource while it records: the resource's
/// ownership (its lock held for the whole helper) and the family recording.
struct Access<'g> {
    device: &'g ash::Device,
    handle: Handle,
    owner: &'g mut Owner,
    family: u32,
}

impl Access<'_> {
    /// Records the acquisition of the resource for this family, an image
    /// into `layout` (buffers: ignored).
    fn take(&mut self, cmd: vk::CommandBuffer, layout: vk::ImageLayout) {
        let families = acquire_families(*self.owner, self.family);
        match self.handle {
            Handle::Image(image) => {
                image_barrier(
                    self.device,
                    cmd,
                    image,
                    self.owner.layout(),
                    layout,
                    families,
                );
                *self.owner = Owner::Family(self.family, layout);
            }
            Handle::Buffer(buffer) => {
                buffer_barrier(self.device, cmd, buffer, families);
                *self.owner = Owner::Family(self.family, vk::ImageLayout::UNDEFINED);
            }
        }
    }

    /// Records the acquire half of the resource's transfer from `from`
    /// (released there, in the same layout, by `release_to_family`).
    fn take_transferred(&mut self, cmd: vk::CommandBuffer, from: u32) {
        let layout = self.owner.layout();
        match self.handle {
            Handle::Image(image) => {
                image_barrier(self.device, cmd, image, layout, layout, (from, self.family))
            }
            Handle::Buffer(buffer) => buffer_barrier(self.device, cmd, buffer, (from, self.family)),
        }
        *self.owner = Owner::Family(self.family, layout);
    }

    /// Records the release of the resource (an image in `GENERAL`) to
    /// `VK_QUEUE_FAMILY_EXTERNAL`, acquiring it first if it was released.
    fn release_external(&mut self, cmd: vk::CommandBuffer) {
        if let Owner::External(_) = *self.owner {
            self.take(cmd, vk::ImageLayout::GENERAL);
        }
        let families = (self.family, vk::QUEUE_FAMILY_EXTERNAL);
        match self.handle {
            Handle::Image(image) => {
                let general = vk::ImageLayout::GENERAL;
                image_barrier(
                    self.device,
                    cmd,
                    image,
                    self.owner.layout(),
                    general,
                    families,
                );
                *self.owner = Owner::External(general);
            }
            Handle::Buffer(buffer) => {
                buffer_barrier(self.device, cmd, buffer, families);
                *self.owner = Owner::External(vk::ImageLayout::UNDEFINED);
            }
        }
    }
}

impl Context {
    /// The one path every helper takes: checks, picks the queue, moves the
    /// resource to its family, records, submits, tracks and waits; returns
    /// the downloaded bytes, if any.
    fn submit_tracked(
        &self,
        placement: Placement,
        sync: SubmitSync<'_>,
        resource: Option<Tracked<'_>>,
        staged: Staged<'_>,
        record: impl FnOnce(vk::CommandBuffer, vk::Buffer, Option<&mut Access<'_>>),
    ) -> Result<Vec<u8>> {
        let _held = self.hold("a helper")?;
        let raw = sync.raw(self)?;
        let (timeout, host_wait) = (sync.timeout, sync.host_wait);
        let inner = &self.inner;
        // Held for the whole helper: no other helper can move the resource
        // between this one's release on another family and its acquire.
        let mut owner = resource
            .as_ref()
            .map(|r| r.owner.lock().unwrap_or_else(|p| p.into_inner()));
        let lane = match placement {
            Placement::Role(role) => self.lane_of(role),
            Placement::WhereOwned(role) => match owner.as_deref() {
                Some(Owner::Family(f, _)) => self.lane_of_family(*f).unwrap_or(self.lane_of(role)),
                _ => self.lane_of(role),
            },
        };
        let family = inner.lanes[lane].family;
        let mut engine = inner.lanes[lane]
            .engine
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _signals = sync.lock_signals()?;
        let slot = engine.slot(&inner.device, family)?;
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let find = |bits| self.memory_type(bits, host, vk::MemoryPropertyFlags::empty());
        let fits = |size, index| crate::memory::check_fits_heap(self, size, index);
        let (staging, ptr) = match staged {
            Staged::None => (vk::Buffer::null(), std::ptr::null_mut()),
            Staged::Upload(data) => {
                let (buffer, ptr) =
                    slot.ensure_staging(&inner.device, data.len() as u64, find, fits)?;
                // SAFETY: the staging mapping holds at least data.len() bytes
                // and the slot is idle (its last submission completed).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
                (buffer, ptr)
            }
            Staged::Download(len) => slot.ensure_staging(&inner.device, len, find, fits)?,
        };
        let mut sync = Some(sync);
        let last_use = resource.as_ref().map(|r| r.last_use);
        engine.run(
            &inner.device,
            &inner.lanes,
            lane,
            &raw,
            Completion::Wait(timeout, host_wait),
            |cmd| {
                let mut access = match (&resource, owner.as_deref_mut()) {
                    (Some(r), Some(owner)) => Some(Access {
                        device: &inner.device,
                        handle: r.handle,
                        owner,
                        family,
                    }),
                    _ => None,
                };
                if let (Some(a), Some(r)) = (access.as_mut(), &resource) {
                    if let Some(from) = a.owner.other_family(family) {
                        self.release_to_family(r, from, family, a.owner.layout())?;
                        a.take_transferred(cmd, from);
                    }
                }
                record(cmd, staging, access.as_mut());
                Ok(())
            },
            |value| {
                if let Some(u) = last_use {
                    u.note(lane, value);
                }
                if let Some(s) = sync.take() {
                    s.submitted(lane, value);
                }
            },
        )?;
        match staged {
            Staged::Download(len) => {
                let len = usize::try_from(len)
                    .map_err(|_| Error::InvalidArgument(format!("{len} bytes")))?;
                let mut out = vec![0u8; len];
                // SAFETY: the copy completed (fence waited); coherent memory
                // of at least `len` bytes, not written by anything now.
                unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), len) };
                Ok(out)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Submits, on a queue of `from` (another family of this context that
    /// owns the resource), the release half of its transfer to `to`, with
    /// no layout change; not waited for: the acquiring submission waits for
    /// it on the GPU (every submission waits for the other queues' latest).
    fn release_to_family(
        &self,
        resource: &Tracked<'_>,
        from: u32,
        to: u32,
        layout: vk::ImageLayout,
    ) -> Result<()> {
        let inner = &self.inner;
        let lane = self.lane_of_family(from).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the resource is owned by queue family {from}, which this context has no queue of"
            ))
        })?;
        let mut handoff = inner.lanes[lane]
            .handoff
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        handoff.run(
            &inner.device,
            &inner.lanes,
            lane,
            &RawSync::default(),
            Completion::DontWait,
            |cmd| {
                match resource.handle {
                    Handle::Image(image) => {
                        image_barrier(&inner.device, cmd, image, layout, layout, (from, to))
                    }
                    Handle::Buffer(buffer) => {
                        buffer_barrier(&inner.device, cmd, buffer, (from, to))
                    }
                }
                Ok(())
            },
            |value| resource.last_use.note(lane, value),
        )
    }

    /// The lane of a queue of `family`, if the context has one.
    fn lane_of_family(&self, family: u32) -> Option<usize> {
        self.inner.lanes.iter().position(|l| l.family == family)
    }

    fn check_image<F, T, M, U>(&self, image: &ExportableImage<F, T, M, U>) -> Result<()> {
        self.check_owns(&image.inner.ctx, "the image")
    }

    fn check_buffer<M>(&self, buffer: &ExportableBuffer<M>) -> Result<()> {
        self.check_owns(&buffer.inner.ctx, "the buffer")
    }

    /// Records commands with `record` on the main queue, submits them with
    /// `sync`, and waits (bounded) until they complete. The closure gets the
    /// device and a command buffer in the recording state.
    ///
    /// Resources the closure's commands use are not tracked by this crate:
    /// on [`Error::Timeout`] the commands may still run, so whatever they use
    /// must stay alive until they complete (the `unsafe` recording calls in
    /// the closure are where the caller promises that).
    pub fn submit_and_wait(
        &self,
        sync: SubmitSync<'_>,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        self.submit_and_wait_on(QueueRole::Main, sync, |device, cmd, _| record(device, cmd))
    }

    /// [`Context::submit_and_wait`] on `role`'s queue; the closure also gets
    /// that queue's family (for the queue-family ownership transfers its
    /// barriers record). On [`QueueRole::Transfer`] record only commands a
    /// transfer queue supports, unless [`Context::queue_family_of`] says
    /// the family is the main one.
    pub fn submit_and_wait_on(
        &self,
        role: QueueRole,
        sync: SubmitSync<'_>,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer, u32),
    ) -> Result<()> {
        let family = self.queue_family_of(role);
        self.submit_tracked(
            Placement::Role(role),
            sync,
            None,
            Staged::None,
            |cmd, _, _| record(&self.inner.device, cmd, family),
        )
        .map(drop)
    }

    fn copy_region(level: u32, layer: u32, extent: [u32; 3]) -> vk::BufferImageCopy {
        vk::BufferImageCopy {
            buffer_offset: 0,
            buffer_row_length: 0,
            buffer_image_height: 0,
            image_subresource: vk::ImageSubresourceLayers {
                aspect_mask: vk::ImageAspectFlags::COLOR,
                mip_level: level,
                base_array_layer: layer,
                layer_count: 1,
            },
            image_offset: vk::Offset3D::default(),
            image_extent: vk::Extent3D {
                width: extent[0],
                height: extent[1],
                depth: extent[2],
            },
        }
    }

    fn level_bytes(info: &crate::ImageInfo, level: u32, layer: u32) -> Result<(u64, [u32; 3])> {
        let out_of_range = || {
            Error::InvalidArgument(format!(
                "level {level} layer {layer} of an image with {} levels and {} layers",
                info.mip_levels(),
                info.array_layers()
            ))
        };
        if layer >= info.array_layers() {
            return Err(out_of_range());
        }
        let extent = info.level_extent(level).ok_or_else(out_of_range)?;
        let bytes = info.level_bytes(level).ok_or_else(out_of_range)?;
        Ok((bytes, extent))
    }

    /// Uploads tightly packed texels into one level and layer of `image`.
    pub fn write_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        level: u32,
        layer: u32,
        data: &[u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_image(image)?;
        let (bytes, extent) = Self::level_bytes(&image.inner.info, level, layer)?;
        if data.len() as u64 != bytes {
            return Err(Error::InvalidArgument(format!(
                "level {level} needs {bytes} bytes of tightly packed texels, got {}",
                data.len()
            )));
        }
        let place = Placement::Role(QueueRole::Transfer);
        let upload = Staged::Upload(data);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            upload,
            |cmd, staging, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                a.take(cmd, vk::ImageLayout::TRANSFER_DST_OPTIMAL);
                // SAFETY: recording; the image is in TRANSFER_DST_OPTIMAL and the
                // staging buffer holds the bytes.
                unsafe {
                    self.inner.device.cmd_copy_buffer_to_image(
                        cmd,
                        staging,
                        image.inner.image,
                        vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                        &[Self::copy_region(level, layer, extent)],
                    )
                };
                a.take(cmd, vk::ImageLayout::GENERAL);
            },
        )
        .map(drop)
    }

    /// Reads one level and layer of `image` back as tightly packed texels.
    pub fn read_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        level: u32,
        layer: u32,
        sync: SubmitSync<'_>,
    ) -> Result<Vec<u8>> {
        self.check_image(image)?;
        let (bytes, extent) = Self::level_bytes(&image.inner.info, level, layer)?;
        let place = Placement::Role(QueueRole::Transfer);
        let download = Staged::Download(bytes);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            download,
            |cmd, staging, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                // GENERAL, not TRANSFER_SRC_OPTIMAL: reading back a released
                // image (already GENERAL) changes no layout, so readers in
                // other processes or devices reading one frame at once do not
                // race on a layout transition of the shared memory.
                a.take(cmd, vk::ImageLayout::GENERAL);
                // SAFETY: recording; the image is in GENERAL (a valid copy
                // source layout) and the staging buffer has room for the bytes.
                unsafe {
                    self.inner.device.cmd_copy_image_to_buffer(
                        cmd,
                        image.inner.image,
                        vk::ImageLayout::GENERAL,
                        staging,
                        &[Self::copy_region(level, layer, extent)],
                    )
                };
            },
        )
    }

    /// Copies `source` (an application's own image of the same format:
    /// the type says so) into level 0, layer 0 of `image`, whose extent is
    /// the region copied; on the queue [`SourceImage::check_copy`] picks
    /// (the transfer queue for a `CONCURRENT` source or one its family
    /// owns). `image` is left in `GENERAL` owned by that queue's family;
    /// the source in its layout, with its owner. A region that does not
    /// fit the source, or a source no queue of the context may access, is
    /// refused before anything is recorded.
    pub fn copy_image_from<F: Format, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        source: &SourceImage<F>,
        image: &ExportableImage<F, T, M, U>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_image(image)?;
        let [w, h, depth] = image.inner.info.extent();
        if depth != 1 {
            return Err(Error::InvalidArgument(format!(
                "a copy from a 2D source into an image of depth {depth}"
            )));
        }
        let extent = [w, h];
        let role = source.check_copy(self, extent)?;
        self.submit_tracked(
            Placement::Role(role),
            sync,
            Some(image.into()),
            Staged::None,
            |cmd, _, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                a.take(cmd, vk::ImageLayout::GENERAL);
                // SAFETY: check_copy returned `role`, and this command
                // buffer is for that role's queue; the image is this
                // context's (checked), of format F, with transfer usage
                // (every preset), of `extent`, in GENERAL owned by this
                // family after `take`; it outlives the submission (its
                // drop waits for it); the source's facts are its
                // constructor's contract.
                unsafe {
                    source.record_copy_to(
                        &self.inner.device,
                        cmd,
                        a.family,
                        image.inner.image,
                        extent,
                    )
                };
                a.take(cmd, vk::ImageLayout::GENERAL);
            },
        )
        .map(drop)
    }

    /// Clears every level and layer of `image` to `color`.
    pub fn clear_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        color: vk::ClearColorValue,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_image(image)?;
        // vkCmdClearColorImage needs a graphics or compute queue.
        let place = Placement::Role(QueueRole::Main);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            Staged::None,
            |cmd, _, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                a.take(cmd, vk::ImageLayout::TRANSFER_DST_OPTIMAL);
                let range = vk::ImageSubresourceRange {
                    aspect_mask: vk::ImageAspectFlags::COLOR,
                    base_mip_level: 0,
                    level_count: vk::REMAINING_MIP_LEVELS,
                    base_array_layer: 0,
                    layer_count: vk::REMAINING_ARRAY_LAYERS,
                };
                // SAFETY: recording; the image is in TRANSFER_DST_OPTIMAL.
                unsafe {
                    self.inner.device.cmd_clear_color_image(
                        cmd,
                        image.inner.image,
                        vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                        &color,
                        &[range],
                    )
                };
                a.take(cmd, vk::ImageLayout::GENERAL);
            },
        )
        .map(drop)
    }

    /// The copy region of a whole plane of a two-plane image, and its bytes.
    fn plane_region<P, M>(
        image: &ExportablePlanarImage<P, M>,
        plane: Plane,
    ) -> (vk::BufferImageCopy, u64) {
        let info = &image.inner.info;
        let [width, height] = info.plane_extent(plane);
        let mut region = Self::copy_region(0, 0, [width, height, 1]);
        region.image_subresource.aspect_mask = plane.aspect();
        (region, info.plane_bytes(plane))
    }

    /// Uploads tightly packed texels of `plane`'s format (R8 / R8G8 for
    /// NV12, R16 / R16G16 for P010: Cb before Cr) into that plane of
    /// `image`; the other plane is left as it is.
    pub fn write_plane<P, M: MemoryLocation>(
        &self,
        image: &ExportablePlanarImage<P, M>,
        plane: Plane,
        data: &[u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_owns(&image.inner.ctx, "the two-plane image")?;
        let (region, bytes) = Self::plane_region(image, plane);
        if data.len() as u64 != bytes {
            return Err(Error::InvalidArgument(format!(
                "the {plane:?} plane needs {bytes} bytes of tightly packed texels, got {}",
                data.len()
            )));
        }
        let place = Placement::Role(QueueRole::Transfer);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            Staged::Upload(data),
            |cmd, staging, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                a.take(cmd, vk::ImageLayout::TRANSFER_DST_OPTIMAL);
                // SAFETY: recording; the image (both planes) is in
                // TRANSFER_DST_OPTIMAL, the region names one plane's aspect
                // and its whole extent, and the staging buffer holds the bytes.
                unsafe {
                    self.inner.device.cmd_copy_buffer_to_image(
                        cmd,
                        staging,
                        image.inner.image,
                        vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                        &[region],
                    )
                };
                a.take(cmd, vk::ImageLayout::GENERAL);
            },
        )
        .map(drop)
    }

    /// Reads `plane` of `image` back as tightly packed texels of the
    /// plane's format.
    pub fn read_plane<P, M: MemoryLocation>(
        &self,
        image: &ExportablePlanarImage<P, M>,
        plane: Plane,
        sync: SubmitSync<'_>,
    ) -> Result<Vec<u8>> {
        self.check_owns(&image.inner.ctx, "the two-plane image")?;
        let (region, bytes) = Self::plane_region(image, plane);
        let place = Placement::Role(QueueRole::Transfer);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            Staged::Download(bytes),
            |cmd, staging, a| {
                let a = a.expect("submit_tracked passes the resource it was given");
                // GENERAL, as read_image: no layout change on a released image.
                a.take(cmd, vk::ImageLayout::GENERAL);
                // SAFETY: recording; the image is in GENERAL (a valid copy
                // source layout), the region names one plane, and the staging
                // buffer has room for its bytes.
                unsafe {
                    self.inner.device.cmd_copy_image_to_buffer(
                        cmd,
                        image.inner.image,
                        vk::ImageLayout::GENERAL,
                        staging,
                        &[region],
                    )
                };
            },
        )
    }

    /// Releases both planes of `image` to `VK_QUEUE_FAMILY_EXTERNAL` in
    /// `GENERAL` layout, as [`Context::release_image`] does for an image.
    pub fn release_planar_image<P, M: MemoryLocation>(
        &self,
        image: &ExportablePlanarImage<P, M>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_owns(&image.inner.ctx, "the two-plane image")?;
        self.submit_tracked(
            Placement::WhereOwned(QueueRole::Transfer),
            sync,
            Some(image.into()),
            Staged::None,
            |cmd, _, a| {
                a.expect("submit_tracked passes the resource it was given")
                    .release_external(cmd);
            },
        )
        .map(drop)
    }

    /// Releases `image` to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` layout, so
    /// CUDA or another process may use it. The next helper that touches it
    /// acquires it back. `sync`'s signals tell the other side when it may start.
    pub fn release_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_image(image)?;
        let place = Placement::WhereOwned(QueueRole::Transfer);
        self.submit_tracked(
            place,
            sync,
            Some(image.into()),
            Staged::None,
            |cmd, _, a| {
                a.expect("submit_tracked passes the resource it was given")
                    .release_external(cmd);
            },
        )
        .map(drop)
    }

    /// Marks `image` as owned by `VK_QUEUE_FAMILY_EXTERNAL` in `layout`
    /// without a barrier: for an importer whose exporter released it.
    ///
    /// # Safety
    /// The image's memory was released to `VK_QUEUE_FAMILY_EXTERNAL` in
    /// exactly `layout` by its last user (the exporter's
    /// [`Context::release_image`] uses [`SharedLayout::General`]), and that
    /// release happens before this context's next use of the image (a
    /// semaphore orders them). A wrong layout makes later barriers invalid.
    pub unsafe fn assume_image_released<F, T, M, U>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        layout: SharedLayout,
    ) -> Result<()> {
        self.check_image(image)?;
        *image.inner.owner.lock().unwrap_or_else(|p| p.into_inner()) = Owner::External(layout.vk());
        Ok(())
    }

    /// Marks `buffer` as owned by `VK_QUEUE_FAMILY_EXTERNAL` without a
    /// barrier: for an importer whose exporter released it, so that this
    /// context's next use acquires it from there (and
    /// [`Context::release_buffer`] gives it back).
    ///
    /// # Safety
    /// The buffer's memory was released to `VK_QUEUE_FAMILY_EXTERNAL` by its
    /// last user (the exporter's [`Context::release_buffer`]), and that
    /// release happens before this context's next use of the buffer (a
    /// semaphore, or a host wait, orders them).
    pub unsafe fn assume_buffer_released<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
    ) -> Result<()> {
        self.check_buffer(buffer)?;
        *buffer.inner.owner.lock().unwrap_or_else(|p| p.into_inner()) =
            Owner::External(vk::ImageLayout::UNDEFINED);
        Ok(())
    }

    /// Uploads `data` at the start of `buffer`.
    pub fn write_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        data: &[u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_buffer(buffer)?;
        if data.len() as u64 > buffer.size() || data.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes into a buffer of {}",
                data.len(),
                buffer.size()
            )));
        }
        let place = Placement::Role(QueueRole::Transfer);
        let upload = Staged::Upload(data);
        self.submit_tracked(place, sync, Some(buffer.into()), upload, |cmd, src, a| {
            let a = a.expect("submit_tracked passes the resource it was given");
            a.take(cmd, vk::ImageLayout::UNDEFINED);
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: data.len() as u64,
            };
            // SAFETY: recording; both buffers are large enough.
            unsafe {
                self.inner
                    .device
                    .cmd_copy_buffer(cmd, src, buffer.raw(), &[region])
            };
            buffer_barrier(
                &self.inner.device,
                cmd,
                buffer.raw(),
                (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
            );
        })
        .map(drop)
    }

    /// Reads the first `len` bytes of `buffer`.
    pub fn read_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        len: u64,
        sync: SubmitSync<'_>,
    ) -> Result<Vec<u8>> {
        self.check_buffer(buffer)?;
        if len > buffer.size() || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes from a buffer of {}",
                buffer.size()
            )));
        }
        let place = Placement::Role(QueueRole::Transfer);
        let download = Staged::Download(len);
        self.submit_tracked(place, sync, Some(buffer.into()), download, |cmd, dst, a| {
            let a = a.expect("submit_tracked passes the resource it was given");
            a.take(cmd, vk::ImageLayout::UNDEFINED);
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: len,
            };
            // SAFETY: recording; both buffers are large enough.
            unsafe {
                self.inner
                    .device
                    .cmd_copy_buffer(cmd, buffer.raw(), dst, &[region])
            };
        })
    }

    /// Reads `out.len()` bytes from the start of a host-visible `buffer`
    /// through its host mapping, with no device copy: one submission
    /// acquires the buffer (as [`Context::read_buffer`] does) and makes
    /// the device's writes visible to the host, is waited for, then the
    /// bytes are copied out. Fewer copies than `read_buffer`, which copies
    /// on the device into staging memory first.
    pub fn read_buffer_mapped(
        &self,
        buffer: &ExportableBuffer<HostVisible>,
        out: &mut [u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        // Before anything is submitted: the copy's own check, early.
        buffer.check_span(0, out.len())?;
        self.make_buffer_host_readable(buffer, sync)?;
        // The submission made every device write before it visible to the
        // host, and completed.
        buffer.read_mapped(0, out)
    }

    /// Makes the device's writes of a host-visible `buffer` visible to host
    /// reads through its mapping: one submission acquires the buffer (as
    /// [`Context::read_buffer`] does) with a barrier whose destination is
    /// `HOST_READ`, and is waited for. What [`Context::read_buffer_mapped`]
    /// does before its copy, for a reader that reads the mapping in place
    /// ([`ExportableBuffer::mapped_ptr`]) or copies later
    /// ([`ExportableBuffer::read_mapped`]).
    pub fn make_buffer_host_readable(
        &self,
        buffer: &ExportableBuffer<HostVisible>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_buffer(buffer)?;
        let place = Placement::Role(QueueRole::Transfer);
        let device = &self.inner.device;
        self.submit_tracked(
            place,
            sync,
            Some(buffer.into()),
            Staged::None,
            |cmd, _, a| {
                a.expect("submit_tracked passes the resource it was given")
                    .take(cmd, vk::ImageLayout::UNDEFINED);
                host_read_barrier(device, cmd);
            },
        )
        .map(drop)
    }

    /// Releases `buffer` to `VK_QUEUE_FAMILY_EXTERNAL`.
    pub fn release_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.check_buffer(buffer)?;
        let place = Placement::WhereOwned(QueueRole::Transfer);
        self.submit_tracked(
            place,
            sync,
            Some(buffer.into()),
            Staged::None,
            |cmd, _, a| {
                a.expect("submit_tracked passes the resource it was given")
                    .release_external(cmd);
            },
        )
        .map(drop)
    }

    /// Signals the binary `semaphore` after everything this context
    /// submitted before, on either of its queues (and after `sync`'s waits),
    /// from the transfer queue where the context has one (a signal that
    /// carries no work needs no other engine), and returns the token that
    /// one wait (CUDA's or a submission's) must consume. A second signal
    /// while one is pending is [`Error::BinarySemaphore`].
    ///
    /// `sync`'s timeline waits are waited for **on the host first**, within
    /// `sync`'s timeout, and nothing is submitted until every one of them has
    /// been reached ([`Error::Timeout`] otherwise, with nothing submitted and
    /// the semaphore still unsignalled). A binary wait may only be submitted
    /// once every signal its signal depends on has been submitted
    /// (VUID-vkQueueSubmit-pWaitSemaphores-03238), and this crate cannot know
    /// whether CUDA, another process or the host will ever signal a timeline
    /// value it has not seen: so every token it mints stands for a signal
    /// that depends on nothing unsubmitted, and a wait on it cannot block the
    /// queue (or, on some drivers, `vkQueueSubmit` itself) for ever.
    pub fn signal_binary(
        &self,
        semaphore: &Semaphore<Binary>,
        sync: SubmitSync<'_>,
    ) -> Result<BinarySignal> {
        let _held = self.hold("signal_binary")?;
        self.check_owns(semaphore.context(), "the binary semaphore to signal")?;
        let raw = sync.raw(self)?;
        sync.wait_timelines_on_host()?;
        let reservation = semaphore.payload().reserve_signal()?;
        let (timeout, host_wait) = (sync.timeout, sync.host_wait);
        let inner = &self.inner;
        let lane = self.lane_of(QueueRole::Transfer);
        let mut engine = inner.lanes[lane]
            .engine
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _signals = sync.lock_signals()?;
        let mut raw = raw;
        raw.signal_semaphores.push(semaphore.raw());
        raw.signal_values.push(0);
        let mut sync = Some(sync);
        let mut submitted = false;
        let result = engine.run(
            &inner.device,
            &inner.lanes,
            lane,
            &raw,
            Completion::Wait(timeout, host_wait),
            |_| Ok(()),
            |value| {
                submitted = true;
                semaphore.last_use.note(lane, value);
                if let Some(s) = sync.take() {
                    s.submitted(lane, value);
                }
            },
        );
        match (result, submitted) {
            // SAFETY: the submission that signals the payload was submitted
            // successfully (a timeout only means it has not completed yet).
            (Ok(()) | Err(Error::Timeout(_)), true) => Ok(unsafe { reservation.submitted() }),
            (Err(e), _) => Err(e),
            (Ok(()), false) => unreachable!("a successful run has submitted"),
        }
    }
}
