//! [`Stream::synchronize_sleeping`](crate::Stream::synchronize_sleeping): a
//! host wait that sleeps in the driver (`cuEventSynchronize` on a
//! blocking-sync event), bounded as long as the GPU runs the crate's own
//! stream.
//!
//! `cuEventSynchronize` has no timeout, and the work a wait is for may never
//! complete (a semaphore wait nobody signals). So the event is not recorded
//! behind that work. It is recorded on a stream of its own, a *sleeper*,
//! behind a `cuStreamWaitValue64` on a word of pinned host memory, and two
//! writers race to release that stream:
//!
//! * the waited stream, which writes `2g` into the word once all its work
//!   before the write is done (`cuStreamWriteValue64`, with its memory
//!   barrier);
//! * the [`Watchdog`], one thread per process, which at the wait's deadline
//!   writes `2g + 1` with a compare-and-swap from the word's previous value
//!   `2g - 2`, so it never overwrites the stream's write.
//!
//! The sleeper waits for a value of at least `2g`, so either write releases
//! it. When the caller wakes it reads the word: `2g` means the work is done;
//! `2g + 1` means the deadline came first, and the stream's write is still
//! to come.
//!
//! # Contract
//!
//! * **Bounded while the GPU runs the sleeper stream.** A sleep with a
//!   deadline returns by then, plus the time the GPU takes to run the
//!   sleeper stream's wait and event record once the watchdog has written
//!   the word. That is µs, unless the sleeper stream shares a hardware
//!   queue (`CUDA_DEVICE_MAX_CONNECTIONS`) with a stream blocked behind a
//!   wait, which holds it back as long as it is blocked: for ever, for a
//!   semaphore nobody signals. Hence an `unsafe fn`, whose caller vouches
//!   for the other streams. When it returns, the sleeper's own stream is
//!   released and drained or draining; only the waited stream's write may
//!   still be pending.
//! * **No word is reused while a write to it is pending.** A sleeper whose
//!   word still awaits its stream's write is a [`PendingSleep`]: the waited
//!   `Stream` keeps it (as it keeps a pending completion) and gives it back
//!   to the pool when it drops; the pool lends it again only once the word
//!   holds the stream's value. A pool that ends with such a word leaks its
//!   page rather than free it (the GPU would write into freed memory).
//! * **Optional.** Where the device lacks unified addressing or 64-bit
//!   stream memory operations, the driver lacks a function, or the watchdog
//!   thread cannot start, [`Sleepers::sleep`] answers [`Slept::Unavailable`]
//!   and the caller blocks another way. So does a device with [`SLOTS`]
//!   sleepers lent or pending at once.
//! * Sleepers are made on first use and destroyed with their device
//!   ([`Sleepers::destroy`], with its context current).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop_sys::{
    CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags, CUstream,
    CUstreamWaitValue_flags, CUstreamWriteValue_flags, CUstream_flags,
};

use crate::driver::{api, create_event, cu, record_drop_error};
use crate::error::{Error, Result};

/// The pinned page of one device's words.
const PAGE_BYTES: usize = 4096;
/// Sleepers per device: one word each.
pub(crate) const SLOTS: usize = PAGE_BYTES / std::mem::size_of::<u64>();

/// What a sleep came to.
pub(crate) enum Slept {
    /// The waited stream's work before the sleep is done.
    Done,
    /// The deadline came first; the stream's write is still pending.
    TimedOut(PendingSleep),
    /// Sleeping in the driver is not possible here; block another way.
    Unavailable,
}

/// A stream of its own, a blocking-sync event recorded on it, and its word.
struct Sleeper {
    stream: CUstream,
    event: CUevent,
    word: *const AtomicU64,
    /// The number of the last sleep: the word holds `2 * generation` when
    /// that sleep's stream write has landed.
    generation: u64,
}

// SAFETY: the handles are process-wide driver handles, used with their
// device's context current on whichever thread; the word points into the
// pool's pinned page, which outlives every sleeper (a page with a pending
// word is leaked, never freed).
unsafe impl Send for Sleeper {}

impl Sleeper {
    fn word(&self) -> &AtomicU64 {
        // SAFETY: the page is live while any sleeper of it is (see above),
        // aligned and zeroed at allocation; only atomics touch it on the host.
        unsafe { &*self.word }
    }

