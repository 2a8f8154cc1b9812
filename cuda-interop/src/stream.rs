//! Streams and events: the queue of the crate's stream-ordered work, its
//! bounded host waits, and the joins between streams.
//!
//! What is enqueued lives with what it works on: the host and device copies
//! of linear memory in the `linear` module (device buffers too), of arrays
//! in `array` and `copy`, kernel launches in `launch`, PTX modules in
//! `module`; the rule that a copy with host memory drains the stream first,
//! and the last-use records every operation takes, in `last_use`.
//!
//! # Contract
//!
//! * **Every host wait is bounded.** [`Stream::synchronize`] and
//!   [`Event::synchronize`] take a timeout; a [`Stream`]'s blocking helpers
//!   use the stream's own [`Stream::timeout`]. Nothing here calls
//!   `cuCtxSynchronize`, `cuStreamSynchronize` or `cuEventSynchronize`.
//! * **Stream waits use a [`HostWait`]**, [`HostWait::ADAPTIVE`] unless told
//!   ([`Stream::synchronize_with`]): spin 50 µs on `cuStreamQuery`, then
//!   sleep on the eventfd of a [`Completion`] enqueued behind the work; a
//!   stream whose shortest recent wait lasted at most 80 spins paces the
//!   next one instead (sleeps through most of the learned length, then
//!   watches its end by querying), and one whose waits all lasted longer
//!   blocks at once.
//!   A stream keeps its last such completion while it is pending and waits
//!   on it again rather than enqueueing another, so repeated timed-out
//!   waits on a stuck stream hold one eventfd, not one each.
//! * A stream is used only with resources of its own device; another
//!   device's is refused with [`Error::DeviceMismatch`] before any call.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_interop_sys::{CUevent, CUevent_flags, CUstream, CUstream_flags};

use crate::completion::Completion;
use crate::context::{device_settled, CudaDevice};
use crate::driver::{create_event, create_untimed_event, cu, cu_query, record_drop_error};
use crate::error::{Error, Result};
use crate::events::{release_track, report_leak, StreamTrack};
use crate::wait::{poll_until, spin_until, Alarm, HostWait, Plan, Seen, WaitHistory};

/// A CUDA stream in the paired device's primary context.
///
/// `Send` but not `Sync`: work enqueued from two threads at once would have no
/// defined order, so enqueueing needs the one owner (or a lock).
///
/// It carries a [`timeout`](Stream::timeout) ([`Stream::DEFAULT_TIMEOUT`]
/// unless [set](Stream::set_timeout)) that bounds every wait its blocking
/// helpers make.
#[derive(Debug)]
pub struct Stream {
    device: CudaDevice,
    stream: CUstream,
    timeout: Duration,
    /// The completion the last blocked wait enqueued, while it may be
    /// pending: the next wait waits on it before enqueueing another.
    marker: RefCell<Option<Completion>>,
    /// What the [`HostWait::Adaptive`] waits learned (it plans the next
    /// one).
    wait_history: Cell<WaitHistory>,
    /// The uses recorded here, as use lists see them (`crate::events`);
    /// taken only by `Drop`, to let go of it with the context current.
    track: Option<Arc<StreamTrack>>,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: a stream handle may be used from any thread with its context current
// (every method enters the context first).
unsafe impl Send for Stream {}

impl Stream {
    /// The timeout of a new stream's blocking helpers.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A new non-blocking stream, with [`Stream::DEFAULT_TIMEOUT`].
    pub fn new(device: &CudaDevice) -> Result<Stream> {
        let _guard = device.enter()?;
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: the device's context is current; writes one stream handle.
        unsafe {
            cu!(cuStreamCreate(
                &mut stream,
                CUstream_flags::CU_STREAM_NON_BLOCKING.0
            ))
        }?;
        Ok(Stream {
            device: device.clone(),
            stream,
            timeout: Stream::DEFAULT_TIMEOUT,
            marker: RefCell::new(None),
            wait_history: Cell::new(WaitHistory::default()),
            track: Some(Arc::new(StreamTrack::new(stream))),
            _not_sync: PhantomData,
        })
    }

