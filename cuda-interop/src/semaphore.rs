//! Vulkan semaphores imported into CUDA.
//!
//! # Contract
//!
//! * Binary and timeline are distinct types. A binary signal returns a
//!   [`BinarySignal`] token (`vk-export`'s, so Vulkan and CUDA share one
//!   rule set, see [`vk_export::token`]) that exactly one wait consumes:
//!   "wait without a signal" and "wait twice" do not compile; a token of
//!   another semaphore and a second signal while one is pending are typed
//!   errors (also after `mem::forget` of a token). An import of a Vulkan
//!   semaphore of this process shares its payload state, so a CUDA signal's
//!   token pays for a Vulkan wait and the other way round.
//! * A timeline signal must be above every value this handle signalled
//!   before. Check, enqueue and update happen under one lock, and the stored
//!   value changes only after the signal was enqueued, so two threads cannot
//!   both pass the check with the same value, and a failed enqueue leaves no
//!   trace. A handle may also carry a largest step between two signals
//!   (`maxTimelineSemaphoreValueDifference`); a signal further above the last
//!   one is refused.
//! * A batch ([`Stream::signal_semaphores`], [`Stream::wait_semaphores`]:
//!   [`SignalOp`], [`WaitOp`]) is one driver call for many semaphores, with
//!   every check of the single calls made for every entry before that call:
//!   one refused entry refuses the batch, and nothing is enqueued or
//!   changed. Its timeline locks are taken in one order (handle address),
//!   so batches and single signals never deadlock on each other. A batch
//!   is one use of its stream (one ticket, no event), kept by every
//!   semaphore in it (and, for waits, by the device's external waits).
//! * Every signal and wait is recorded as a use of the semaphore; `Drop`
//!   waits for those uses (at most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT),
//!   never `cuCtxSynchronize`) before `cuDestroyExternalSemaphore`, which
//!   requires every outstanding signal and wait to have completed. If they
//!   do not complete in time (a wait nobody signals), the handle is leaked
//!   and the leak reported through [`drop_errors`](crate::drop_errors).

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, PoisonError};

use cuda_interop_sys::{self as sys, CUexternalSemaphore, CUexternalSemaphoreHandleType};
use smallvec::SmallVec;
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::{BinaryPayload, BinarySignal, ReceivedSemaphore, SemaphoreKind, SemaphoreRecord};

use crate::context::CudaDevice;
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, ImportError, Result};
use crate::events::{report_leak, DROP_WAIT_LIMIT};
use crate::last_use::LastUse;
use crate::stream::{order_streams, Stream};

/// A Vulkan semaphore imported into CUDA.
#[derive(Debug)]
pub struct ExternalSemaphore<K> {
    device: CudaDevice,
    handle: CUexternalSemaphore,
    /// The last value signalled through this handle (timeline only); held
    /// locked across a signal's check, enqueue and update.
    last_signalled: Mutex<u64>,
    /// The largest step from the last signalled value to the next one, if
    /// the Vulkan device bounds it.
    max_difference: Option<u64>,
    /// Binary payload state, shared with the Vulkan semaphore when imported
    /// from this process (unused for timelines).
    payload: BinaryPayload,
    last_use: LastUse,
    _kind: PhantomData<fn() -> K>,
}

// SAFETY: the handle is usable from any thread with the context current
// (every use enters it); the counter is behind a mutex and the last-use
// record is Send and Sync.
unsafe impl<K> Send for ExternalSemaphore<K> {}
// SAFETY: signal and wait enqueue on a stream the caller owns; the counter
// and the last-use record are behind mutexes.
unsafe impl<K> Sync for ExternalSemaphore<K> {}

impl<K> Drop for ExternalSemaphore<K> {
    fn drop(&mut self) {
        if let Err(why) = self.last_use.wait_before_release(DROP_WAIT_LIMIT) {
            report_leak("an imported semaphore", &why);
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live semaphore of the current context, destroyed once,
            // after every signal and wait enqueued on it has completed (each
            // was recorded as a use, and all completed above).
            record_drop_error(unsafe { cu!(cuDestroyExternalSemaphore(self.handle)) });
        }
    }
}

