//! The CUDA receiver: a [`Session`] whose ring is imported once into CUDA
//! on the device whose `deviceUUID` the ring's records name, on its
//! primary context (what the CUDA runtime, cudarc and PyTorch use).
//!
//! # Contract
//!
//! * [`CudaReceiver::from_session`] imports the ring the setup message
//!   shares: a buffer ring's slots are its buffers, mapped whole (pitched
//!   memory of the layout's row pitch); an image ring's slots are its
//!   images mapped as CUDA arrays (any format of
//!   `vk_export::format::SUPPORTED`, made with the storage, sampled or
//!   colour-attachment usage preset), each beside a tightly packed buffer
//!   of this receiver that the frame is copied into (the crate's copy
//!   kernel). The "produced" and "released" timelines are imported on the
//!   same device; a ring without them is refused with what to use instead.
//! * Frames come from the session ([`CudaReceiver::next`]); a frame's
//!   memory is [`CudaReceiver::slot`]'s (a buffer, or an image ring's
//!   packed copy) or, for an image ring, [`CudaReceiver::array`] (the image
//!   itself, zero copy). Before reading, order the reads after "produced":
//!   [`CudaReceiver::wait_produced`] enqueues that wait alone,
//!   [`CudaReceiver::wait_on`] that wait and an image ring's copy, on the
//!   caller's stream;
//!   [`CudaReceiver::enqueue_readable`] on the receiver's own wait stream.
//!   Each refuses a frame the session no longer holds, or another
//!   session's.
//! * Releasing: [`CudaReceiver::release_after`] enqueues the slot's
//!   "released" signal on the caller's stream (after its reads) and sends
//!   the release with the GPU promise; the sender does not write the slot
//!   before the signal. A frame dropped instead is released as if its
//!   reads had completed: drop one only after they have.
//! * A multi-image ring (a session of `Session::connect_named_any`, or
//!   [`CudaReceiver::connect_any`]): every part of every slot is imported
//!   as an image ring's slot is (its format, a CUDA array, a packed
//!   copy); [`CudaReceiver::part`], [`CudaReceiver::part_array`] and
//!   [`CudaReceiver::part_pitched`] give one part of a frame by name, the
//!   slot-wide methods part 0; [`CudaReceiver::wait_on`] copies every part,
//!   after the one "produced" wait; one release ("released" signal) covers
//!   the whole frame.
//! * Every host wait is bounded; nothing here blocks on the sender.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::{DLDataType, DLDataTypeCode, ManagedTensor};
use cuda_interop::{
    CopyEngine, CudaDevice, DeviceBuffer, ExternalSemaphore, OwnedArray, PitchedMut, Stream,
};
use vk_export::markers::DeviceLocal;
use vk_export::semaphore_kinds::Timeline;
use vk_export::wire::Received;
use vk_export::{Context, HeadlessOptions};

use crate::discovery::Directory;
use crate::protocol::{Delivery, PartLayout, RingLayout};
use crate::session::{has_semaphores, ConnectError, Frame, Session};
use crate::transport::{deadline_after, left, ConsumerError};

/// The CUDA device paired by UUID with a new headless Vulkan context on the
/// device whose `deviceUUID` is `uuid` (the CUDA device keeps the context:
/// records are verified on it).
pub fn cuda_device_for(uuid: vk_export::DeviceUuid) -> Result<CudaDevice, ConsumerError> {
    let vulkan = Context::headless(&HeadlessOptions {
        device_uuid: Some(uuid),
        ..HeadlessOptions::default()
    })?;
    Ok(CudaDevice::for_vulkan(&vulkan)?)
}

/// `mutex`'s guard, waiting at most `bound` for it (a poisoned lock is
/// taken as is: what it guards stays consistent);
/// [`cuda_interop::Error::Timeout`] otherwise, also when this thread holds
/// it already.
fn lock_within<T>(
    mutex: &Mutex<T>,
    bound: Duration,
) -> Result<MutexGuard<'_, T>, cuda_interop::Error> {
    let deadline = Instant::now() + bound;
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TryLockError::WouldBlock) => return Err(cuda_interop::Error::Timeout(bound)),
        }
    }
}

/// A CUDA receiver of a frame ring (see the module contract).
pub struct CudaReceiver {
    // Dropped first: the slots' drops wait (bounded) for this receiver's
    // copies out of them, before the connection closes.
    slots: Vec<Slot>,
    /// Per slot, every part's slot (one, `slots[i]`'s twin, for a ring of
    /// one image or buffer a slot).
    parts: Vec<Vec<Slot>>,
    gpu: GpuSync,
    session: Session,
}

impl std::fmt::Debug for CudaReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaReceiver")
            .field("session", &self.session)
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

