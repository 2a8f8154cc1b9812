//! Last-use tracking: a resource is destroyed only after the GPU work that
//! uses it has completed, however its borrows ended. Also the one way a
//! synchronous copy with host memory runs (`Stream::copy_with_host_memory`),
//! which drains the stream, enqueues, records the uses and waits.
//!
//! # Contract
//!
//! * Each resource whose destruction could race the GPU (imported memory and
//!   its mappings, an imported semaphore, a [`DeviceBuffer`](crate::DeviceBuffer))
//!   owns a [`LastUse`]. Every stream-ordered operation on it is recorded
//!   right after enqueueing. On one of the crate's [`Stream`]s that is a
//!   ticket of the stream's track ([`LastUse::record`], no driver call):
//!   the wait for the list to go idle records one event on the stream
//!   then, which completes after the operation (and after whatever the
//!   stream was given after it: see `crate::events`), unless a host wait
//!   on the stream already showed it drained. On a stream the crate does
//!   not own, it is a fresh event recorded there ([`LastUse::record_raw`]).
//!   A batch of operations on several resources (one driver call) is one
//!   ticket, kept by every resource's list ([`LastUse::record_ticket`]).
//! * The resource's `Drop` calls [`LastUse::wait_before_release`], bounded by
//!   [`DROP_WAIT_LIMIT`], before it frees or destroys anything. If the work
//!   does not complete in time (a stream stuck behind a semaphore wait nobody
//!   signals), the destructor leaks the resource instead of freeing memory
//!   the GPU may still use, and reports that through
//!   [`drop_errors`](crate::drop_errors).
//! * The record lives in the resource, not in a borrow or a guard, so
//!   `mem::forget` of a mapping cannot skip it: the import's own `Drop` still
//!   waits for the copies made through the forgotten mapping.
//! * Once a wait has given up, or a use could not be recorded, the resource
//!   can never be shown idle: every later wait on it gives up at once, and
//!   the whole resource is leaked.
//! * **Copies to or from host memory drain the stream first.** For pageable
//!   host memory, `cuMemcpyDtoHAsync` blocks inside the driver until the copy
//!   is done, so a copy queued behind a semaphore wait nobody signals would
//!   block forever. Every synchronous helper that copies host memory first
//!   waits (bounded by the stream's timeout) for the stream's earlier work,
//!   returns [`Error::Timeout`] with nothing enqueued if it does not drain,
//!   and only then enqueues the copy and waits for it. **The one wait
//!   without a bound** is this last one, past the timeout: the copy reads or
//!   writes the caller's borrowed host memory, so returning before it is
//!   done would let the GPU touch memory the caller may free. The stream was
//!   drained first, so nothing but the copy itself (or a driver fault, which
//!   ends the wait with an error) stands before it.
//! * **Device-side operations are tracked, not waited for.** Each operation
//!   on imported memory, a semaphore or a
//!   [`DeviceBuffer`](crate::DeviceBuffer) records its last
//!   use on that resource, whose destructor waits for it (see the crate's
//!   last-use rule), so a stream-ordered copy cannot outlive its memory.
//!   Kernel launches are tracked the same way through
//!   [`Stream::launch_tracked`] and the resources it lists
//!   ([`KernelUses`](crate::KernelUses)); the bare [`Stream::launch`]
//!   leaves what the kernel uses to its caller.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::context::{device_settled, CudaDevice};
use crate::error::{Error, Result};
use crate::events::{Events, StreamTrack, DROP_WAIT_LIMIT};
use crate::stream::Stream;
use crate::wait::{poll_until, HostWait};
use cuda_interop_sys::CUstream;

/// The uses of one resource that may not have completed yet: tickets of
/// the crate's streams, events on foreign ones.
pub(crate) struct LastUse {
    device: CudaDevice,
    /// The tracked streams with their newest ticket, and the events
    /// (`DISABLE_TIMING`, of the device's context) recorded on foreign
    /// streams after an operation on the resource.
    pending: Mutex<Events>,
    /// Set when a wait gave up or a use could not be recorded.
    gave_up: AtomicBool,
}

// SAFETY: the events are driver handles, usable from any thread with their
// context current (every use enters the device first); the list is only read
// or changed under its mutex.
unsafe impl Send for LastUse {}
// SAFETY: as above; every method takes the mutex before touching the list.
unsafe impl Sync for LastUse {}

impl fmt::Debug for LastUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One lock: the guard of a first `self.lock()` would live to the end
        // of the statement, and a second would wait on it for ever.
        let pending = {
            let events = self.lock();
            events.pending.len() + events.tracked.len()
        };
        f.debug_struct("LastUse")
            .field("pending", &pending)
            .field("gave_up", &self.gave_up.load(Ordering::Relaxed))
            .finish()
    }
}

