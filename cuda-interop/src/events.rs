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
//! * A use on one of the crate's own streams is not an event: it is a
//!   position in that stream ([`StreamTrack`]: a ticket taken right after
//!   the enqueue). A list keeps the stream's track and its newest ticket
//!   there, and only a wait for the list to go idle (a destructor's, a
//!   device-wide settle check) records an event on the stream, which, the
//!   stream running in order, covers every ticket taken before it. The
//!   price: such a wait also waits for the stream's work enqueued after the
//!   use, up to the moment it records. A stream that drained in a host wait
//!   marks every ticket taken before that wait done, with no event at all.
//! * The device's external waits ([`ExternalWaits`]) are kept the same way:
//!   each wait on one of the crate's streams is that stream's ticket (no
//!   driver call), and the device-wide check before a destroy that
//!   synchronizes the device records the event that covers it. That check
//!   then also waits for the stream's work enqueued after the wait (which a
//!   free's own device synchronization would wait for anyway; a busy
//!   stream's or a pending event's destroy, which run the same check, would
//!   not), bounded: past [`DROP_WAIT_LIMIT`] of such work the destroy leaks
//!   and reports instead of blocking in the driver, as it does for a wait
//!   that nobody signals. See [`ExternalWaits::settled`] for which waits a
//!   check covers.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use cuda_interop_sys::{CUcontext, CUevent, CUstream};

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

/// How many streams a list tracks uses on before it lets go of those known
/// done (a resource used on many short-lived streams).
const TRACKS_BEFORE_PRUNE: usize = 8;

/// The events of one resource (or one device's external waits): those
/// recorded after work that may not have completed, and completed ones kept
/// for the next record, so that a steady frame loop creates no events.
#[derive(Default)]
pub(crate) struct Events {
    pub(crate) pending: Vec<CUevent>,
    pub(crate) spare: Vec<CUevent>,
    /// Uses on the crate's own streams: each stream's track and the newest
    /// ticket taken there, pending until seen done.
    pub(crate) tracked: Vec<(Arc<StreamTrack>, u64)>,
}