impl CudaReceiver {
    /// Connects to the sender at socket `path` and imports its ring on the
    /// CUDA device its records name ([`cuda_device_for`]).
    pub fn connect(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<CudaReceiver, ConsumerError> {
        let (session, setup) = Session::connect(path, delivery, timeout)?;
        CudaReceiver::from_session(session, setup, cuda_device_for)
    }

    /// [`CudaReceiver::connect`] that takes multi-image rings too.
    pub fn connect_any(
        path: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<CudaReceiver, ConsumerError> {
        let (session, setup) = Session::connect_any(path, delivery, timeout)?;
        CudaReceiver::from_session(session, setup, cuda_device_for)
    }

    /// [`CudaReceiver::connect_named`] that takes multi-image rings too.
    pub fn connect_named_any(
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<CudaReceiver, ConnectError> {
        let directory = Directory::from_env()?;
        let (session, setup) = Session::connect_named_any(&directory, name, delivery, timeout)?;
        Ok(CudaReceiver::from_session(session, setup, cuda_device_for)?)
    }

    /// Connects to the sender named `name` in the default directory
    /// ([`Directory::from_env`]), waiting up to `timeout` for it to appear,
    /// and imports its ring.
    pub fn connect_named(
        name: &str,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<CudaReceiver, ConnectError> {
        let deadline = deadline_after(timeout);
        let directory = Directory::from_env()?;
        let (session, setup) = Session::connect_named(&directory, name, delivery, timeout)?;
        let _ = left(deadline);
        Ok(CudaReceiver::from_session(session, setup, cuda_device_for)?)
    }

    /// Imports `session`'s ring from its setup message; `cuda_for` gives the
    /// CUDA device for the resources' `deviceUUID`.
    pub fn from_session(
        session: Session,
        mut setup: Received,
        cuda_for: impl FnOnce(vk_export::DeviceUuid) -> Result<CudaDevice, ConsumerError>,
    ) -> Result<CudaReceiver, ConsumerError> {
        let layout = *session.layout();
        if !has_semaphores(&layout, &setup) {
            let (what, instead) = if layout.is_image_ring() {
                (
                    "images",
                    "or receive the images on Vulkan (vulkan_receiver::VulkanReceiver; the \
                     vulkan_client example)",
                )
            } else {
                (
                    "buffers",
                    "or read the host-visible buffers on the host (host_receiver::HostReceiver; \
                     the Python module does, giving NumPy arrays)",
                )
            };
            return Err(ConsumerError::Protocol(format!(
                "the sender shares {} {what} and no semaphores (a Vulkan driver without \
                 VK_KHR_external_semaphore_fd, such as lavapipe, or a sender run with \
                 --no-semaphores): a CUDA receiver needs the \"produced\" and \"released\" \
                 timelines; run the sender on a GPU whose driver exports semaphores, {instead}",
                layout.slots
            )));
        }
        let uuid = match &setup.message().resources[0] {
            vk_export::wire::Resource::Image(info) => info.device_uuid(),
            vk_export::wire::Resource::Buffer(info) => info.device_uuid(),
            _ => {
                return Err(ConsumerError::Protocol(
                    "the ring's first resource is neither a buffer nor an image".into(),
                ))
            }
        };
        let cuda = cuda_for(uuid)?;
        let n = layout.slots as usize;
        let parts: Vec<Vec<Slot>> = if layout.is_multi_image() {
            // Part by part (one format each), then slot by slot.
            let mut by_part = Vec::with_capacity(session.parts().len());
            for (p, part) in (0u32..).zip(session.parts()) {
                let images = Images::of_part(&layout, part, p);
                by_part.push(image_slots(&cuda, &images, &mut setup)?);
            }
            (0..n)
                .map(|i| by_part.iter().map(|slots| slots[i].share()).collect())
                .collect()
        } else if layout.is_image_ring() {
            let images = Images::of_ring(&layout);
            image_slots(&cuda, &images, &mut setup)?
                .into_iter()
                .map(|s| vec![s])
                .collect()
        } else {
            buffer_slots(&cuda, &layout, &mut setup)?
                .into_iter()
                .map(|s| vec![s])
                .collect()
        };
        let slots = parts.iter().map(|p| p[0].share()).collect();
        let semaphore = |setup: &mut Received, i: usize| {
            let received = setup.take_semaphore::<Timeline>(i)?;
            cuda.import_received_semaphore(received)
                .map_err(|e| ConsumerError::Cuda(e.into_error()))
        };
        let produced_at = layout.produced_index();
        let produced = semaphore(&mut setup, produced_at)?;
        let released = (0..n)
            .map(|i| semaphore(&mut setup, produced_at + 1 + i))
            .collect::<Result<Vec<_>, _>>()?;
        let gpu = GpuSync {
            wait_stream: Mutex::new(Stream::new(&cuda)?),
            release_stream: Mutex::new(Stream::new(&cuda)?),
            cuda,
            produced,
            released,
        };
        Ok(CudaReceiver {
            slots,
            parts,
            gpu,
            session,
        })
    }

    /// The session (layout, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The ring's layout.
    pub fn layout(&self) -> &RingLayout {
        self.session.layout()
    }

    /// The CUDA device the ring is imported on.
    pub fn cuda(&self) -> &CudaDevice {
        &self.gpu.cuda
    }

    /// The next frame ([`Session::next`]).
    pub fn next(&self, timeout: Duration) -> Result<Frame, ConsumerError> {
        self.session.next(timeout)
    }

    /// The memory of `frame`'s slot: a buffer ring's buffer (rows
    /// [`RingLayout::row_pitch`] apart), an image ring's tightly packed
    /// copy (filled by [`CudaReceiver::wait_on`] or
    /// [`CudaReceiver::enqueue_readable`]).
    pub fn slot(&self, frame: &Frame) -> Result<&Slot, ConsumerError> {
        self.session.check_held(frame)?;
        Ok(&self.slots[frame.slot() as usize])
    }

    /// The slots, by index (what a frame's memory is kept alive by; a
    /// multi-image ring's: part 0's).
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// A multi-image ring's parts, in slot order (empty for other rings).
    pub fn parts(&self) -> &[PartLayout] {
        self.session.parts()
    }

    /// The index of the part named `name`, or an error naming the parts.
    fn part_index(&self, name: &str) -> Result<usize, ConsumerError> {
        self.session.part_index(name).ok_or_else(|| {
            let names: Vec<String> = self.parts().iter().map(|p| p.name.to_string()).collect();
            ConsumerError::Protocol(format!(
                "no part named {name:?}: the ring's parts are [{}]",
                names.join(", ")
            ))
        })
    }

    /// The packed copy of part `name` of `frame` (a multi-image ring's;
    /// filled by [`CudaReceiver::wait_on`], as [`CudaReceiver::slot`]).
    pub fn part(&self, frame: &Frame, name: &str) -> Result<&Slot, ConsumerError> {
        self.session.check_held(frame)?;
        let p = self.part_index(name)?;
        Ok(&self.parts[frame.slot() as usize][p])
    }

    /// Every part's packed copy of `frame`, in part order (one for a ring
    /// of one image or buffer a slot).
    pub fn part_slots(&self, frame: &Frame) -> Result<&[Slot], ConsumerError> {
        self.session.check_held(frame)?;
        Ok(&self.parts[frame.slot() as usize])
    }

    /// Part `name` of `frame` as its CUDA array (the image itself, zero
    /// copy), on [`CudaReceiver::array`]'s terms.
    pub fn part_array(
        &self,
        frame: &Frame,
        name: &str,
    ) -> Result<cuda_interop::sys::CUarray, ConsumerError> {
        let slot = self.part(frame, name)?;
        match &slot.image {
            Some(image) => Ok(image.level0()?),
            None => Err(ConsumerError::Protocol("a buffer slot has no array".into())),
        }
    }

    /// Part `name` of `frame`'s packed copy as pitched device memory, on
    /// [`CudaReceiver::pitched`]'s terms.
    pub fn part_pitched(&self, frame: &Frame, name: &str) -> Result<PitchedPlane, ConsumerError> {
        let p = self.part_index(name)?;
        let slot = self.part(frame, name)?;
        let layout = self.session.layout();
        let row = self.parts()[p].row_bytes(layout.width);
        Ok(PitchedPlane {
            ptr: slot.data,
            pitch: row,
            row_bytes: row,
            rows: layout.height,
        })
    }

    /// Enqueues on `stream` (of this receiver's device) the wait for
    /// `frame`'s "produced" value and, for an image ring, the copy of the
    /// image into the slot's buffer: reads enqueued after it on `stream`
    /// see the frame.
    pub fn wait_on(&self, frame: &Frame, stream: &Stream) -> Result<(), ConsumerError> {
        self.session.check_held(frame)?;
        self.gpu.produced.wait(stream, frame.sequence())?;
        for part in &self.parts[frame.slot() as usize] {
            if let Some(image) = &part.image {
                image.enqueue_copy_out(stream)?;
            }
        }
        Ok(())
    }

    /// Enqueues on `stream` only the wait for `frame`'s "produced" value:
    /// a buffer ring's slot, and an image ring's array
    /// ([`CudaReceiver::array`]), are readable by work enqueued after it; an
    /// image ring's packed copy ([`CudaReceiver::slot`]) is not made (that
    /// is [`CudaReceiver::wait_on`]).
    pub fn wait_produced(&self, frame: &Frame, stream: &Stream) -> Result<(), ConsumerError> {
        self.session.check_held(frame)?;
        Ok(self.gpu.produced.wait(stream, frame.sequence())?)
    }

    /// An image ring's frame as the slot's CUDA array (level 0, the image
    /// itself, zero copy; `None` for a buffer ring): a raw `CUarray` of the
    /// ring's primary context (also a `cudaArray_t` for the runtime API),
    /// valid while this receiver lives. Read it only after
    /// [`CudaReceiver::wait_produced`] (or [`CudaReceiver::wait_on`]) and
    /// only while the frame is held: release it after those reads
    /// ([`CudaReceiver::release_after`]).
    pub fn array(
        &self,
        frame: &Frame,
    ) -> Result<Option<cuda_interop::sys::CUarray>, ConsumerError> {
        self.session.check_held(frame)?;
        match &self.slots[frame.slot() as usize].image {
            Some(image) => Ok(Some(image.level0()?)),
            None => Ok(None),
        }
    }

    /// An image ring's frame as a surface object on the slot's array (level
    /// 0, the image itself, zero copy; `None` for a buffer ring), for
    /// kernels that read or write texels with `surf2Dread`/`surf2Dwrite`.
    /// Images shared without storage usage (sRGB ones: no GPU offers sRGB
    /// storage) have none: [`cuda_interop::Error::Unsupported`] says to
    /// read them through [`CudaReceiver::texture`] or the array.
    /// Launch with [`Stream::launch_tracked`] naming the surface in its
    /// [`cuda_interop::KernelUses`]: its drop then waits for those kernels.
    /// Use it, like [`CudaReceiver::array`], after
    /// [`CudaReceiver::wait_produced`] and before
    /// [`CudaReceiver::release_after`] of the frame; the surface may be kept
    /// and used for later frames of the same slot ([`Frame::slot`]).
    pub fn surface(
        &self,
        frame: &Frame,
    ) -> Result<Option<cuda_interop::Surface<'_>>, ConsumerError> {
        self.session.check_held(frame)?;
        match &self.slots[frame.slot() as usize].image {
            Some(image) => Ok(Some(image.surface()?)),
            None => Ok(None),
        }
    }

    /// An image ring's frame as a texture object (point sampling,
    /// unnormalised coordinates, element-type reads; `None` for a buffer
    /// ring), on the same terms as [`CudaReceiver::surface`].
    pub fn texture(
        &self,
        frame: &Frame,
    ) -> Result<Option<cuda_interop::Texture<'_>>, ConsumerError> {
        self.session.check_held(frame)?;
        match &self.slots[frame.slot() as usize].image {
            Some(image) => Ok(Some(image.texture()?)),
            None => Ok(None),
        }
    }

    /// `frame`'s slot memory as pitched device memory: a buffer ring's
    /// buffer (rows [`RingLayout::row_pitch`] apart; a planar ring's luma
    /// plane, see [`CudaReceiver::chroma`]), or an image ring's tightly
    /// packed copy (made by [`CudaReceiver::wait_on`]). Read it after
    /// [`CudaReceiver::wait_on`] (a buffer ring:
    /// [`CudaReceiver::wait_produced`] suffices) and before
    /// [`CudaReceiver::release_after`]; the address stays valid while this
    /// receiver lives.
    pub fn pitched(&self, frame: &Frame) -> Result<PitchedPlane, ConsumerError> {
        let slot = self.slot(frame)?;
        let layout = self.session.layout();
        Ok(PitchedPlane {
            ptr: slot.data,
            pitch: layout.row_pitch,
            row_bytes: u64::from(layout.width) * layout.texel_bytes(),
            rows: layout.height,
        })
    }

    /// A planar ring's chroma plane of `frame` (`height / 2` rows of
    /// `width / 2` interleaved Cb, Cr pairs, as wide in bytes as a luma
    /// row), on the same terms as [`CudaReceiver::pitched`], which gives
    /// the luma plane; `None` for other rings. With the luma plane's
    /// address and pitch it is what NVENC takes as an NV12 or P010 input.
    pub fn chroma(&self, frame: &Frame) -> Result<Option<PitchedPlane>, ConsumerError> {
        let slot = self.slot(frame)?;
        let layout = self.session.layout();
        Ok(layout
            .planar_format()
            .map(|(planar, chroma_offset)| PitchedPlane {
                ptr: slot.data + chroma_offset,
                pitch: layout.row_pitch,
                row_bytes: u64::from(layout.width) * planar.sample_bytes(),
                rows: layout.height / 2,
            }))
    }

    /// [`CudaReceiver::wait_on`] on the receiver's own wait stream,
    /// returned locked for the caller to order its reads after (or to
    /// wait for). The lock is waited for at most
    /// [`Stream::DEFAULT_TIMEOUT`]: a second call while this thread holds
    /// the guard fails instead of waiting for itself. Enqueue it once per
    /// frame: a second image copy would overwrite what the first one's
    /// readers read.
    pub fn enqueue_readable(&self, frame: &Frame) -> Result<MutexGuard<'_, Stream>, ConsumerError> {
        self.session.check_held(frame)?;
        let via = lock_within(&self.gpu.wait_stream, Stream::DEFAULT_TIMEOUT)?;
        self.wait_on(frame, &via)?;
        Ok(via)
    }

    /// Copies `dst.len()` bytes from byte `at` of `frame`'s slot memory to
    /// `dst`, after the work already enqueued on `stream` (of this
    /// receiver's device: [`CudaReceiver::wait_on`] first, so that the copy
    /// sees the frame), waiting for it within `timeout`. A range outside the
    /// slot is refused. For checks and tools: a zero-copy reader reads the
    /// slot on the GPU.
    pub fn copy_to_host(
        &self,
        frame: &Frame,
        stream: &Stream,
        at: u64,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<(), ConsumerError> {
        let slot = self.slot(frame)?;
        self.copy_slot_to_host(frame, slot, stream, at, dst, timeout)
    }

    /// [`CudaReceiver::copy_to_host`] of part `name`'s packed copy (a
    /// multi-image ring's).
    pub fn copy_part_to_host(
        &self,
        frame: &Frame,
        name: &str,
        stream: &Stream,
        at: u64,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<(), ConsumerError> {
        let slot = self.part(frame, name)?;
        self.copy_slot_to_host(frame, slot, stream, at, dst, timeout)
    }

    fn copy_slot_to_host(
        &self,
        frame: &Frame,
        slot: &Slot,
        stream: &Stream,
        at: u64,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<(), ConsumerError> {
        let len = dst.len() as u64;
        if at.checked_add(len).is_none_or(|end| end > slot.len) {
            return Err(ConsumerError::Protocol(format!(
                "{len} bytes at {at} of a slot of {} bytes: outside the slot",
                slot.len
            )));
        }
        if stream.device().ordinal() != self.gpu.cuda.ordinal() {
            return Err(ConsumerError::Protocol(format!(
                "a stream of CUDA device {}, not of this receiver's device {}",
                stream.device().ordinal(),
                self.gpu.cuda.ordinal()
            )));
        }
        // A copy into pageable memory blocks in the driver until it is done:
        // queued behind a wait nobody signals it would never return, so the
        // stream drains (bounded) first.
        stream.synchronize(timeout)?;
        let copy = cuda_interop::sys::Driver::global()
            .map_err(|e| ConsumerError::Protocol(e.to_string()))?
            .fns()
            .cuMemcpyDtoHAsync
            .ok_or_else(|| {
                ConsumerError::Protocol("the CUDA driver lacks cuMemcpyDtoHAsync".into())
            })?;
        let current = self.gpu.cuda.enter()?;
        // SAFETY: the slot belongs to this receiver, so its `len` bytes at
        // `data` stay mapped device memory of this device (current here) for
        // the call, and [at, at + len) lies inside them (checked above);
        // `dst` is a live, writable host range of `len` bytes, pageable, so
        // the copy has completed when the call returns (the driver's
        // documented behaviour for device-to-pageable copies); `stream` is a
        // live stream of this device's primary context (its ordinal checked
        // above; every `Stream` is made on the primary context).
        let status = unsafe {
            copy(
                dst.as_mut_ptr().cast(),
                slot.data + at,
                dst.len(),
                stream.raw(),
            )
        };
        drop(current);
        if status != cuda_interop::sys::CUresult::CUDA_SUCCESS {
            return Err(ConsumerError::Protocol(format!(
                "cuMemcpyDtoHAsync from a slot failed: {status:?}"
            )));
        }
        stream.synchronize(timeout)?;
        // The frame must still be this receiver's: the copy read the frame.
        self.session.check_held(frame)
    }

    /// [`CudaReceiver::wait_on`] for a foreign stream (the runtime's,
    /// PyTorch's, CuPy's), so reads enqueued on `stream` afterwards see the
    /// frame. A buffer ring's wait goes on `stream` itself where it is a
    /// stream of the primary context (theirs are: no extra hop); an image
    /// ring's wait and copy are enqueued on the receiver's wait stream, and
    /// `stream` waits for them there (an event).
    ///
    /// # Safety
    ///
    /// `stream` is 1 (the legacy default stream), 2 (the per-thread default
    /// stream) or a live stream of this receiver's CUDA device, for the
    /// call.
    pub unsafe fn wait_on_raw(&self, frame: &Frame, stream: usize) -> Result<(), ConsumerError> {
        // Image rings (every slot an image, or a set of them) copy; the
        // callees check that the frame is held.
        if self.slots.first().is_some_and(|slot| slot.image.is_some()) {
            let via = self.enqueue_readable(frame)?;
            // SAFETY: the caller's guarantee: `stream` is a live stream of
            // this device (or a default one) for the call.
            return Ok(unsafe { via.join_raw(stream as _) }?);
        }
        // SAFETY: the caller's guarantee, as above.
        unsafe { self.wait_produced_raw(frame, stream) }
    }

    /// [`CudaReceiver::wait_produced`] for a foreign stream (the runtime's,
    /// PyTorch's, CuPy's): the wait goes on `stream` itself where it is a
    /// stream of the primary context (theirs are), else through the
    /// receiver's wait stream and an event. A buffer ring's slot and an
    /// image ring's array ([`CudaReceiver::array`]) are readable by work
    /// enqueued on `stream` afterwards; an image ring's packed copy is not
    /// made.
    ///
    /// # Safety
    ///
    /// As [`CudaReceiver::wait_on_raw`].
    pub unsafe fn wait_produced_raw(
        &self,
        frame: &Frame,
        stream: usize,
    ) -> Result<(), ConsumerError> {
        self.session.check_held(frame)?;
        let via = lock_within(&self.gpu.wait_stream, Stream::DEFAULT_TIMEOUT)?;
        // SAFETY: the caller's guarantee: `stream` is a live stream of this
        // device (or a default one) for the call.
        unsafe {
            self.gpu
                .produced
                .wait_raw_stream(stream as _, frame.sequence(), &via)
        }?;
        Ok(())
    }

    /// Releases `frame` after the work enqueued on `stream` so far: the
    /// slot's "released" timeline is signalled there with the frame's
    /// number, and the release promises it (see the module contract).
    pub fn release_after(&self, frame: Frame, stream: &Stream) -> Result<(), ConsumerError> {
        self.session.check_held(&frame)?;
        let released = &self.gpu.released[frame.slot() as usize];
        if released.last_signalled() < frame.sequence() {
            if let Err(e) = released.signal(stream, frame.sequence()) {
                return Err(self.unsignalled(frame, e));
            }
        }
        self.session.release(frame, true)
    }

    /// [`CudaReceiver::release_after`] on a raw `CUstream` (the runtime's,
    /// PyTorch's, CuPy's).
    ///
    /// # Safety
    ///
    /// `stream` is 1 (the legacy default stream), 2 (the per-thread default
    /// stream) or a live stream of this receiver's CUDA device, for the
    /// call.
    pub unsafe fn release_after_raw(
        &self,
        frame: Frame,
        stream: usize,
    ) -> Result<(), ConsumerError> {
        self.session.check_held(&frame)?;
        let released = &self.gpu.released[frame.slot() as usize];
        if released.last_signalled() < frame.sequence() {
            let via = lock_within(&self.gpu.release_stream, Stream::DEFAULT_TIMEOUT)?;
            // SAFETY: the caller's guarantee: `stream` is a live stream of
            // this device (or a default one) for the call.
            let signalled =
                unsafe { released.signal_raw_stream(stream as _, frame.sequence(), &via) };
            if let Err(e) = signalled {
                drop(via);
                return Err(self.unsignalled(frame, e));
            }
        }
        self.session.release(frame, true)
    }

    /// A release whose GPU signal could not be enqueued: the reads may still
    /// run, so the frame is not given back as done; the session is closed
    /// instead (the sender counts the connection gone).
    fn unsignalled(&self, frame: Frame, error: cuda_interop::Error) -> ConsumerError {
        self.session.close(&format!(
            "the release of frame {} could not be signalled",
            frame.sequence()
        ));
        drop(frame);
        ConsumerError::Cuda(error)
    }
}

/// The slots of a buffer ring: each buffer imported and mapped whole.
fn buffer_slots(
    cuda: &CudaDevice,
    layout: &RingLayout,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    let need = layout.checked_frame_bytes()?;
    let mut slots = Vec::with_capacity(layout.slots as usize);
    for i in 0..layout.slots as usize {
        let buffer = setup.take_buffer::<DeviceLocal>(i)?;
        let imported = cuda
            .import_received_buffer(buffer)
            .map_err(|e| e.into_error())?;
        let len = imported.size();
        if len < need {
            return Err(ConsumerError::Protocol(format!(
                "slot {i}'s buffer has {len} bytes; a {}x{} frame with row pitch {} needs {need}",
                layout.width, layout.height, layout.row_pitch
            )));
        }
        let byte_len = i64::try_from(len)
            .map_err(|_| ConsumerError::Protocol(format!("a buffer of {len} bytes")))?;
        let mapping = imported.into_dlpack(
            DLDataType::scalar(DLDataTypeCode::UInt, 8),
            &[byte_len],
            None,
            false,
        )?;
        let data = mapping.tensor().data as u64;
        slots.push(Slot {
            memory: SlotMemory::new(Arc::new(CudaSlot {
                _mapping: Mutex::new(mapping),
            })),
            data,
            len,
            image: None,
        });
    }
    Ok(slots)
}

/// Calls macro `$m` with every format [`image_slots`] imports: those of
/// `vk_export::format::SUPPORTED` (a unit test checks the two agree).
macro_rules! image_formats {
    ($m:ident) => {
        $m!(
            R8Unorm,
            Rg8Unorm,
            Rgba8Unorm,
            Rgba8Uint,
            Rgba8Srgb,
            Bgra8Unorm,
            Bgra8Srgb,
            A2b10g10r10UnormPack32,
            R16Unorm,
            Rg16Unorm,
            R16Sfloat,
            Rgba16Sfloat,
            Rgba16Uint,
            R32Uint,
            R32Sfloat,
            Rg32Sfloat,
            Rgba32Sfloat
        )
    };
}

/// The images [`image_slots`] imports: one per slot, all of one format.
struct Images {
    /// What they are, for errors: "slot" or "part NAME of slot".
    what: String,
    width: u32,
    height: u32,
    /// The announced row (the format's texel size times the width).
    row_pitch: u64,
    vk_format: u32,
    /// Per slot, the image's index in the setup message.
    indices: Vec<usize>,
}

impl Images {
    /// The images of a ring of one image a slot.
    fn of_ring(layout: &RingLayout) -> Images {
        Images {
            what: "slot".into(),
            width: layout.width,
            height: layout.height,
            row_pitch: layout.row_pitch,
            vk_format: layout.vk_format().unwrap_or(0),
            indices: (0..layout.slots)
                .map(|i| layout.resource_of(i, 0))
                .collect(),
        }
    }

    /// Part `p` of every slot of a multi-image ring.
    fn of_part(layout: &RingLayout, part: &PartLayout, p: u32) -> Images {
        Images {
            what: format!("part {} of slot", part.name),
            width: layout.width,
            height: layout.height,
            row_pitch: part.row_bytes(layout.width),
            vk_format: part.vk_format,
            indices: (0..layout.slots)
                .map(|i| layout.resource_of(i, p))
                .collect(),
        }
    }
}

/// The slots of an image ring (or one part of a multi-image ring's), for
/// the format `images` names (one of `vk_export::format::SUPPORTED`).
fn image_slots(
    cuda: &CudaDevice,
    layout: &Images,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    use vk_export::format::*;
    let format = layout.vk_format;
    let raw = vk_export::ash::vk::Format::from_raw(format as i32);
    macro_rules! by_format {
        ($($format:ty),*) => {
            $(if raw == <$format>::VK {
                return image_slots_of::<$format>(cuda, layout, setup);
            })*
        };
    }
    image_formats!(by_format);
    Err(ConsumerError::Protocol(format!(
        "the sender's images are VkFormat {}, which vk-export cannot map into CUDA \
         (supported: {})",
        format,
        SUPPORTED.iter().map(|f| f.1).collect::<Vec<_>>().join(", ")
    )))
}

/// [`image_slots`] for images of format `F`, of the usage preset the
/// first image's record names (a sender of sRGB images, which have no
/// storage usage, shares them sampled or as colour attachments).
fn image_slots_of<F: vk_export::format::Format>(
    cuda: &CudaDevice,
    layout: &Images,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    use vk_export::markers::{usage, Usage};
    let flags = match setup.message().resources.first() {
        Some(vk_export::wire::Resource::Image(info)) => info.usage(),
        // take_image refuses it with what it is.
        _ => usage::Storage::VK,
    };
    if flags == usage::Storage::VK {
        image_slots_with::<F, usage::Storage>(cuda, layout, setup)
    } else if flags == usage::StorageColorAttachment::VK {
        image_slots_with::<F, usage::StorageColorAttachment>(cuda, layout, setup)
    } else if flags == usage::Sampled::VK {
        image_slots_with::<F, usage::Sampled>(cuda, layout, setup)
    } else if flags == usage::ColorAttachment::VK {
        image_slots_with::<F, usage::ColorAttachment>(cuda, layout, setup)
    } else {
        Err(ConsumerError::Protocol(format!(
            "the sender's images have usage {flags:?}: a CUDA receiver maps images made with \
             storage, sampled or colour-attachment usage (vk_export::markers::usage)"
        )))
    }
}

/// [`image_slots_of`] for usage `U`: each image imported and mapped as a
/// CUDA array, beside a tightly packed buffer of its rows.
fn image_slots_with<F: vk_export::format::Format, U: SurfaceChoice>(
    cuda: &CudaDevice,
    layout: &Images,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    use vk_export::markers::Optimal;
    // Checked layouts: at most 2^16 x 2^16 texels of 16 bytes.
    let len = layout.row_pitch * u64::from(layout.height);
    if layout.row_pitch != u64::from(layout.width) * u64::from(F::TEXEL_BYTES) {
        return Err(ConsumerError::Protocol(format!(
            "an image ring of {} announces rows of {} bytes for {} texels",
            F::NAME,
            layout.row_pitch,
            layout.width
        )));
    }
    let mut slots = Vec::with_capacity(layout.indices.len());
    for (i, &index) in layout.indices.iter().enumerate() {
        let image = setup.take_image::<F, Optimal, DeviceLocal, U>(index)?;
        let extent = image.record().info().extent();
        if extent != [layout.width, layout.height, 1] {
            return Err(ConsumerError::Protocol(format!(
                "{} {i}'s image is {}x{}x{}, not the layout's {}x{}",
                layout.what, extent[0], extent[1], extent[2], layout.width, layout.height
            )));
        }
        let array = cuda
            .import_received_image(image)
            .map_err(|e| e.into_error())?
            .into_mapped_array()?;
        let bytes = usize::try_from(len)
            .map_err(|_| ConsumerError::Protocol(format!("a frame of {len} bytes")))?;
        let rows = DeviceBuffer::new(cuda, bytes)?;
        let data = rows.device_ptr();
        let slot = Arc::new(ImageSlot {
            array,
            rows: Mutex::new(rows),
        });
        slots.push(Slot {
            memory: SlotMemory::new(slot.clone()),
            data,
            len,
            image: Some(slot),
        });
    }
    Ok(slots)
}

/// An image slot: the image as a CUDA array, and the pitched buffer this
/// consumer copies each frame into (what its tensors address).
struct ImageSlot<F, U> {
    // Dropped first: the array's drop waits (bounded) for the copies out of
    // it; the buffer's own drop waits for them too (each is recorded on both).
    array: OwnedArray<F, vk_export::markers::Optimal, DeviceLocal, U>,
    rows: Mutex<DeviceBuffer>,
}

/// The usage presets a CUDA receiver maps, and whether a surface object can
/// be made on them (storage usage only).
trait SurfaceChoice: vk_export::markers::Usage {
    fn surface<'a, F: vk_export::format::Format>(
        level: &cuda_interop::LevelArray<'a, F, Self>,
    ) -> Result<cuda_interop::Surface<'a>, cuda_interop::Error>
    where
        Self: Sized;
}

macro_rules! with_surface {
    ($($usage:ident),*) => {$(
        impl SurfaceChoice for vk_export::markers::usage::$usage {
            fn surface<'a, F: vk_export::format::Format>(
                level: &cuda_interop::LevelArray<'a, F, Self>,
            ) -> Result<cuda_interop::Surface<'a>, cuda_interop::Error> {
                level.surface()
            }
        }
    )*};
}
macro_rules! without_surface {
    ($($usage:ident),*) => {$(
        impl SurfaceChoice for vk_export::markers::usage::$usage {
            fn surface<'a, F: vk_export::format::Format>(
                _level: &cuda_interop::LevelArray<'a, F, Self>,
            ) -> Result<cuda_interop::Surface<'a>, cuda_interop::Error> {
                Err(cuda_interop::Error::Unsupported(format!(
                    "a surface on {} images made without storage usage (the sender's \
                     usage::{}): read them through CudaReceiver::texture or array",
                    F::NAME,
                    stringify!($usage)
                )))
            }
        }
    )*};
}
with_surface!(Storage, StorageColorAttachment);
without_surface!(Sampled, ColorAttachment);