    /// Whether the last sleep's stream write has landed (the word is free).
    fn landed(&self) -> bool {
        self.word().load(Ordering::Acquire) == 2 * self.generation
    }

    fn address(&self) -> CUdeviceptr {
        // Unified addressing: pinned host memory has the same address on the
        // device (checked when the pool starts).
        self.word as CUdeviceptr
    }
}

/// A sleeper whose sleep timed out: its word still awaits the waited
/// stream's write. Give it back with [`Sleepers::put_back`].
pub(crate) struct PendingSleep {
    sleeper: Sleeper,
}

impl std::fmt::Debug for PendingSleep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSleep")
            .field("generation", &self.sleeper.generation)
            .finish_non_exhaustive()
    }
}

impl PendingSleep {
    /// Whether the stream's write has landed: the stream got past the point
    /// the timed-out sleep was for.
    pub(crate) fn landed(&self) -> bool {
        self.sleeper.landed()
    }
}

/// One device's sleepers.
#[derive(Default)]
pub(crate) struct Sleepers {
    pool: Mutex<Pool>,
}

#[derive(Default)]
enum Pool {
    #[default]
    Untried,
    Unavailable,
    Ready(Ready),
}

struct Ready {
    page: *mut c_void,
    watchdog: &'static Watchdog,
    /// Sleepers made so far (the next one takes word `made`).
    made: usize,
    idle: Vec<Sleeper>,
    /// Given back while their word awaited a write.
    pending: Vec<Sleeper>,
}

// SAFETY: the page is pinned host memory owned by the pool, freed only by
// `Sleepers::destroy`; the sleepers are `Send`.
unsafe impl Send for Ready {}

impl Sleepers {
    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps until the work enqueued on `stream` so far is done or
    /// `deadline` has passed (`None`: no deadline).
    ///
    /// # Safety
    /// `device`'s primary context is current on this thread, and `stream` is
    /// a live stream of it, alive until this returns.
    pub(crate) unsafe fn sleep(
        &self,
        device: CUdevice,
        stream: CUstream,
        deadline: Option<Instant>,
    ) -> Result<Slept> {
        // SAFETY: the caller's context is current.
        let Some((mut sleeper, watchdog)) = (unsafe { self.take(device) }) else {
            return Ok(Slept::Unavailable);
        };
        let before = 2 * sleeper.generation;
        let done = before + 2;
        let late = done + 1;
        // SAFETY: a live stream of the current context (the caller's word);
        // the address is the sleeper's word in the pinned page, which
        // outlives the write (see `Sleeper`).
        let written = unsafe {
            cu!(cuStreamWriteValue64(
                stream,
                sleeper.address(),
                done,
                CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT.0
            ))
        };
        if let Err(e) = written {
            self.put_back(sleeper);
            return Err(e);
        }
        sleeper.generation += 1;
        // SAFETY: the sleeper's stream and event are live, of this context;
        // the word as above.
        let armed = unsafe {
            cu!(cuStreamWaitValue64(
                sleeper.stream,
                sleeper.address(),
                done,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ.0
            ))
        }
        .and_then(|()| unsafe { cu!(cuEventRecord(sleeper.event, sleeper.stream)) });
        if let Err(e) = armed {
            // Release the sleeper's stream, which may be waiting on the word.
            release(sleeper.word(), before, late);
            self.put_back(sleeper);
            return Err(e);
        }
        let synchronized = {
            // SAFETY: the word lives as long as the sleeper (above), which
            // outlives the alarm (dropped at the end of this block).
            let _alarm = deadline.map(|at| unsafe { watchdog.arm(at, sleeper.word, before, late) });
            // SAFETY: a live event of the current context, recorded behind a
            // wait that the waited stream or the alarm releases.
            unsafe { cu!(cuEventSynchronize(sleeper.event)) }
        };
        if let Err(e) = synchronized {
            release(sleeper.word(), before, late);
            self.put_back(sleeper);
            return Err(e);
        }
        let word = sleeper.word().load(Ordering::Acquire);
        if word == done {
            self.put_back(sleeper);
            Ok(Slept::Done)
        } else if word == late {
            Ok(Slept::TimedOut(PendingSleep { sleeper }))
        } else {
            self.put_back(sleeper);
            Err(Error::Unsupported(format!(
                "a sleeping host wait woke with its word at {word}, neither {done} nor {late}; \
                 wait with HostWait::Block instead"
            )))
        }
    }

