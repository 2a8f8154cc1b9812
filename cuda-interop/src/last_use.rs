//! Last-use tracking: a resource is destroyed only after the GPU work that
//! uses it has completed, however its borrows ended.
//!
//! # Contract
//!
//! * Each resource whose destruction could race the GPU (imported memory and
//!   its mappings, an imported semaphore, a [`DeviceBuffer`](crate::DeviceBuffer))
//!   owns a [`LastUse`]. Every stream-ordered operation on it records a fresh
//!   event on the operation's stream right after enqueueing
//!   ([`LastUse::record`]), so the event completes when that operation does.
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

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cuda_interop_sys::CUevent;

use crate::device::CudaDevice;
use crate::driver::{create_untimed_event, cu, cu_query, record_drop_error};
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::wait::poll_until;

/// How long a destructor waits for the GPU's last use of a resource (an
/// import, a mapping, a semaphore, a device buffer) before it gives up and
/// leaks the resource, reporting it through [`drop_errors`](crate::drop_errors).
pub const DROP_WAIT_LIMIT: Duration = Duration::from_secs(5);

/// The events recorded after the operations on one resource that may not
/// have completed yet.
pub(crate) struct LastUse {
    device: CudaDevice,
    /// Events (`DISABLE_TIMING`) of the current context, each recorded on a
    /// stream after an operation on the resource.
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
        f.debug_struct("LastUse")
            .field("pending", &self.lock().pending.len())
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
    /// call it right after enqueueing the operation. Also forgets the events
    /// of earlier uses that have completed. The caller has checked that the
    /// stream belongs to this device.
    ///
    /// If this fails, the use is untracked and the resource will be leaked
    /// by its destructor rather than freed under the GPU.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        let recorded = self.record_event(stream);
        if recorded.is_err() {
            self.gave_up.store(true, Ordering::Release);
        }
        recorded
    }

    fn record_event(&self, stream: &Stream) -> Result<()> {
        let _guard = self.device.enter()?;
        // An event whose query fails stays pending, and the destructor's
        // wait reports the error: this use is recorded either way.
        self.lock().record(stream)
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
        if self.lock().pending.is_empty() {
            return Ok(());
        }
        let waited = poll_until(limit, || {
            let _guard = self.device.enter()?;
            let mut events = self.lock();
            events.forget_completed()?;
            Ok(events.pending.is_empty())
        });
        if waited.is_err() {
            self.gave_up.store(true, Ordering::Release);
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

/// How many completed events a list keeps for reuse: enough for the few
/// streams a resource is used on at once; the rest are destroyed.
const SPARE_EVENTS: usize = 4;

/// The events of one resource (or one device's external waits): those
/// recorded after work that may not have completed, and completed ones kept
/// for the next record, so that a steady frame loop creates no events.
#[derive(Default)]
pub(crate) struct Events {
    pending: Vec<CUevent>,
    spare: Vec<CUevent>,
}

impl Events {
    /// Records a spare (or new) event on `stream` and keeps it pending; first
    /// moves the completed ones to the spares. An earlier event whose query
    /// fails stays pending (the wait for it reports the error). The events'
    /// context must be current, and `stream` must belong to it.
    fn record(&mut self, stream: &Stream) -> Result<()> {
        let _ = self.forget_completed();
        let event = match self.spare.pop() {
            Some(event) => event,
            // The context is current (the caller's contract).
            None => create_untimed_event()?,
        };
        // Kept before it is recorded, so that it is destroyed either way.
        self.pending.push(event);
        // SAFETY: a live event and a live stream, both of the current context
        // (the caller's contract). A spare has completed, so re-recording it
        // loses no work anybody waits for.
        unsafe { cu!(cuEventRecord(event, stream.raw())) }
    }

    /// Moves the events that have completed from the pending list to the
    /// spares (destroying those beyond [`SPARE_EVENTS`]); the first failed
    /// query is returned (its event stays pending). The context must be
    /// current.
    fn forget_completed(&mut self) -> Result<()> {
        let mut first_error = Ok(());
        let spare = &mut self.spare;
        self.pending.retain(|&event| {
            // SAFETY: a live event of the current context, made by `record`.
            match unsafe { cu_query!(cuEventQuery(event)) } {
                Ok(true) => {
                    if spare.len() < SPARE_EVENTS {
                        spare.push(event);
                    } else {
                        // SAFETY: a live event, complete, destroyed once and
                        // dropped from the list.
                        record_drop_error(unsafe { cu!(cuEventDestroy(event)) });
                    }
                    false
                }
                Ok(false) => true,
                Err(error) => {
                    if first_error.is_ok() {
                        first_error = Err(error);
                    }
                    true
                }
            }
        });
        first_error
    }

    /// Destroys every event, pending or spare. The context must be current.
    fn destroy_all(&mut self) {
        for event in self.pending.drain(..).chain(self.spare.drain(..)) {
            // SAFETY: a live event of the current context, destroyed once. One
            // still pending (its owner leaked the resource) is released by the
            // driver when it completes, as cuEventDestroy documents.
            record_drop_error(unsafe { cu!(cuEventDestroy(event)) });
        }
    }
}

impl Drop for LastUse {
    fn drop(&mut self) {
        let events = self
            .pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if events.pending.is_empty() && events.spare.is_empty() {
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            events.destroy_all();
        }
    }
}

/// `Ok` when a destroy that may wait for the whole device (`cuMemFree`,
/// `cuDestroyExternalMemory`, `cuMipmappedArrayDestroy`) cannot block on a
/// stream stuck behind an external-semaphore wait of this crate.
pub(crate) fn device_settled(device: &CudaDevice) -> Result<()> {
    device.inner.external_waits.settled(device, DROP_WAIT_LIMIT)
}

/// Reports through [`drop_errors`](crate::drop_errors) that a destructor
/// leaked `resource` because [`LastUse::wait_before_release`] failed with `why`.
pub(crate) fn report_leak(resource: &str, why: &Error) {
    record_drop_error(Err(Error::Cleanup(format!(
        "{resource} leaked, not destroyed: the GPU work using it was not seen to complete ({why}), \
         and destroying it could let the GPU use freed memory"
    ))));
}

/// The stream waits on external semaphores of one device that may not have
/// completed yet.
///
/// Some driver calls wait for the whole device (`cuMemFree` synchronizes),
/// so one stream stuck on a semaphore wait that nobody signals (a dead
/// producer) would make them block for ever. Destructors that make such a
/// call first check, bounded, that every external wait enqueued through this
/// crate on the device has completed ([`ExternalWaits::settled`]); if not,
/// they leak instead of blocking. Waits the application enqueues itself, on
/// raw streams, are not seen here.
#[derive(Default)]
pub(crate) struct ExternalWaits {
    pending: Mutex<Events>,
    /// A settle check gave up: later checks only look, without waiting.
    stuck: AtomicBool,
    /// A wait could not be recorded: the list can no longer show that every
    /// external wait completed, so every later settle check fails.
    untracked: AtomicBool,
}

impl fmt::Debug for ExternalWaits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalWaits")
            .field("stuck", &self.stuck.load(Ordering::Relaxed))
            .finish()
    }
}