mod sealed {
    /// Only this crate's image slots are [`super::CopyOut`]: the ring runs
    /// them under its wait stream's lock and relies on what they copy.
    pub trait Sealed {}
}

/// What [`CudaReceiver::enqueue_readable`] does with an image slot, whatever its
/// format (sealed: this crate's image slots only).
pub(crate) trait CopyOut: sealed::Sealed + Send + Sync {
    /// Enqueues on `stream` the copy of the slot's image (level 0) into its
    /// pitched buffer ([`Slot::data`]); returns the engine that copies.
    fn enqueue_copy_out(&self, stream: &Stream) -> Result<CopyEngine, cuda_interop::Error>;
    /// The image's level 0 as a `CUarray`.
    fn level0(&self) -> Result<cuda_interop::sys::CUarray, cuda_interop::Error>;
    /// A surface object on level 0.
    fn surface(&self) -> Result<cuda_interop::Surface<'_>, cuda_interop::Error>;
    /// A texture object on level 0.
    fn texture(&self) -> Result<cuda_interop::Texture<'_>, cuda_interop::Error>;
}

impl<F: vk_export::format::Format, U: SurfaceChoice> sealed::Sealed for ImageSlot<F, U> {}

impl<F: vk_export::format::Format, U: SurfaceChoice> CopyOut for ImageSlot<F, U> {
    fn enqueue_copy_out(&self, stream: &Stream) -> Result<CopyEngine, cuda_interop::Error> {
        let level = self.array.array().level(0)?;
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        level.enqueue_copy_to(stream, PitchedMut::buffer(&mut rows))
    }