    /// The track use lists keep of this stream (`crate::events`).
    pub(crate) fn track(&self) -> &Arc<StreamTrack> {
        self.track
            .as_ref()
            .expect("taken only by the stream's drop")
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// The `CUstream`.
    pub fn raw(&self) -> CUstream {
        self.stream
    }

    /// The bound on every wait this stream's blocking helpers make (host
    /// copies, level copies).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on the waits of this stream's blocking helpers.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Whether all work enqueued so far is done (`cuStreamQuery`); never blocks.
    pub fn query(&self) -> Result<bool> {
        let issued = self.track().issued();
        let _guard = self.device.enter()?;
        // SAFETY: a live stream of the current context.
        let idle = unsafe { cu_query!(cuStreamQuery(self.stream)) }?;
        if idle {
            // Everything enqueued before the query is done.
            self.track().mark_done_through(issued);
        }
        Ok(idle)
    }

    /// Makes the foreign stream `later` (the runtime's, PyTorch's, CuPy's)
    /// wait for the work enqueued on this stream so far: an event recorded
    /// here, waited for there (`cuStreamWaitEvent`); nothing blocks on the
    /// host. Work enqueued on `later` afterwards runs after it.
    ///
    /// # Safety
    /// `later` is `CU_STREAM_LEGACY` (`1`), `CU_STREAM_PER_THREAD` (`2`), or
    /// a live stream of this stream's device (any context of it), alive for
    /// the duration of the call.
    pub unsafe fn join_raw(&self, later: CUstream) -> Result<()> {
        // SAFETY: this stream is live (borrowed) and of its device's primary
        // context; the caller vouches for `later`.
        unsafe { order_streams(&self.device, self.stream, later) }
    }

    /// Waits until all work enqueued so far is done, at most `timeout`
    /// ([`Error::Timeout`]; the work stays enqueued), with the default
    /// strategy [`HostWait::ADAPTIVE`]: spins 50 µs on `cuStreamQuery`, then
    /// enqueues a [`Completion`] and sleeps in `poll()` on its eventfd
    /// (waking every 100 ms to query the driver); on a stream whose recent
    /// waits lasted up to 4 ms, it first sleeps through most of the learned
    /// length and watches its end (see [`HostWait::Adaptive`]). See
    /// [`Stream::synchronize_with`].
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        self.synchronize_with(HostWait::default(), timeout)
    }

    /// Waits until all work enqueued so far is done, at most `timeout`
    /// ([`Error::Timeout`]; the work stays enqueued), the way `strategy`
    /// says.
    ///
    /// Work that is already done returns at once, with nothing enqueued.
    /// [`HostWait::Block`] (and [`HostWait::Adaptive`] once its spin, or
    /// its watch of the learned end, is over) enqueues a [`Completion`]
    /// behind the work and sleeps on its eventfd; if that one is still
    /// pending when the wait times out, the
    /// stream keeps it and the next wait sleeps on it again, so a stuck
    /// stream holds one eventfd however often it is waited for. If no
    /// eventfd can be made (the fd limit), a blocking wait falls back to
    /// [`HostWait::Poll`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuda_interop::{CudaDevice, HostWait, Stream};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let ctx = vk_export::Context::headless(&Default::default())?;
    /// let stream = Stream::new(&CudaDevice::for_vulkan(&ctx)?)?;
    /// // ... enqueue a long kernel ...
    /// stream.synchronize_with(HostWait::Block, Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn synchronize_with(&self, strategy: HostWait, timeout: Duration) -> Result<()> {
        let issued = self.track().issued();
        let drained = self.drain_with(strategy, timeout);
        if drained.is_ok() {
            // Everything enqueued before the wait is done.
            self.track().mark_done_through(issued);
        }
        drained
    }