fn cuda_handle_type(kind: vk_export::ash::vk::SemaphoreType) -> CUexternalSemaphoreHandleType {
    if kind == vk_export::ash::vk::SemaphoreType::TIMELINE {
        CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
    } else {
        CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD
    }
}

impl CudaDevice {
    /// Imports a semaphore of this process (the CUDA handle type follows the
    /// semaphore's kind). A binary semaphore's tokens are shared with it;
    /// timeline signals are bounded by its device's
    /// `maxTimelineSemaphoreValueDifference`.
    pub fn import_semaphore<K: SemaphoreKind>(
        &self,
        semaphore: &vk_export::Semaphore<K>,
    ) -> Result<ExternalSemaphore<K>> {
        self.check_resource_device(&semaphore.record().info().device_uuid())?;
        let fd = semaphore.export_fd()?;
        let payload = shared_payload(semaphore);
        let max = Some(semaphore.context().max_timeline_difference());
        self.import_semaphore_with(fd, K::VK, payload, max)
            .map_err(ImportError::into_error)
    }

    /// Imports a semaphore received over a socket, verified first on the
    /// paired Vulkan device (both UUIDs, the kind's exportability), like
    /// [`CudaDevice::import_received_image`]. A binary semaphore starts with
    /// no known pending signal ([`ExternalSemaphore::assume_signalled`]); one
    /// this process sent to itself is refused
    /// ([`ReceivedSemaphore::check_not_own_binary`](vk_export::ReceivedSemaphore::check_not_own_binary)).
    pub fn import_received_semaphore<K: SemaphoreKind>(
        &self,
        received: ReceivedSemaphore<K>,
    ) -> Result<ExternalSemaphore<K>, ImportError> {
        let own_binary = received.check_not_own_binary();
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = own_binary {
            return Err(ImportError {
                error: error.into(),
                fd,
            });
        }
        let max = self
            .vulkan()
            .map(vk_export::Context::max_timeline_difference);
        if let Err(error) = self
            .check_resource_device(&record.info().device_uuid())
            .and_then(|()| self.verify_with_vulkan(|ctx| ctx.verify_semaphore(&record)))
        {
            return Err(ImportError { error, fd });
        }
        self.import_semaphore_with(fd, K::VK, BinaryPayload::new(), max)
    }

    /// Imports a semaphore from a record and an fd that did not travel
    /// together through this crate.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of a semaphore of kind `K` whose own,
    /// unmodified record is `record`. On success the fd is consumed; on
    /// failure it comes back in the error.
    pub unsafe fn import_semaphore_fd<K: SemaphoreKind>(
        &self,
        record: SemaphoreRecord<K>,
        fd: OwnedFd,
    ) -> Result<ExternalSemaphore<K>, ImportError> {
        if let Err(error) = self.check_resource_device(&record.info().device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let max = self
            .vulkan()
            .map(vk_export::Context::max_timeline_difference);
        self.import_semaphore_with(fd, K::VK, BinaryPayload::new(), max)
    }

    fn import_semaphore_with<K>(
        &self,
        fd: OwnedFd,
        kind: vk_export::ash::vk::SemaphoreType,
        payload: BinaryPayload,
        max_difference: Option<u64>,
    ) -> Result<ExternalSemaphore<K>, ImportError> {
        let mut desc = sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
            type_: cuda_handle_type(kind),
            ..Default::default()
        };
        let mut handle: CUexternalSemaphore = std::ptr::null_mut();
        let import = |raw| {
            desc.handle.fd = raw;
            // SAFETY: a zeroed descriptor (flags 0) naming an open fd this
            // crate owns, with the handle type of the record's semaphore
            // kind; the device's context is current; writes one handle.
            unsafe { cu!(cuImportExternalSemaphore(&mut handle, &desc)) }
                .map_err(vk_export::ImportFailure::from)
        };
        // SAFETY: `import` gives the duplicate to exactly one
        // cuImportExternalSemaphore call.
        unsafe { self.import_fd_with(fd, "semaphore", import) }?;
        Ok(ExternalSemaphore {
            device: self.clone(),
            handle,
            last_signalled: Mutex::new(0),
            max_difference,
            payload,
            last_use: LastUse::new(self),
            _kind: PhantomData,
        })
    }
}