    /// A sleeper and the watchdog, or `None` where sleeping is unavailable
    /// (or every word is in use).
    ///
    /// # Safety
    /// `device`'s primary context is current on this thread.
    unsafe fn take(&self, device: CUdevice) -> Option<(Sleeper, &'static Watchdog)> {
        let mut pool = self.lock();
        if matches!(*pool, Pool::Untried) {
            // SAFETY: the caller's context is current.
            *pool = match unsafe { Ready::start(device) } {
                Some(ready) => Pool::Ready(ready),
                None => Pool::Unavailable,
            };
        }
        let Pool::Ready(ready) = &mut *pool else {
            return None;
        };
        let (landed, still): (Vec<_>, Vec<_>) = std::mem::take(&mut ready.pending)
            .into_iter()
            .partition(Sleeper::landed);
        ready.pending = still;
        ready.idle.extend(landed);
        if let Some(sleeper) = ready.idle.pop() {
            return Some((sleeper, ready.watchdog));
        }
        if ready.made == SLOTS {
            return None;
        }
        // SAFETY: the caller's context is current; word `made` is in the
        // page and no sleeper uses it yet.
        let sleeper = unsafe { ready.make() }.ok()?;
        ready.made += 1;
        Some((sleeper, ready.watchdog))
    }

    /// Takes back a sleeper (a [`PendingSleep`] too): lent again once its
    /// word is free.
    fn put_back(&self, sleeper: Sleeper) {
        let mut pool = self.lock();
        match &mut *pool {
            Pool::Ready(ready) if sleeper.landed() => ready.idle.push(sleeper),
            Pool::Ready(ready) => ready.pending.push(sleeper),
            // Unreachable (a sleeper comes from a ready pool). Its handles
            // are let go, not destroyed without their context (a `Sleeper`
            // has no destructor).
            _ => {}
        }
    }

    /// Takes back a timed-out sleep's sleeper ([`Sleepers::put_back`]).
    pub(crate) fn put_back_pending(&self, pending: PendingSleep) {
        self.put_back(pending.sleeper);
    }

    /// Destroys the sleepers, and frees the page unless a word still awaits
    /// a stream's write (then the page is leaked and reported).
    ///
    /// # Safety
    /// The device's primary context is current on this thread, and no
    /// sleep is in progress (the device is being dropped).
    pub(crate) unsafe fn destroy(&mut self) {
        let Pool::Ready(ready) = std::mem::take(&mut *self.lock()) else {
            return;
        };
        let awaited = ready.pending.iter().filter(|s| !s.landed()).count();
        for sleeper in ready.idle.iter().chain(&ready.pending) {
            // SAFETY: handles of the current context, made by `Ready::make`;
            // the stream's wait was released (by its write or by `release`).
            unsafe {
                record_drop_error(cu!(cuEventDestroy(sleeper.event)));
                record_drop_error(cu!(cuStreamDestroy(sleeper.stream)));
            }
        }
        if awaited > 0 {
            record_drop_error(Err(Error::Cleanup(format!(
                "the sleeping host waits' pinned page (4 KiB) leaked, not freed: {awaited} word(s) \
                 still await the write of a stream that did not get there"
            ))));
            return;
        }
        // SAFETY: the page `Ready::start` allocated; no write to it is pending.
        record_drop_error(unsafe { cu!(cuMemFreeHost(ready.page)) });
    }
}