    /// [`Stream::synchronize_with`]'s wait.
    fn drain_with(&self, strategy: HostWait, timeout: Duration) -> Result<()> {
        let _guard = self.device.enter()?;
        let start = Instant::now();
        let query = || {
            // SAFETY: a live stream of the current context (the guard above
            // lives across the whole wait, on this thread).
            unsafe { cu_query!(cuStreamQuery(self.stream)) }
        };
        match strategy {
            HostWait::Spin => spin_until(timeout, query),
            HostWait::Poll => poll_until(timeout, query),
            HostWait::Block => self.block(start, timeout, query),
            HostWait::Adaptive { spin } => {
                let mut history = self.wait_history.get();
                let plan = history.plan(spin);
                let waited = self.adaptive(start, timeout, spin, plan, query);
                if let Ok(seen) = waited {
                    history.record(spin, plan, seen, start.elapsed());
                    self.wait_history.set(history);
                }
                waited.map(|_| ())
            }
        }
    }

    /// An adaptive wait that began at `start`, as `plan` says: where it saw
    /// the work done.
    fn adaptive(
        &self,
        start: Instant,
        timeout: Duration,
        spin: Duration,
        plan: Plan,
        mut query: impl FnMut() -> Result<bool>,
    ) -> Result<Seen> {
        let left = || timeout.saturating_sub(start.elapsed());
        // Work done before the wait began says nothing of its length.
        if query()? {
            return Ok(Seen::AtOnce);
        }
        let (check, from, until, step) = match plan {
            // Nothing learned: a watch from the start, a spin long, then
            // the block.
            Plan::SpinThenBlock => (None, Duration::ZERO, spin, spin),
            Plan::Block => return self.block(start, timeout, query).map(|()| Seen::Blocked),
            Plan::Pace {
                check,
                from,
                until,
                step,
            } => (check, from, until, step),
        };
        // Sleeping through the learned part of the work costs a wake-up or
        // two; its end is then seen by a short spin, or by sleeps of `step`
        // where recent lengths differ.
        let alarm = Alarm::new();
        let looks = [(check, Seen::AtCheck), (Some(from), Seen::AtFrom)];
        for (at, seen) in looks.into_iter().filter_map(|(at, seen)| Some((at?, seen))) {
            if at.is_zero() {
                continue;
            }
            alarm.sleep_until(start, at.min(timeout));
            if query()? {
                return Ok(seen);
            }
            if left().is_zero() {
                return Err(Error::Timeout(timeout));
            }
        }
        let spin_for = from
            .saturating_add(spin)
            .min(until)
            .saturating_sub(start.elapsed())
            .min(left());
        match spin_until(spin_for, &mut query) {
            Ok(()) => return Ok(Seen::Watching),
            Err(Error::Timeout(_)) => {}
            Err(other) => return Err(other),
        }
        loop {
            let now = start.elapsed();
            if now >= until || now >= timeout {
                break;
            }
            alarm.sleep_until(start, now.saturating_add(step).min(until).min(timeout));
            if query()? {
                return Ok(Seen::Watching);
            }
        }
        self.block(start, timeout, query).map(|()| Seen::Blocked)
    }