/// The event a [`StreamTrack`] recorded behind the tickets it covers,
/// shared with the lists that query it outside the track's lock; destroyed
/// by the last reference, with the context current (see
/// [`release_track`]), or leaked by the track's drop.
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

    /// Keeps `ticket` of `track` (taken right after the use was enqueued
    /// on its stream) pending here: no driver call, no context needed.
    /// Returns whether this added a stream and the list has grown past
    /// [`TRACKS_BEFORE_PRUNE`] streams: its owner then prunes it
    /// ([`Events::prune_tracked`]).
    pub(crate) fn keep_tracked(&mut self, track: &Arc<StreamTrack>, ticket: u64) -> bool {
        match self.tracked.iter_mut().find(|(t, _)| Arc::ptr_eq(t, track)) {
            Some((_, newest)) => {
                *newest = (*newest).max(ticket);
                // Only a new stream grows the list: a use on a stream
                // already kept never prunes (many busy streams would
                // otherwise prune at every use).
                false
            }
            None => {
                self.tracked.push((Arc::clone(track), ticket));
                self.tracked.len() > TRACKS_BEFORE_PRUNE
            }
        }
    }

    /// Forgets the tracked uses already known done, recording nothing (a
    /// stream used once and dropped, or drained, is let go). The context
    /// must be current.
    pub(crate) fn prune_tracked(&mut self) {
        let _ = self.let_go_of_tracked(|track, ticket| Ok(track.is_known_done(ticket)));
    }

    /// Whether one of the tracked streams is marked stuck (no driver call).
    pub(crate) fn any_marked_stuck(&self) -> bool {
        self.tracked
            .iter()
            .any(|(track, _)| track.is_marked_stuck())
    }

    /// Whether a wait for one of the tracked uses timed out on its stream,
    /// which has not moved since ([`StreamTrack::still_stuck`]). The
    /// context must be current.
    pub(crate) fn on_a_stuck_stream(&self) -> bool {
        self.tracked.iter().any(|(track, _)| track.still_stuck())
    }

    /// A wait for the tracked uses timed out: the streams of those still
    /// pending are marked stuck. The context must be current.
    pub(crate) fn mark_tracks_stuck(&self) {
        for (track, _) in &self.tracked {
            track.mark_stuck();
        }
    }

    /// Forgets the tracked uses known done, recording an event on a
    /// stream where none covers its use yet (see [`StreamTrack::cover`]);
    /// the first failure is returned (its use stays pending). The context
    /// must be current.
    pub(crate) fn settle_tracked(&mut self) -> Result<()> {
        self.let_go_of_tracked(StreamTrack::is_done)
    }

    /// Lets go of the tracked uses `done` says are done (the context must be
    /// current: a track's last holder destroys its event); one it fails on
    /// stays, and the first failure is returned.
    fn let_go_of_tracked(
        &mut self,
        mut done: impl FnMut(&StreamTrack, u64) -> Result<bool>,
    ) -> Result<()> {
        let mut first_error = Ok(());
        let mut kept = Vec::with_capacity(self.tracked.len());
        for (track, ticket) in self.tracked.drain(..) {
            match done(&track, ticket) {
                Ok(true) => release_track(track),
                Ok(false) => kept.push((track, ticket)),
                Err(error) => {
                    if first_error.is_ok() {
                        first_error = Err(error);
                    }
                    kept.push((track, ticket));
                }
            }
        }
        self.tracked = kept;
        first_error
    }

    /// No event or tracked use is pending.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.tracked.is_empty()
    }

    /// Lets go of the tracks without destroying any event (for a list
    /// dropped without its context current).
    pub(crate) fn leak_tracks(&mut self) {
        for (track, _) in self.tracked.drain(..) {
            std::mem::forget(track);
        }
    }

    /// Destroys every event, pending or spare, and lets go of the tracks.
    /// The context must be current.
    pub(crate) fn destroy_all(&mut self) {
        for (track, _) in self.tracked.drain(..) {
            release_track(track);
        }
        for event in self.pending.drain(..).chain(self.spare.drain(..)) {
            // SAFETY: a live event of the current context, destroyed once. One
            // still pending (its owner leaked the resource) is released by the
            // driver when it completes, as cuEventDestroy documents.
            record_drop_error(unsafe { cu!(cuEventDestroy(event)) });
        }
    }
}

/// One of the crate's streams as use lists see it (see the module
/// contract): tickets taken after each tracked enqueue, and the newest event
/// recorded on the stream to show them done. Shared by the stream and every
/// list that keeps a use of it; the event is destroyed by the last holder,
/// with the context current ([`release_track`]), or leaked.
pub(crate) struct StreamTrack {
    /// The newest ticket taken.
    issued: AtomicU64,
    /// Every ticket up to this one is done (the stream drained in a host
    /// wait that began after it was taken, or an event covering it was
    /// seen complete).
    done_through: AtomicU64,
    /// A destructor's wait timed out on the covering event (kept as
    /// `TrackState::stuck_on`): later waits on this stream look once and
    /// give up too, rather than each wait its whole bound, as long as that
    /// event is still pending ([`StreamTrack::still_stuck`]); cleared once
    /// it is seen complete, or a drain or a later completed event is.
    stuck: AtomicBool,
    state: Mutex<TrackState>,
}

struct TrackState {
    /// The live stream; `None` once its owner destroyed it (`covering` then
    /// covers every ticket, or `broken` is set).
    stream: Option<CUstream>,
    /// The newest event recorded on the stream, and the newest ticket it
    /// covers.
    covering: Option<(u64, Arc<SharedEvent>)>,
    /// The stream was destroyed and the event behind its pending tickets
    /// could not be recorded: they can never be shown done.
    broken: bool,
    /// The covering event a destructor's wait timed out on, while the
    /// stream is marked stuck (`StreamTrack::stuck`).
    stuck_on: Option<Arc<SharedEvent>>,
}