/// The payload state to share with an in-process import: a binary
/// semaphore's own, a fresh one for timelines (unused there).
fn shared_payload<K: SemaphoreKind>(semaphore: &vk_export::Semaphore<K>) -> BinaryPayload {
    let any: &dyn std::any::Any = semaphore;
    any.downcast_ref::<vk_export::Semaphore<Binary>>()
        .map_or_else(BinaryPayload::new, |b| b.payload().clone())
}

impl<K> ExternalSemaphore<K> {
    /// The driver handle, for calls the crate does not wrap (batched waits,
    /// a C frame loop). Using it is `unsafe` at the call site; it is valid
    /// while `self` lives, and work using it is not tracked as a last use.
    pub fn raw(&self) -> CUexternalSemaphore {
        self.handle
    }

    /// Enqueues a signal of `value` (0 for binary) on `stream`; records
    /// nothing.
    fn enqueue_signal(&self, stream: &Stream, value: u64) -> Result<()> {
        stream.check_device(&self.device)?;
        // SAFETY: a live stream (borrowed) of this semaphore's device.
        unsafe { self.enqueue_signal_on(stream.raw(), value) }
    }

    /// [`Self::enqueue_signal`] on a raw stream.
    ///
    /// # Safety
    /// `stream` is a default stream handle or a live stream of this
    /// semaphore's device's primary context, alive for the call.
    unsafe fn enqueue_signal_on(&self, stream: sys::CUstream, value: u64) -> Result<()> {
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        params.params.fence.value = value;
        let _guard = self.device.enter_unless_current()?;
        // SAFETY: one zeroed parameter block (flags 0) for one live semaphore,
        // on a live stream (the caller's contract), both of the current
        // context; the semaphore is destroyed only after this signal
        // completes (recorded by callers).
        unsafe {
            cu!(cuSignalExternalSemaphoresAsync(
                &self.handle,
                &params,
                1,
                stream
            ))
        }
    }

    /// Enqueues a wait for `value` (0 for binary) on `stream` and records it
    /// as a use.
    fn wait_raw(&self, stream: &Stream, value: u64) -> Result<()> {
        let _in_flight = self.device.inner.external_waits.begin_wait();
        self.enqueue_wait(stream, value)?;
        self.track_wait(stream);
        Ok(())
    }

    /// Enqueues a wait for `value` (0 for binary) on `stream`; `Ok` means
    /// the wait is enqueued (and must be tracked with [`Self::track_wait`]).
    fn enqueue_wait(&self, stream: &Stream, value: u64) -> Result<()> {
        stream.check_device(&self.device)?;
        // SAFETY: a live stream (borrowed) of this semaphore's device.
        unsafe { self.enqueue_wait_on(stream.raw(), value) }
    }

    /// [`Self::enqueue_wait`] on a raw stream.
    ///
    /// # Safety
    /// `stream` is a default stream handle or a live stream of this
    /// semaphore's device's primary context, alive for the call.
    unsafe fn enqueue_wait_on(&self, stream: sys::CUstream, value: u64) -> Result<()> {
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        params.params.fence.value = value;
        let _guard = self.device.enter_unless_current()?;
        // SAFETY: one zeroed parameter block (flags 0) for one live
        // semaphore, on a live stream (the caller's contract), both of the
        // current context; the semaphore is destroyed only after this wait
        // completes (tracked by the caller).
        unsafe {
            cu!(cuWaitExternalSemaphoresAsync(
                &self.handle,
                &params,
                1,
                stream
            ))
        }
    }