    /// The blocking part of a stream wait that began at `start`: sleep on a
    /// completion behind the stream's work (the pending one kept from an
    /// earlier wait, else a new one) until the stream is idle.
    fn block(
        &self,
        start: Instant,
        timeout: Duration,
        mut query: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        loop {
            if query()? {
                return Ok(());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            // Only the stream's own query may end this wait with an error: a
            // marker that cannot be made or waited on (no eventfd, a failed
            // cuLaunchHostFunc, a poll error) says nothing about the work, so
            // the wait goes on by polling the stream, for what is left of the
            // bound when the marker fails (its wait may have used most of it).
            let poll_rest = |query| {
                poll_until(timeout.saturating_sub(start.elapsed()), query).map_err(|e| match e {
                    Error::Timeout(_) => Error::Timeout(timeout),
                    other => other,
                })
            };
            let kept = self.marker.take();
            let marker = match kept {
                // Still pending, so it is not behind anything newer than the
                // stream's current work: a lower bound worth waiting for.
                Some(marker) if matches!(marker.is_signalled(), Ok(false)) => marker,
                // SAFETY: this stream, live while borrowed, of its device's
                // context.
                _ => match unsafe { Completion::new(&self.device, self.stream) } {
                    Ok(marker) => marker,
                    Err(_) => return poll_rest(&mut query),
                },
            };
            match marker.wait_with(HostWait::Block, left) {
                // The stream may hold work enqueued after the marker: query again.
                Ok(()) => continue,
                Err(Error::Timeout(_)) => {
                    self.marker.replace(Some(marker));
                    return Err(Error::Timeout(timeout));
                }
                Err(_) => return poll_rest(&mut query),
            }
        }
    }

    /// Marks the work enqueued on this stream so far: a [`Completion`] to
    /// query, wait for (bounded, with any [`HostWait`]) or watch as an fd,
    /// on any thread.
    ///
    /// Enqueues an event record and a host function (`cuLaunchHostFunc`)
    /// that writes the completion's eventfd. If the stream never gets there
    /// (stuck behind a semaphore wait nobody signals), the host function's
    /// small shared allocation is leaked; its fd is closed with the
    /// completion.
    pub fn completion(&self) -> Result<Completion> {
        // SAFETY: this stream, live while borrowed, of its device's context.
        unsafe { Completion::new(&self.device, self.stream) }
    }

    /// Refuses resources of another device.
    pub(crate) fn check_device(&self, device: &CudaDevice) -> Result<()> {
        device.check_resource_device(&self.device.uuid())
    }

    /// Records `event` on this stream (for timing and host waits).
    pub fn record(&self, event: &Event) -> Result<()> {
        self.check_device(&event.device)?;
        let _guard = self.device.enter()?;
        // SAFETY: a live event and a live stream, both of the current context.
        unsafe { cu!(cuEventRecord(event.event, self.stream)) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A stream behind an external-semaphore wait that is not completing
        // is leaked rather than destroyed: the driver may wait for it.
        if !self.query().unwrap_or(true) {
            if let Err(why) = device_settled(&self.device) {
                report_leak("a stream with pending work", &why);
                return;
            }
        }
        if let Ok(_guard) = self.device.enter() {
            // Use lists that still hold a use of this stream get an event
            // behind it now, while the stream is live.
            self.track().close();
            // SAFETY: a live stream of the current context, destroyed once.
            // Destruction does not wait: pending work still completes, and the
            // driver releases the stream afterwards.
            record_drop_error(unsafe { cu!(cuStreamDestroy(self.stream)) });
            // Let go with the context current: if this was the last holder,
            // the track's event is destroyed here, not leaked by a field drop.
            if let Some(track) = self.track.take() {
                release_track(track);
            }
        }
    }
}

/// A CUDA event.
#[derive(Debug)]
pub struct Event {
    device: CudaDevice,
    event: CUevent,
    timing: bool,
}

// SAFETY: an event handle is usable from any thread with the context current.
unsafe impl Send for Event {}
// SAFETY: queries and records are thread-safe in the driver.
unsafe impl Sync for Event {}

impl Event {
    fn create(device: &CudaDevice, flags: u32, timing: bool) -> Result<Event> {
        let _guard = device.enter()?;
        let event = create_event(flags)?;
        Ok(Event {
            device: device.clone(),
            event,
            timing,
        })
    }

    /// A new timing event (for [`Event::elapsed_ms_since`]).
    pub fn new(device: &CudaDevice) -> Result<Event> {
        Event::create(device, CUevent_flags::CU_EVENT_DEFAULT.0, true)
    }

    /// A new event without timing, created with `CU_EVENT_BLOCKING_SYNC`, for
    /// handing to other CUDA code that waits on it with
    /// `cuEventSynchronize` (which then sleeps instead of spinning). This
    /// crate's [`Event::synchronize`] polls either way.
    pub fn new_blocking_sync(device: &CudaDevice) -> Result<Event> {
        let flags =
            CUevent_flags::CU_EVENT_BLOCKING_SYNC.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        Event::create(device, flags, false)
    }

    /// The `CUevent`.
    pub fn raw(&self) -> CUevent {
        self.event
    }

    /// Whether the work before the event's last record is done (also `true`
    /// for an event never recorded); never blocks.
    pub fn query(&self) -> Result<bool> {
        let _guard = self.device.enter()?;
        // SAFETY: a live event of the current context.
        unsafe { cu_query!(cuEventQuery(self.event)) }
    }

    /// Waits until the event completes, at most `timeout` ([`Error::Timeout`]).
    /// Polls `cuEventQuery` the [`HostWait::Poll`] way (spin, yield, then
    /// sleeps of up to 1 ms); for a wait that sleeps until the work is done,
    /// take a [`Stream::completion`] where the event is recorded.
    pub fn synchronize(&self, timeout: Duration) -> Result<()> {
        let _guard = self.device.enter()?;
        poll_until(timeout, || {
            // SAFETY: a live event of the current context (the guard above
            // lives across the whole wait, on this thread).
            unsafe { cu_query!(cuEventQuery(self.event)) }
        })
    }

    /// Milliseconds between `start` and this event (both timing events,
    /// recorded and complete).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        if !(self.timing && start.timing) {
            return Err(Error::InvalidArgument(
                "elapsed time needs two timing events (Event::new)".into(),
            ));
        }
        self.device.check_resource_device(&start.device.uuid())?;
        let _guard = self.device.enter()?;
        let mut ms = 0f32;
        // SAFETY: two live events of the current context; writes one float.
        unsafe { cu!(cuEventElapsedTime(&mut ms, start.event, self.event)) }?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // As for streams: a pending event behind a stuck external wait is
        // leaked rather than destroyed.
        if !self.query().unwrap_or(true) {
            if let Err(why) = device_settled(&self.device) {
                report_leak("a pending event", &why);
                return;
            }
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live event of the current context, destroyed once; a
            // pending one is released by the driver when it completes.
            record_drop_error(unsafe { cu!(cuEventDestroy(self.event)) });
        }
    }
}