    fn level0(&self) -> Result<cuda_interop::sys::CUarray, cuda_interop::Error> {
        Ok(self.array.array().level(0)?.raw())
    }

    fn surface(&self) -> Result<cuda_interop::Surface<'_>, cuda_interop::Error> {
        U::surface(&self.array.array().level(0)?)
    }

    fn texture(&self) -> Result<cuda_interop::Texture<'_>, cuda_interop::Error> {
        self.array.array().level(0)?.texture()
    }
}

/// One slot's buffer, mapped into CUDA.
struct CudaSlot {
    /// The whole-buffer tensor `ImportedBuffer::into_dlpack` made: it owns
    /// the mapping and the import, and is never handed out itself.
    _mapping: Mutex<ManagedTensor>,
}

/// What keeps one slot's memory alive (a CUDA mapping, or whatever the
/// caller gave). Every tensor handed out of the slot
/// should hold a clone.
#[derive(Clone)]
pub struct SlotMemory {
    _keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotMemory")
    }
}

impl SlotMemory {
    /// Memory kept alive by `keep` (dropped with the last clone).
    pub fn new(keep: Arc<dyn std::any::Any + Send + Sync>) -> SlotMemory {
        SlotMemory { _keep: keep }
    }
}

/// A frame's memory as pitched device memory ([`CudaReceiver::pitched`]):
/// `rows` rows of `row_bytes` bytes each, the first at `ptr`, each `pitch`
/// bytes after the one before: the layout NVENC, `cudaMemcpy2D` and a
/// strided tensor take. Only the rows' bytes are promised: the last row
/// may end at its `row_bytes` (a sender's slot need not hold a whole
/// `pitch` after it), so address `(rows - 1) * pitch + row_bytes` bytes,
/// not `rows * pitch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PitchedPlane {
    /// The first row's address (a `CUdeviceptr` of the receiver's device).
    pub ptr: u64,
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes of pixels in a row (at most `pitch`).
    pub row_bytes: u64,
    /// Rows.
    pub rows: u32,
}