    /// Records an enqueued wait as a use of the semaphore and as a pending
    /// external wait of the device: one ticket of the stream's track, kept
    /// by both lists (no driver call).
    fn track_wait(&self, stream: &Stream) {
        let ticket = stream.track().ticket();
        self.last_use.record_ticket(stream.track(), ticket);
        keep_external_wait(&self.device, stream, ticket);
    }

    /// [`Self::track_wait`] on a raw stream.
    ///
    /// # Safety
    /// As [`Self::enqueue_wait_on`].
    unsafe fn track_wait_on(&self, stream: sys::CUstream) -> Result<()> {
        // Both records are made whatever the other's outcome: a failed one
        // marks its list as unreliable (its owner then leaks instead of
        // trusting it), and must not keep the other from recording.
        let waits = &self.device.inner.external_waits;
        let device_wide = match self.device.enter() {
            // Device-wide destroys check this before they could block on it.
            // SAFETY: a live stream of this semaphore's device's primary
            // context (the caller's contract), which the guard made current.
            Ok(_guard) => unsafe { waits.record(stream) },
            Err(e) => {
                waits.mark_untracked();
                Err(e)
            }
        };
        // SAFETY: as above.
        let own = unsafe { self.last_use.record_raw(stream) };
        device_wide.and(own)
    }
}

impl ExternalSemaphore<Binary> {
    /// Enqueues a signal and returns its token, which exactly one wait (this
    /// semaphore's, or a Vulkan submission's on the same payload) must
    /// consume. A signal already pending is [`Error::Vulkan`] with
    /// `BinarySemaphore`, and nothing is enqueued.
    pub fn signal(&self, stream: &Stream) -> Result<BinarySignal> {
        let reservation = self.payload.reserve_signal()?;
        self.enqueue_signal(stream, 0)?;
        // SAFETY: the signal of this payload was just enqueued successfully.
        let token = unsafe { reservation.submitted() };
        self.last_use.record(stream)?;
        Ok(token)
    }

    /// Enqueues a wait for `signal` and consumes it. A token of another
    /// payload is refused before anything is enqueued.
    pub fn wait(&self, stream: &Stream, signal: BinarySignal) -> Result<()> {
        self.payload.check(&signal)?;
        let _in_flight = self.device.inner.external_waits.begin_wait();
        self.enqueue_wait(stream, 0)?;
        // The token is spent: the wait is tracked whatever consume answers.
        self.track_wait(stream);
        // SAFETY: the wait for this signal was just enqueued successfully.
        unsafe { self.payload.consume(signal) }?;
        Ok(())
    }

    /// This semaphore's payload state.
    pub fn payload(&self) -> &BinaryPayload {
        &self.payload
    }

    /// The replacement token of a pending signal whose token was dropped
    /// unused (a wait that failed before it was enqueued); see
    /// [`BinaryPayload::reclaim`].
    pub fn reclaim_signal(&self) -> Option<BinarySignal> {
        self.payload.reclaim()
    }

    /// The token of a signal this crate did not see: one the peer process
    /// submitted, or the application's own `vkQueueSubmit`.
    ///
    /// # Safety
    /// A signal operation on this semaphore's payload has been submitted
    /// (and not yet waited for), before the wait that uses the token is
    /// enqueued.
    pub unsafe fn assume_signalled(&self) -> Result<BinarySignal> {
        let reservation = self.payload.reserve_signal()?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { reservation.submitted() })
    }
}