// SAFETY: the stream handle is only used under the mutex, with its context
// current (the callers' contract), and never after its owner destroyed it
// (`close` clears it under the same mutex first).
unsafe impl Send for StreamTrack {}
// SAFETY: as above; the counters are atomic.
unsafe impl Sync for StreamTrack {}

impl StreamTrack {
    /// The track of the live stream `stream`.
    pub(crate) fn new(stream: CUstream) -> StreamTrack {
        StreamTrack {
            issued: AtomicU64::new(0),
            done_through: AtomicU64::new(0),
            stuck: AtomicBool::new(false),
            state: Mutex::new(TrackState {
                stream: Some(stream),
                covering: None,
                broken: false,
                stuck_on: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TrackState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new ticket: call it right after enqueueing the tracked operation,
    /// so that every event recorded on the stream after the ticket was
    /// taken completes after the operation.
    pub(crate) fn ticket(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The newest ticket taken so far (for a host wait about to begin).
    pub(crate) fn issued(&self) -> u64 {
        self.issued.load(Ordering::Acquire)
    }

    /// Every ticket up to `ticket` is done (the stream drained after it was
    /// taken, or an event behind it completed): the stream moves, so it is
    /// not stuck.
    pub(crate) fn mark_done_through(&self, ticket: u64) {
        self.done_through.fetch_max(ticket, Ordering::AcqRel);
        self.stuck.store(false, Ordering::Release);
    }

    /// Whether the use of `ticket` is done: known from a drained host wait,
    /// or from the covering event, which this records on the stream if none
    /// covers `ticket` yet. The context must be current.
    fn is_done(&self, ticket: u64) -> Result<bool> {
        Ok(self.pending_cover(ticket)?.is_none())
    }

    /// `None` if the use of `ticket` is done, else the event that covers it
    /// (recorded now if none does yet), still pending. The context must be
    /// current.
    fn pending_cover(&self, ticket: u64) -> Result<Option<Arc<SharedEvent>>> {
        if self.done_through.load(Ordering::Acquire) >= ticket {
            return Ok(None);
        }
        let event = self.cover(ticket)?;
        if event.is_complete()? {
            self.mark_done_through(ticket);
            return Ok(None);
        }
        Ok(Some(event))
    }

    /// Whether the use of `ticket` is known done without recording
    /// anything: from a drained host wait, or from an event that already
    /// covers it and has completed (one query). The context must be
    /// current.
    fn is_known_done(&self, ticket: u64) -> bool {
        if self.done_through.load(Ordering::Acquire) >= ticket {
            return true;
        }
        let covering = match &self.lock().covering {
            Some((covered, event)) if *covered >= ticket => Arc::clone(event),
            _ => return false,
        };
        matches!(covering.is_complete(), Ok(true))
    }

    /// Whether the stream is marked stuck (no driver call).
    fn is_marked_stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire)
    }

    /// Marked stuck, and the very event that timed out is still pending
    /// (one query; seen complete, the mark is cleared: the stream moved).
    /// The context must be current.
    fn still_stuck(&self) -> bool {
        if !self.is_marked_stuck() {
            return false;
        }
        let Some(timed_out) = self.lock().stuck_on.clone() else {
            return false;
        };
        match timed_out.is_complete() {
            Ok(true) => {
                self.stuck.store(false, Ordering::Release);
                self.lock().stuck_on = None;
                false
            }
            _ => true,
        }
    }

    /// A destructor's wait timed out on this stream's covering event (if it
    /// has one: a track whose record failed is not stuck, just unproven):
    /// that event is kept as the mark, unless one is set already. The
    /// context must be current (an earlier mark's event may go).
    fn mark_stuck(&self) {
        let mut state = self.lock();
        if self.stuck.load(Ordering::Acquire) && state.stuck_on.is_some() {
            return;
        }
        if let Some((_, event)) = &state.covering {
            state.stuck_on = Some(Arc::clone(event));
            self.stuck.store(true, Ordering::Release);
        }
    }

    /// The event that covers `ticket`: the newest one if it does, else one
    /// recorded now, covering every ticket taken so far. The context must
    /// be current.
    fn cover(&self, ticket: u64) -> Result<Arc<SharedEvent>> {
        let mut state = self.lock();
        if let Some((covered, event)) = &state.covering {
            if *covered >= ticket {
                return Ok(Arc::clone(event));
            }
        }
        if state.broken {
            return Err(Error::Cleanup(
                "the stream was destroyed and no event could be recorded behind its uses".into(),
            ));
        }
        let Some(stream) = state.stream else {
            // `close` covers every ticket or breaks the track.
            return Err(Error::Cleanup(
                "a use on a destroyed stream with no event behind it".into(),
            ));
        };
        // Taken before the record: every ticket up to it was taken after its
        // enqueue, so before this record.
        let covered = self.issued();
        // A failure records nothing: the next wait tries again.
        // SAFETY: the live stream of the current context (it is cleared here
        // before its owner destroys it, under this lock).
        let event = unsafe { SharedEvent::record(stream) }?;
        state.covering = Some((covered, Arc::clone(&event)));
        Ok(event)
    }

    /// The stream's owner is about to destroy it: an event behind every
    /// ticket taken that none covers yet, then no stream. The context must
    /// be current.
    pub(crate) fn close(&self) {
        let issued = self.issued();
        let mut state = self.lock();
        let covered = state.covering.as_ref().map_or(0, |(c, _)| *c);
        if issued > covered && self.done_through.load(Ordering::Acquire) < issued {
            match state.stream {
                // SAFETY: the live stream of the current context, not yet
                // destroyed (the caller's contract).
                Some(stream) => match unsafe { SharedEvent::record(stream) } {
                    Ok(event) => state.covering = Some((u64::MAX, event)),
                    Err(_) => state.broken = true,
                },
                None => state.broken = true,
            }
        } else if let Some((covered, _)) = &mut state.covering {
            // No ticket can be taken on a destroyed stream.
            *covered = u64::MAX;
        }
        state.stream = None;
    }

    /// Destroys the covering event and the stuck mark's (the context must
    /// be current).
    pub(crate) fn destroy_event(&self) {
        let mut state = self.lock();
        state.covering = None;
        state.stuck_on = None;
    }
}

impl fmt::Debug for StreamTrack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamTrack")
            .field("issued", &self.issued.load(Ordering::Relaxed))
            .field("done_through", &self.done_through.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for StreamTrack {
    fn drop(&mut self) {
        // Dropped by a holder without the context current: its event is
        // leaked rather than destroyed without it.
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, event)) = state.covering.take() {
            std::mem::forget(event);
        }
        if let Some(event) = state.stuck_on.take() {
            std::mem::forget(event);
        }
    }
}

/// Lets go of `track`; the last holder destroys its event. The context must
/// be current.
pub(crate) fn release_track(track: Arc<StreamTrack>) {
    if let Some(track) = Arc::into_inner(track) {
        track.destroy_event();
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
    /// Waits being enqueued and not yet recorded ([`ExternalWaits::begin_wait`]):
    /// a settle check counts them as pending.
    in_flight: AtomicUsize,
    /// A settle check gave up on these covering events (the waits on the
    /// crate's streams it timed out on): while one of them is pending,
    /// later checks only look, without waiting. Empty: not stuck. The
    /// events go with the context current (their last holder destroys
    /// them).
    stuck_on: Mutex<Vec<Arc<SharedEvent>>>,
    /// A wait could not be recorded: the list can no longer show that every
    /// external wait completed, so every later settle check fails.
    untracked: AtomicBool,
}

impl fmt::Debug for ExternalWaits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalWaits")
            .field(
                "stuck",
                &!self
                    .stuck_on
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_empty(),
            )
            .finish()
    }
}

/// The lists of the primary contexts with a live device in this process
/// (the context handle as an address; dead entries are dropped as found).
static LISTS: Mutex<Vec<(usize, Weak<ExternalWaits>)>> = Mutex::new(Vec::new());

impl ExternalWaits {
    /// The list of the primary context `context`: the one a live device of
    /// it already has, else a new one.
    pub(crate) fn of_context(context: CUcontext) -> Arc<ExternalWaits> {
        let mut lists = LISTS.lock().unwrap_or_else(PoisonError::into_inner);
        lists.retain(|(_, list)| list.strong_count() > 0);
        let key = context as usize;
        if let Some(list) = lists
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, list)| list.upgrade())
        {
            return list;
        }
        let list = Arc::new(ExternalWaits::default());
        lists.push((key, Arc::downgrade(&list)));
        list
    }

    fn lock(&self) -> MutexGuard<'_, Events> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A wait is about to be enqueued: until the returned guard drops
    /// (after its record, or its failure), settle checks count it pending,
    /// so one on another thread cannot pass between the enqueue and the
    /// record.
    pub(crate) fn begin_wait(&self) -> InFlightWait<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlightWait(self)
    }

    fn nothing_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
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

    /// Keeps the external wait just enqueued on a stream of the crate, as
    /// `ticket` of its `track` (taken right after the enqueue): no driver
    /// call. A list grown past a few streams lets go of those known done,
    /// with the context `enter` makes current (skipped if it cannot).
    pub(crate) fn keep_stream_wait<G>(
        &self,
        track: &Arc<StreamTrack>,
        ticket: u64,
        enter: impl FnOnce() -> Result<G>,
    ) {
        let mut events = self.lock();
        if events.keep_tracked(track, ticket) {
            if let Ok(_guard) = enter() {
                events.prune_tracked();
            }
        }
    }

    /// Marks the list unreliable: a wait was enqueued but not recorded.
    pub(crate) fn mark_untracked(&self) {
        self.untracked.store(true, Ordering::Release);
    }

    /// `Ok` once every external wait of the device recorded before the check
    /// began has completed, waiting at most `limit` (no wait at all while a
    /// wait an earlier check gave up on is still pending). `enter` makes the
    /// device's context current until the guard it returns drops.
    ///
    /// On the crate's streams the check waits in two rounds: for the tickets
    /// kept at its first look with no wait in flight, then for those kept by
    /// the time that round passed, not for those kept while the second runs:
    /// a stream given a wait every frame on another thread would otherwise
    /// never be seen idle. So a wait enqueued during the second round (as
    /// long as the stream's queue took to drain once) can still be stuck
    /// when the destroy runs. Waits on foreign streams are events, re-read
    /// at every look: one such stream fed a wait every frame keeps the check
    /// from passing until its bound.
    pub(crate) fn settled<G>(&self, enter: impl Fn() -> Result<G>, limit: Duration) -> Result<()> {
        if self.untracked.load(Ordering::Acquire) {
            return Err(Error::Cleanup(
                "an external-semaphore wait of this device could not be recorded, so no destroy \
                 can be shown not to wait for it"
                    .into(),
            ));
        }
        if self.nothing_in_flight() && self.lock().is_idle() {
            return Ok(());
        }
        let look_only = self.still_stuck(&enter);
        let limit = if look_only { Duration::ZERO } else { limit };
        let start = Instant::now();
        let mut waited = Ok(());
        for _round in 0..2 {
            let (round, blocking) =
                self.settle_round(&enter, limit.saturating_sub(start.elapsed()));
            waited = round;
            // A timeout of a check that waited marks the device stuck on the
            // events it gave up on; a look-only check keeps the earlier
            // mark (its own look would only renew it).
            let timed_out = matches!(waited, Err(Error::Timeout(_)));
            let let_go = if timed_out && !look_only && !blocking.is_empty() {
                std::mem::replace(
                    &mut *self.stuck_on.lock().unwrap_or_else(PoisonError::into_inner),
                    blocking,
                )
            } else {
                blocking
            };
            // The events go with the context current (a last holder destroys
            // them); the waits seen done leave the list.
            match enter() {
                Ok(_guard) => {
                    drop(let_go);
                    self.lock().prune_tracked();
                }
                Err(_) => let_go.into_iter().for_each(std::mem::forget),
            }
            if waited.is_err() {
                break;
            }
        }
        waited.map_err(|e| {
            Error::Cleanup(format!(
                "a stream of this device is still waiting on an external semaphore ({e}), and this \
                 destroy would wait for the whole device"
            ))
        })
    }

    /// One round of [`ExternalWaits::settled`]: waits at most `limit` for the
    /// tickets kept at its first look with nothing in flight and for the
    /// foreign streams' events. Returns the covering events of the tickets
    /// still pending at its last look (each one covered, none skipped).
    fn settle_round<G>(
        &self,
        enter: &impl Fn() -> Result<G>,
        limit: Duration,
    ) -> (Result<()>, Vec<Arc<SharedEvent>>) {
        let mut kept: Option<Vec<(Arc<StreamTrack>, u64)>> = None;
        let mut blocking = Vec::new();
        let waited = poll_until(limit, || {
            let _guard = enter()?;
            // Last look's events, let go with the context current.
            blocking.clear();
            let mut events = self.lock();
            events.forget_completed()?;
            let foreign_idle = events.pending.is_empty();
            let kept = match &kept {
                Some(kept) => kept,
                // Every wait begun before this look is recorded by now.
                None if self.nothing_in_flight() => kept.insert(events.tracked.clone()),
                None => return Ok(false),
            };
            drop(events);
            for (track, ticket) in kept {
                if let Some(event) = track.pending_cover(*ticket)? {
                    blocking.push(event);
                }
            }
            Ok(blocking.is_empty() && foreign_idle)
        });
        // The copies of the tracks go with the context current (a last
        // holder destroys its event).
        match enter() {
            Ok(_guard) => kept
                .into_iter()
                .flatten()
                .for_each(|(track, _)| release_track(track)),
            Err(_) => drop(kept),
        }
        (waited, blocking)
    }

    /// Whether an earlier check gave up and one of the events it gave up on
    /// is still pending (one query each, no record). Cleared, with the
    /// context current, once none is.
    fn still_stuck<G>(&self, enter: &impl Fn() -> Result<G>) -> bool {
        let Ok(_guard) = enter() else {
            return !self
                .stuck_on
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty();
        };
        let mut stuck_on = self.stuck_on.lock().unwrap_or_else(PoisonError::into_inner);
        if stuck_on.is_empty() {
            return false;
        }
        if stuck_on
            .iter()
            .all(|event| matches!(event.is_complete(), Ok(true)))
        {
            stuck_on.clear();
            return false;
        }
        true
    }

    /// Destroys the events left (the context must be current).
    pub(crate) fn destroy_all(&self) {
        self.stuck_on
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.lock().destroy_all();
    }
}

impl Drop for ExternalWaits {
    fn drop(&mut self) {
        // Dropped without `destroy_all` (the context could not be made
        // current): the stuck mark's events are leaked, not destroyed
        // without it.
        let stuck_on = self
            .stuck_on
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        stuck_on.drain(..).for_each(std::mem::forget);
    }
}

/// A wait of [`ExternalWaits::begin_wait`] being enqueued and recorded.
pub(crate) struct InFlightWait<'a>(&'a ExternalWaits);

impl Drop for InFlightWait<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

// SAFETY: as for LastUse: driver handles under a mutex, used with their
// context current.
unsafe impl Send for ExternalWaits {}
// SAFETY: as above.
unsafe impl Sync for ExternalWaits {}