/// A slot: its memory's keeper and address.
pub struct Slot {
    /// Keeps the memory alive.
    pub memory: SlotMemory,
    /// The first byte's address (a CUDA device pointer for an imported ring;
    /// for an image ring, this consumer's pitched copy of the image).
    pub data: u64,
    /// Bytes at `data`.
    pub len: u64,
    /// An image ring's slot: what copies the image to `data`.
    pub(crate) image: Option<Arc<dyn CopyOut>>,
}

impl Slot {
    /// Another handle on the same slot (its memory kept by both).
    fn share(&self) -> Slot {
        Slot {
            memory: self.memory.clone(),
            data: self.data,
            len: self.len,
            image: self.image.clone(),
        }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("data", &self.data)
            .field("len", &self.len)
            .field("image", &self.image.is_some())
            .finish()
    }
}

/// The CUDA side of a ring: semaphores and the streams their operations are
/// enqueued on.
struct GpuSync {
    /// The device the ring is imported on.
    cuda: CudaDevice,
    /// The "produced" timeline: frame `f` is written once it reaches `f`.
    produced: ExternalSemaphore<Timeline>,
    /// Per slot, its "released" timeline.
    released: Vec<ExternalSemaphore<Timeline>>,
    /// Waits for "produced" (a consumer may name it as the stream its reads
    /// must follow).
    wait_stream: Mutex<Stream>,
    /// Signals of "released".
    release_stream: Mutex<Stream>,
}

impl std::fmt::Debug for GpuSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSync")
            .field("ordinal", &self.cuda.ordinal())
            .field("slots", &self.released.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_rings_of_every_supported_format_are_imported() {
        use vk_export::format::*;
        macro_rules! list {
            ($($format:ty),*) => {
                [$(<$format>::VK),*]
            };
        }
        let dispatched = image_formats!(list);
        for (format, name, _, _) in SUPPORTED {
            assert!(
                dispatched.contains(format),
                "{name} is not imported by image_slots"
            );
        }
        assert_eq!(dispatched.len(), SUPPORTED.len());
    }
}