impl ExternalSemaphore<Timeline> {
    /// Enqueues a signal of `value`, which must be above every value this
    /// handle signalled before (and, where the handle has a largest step, at
    /// most that step above the last one); otherwise
    /// [`Error::InvalidArgument`] and nothing is enqueued.
    ///
    /// The check, the enqueue and the update of the last value happen under
    /// one lock, and the last value changes only when the enqueue succeeded.
    pub fn signal(&self, stream: &Stream, value: u64) -> Result<()> {
        stream.check_device(&self.device)?;
        // SAFETY: a live stream (borrowed) of this semaphore's device.
        unsafe { self.enqueue_checked_signal(stream.raw(), value) }?;
        self.last_use.record(stream)
    }

    /// [`Self::signal`] on a raw stream.
    ///
    /// # Safety
    /// `stream` is a default stream handle or a live stream of this
    /// semaphore's device's primary context, alive for the call.
    unsafe fn signal_on(&self, stream: sys::CUstream, value: u64) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_checked_signal(stream, value) }?;
        // SAFETY: forwarded from the caller.
        unsafe { self.last_use.record_raw(stream) }
    }

    /// [`Self::signal`]'s check, enqueue and update of the last value, under
    /// one lock; records no use.
    ///
    /// # Safety
    /// As [`Self::signal_on`].
    unsafe fn enqueue_checked_signal(&self, stream: sys::CUstream, value: u64) -> Result<()> {
        let mut last = self
            .last_signalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.check_signal_value(*last, value)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_signal_on(stream, value) }?;
        *last = value;
        Ok(())
    }

    /// `Ok` if `value` may follow `previous`, the last value this handle
    /// signalled: above it, and at most the handle's largest step above it.
    fn check_signal_value(&self, previous: u64, value: u64) -> Result<()> {
        if value <= previous {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value} is not above the last value signalled ({previous}): values only go up"
            )));
        }
        if let Some(max) = self.max_difference {
            if value - previous > max {
                return Err(Error::InvalidArgument(format!(
                    "timeline signal {value} is {} above the last value signalled ({previous}); \
                     the device allows at most {max} (maxTimelineSemaphoreValueDifference)",
                    value - previous
                )));
            }
        }
        Ok(())
    }

    /// Enqueues a wait until the value is at least `value`.
    pub fn wait(&self, stream: &Stream, value: u64) -> Result<()> {
        self.wait_raw(stream, value)
    }

    /// The highest value this handle has signalled.
    pub fn last_signalled(&self) -> u64 {
        *self
            .last_signalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The largest step from the last signalled value to the next signal, if
    /// this handle has one.
    pub fn max_difference(&self) -> Option<u64> {
        self.max_difference
    }
}

/// Ordering with CUDA streams this crate does not own: a runtime, PyTorch
/// or CuPy stream handed over as a raw handle (the C ABI's and the DLPack
/// and CUDA Array Interface `stream` arguments). A stream of this device's
/// primary context (theirs are, and the default stream handles count as
/// its) takes the semaphore operation itself, tracked as a use there like
/// [`Self::wait`] and [`Self::signal`]: no extra hop. A stream of another
/// context of the device is joined with an event to `via`, a [`Stream`] of
/// this crate that takes the operation.
impl ExternalSemaphore<Timeline> {
    /// Makes the foreign `stream` wait until the value is at least `value`:
    /// work the caller enqueues on `stream` afterwards runs after the value
    /// is reached. The wait is enqueued on `stream` itself where it is a
    /// stream of this device's primary context; otherwise on `via` (a
    /// tracked use), with `stream` waiting for an event recorded on `via`
    /// after it (`cuStreamWaitEvent`). Which one is the driver's answer for
    /// `stream`, so do not rely on `via`'s other work being ordered before
    /// `stream`: say so with [`Stream::join_raw`].
    ///
    /// # Safety
    /// `stream` is `CU_STREAM_LEGACY` (`1`), `CU_STREAM_PER_THREAD` (`2`), or
    /// a live stream of this semaphore's device that stays alive for the
    /// duration of this call.
    pub unsafe fn wait_raw_stream(
        &self,
        stream: sys::CUstream,
        value: u64,
        via: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller vouches for `stream`.
        if unsafe { self.device.is_primary_context_stream(stream) }? {
            let _in_flight = self.device.inner.external_waits.begin_wait();
            // SAFETY: a live stream (or a default one) of this device's
            // primary context, just checked; alive for the call.
            unsafe { self.enqueue_wait_on(stream, value) }?;
            // SAFETY: as above.
            return unsafe { self.track_wait_on(stream) };
        }
        self.wait(via, value)?;
        // SAFETY: `via` is a live stream of this device (checked by the
        // wait); the caller vouches for `stream`.
        unsafe { order_streams(&self.device, via.raw(), stream) }
    }