impl Ready {
    /// Checks that the device and driver can sleep this way, and allocates
    /// the page; `None` where they cannot.
    ///
    /// # Safety
    /// `device`'s primary context is current on this thread.
    unsafe fn start(device: CUdevice) -> Option<Ready> {
        let fns = api().ok()?.fns();
        let functions = [
            fns.cuStreamWaitValue64.is_some(),
            fns.cuStreamWriteValue64.is_some(),
            fns.cuEventSynchronize.is_some(),
            fns.cuMemAllocHost.is_some(),
            fns.cuMemFreeHost.is_some(),
        ];
        if functions.contains(&false) {
            return None;
        }
        for attribute in [
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
        ] {
            let mut value = 0;
            // SAFETY: writes one int; `device` is a valid device handle.
            unsafe { cu!(cuDeviceGetAttribute(&mut value, attribute, device)) }.ok()?;
            if value != 1 {
                return None;
            }
        }
        let watchdog = Watchdog::global()?;
        let mut page: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; the context is current.
        unsafe { cu!(cuMemAllocHost(&mut page, PAGE_BYTES)) }.ok()?;
        if page.is_null() || page.align_offset(std::mem::align_of::<AtomicU64>()) != 0 {
            return None;
        }
        // SAFETY: the page is PAGE_BYTES of host memory, just allocated.
        unsafe { std::ptr::write_bytes(page.cast::<u8>(), 0, PAGE_BYTES) };
        Some(Ready {
            page,
            watchdog,
            made: 0,
            idle: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// A new sleeper on word `made`.
    ///
    /// # Safety
    /// The pool's context is current; word `made` (< SLOTS) is unused.
    unsafe fn make(&self) -> Result<Sleeper> {
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: writes one stream handle; the context is current.
        unsafe {
            cu!(cuStreamCreate(
                &mut stream,
                CUstream_flags::CU_STREAM_NON_BLOCKING.0
            ))
        }?;
        let event = match create_event(
            CUevent_flags::CU_EVENT_BLOCKING_SYNC.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0,
        ) {
            Ok(event) => event,
            Err(e) => {
                // SAFETY: the stream just made, with nothing enqueued.
                record_drop_error(unsafe { cu!(cuStreamDestroy(stream)) });
                return Err(e);
            }
        };
        Ok(Sleeper {
            stream,
            event,
            // SAFETY: `made` < SLOTS: within the page.
            word: unsafe { self.page.cast::<AtomicU64>().add(self.made) },
            generation: 0,
        })
    }
}

/// Writes `to` into `word` if it still holds `from` (the stream's write has
/// not landed): releases a sleeper's stream without overwriting that write.
fn release(word: &AtomicU64, from: u64, to: u64) {
    let _ = word.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire);
}

/// How long the watchdog sleeps at most while it has nothing armed, before
/// it parks for good (until an arm wakes it).
const IDLE_TICK: Duration = Duration::from_millis(50);
/// Idle ticks in a row after which the watchdog parks.
const IDLE_TICKS: u32 = 20;

/// One thread that releases sleepers at their deadlines.
///
/// Arming costs no system call in the common case: while it has nothing
/// armed the thread wakes every [`IDLE_TICK`] (for [`IDLE_TICKS`] ticks, then
/// it parks), and an arm only notifies it when the new deadline comes
/// before the thread's next wake-up.
pub(crate) struct Watchdog {
    alarms: Mutex<Alarms>,
    wake: Condvar,
}

#[derive(Default)]
struct Alarms {
    armed: BTreeMap<(Instant, u64), Release>,
    next_key: u64,
    /// When the thread will look next (`None`: parked until notified).
    looks_at: Option<Instant>,
    /// Whether anything was armed since the thread last looked.
    armed_since_look: bool,
}

/// A compare-and-swap to make at a deadline (see [`release`]).
#[derive(Clone, Copy)]
struct Release {
    word: *const AtomicU64,
    from: u64,
    to: u64,
}

// SAFETY: the word is valid until its alarm is disarmed (the arm's
// contract), and is only written atomically, under the watchdog's lock.
unsafe impl Send for Release {}

/// An armed deadline: disarmed when dropped.
pub(crate) struct Alarm {
    watchdog: &'static Watchdog,
    key: (Instant, u64),
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.watchdog.lock().armed.remove(&self.key);
    }
}

impl Watchdog {
    /// The process's watchdog, started on first use; `None` if its thread
    /// cannot be started.
    pub(crate) fn global() -> Option<&'static Watchdog> {
        static GLOBAL: OnceLock<Option<&'static Watchdog>> = OnceLock::new();
        *GLOBAL.get_or_init(Watchdog::start)
    }

    /// A new watchdog and its thread (leaked: it runs for the process).
    pub(crate) fn start() -> Option<&'static Watchdog> {
        let watchdog: &'static Watchdog = Box::leak(Box::new(Watchdog {
            alarms: Mutex::new(Alarms::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("cuda-interop-watchdog".into())
            .spawn(move || watchdog.run())
            .ok()?;
        Some(watchdog)
    }