impl LastUse {
    /// No use yet, on `device`.
    pub(crate) fn new(device: &CudaDevice) -> LastUse {
        LastUse {
            device: device.clone(),
            pending: Mutex::new(Events::default()),
            gave_up: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Events> {
        // The list stays consistent whatever panicked while holding it: an
        // event is pushed whole or not at all.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that the work enqueued on `stream` so far uses the resource:
    /// call it right after enqueueing the operation. A ticket of the
    /// stream's track: no driver call (unless the list has grown past a few
    /// streams: those known done are then let go), and it cannot fail. The
    /// caller has checked that the stream belongs to this device.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        self.record_ticket(stream.track(), stream.track().ticket());
        Ok(())
    }

    /// Records a use of `ticket` of `track` (taken right after enqueueing
    /// the operation: one ticket may stand for a batch on several
    /// resources).
    pub(crate) fn record_ticket(&self, track: &Arc<StreamTrack>, ticket: u64) {
        let mut events = self.lock();
        if events.keep_tracked(track, ticket) {
            // Used on many streams: those known done are let go.
            if let Ok(_guard) = self.device.enter() {
                events.prune_tracked();
            }
        }
    }

    /// [`LastUse::record`] for a stream this crate does not own.
    ///
    /// # Safety
    /// `stream` is a default stream handle or a live stream of this
    /// resource's device's primary context, alive for the call.
    pub(crate) unsafe fn record_raw(&self, stream: CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        let recorded = unsafe { self.record_event(stream) };
        if recorded.is_err() {
            self.gave_up.store(true, Ordering::Release);
        }
        recorded
    }

    /// # Safety
    /// As [`LastUse::record_raw`].
    unsafe fn record_event(&self, stream: CUstream) -> Result<()> {
        let _guard = self.device.enter()?;
        // An event whose query fails stays pending, and the destructor's
        // wait reports the error: this use is recorded either way.
        // SAFETY: a live stream of this resource's device's primary context
        // (the caller's contract), which the guard made current.
        unsafe { self.lock().record(stream) }
    }

    /// Waits until every recorded use has completed, at most `limit`
    /// ([`Error::Timeout`]). For destructors: a failure means the resource
    /// must be leaked, and every later call fails at once.
    pub(crate) fn wait_before_release(&self, limit: Duration) -> Result<()> {
        if self.gave_up.load(Ordering::Acquire) {
            return Err(Error::Cleanup(
                "an earlier wait for its last use gave up, or a use could not be recorded".into(),
            ));
        }
        if self.lock().is_idle() {
            return Ok(());
        }
        // Another destructor timed out on a stream this resource was used
        // on, and the stream has not moved since: look once, do not wait
        // the bound again.
        let stuck = self.lock().any_marked_stuck()
            && match self.device.enter() {
                Ok(_guard) => self.lock().on_a_stuck_stream(),
                Err(_) => false,
            };
        let limit = match stuck {
            true => Duration::ZERO,
            false => limit,
        };
        let waited = poll_until(limit, || {
            let _guard = self.device.enter()?;
            let mut events = self.lock();
            events.forget_completed()?;
            events.settle_tracked()?;
            Ok(events.is_idle())
        });
        if let Err(error) = &waited {
            self.gave_up.store(true, Ordering::Release);
            if matches!(error, Error::Timeout(_)) {
                // Only a wait that ran out of time says the streams are
                // stuck (an error says nothing about them).
                if let Ok(_guard) = self.device.enter() {
                    self.lock().mark_tracks_stuck();
                }
            }
        }
        waited
    }
}

impl LastUse {
    /// For destructors whose call may wait for the whole device (`cuMemFree`,
    /// `cuDestroyExternalMemory`, `cuMipmappedArrayDestroy`): every recorded
    /// use has completed, and no external wait of this crate could make the
    /// call block ([`device_settled`]); both bounded by [`DROP_WAIT_LIMIT`].
    pub(crate) fn settle_before_device_wide_release(&self) -> Result<()> {
        self.wait_before_release(DROP_WAIT_LIMIT)
            .and_then(|()| device_settled(&self.device))
    }
}

impl Drop for LastUse {
    fn drop(&mut self) {
        let events = self
            .pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if events.is_idle() && events.spare.is_empty() {
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            events.destroy_all();
        } else {
            events.leak_tracks();
        }
    }
}

impl Stream {
    /// How every synchronous copy to or from host memory runs: wait (bounded
    /// by the stream's timeout) for the stream to drain, so that the copy
    /// waits for nothing else (a pageable copy blocks inside the driver until
    /// it is done); then `enqueue` the copy, record it as a use of each of
    /// `used`, and wait for the copy.
    ///
    /// The wait for the copy itself is not cut short at the timeout: the
    /// host memory is the caller's borrow, and a copy from or to page-locked
    /// memory runs asynchronously and may still access it, so this returns
    /// only when the copy is done or the driver reports an error. With the
    /// stream drained first, that wait is the copy's own time.
    pub(crate) fn copy_with_host_memory(
        &self,
        used: &[&LastUse],
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.synchronize(self.timeout())?;
        enqueue()?;
        let recorded = used.iter().try_for_each(|last_use| last_use.record(self));
        // Whatever ends the first wait early (its timeout, or a failure of
        // its wake-up machinery), the copy may still be running on the
        // caller's memory: only the stream's own query (done, or a sticky
        // driver error) may end the wait for it.
        let copied = match self.synchronize(self.timeout()) {
            Ok(()) => Ok(()),
            Err(_) => self.synchronize_with(HostWait::Poll, Duration::MAX),
        };
        copied.and(recorded)
    }
}