    /// Signals `value` once the work enqueued so far on the foreign `stream`
    /// has completed, with [`Self::signal`]'s checks (a value not above the
    /// last one signalled is refused before anything is enqueued). The
    /// signal is enqueued on `stream` itself where it is a stream of this
    /// device's primary context; otherwise an event is recorded on `stream`,
    /// `via` waits for it and takes the signal.
    ///
    /// # Safety
    /// As for [`Self::wait_raw_stream`].
    pub unsafe fn signal_raw_stream(
        &self,
        stream: sys::CUstream,
        value: u64,
        via: &Stream,
    ) -> Result<()> {
        let last = self.last_signalled();
        if value <= last {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value} is not above the last value signalled ({last}): values only go up"
            )));
        }
        // SAFETY: the caller vouches for `stream`.
        if unsafe { self.device.is_primary_context_stream(stream) }? {
            // SAFETY: a live stream (or a default one) of this device's
            // primary context, just checked; alive for the call.
            return unsafe { self.signal_on(stream, value) };
        }
        via.check_device(&self.device)?;
        // SAFETY: `via` is a live stream of this device (checked above); the
        // caller vouches for `stream`.
        unsafe { order_streams(&self.device, stream, via.raw()) }?;
        self.signal(via, value)
    }
}

/// One semaphore of a batched signal ([`Stream::signal_semaphores`]).
#[derive(Debug)]
pub enum SignalOp<'a> {
    /// Signal `value`, under the rules of a single timeline signal
    /// ([`ExternalSemaphore`]`<Timeline>::signal`).
    Timeline(&'a ExternalSemaphore<Timeline>, u64),
    /// Signal a binary semaphore; its token comes back from the batch.
    Binary(&'a ExternalSemaphore<Binary>),
}

/// One semaphore of a batched wait ([`Stream::wait_semaphores`]).
#[derive(Debug)]
pub enum WaitOp<'a> {
    /// Wait until the value is at least the given one.
    Timeline(&'a ExternalSemaphore<Timeline>, u64),
    /// Wait for the signal this token stands for, and consume it.
    Binary(&'a ExternalSemaphore<Binary>, BinarySignal),
}

impl SignalOp<'_> {
    fn device(&self) -> &CudaDevice {
        match self {
            SignalOp::Timeline(s, _) => &s.device,
            SignalOp::Binary(s) => &s.device,
        }
    }
    fn handle(&self) -> CUexternalSemaphore {
        match self {
            SignalOp::Timeline(s, _) => s.handle,
            SignalOp::Binary(s) => s.handle,
        }
    }
    fn last_use(&self) -> &LastUse {
        match self {
            SignalOp::Timeline(s, _) => &s.last_use,
            SignalOp::Binary(s) => &s.last_use,
        }
    }
}

impl WaitOp<'_> {
    fn device(&self) -> &CudaDevice {
        match self {
            WaitOp::Timeline(s, _) => &s.device,
            WaitOp::Binary(s, _) => &s.device,
        }
    }
    fn handle(&self) -> CUexternalSemaphore {
        match self {
            WaitOp::Timeline(s, _) => s.handle,
            WaitOp::Binary(s, _) => s.handle,
        }
    }
}