impl ExternalWaits {
    fn lock(&self) -> MutexGuard<'_, Events> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the external wait just enqueued on `stream`. The device's
    /// context must be current.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        let recorded = self.lock().record(stream);
        if recorded.is_err() {
            self.untracked.store(true, Ordering::Release);
        }
        recorded
    }

    /// Marks the list unreliable: a wait was enqueued but not recorded.
    pub(crate) fn mark_untracked(&self) {
        self.untracked.store(true, Ordering::Release);
    }

    /// `Ok` once every recorded external wait of `device` has completed,
    /// waiting at most `limit` (no wait at all once a check has given up and
    /// a wait is still pending).
    pub(crate) fn settled(&self, device: &CudaDevice, limit: Duration) -> Result<()> {
        if self.untracked.load(Ordering::Acquire) {
            return Err(Error::Cleanup(
                "an external-semaphore wait of this device could not be recorded, so no destroy \
                 can be shown not to wait for it"
                    .into(),
            ));
        }
        if self.lock().pending.is_empty() {
            return Ok(());
        }
        let limit = if self.stuck.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            limit
        };
        let waited = poll_until(limit, || {
            let _guard = device.enter()?;
            let mut events = self.lock();
            events.forget_completed()?;
            Ok(events.pending.is_empty())
        });
        self.stuck.store(waited.is_err(), Ordering::Release);
        waited.map_err(|e| {
            Error::Cleanup(format!(
                "a stream of this device is still waiting on an external semaphore ({e}), and this \
                 destroy would wait for the whole device"
            ))
        })
    }

    /// Destroys the events left (the context must be current).
    pub(crate) fn destroy_all(&self) {
        self.lock().destroy_all();
    }
}

// SAFETY: as for LastUse: driver handles under a mutex, used with their
// context current.
unsafe impl Send for ExternalWaits {}
// SAFETY: as above.
unsafe impl Sync for ExternalWaits {}