    fn lock(&self) -> MutexGuard<'_, Alarms> {
        self.alarms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// At `deadline`, writes `to` into `word` if it still holds `from`,
    /// unless the returned alarm was dropped before.
    ///
    /// # Safety
    /// `word` points to a live, aligned `u64` that only atomics touch on the
    /// host, and stays so until the alarm is dropped.
    pub(crate) unsafe fn arm(
        &'static self,
        deadline: Instant,
        word: *const AtomicU64,
        from: u64,
        to: u64,
    ) -> Alarm {
        let mut alarms = self.lock();
        let key = (deadline, alarms.next_key);
        alarms.next_key += 1;
        alarms.armed.insert(key, Release { word, from, to });
        alarms.armed_since_look = true;
        if alarms.looks_at.is_none_or(|at| deadline < at) {
            self.wake.notify_one();
        }
        Alarm {
            watchdog: self,
            key,
        }
    }

    /// How many alarms are armed.
    #[cfg(test)]
    fn armed(&self) -> usize {
        self.lock().armed.len()
    }

    fn run(&self) {
        let mut alarms = self.lock();
        let mut idle_ticks = 0;
        loop {
            let now = Instant::now();
            while let Some((&key, &due)) = alarms.armed.first_key_value() {
                if key.0 > now {
                    break;
                }
                alarms.armed.remove(&key);
                // SAFETY: armed, so the word is live (the arm's contract),
                // and the lock keeps its alarm from being dropped meanwhile.
                release(unsafe { &*due.word }, due.from, due.to);
            }
            if alarms.armed_since_look || !alarms.armed.is_empty() {
                idle_ticks = 0;
            } else {
                idle_ticks += 1;
            }
            alarms.armed_since_look = false;
            alarms.looks_at = match alarms.armed.first_key_value() {
                Some((key, _)) => Some(key.0),
                None if idle_ticks < IDLE_TICKS => Some(now + IDLE_TICK),
                None => None,
            };
            alarms = match alarms.looks_at {
                Some(at) => {
                    self.wake
                        .wait_timeout(alarms, at.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .wake
                    .wait(alarms)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (at most 10 s, a hang detector) until `ready` holds.
    fn eventually(mut ready: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn an_alarm_releases_its_word_at_its_deadline() {
        let watchdog = Watchdog::start().unwrap();
        let word = Box::new(AtomicU64::new(4));
        // SAFETY: the box outlives the alarm.
        let _alarm = unsafe { watchdog.arm(Instant::now(), &*word, 4, 7) };
        assert!(eventually(|| word.load(Ordering::Acquire) == 7));
        assert_eq!(watchdog.armed(), 0);
    }

    #[test]
    fn an_alarm_never_overwrites_a_write_that_landed_first() {
        let watchdog = Watchdog::start().unwrap();
        let word = Box::new(AtomicU64::new(6));
        // SAFETY: the box outlives the alarm.
        let _alarm = unsafe { watchdog.arm(Instant::now(), &*word, 4, 7) };
        assert!(eventually(|| watchdog.armed() == 0));
        assert_eq!(word.load(Ordering::Acquire), 6);
    }

    #[test]
    fn a_dropped_alarm_is_disarmed() {
        let watchdog = Watchdog::start().unwrap();
        let word = Box::new(AtomicU64::new(0));
        // SAFETY: the box outlives the alarm.
        let alarm = unsafe { watchdog.arm(Instant::now() + Duration::from_secs(60), &*word, 0, 1) };
        assert_eq!(watchdog.armed(), 1);
        drop(alarm);
        assert_eq!(watchdog.armed(), 0);
        assert_eq!(word.load(Ordering::Acquire), 0);
    }

    #[test]
    fn an_earlier_deadline_wakes_a_watchdog_sleeping_until_a_later_one() {
        let watchdog = Watchdog::start().unwrap();
        let far = Box::new(AtomicU64::new(0));
        let near = Box::new(AtomicU64::new(0));
        // SAFETY: the boxes outlive the alarms.
        let _far = unsafe { watchdog.arm(Instant::now() + Duration::from_secs(3600), &*far, 0, 1) };
        // Let the thread go to sleep until the far deadline.
        assert!(eventually(|| watchdog.lock().looks_at.is_some_and(|at| {
            at > Instant::now() + Duration::from_secs(60)
        })));
        // SAFETY: as above.
        let _near = unsafe { watchdog.arm(Instant::now(), &*near, 0, 1) };
        assert!(eventually(|| near.load(Ordering::Acquire) == 1));
        assert_eq!(far.load(Ordering::Acquire), 0);
    }
}