/// Makes `later` wait for the work enqueued so far on `earlier`, through an
/// event made for this one join and destroyed at once.
///
/// The event is destroyed with `cuEventDestroy` while it may be pending,
/// which the driver allows (it releases the event when it completes, and
/// the wait has captured its record already). An [`Event`] would instead
/// wait in its `Drop` for the device to settle, which can take up to
/// [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT) behind an external wait and is
/// no place for a join that must not block.
///
/// # Safety
/// `earlier` and `later` are each `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`
/// or a live stream of `device`'s context, alive for the duration of the
/// call.
pub(crate) unsafe fn order_streams(
    device: &CudaDevice,
    earlier: CUstream,
    later: CUstream,
) -> Result<()> {
    let _guard = device.enter()?;
    let event = create_untimed_event()?;
    // SAFETY: a live event of the current context; the caller vouches for
    // `earlier`.
    let mut joined = unsafe { cu!(cuEventRecord(event, earlier)) };
    if joined.is_ok() {
        // SAFETY: a live event of the current context, just recorded; the
        // caller vouches for `later`. The wait captures that record now.
        joined = unsafe { cu!(cuStreamWaitEvent(later, event, 0)) };
    }
    // SAFETY: a live event of the current context, destroyed once, after
    // its last use; pending, it is released by the driver when it completes.
    let destroyed = unsafe { cu!(cuEventDestroy(event)) };
    joined.and(destroyed)
}