/// Keeps the external wait just enqueued on `stream`, as `ticket` of its
/// track, in `device`'s list (which destroys that synchronize the device
/// check first; the waiting semaphore's device, as for waits on foreign
/// streams). No driver call.
fn keep_external_wait(device: &CudaDevice, stream: &Stream, ticket: u64) {
    device
        .inner
        .external_waits
        .keep_stream_wait(stream.track(), ticket, || device.enter());
}

/// Entries a batch holds without allocating (its handles, parameters and
/// locks): a frame's few semaphores.
const INLINE_ENTRIES: usize = 4;

/// A batch's per-entry storage: inline up to [`INLINE_ENTRIES`].
type Entries<T> = SmallVec<[T; INLINE_ENTRIES]>;

/// The driver's limit on entries per batched call is a `c_uint`.
fn batch_count(len: usize) -> Result<std::ffi::c_uint> {
    std::ffi::c_uint::try_from(len).map_err(|_| {
        Error::InvalidArgument(format!(
            "a batch of {len} semaphore operations is more than one driver call takes; split it"
        ))
    })
}

/// Batched semaphore operations: many imported semaphores signalled or
/// waited on with one `cuSignalExternalSemaphoresAsync` or
/// `cuWaitExternalSemaphoresAsync` call.
///
/// Each entry is checked as the single call checks it (the semaphore's
/// device is the stream's, timeline values only go up within the largest
/// step, binary tokens belong to their semaphore, one pending binary signal
/// at most), **all of them before the driver call**: if one entry is
/// refused, nothing is enqueued and no semaphore's state changes.
impl Stream {
    /// Enqueues one signal of every entry, in one driver call, and returns
    /// the tokens of the binary entries in their order in `batch`.
    ///
    /// A timeline semaphore may appear once per batch (the driver does not
    /// order the entries of one call): a second entry of the same handle is
    /// [`Error::InvalidArgument`]. An empty batch calls nothing.
    pub fn signal_semaphores(&self, batch: &[SignalOp<'_>]) -> Result<Vec<BinarySignal>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let count = batch_count(batch.len())?;
        for op in batch {
            self.check_device(op.device())?;
        }
        // The timeline entries, locked in address order so that two batches
        // (or a batch and single signals) never wait on each other's locks.
        let mut timelines: Entries<(&ExternalSemaphore<Timeline>, u64)> = batch
            .iter()
            .filter_map(|op| match op {
                SignalOp::Timeline(s, value) => Some((*s, *value)),
                SignalOp::Binary(_) => None,
            })
            .collect();
        timelines.sort_by_key(|(s, _)| s.handle as usize);
        if timelines.windows(2).any(|w| w[0].0.handle == w[1].0.handle) {
            return Err(Error::InvalidArgument(
                "a timeline semaphore appears twice in one signal batch: signal the larger value once"
                    .into(),
            ));
        }
        let mut locked: Entries<_> = SmallVec::with_capacity(timelines.len());
        for (semaphore, value) in &timelines {
            let last = semaphore
                .last_signalled
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            semaphore.check_signal_value(*last, *value)?;
            locked.push((last, *value));
        }
        // Binary reservations: a refused one drops the earlier ones, which
        // releases their payloads.
        let reservations = batch
            .iter()
            .filter_map(|op| match op {
                SignalOp::Binary(s) => Some(s.payload.reserve_signal()),
                SignalOp::Timeline(..) => None,
            })
            .collect::<std::result::Result<Entries<_>, _>>()?;
        let handles: Entries<CUexternalSemaphore> = batch.iter().map(SignalOp::handle).collect();
        let params: Entries<sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS> = batch
            .iter()
            .map(|op| {
                let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
                if let SignalOp::Timeline(_, value) = op {
                    p.params.fence.value = *value;
                }
                p
            })
            .collect();
        {
            let _guard = self.device().enter_unless_current()?;
            // SAFETY: `count` live semaphores and as many zeroed parameter
            // blocks (flags 0), on a live stream, all of the current context
            // (each semaphore's device is the stream's, checked above); each
            // semaphore is destroyed only after this signal completes (its
            // use is recorded below).
            unsafe {
                cu!(cuSignalExternalSemaphoresAsync(
                    handles.as_ptr(),
                    params.as_ptr(),
                    count,
                    self.raw()
                ))
            }?;
        }
        for (last, value) in &mut locked {
            **last = *value;
        }
        drop(locked);
        let tokens = reservations
            .into_iter()
            // SAFETY: the signal of each reserved payload was just enqueued.
            .map(|r| unsafe { r.submitted() })
            .collect();
        // One ticket behind the batch, kept by every semaphore's list.
        self.record_batch_use(batch.iter().map(SignalOp::last_use));
        Ok(tokens)
    }

    /// Records the batch just enqueued on this stream as a use of each
    /// semaphore in `uses`: one ticket of the stream's track, kept by every
    /// list, and returned.
    fn record_batch_use<'u>(&self, uses: impl Iterator<Item = &'u LastUse>) -> u64 {
        let ticket = self.track().ticket();
        for last_use in uses {
            last_use.record_ticket(self.track(), ticket);
        }
        ticket
    }

