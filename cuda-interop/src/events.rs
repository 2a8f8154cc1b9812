//! Lists of CUDA events recorded behind stream work, and the bound and the
//! report of a destructor that waits for such work.
//!
//! # Contract
//!
//! * Nothing here holds a device or a stream: this module sits below them.
//!   An [`Events`] list records on a raw stream of the context its caller
//!   made current; [`ExternalWaits`] enters the device's context through the
//!   closure its caller passes.
//! * A destructor waits for the events of its resource at most
//!   [`DROP_WAIT_LIMIT`]; past that it leaks the resource and says so with
//!   [`report_leak`] (through [`drop_errors`](crate::drop_errors)).
//! * A list that could not record a use can never be shown idle: its owner
//!   leaks rather than trusts it.
//! * A [`SharedEvent`] (one record behind a batch on several resources) is
//!   kept by each resource's list and destroyed by the last one to let go,
//!   with the context current.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cuda_interop_sys::{CUevent, CUstream};

use crate::driver::{create_untimed_event, cu, cu_query, record_drop_error};
use crate::error::{Error, Result};
use crate::wait::poll_until;

/// How long a destructor waits for the GPU's last use of a resource (an
/// import, a mapping, a semaphore, a device buffer) before it gives up and
/// leaks the resource, reporting it through [`drop_errors`](crate::drop_errors).
pub const DROP_WAIT_LIMIT: Duration = Duration::from_secs(5);

/// How many completed events a list keeps for reuse: enough for the few
/// streams a resource is used on at once; the rest are destroyed.
const SPARE_EVENTS: usize = 4;

/// The events of one resource (or one device's external waits): those
/// recorded after work that may not have completed, and completed ones kept
/// for the next record, so that a steady frame loop creates no events.
#[derive(Default)]
pub(crate) struct Events {
    pub(crate) pending: Vec<CUevent>,
    pub(crate) spare: Vec<CUevent>,
    /// Events shared with other lists (one record behind a batch of
    /// operations on several resources), pending here until seen complete.
    pub(crate) shared: Vec<Arc<SharedEvent>>,
}

/// One event recorded behind a batch of operations on several resources of
/// one context, in the list of each of them. The list that lets go of the
/// last reference destroys it; every list operation runs with the context
/// current, and a list dropped without it leaks its references
/// ([`Events::leak_shared`]) rather than destroy an event without it.
pub(crate) struct SharedEvent {
    event: CUevent,
    /// Seen complete once: later queries of other lists need no driver call.
    complete: AtomicBool,
}

// SAFETY: an event handle, used only with its context current (the lists'
// contract); the flag is atomic.
unsafe impl Send for SharedEvent {}
// SAFETY: as above.
unsafe impl Sync for SharedEvent {}

impl SharedEvent {
    /// A new event recorded on `stream`. The context must be current.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context, alive for the
    /// duration of the call.
    pub(crate) unsafe fn record(stream: CUstream) -> Result<Arc<SharedEvent>> {
        let shared = Arc::new(SharedEvent {
            event: create_untimed_event()?,
            complete: AtomicBool::new(false),
        });
        // SAFETY: a live event and a live stream of the current context (the
        // caller's contract); on failure the event is destroyed here, with
        // the context still current.
        unsafe { cu!(cuEventRecord(shared.event, stream)) }?;
        Ok(shared)
    }

    /// Whether the work before the record has completed. The context must
    /// be current.
    fn is_complete(&self) -> Result<bool> {
        if self.complete.load(Ordering::Acquire) {
            return Ok(true);
        }
        // SAFETY: a live event of the current context.
        let done = unsafe { cu_query!(cuEventQuery(self.event)) }?;
        if done {
            self.complete.store(true, Ordering::Release);
        }
        Ok(done)
    }
}

impl Drop for SharedEvent {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once, by the last reference, which
        // a list drops with the context current (see the type's doc).
        record_drop_error(unsafe { cu!(cuEventDestroy(self.event)) });
    }
}

impl Events {
    /// Records a spare (or new) event on `stream` and keeps it pending; first
    /// moves the completed ones to the spares. An earlier event whose query
    /// fails stays pending (the wait for it reports the error). The events'
    /// context must be current, and `stream` must belong to it.
    ///
    /// # Safety
    /// `stream` is a live stream of the current context, alive for the
    /// duration of the call.
    pub(crate) unsafe fn record(&mut self, stream: CUstream) -> Result<()> {
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
        unsafe { cu!(cuEventRecord(event, stream)) }
    }

    /// Moves the events that have completed from the pending list to the
    /// spares (destroying those beyond [`SPARE_EVENTS`]); the first failed
    /// query is returned (its event stays pending). The context must be
    /// current.
    pub(crate) fn forget_completed(&mut self) -> Result<()> {
        let mut first_error = Ok(());
        self.shared.retain(|event| match event.is_complete() {
            Ok(done) => !done,
            Err(error) => {
                if first_error.is_ok() {
                    first_error = Err(error);
                }
                true
            }
        });
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

    /// Keeps `event` (recorded behind work on this list's resource) pending
    /// here; first moves the completed ones out. The context must be
    /// current.
    pub(crate) fn keep_shared(&mut self, event: &Arc<SharedEvent>) {
        let _ = self.forget_completed();
        self.shared.push(Arc::clone(event));
    }

    /// No event is pending.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.shared.is_empty()
    }

    /// Lets go of the shared events without destroying any (for a list
    /// dropped without its context current).
    pub(crate) fn leak_shared(&mut self) {
        for event in self.shared.drain(..) {
            std::mem::forget(event);
        }
    }

    /// Destroys every event, pending or spare, and lets go of the shared
    /// ones. The context must be current.
    pub(crate) fn destroy_all(&mut self) {
        self.shared.clear();
        for event in self.pending.drain(..).chain(self.spare.drain(..)) {
            // SAFETY: a live event of the current context, destroyed once. One
            // still pending (its owner leaked the resource) is released by the
            // driver when it completes, as cuEventDestroy documents.
            record_drop_error(unsafe { cu!(cuEventDestroy(event)) });
        }
    }
}

/// Reports through [`drop_errors`](crate::drop_errors) that a destructor
/// leaked `resource` because
/// [`LastUse::wait_before_release`](crate::last_use::LastUse::wait_before_release)
/// failed with `why`.
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
    ///
    /// # Safety
    /// `stream` is a live stream of the device's context (current), alive
    /// for the duration of the call.
    pub(crate) unsafe fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        let recorded = unsafe { self.lock().record(stream) };
        if recorded.is_err() {
            self.untracked.store(true, Ordering::Release);
        }
        recorded
    }

    /// Marks the list unreliable: a wait was enqueued but not recorded.
    pub(crate) fn mark_untracked(&self) {
        self.untracked.store(true, Ordering::Release);
    }

    /// `Ok` once every recorded external wait of the device has completed,
    /// waiting at most `limit` (no wait at all once a check has given up and
    /// a wait is still pending). `enter` makes the device's context current
    /// until the guard it returns drops.
    pub(crate) fn settled<G>(&self, enter: impl Fn() -> Result<G>, limit: Duration) -> Result<()> {
        if self.untracked.load(Ordering::Acquire) {
            return Err(Error::Cleanup(
                "an external-semaphore wait of this device could not be recorded, so no destroy \
                 can be shown not to wait for it"
                    .into(),
            ));
        }
        if self.lock().is_idle() {
            return Ok(());
        }
        let limit = if self.stuck.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            limit
        };
        let waited = poll_until(limit, || {
            let _guard = enter()?;
            let mut events = self.lock();
            events.forget_completed()?;
            Ok(events.is_idle())
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