    /// Enqueues one wait of every entry, in one driver call, and consumes
    /// the binary entries' tokens.
    ///
    /// A token of another semaphore refuses the whole batch before the
    /// driver; the batch's tokens are then dropped unused, so each can be
    /// reclaimed once (`ExternalSemaphore<Binary>::reclaim_signal`), as
    /// after a refused single wait. An empty batch calls nothing.
    ///
    /// `batch` is any list of entries (a `Vec`, an array, an iterator): a
    /// few entries are held inline, with no allocation.
    pub fn wait_semaphores<'a>(&self, batch: impl IntoIterator<Item = WaitOp<'a>>) -> Result<()> {
        let batch: Entries<WaitOp<'a>> = batch.into_iter().collect();
        if batch.is_empty() {
            return Ok(());
        }
        let count = batch_count(batch.len())?;
        for op in &batch {
            self.check_device(op.device())?;
            if let WaitOp::Binary(s, token) = op {
                s.payload.check(token)?;
            }
        }
        let handles: Entries<CUexternalSemaphore> = batch.iter().map(WaitOp::handle).collect();
        let params: Entries<sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS> = batch
            .iter()
            .map(|op| {
                let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
                if let WaitOp::Timeline(_, value) = op {
                    p.params.fence.value = *value;
                }
                p
            })
            .collect();
        let _in_flight = self.device().inner.external_waits.begin_wait();
        {
            let _guard = self.device().enter_unless_current()?;
            // SAFETY: `count` live semaphores and as many zeroed parameter
            // blocks (flags 0), on a live stream, all of the current context
            // (checked above); each semaphore is destroyed only after this
            // wait completes (tracked below).
            unsafe {
                cu!(cuWaitExternalSemaphoresAsync(
                    handles.as_ptr(),
                    params.as_ptr(),
                    count,
                    self.raw()
                ))
            }?;
        }
        // One ticket covers every wait of the batch (they were enqueued
        // together, on this stream), kept by each semaphore's list and by
        // the device's external waits. Tokens are consumed whatever the
        // others' outcome.
        let ticket = self.record_batch_use(batch.iter().map(|op| match op {
            WaitOp::Timeline(s, _) => &s.last_use,
            WaitOp::Binary(s, _) => &s.last_use,
        }));
        keep_external_wait(self.device(), self, ticket);
        let mut outcome = Ok(());
        for op in batch {
            if let WaitOp::Binary(s, token) = op {
                // SAFETY: the wait for this signal was just enqueued (its
                // token was checked to be this payload's).
                let consumed = unsafe { s.payload.consume(token) }.map_err(Error::from);
                outcome = outcome.and(consumed);
            }
        }
        outcome
    }
}
