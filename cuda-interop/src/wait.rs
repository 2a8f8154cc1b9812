//! Bounded host waits for GPU work, and the strategies they can use.
//!
//! # Contract
//!
//! * Every host wait of the crate is bounded: it returns [`Error::Timeout`]
//!   once its bound has passed and a last driver query (`cuStreamQuery`,
//!   `cuEventQuery`) still says "not yet". None calls `cuStreamSynchronize`,
//!   `cuEventSynchronize` or `cuCtxSynchronize`: work queued behind a
//!   semaphore wait nobody signals never completes, and a blocking call
//!   would never return.
//! * How a wait spends its time is a [`HostWait`]: spin on the query
//!   ([`HostWait::Spin`]), sleep in `poll()` on an eventfd that a host
//!   function enqueued behind the work writes ([`HostWait::Block`], see
//!   [`Completion`](crate::Completion)), spin briefly and then block
//!   ([`HostWait::Adaptive`], the default; on a stream it paces repeated
//!   work, [`WaitHistory`]), or the crate's older poll with sleeps
//!   ([`HostWait::Poll`]).
//! * A blocked or paced wait queries the driver at least every
//!   [`BLOCK_SLICE`], so a driver error (a poisoned context) or work that
//!   completed while its host function was delayed ends the wait instead of
//!   the timeout.
//! * Destructor waits (the last-use rule) still use [`poll_until`]: they run
//!   rarely, and enqueue no work (the most they add is one event record
//!   behind a stream's uses, `crate::events`).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
};

use crate::error::{Error, Result};

/// How a host thread waits for GPU work ([`Stream::synchronize_with`],
/// [`Completion::wait_with`]).
///
/// Measured on an H100 (driver 580) for a 2 ms kernel: spinning learns of
/// the end ~10-20 µs after it at a whole core; blocking on an eventfd
/// ([`HostWait::Block`]) ~150-200 µs after it at 5-7 % of a core.
/// [`HostWait::Adaptive`] spins for short work, sleeps through most of
/// repeated work of up to 4 ms and spins at its end, and blocks for
/// longer work; `cargo run --release -p cuda-interop-bench --bin host_wait`
/// measures them on your GPU.
///
/// Every strategy is bounded by the wait's timeout.
///
/// ```
/// use std::time::Duration;
/// use cuda_interop::HostWait;
///
/// assert_eq!(HostWait::default(), HostWait::ADAPTIVE);
/// assert_eq!(HostWait::ADAPTIVE, HostWait::Adaptive { spin: Duration::from_micros(50) });
/// ```
///
/// [`Stream::synchronize_with`]: crate::Stream::synchronize_with
/// [`Completion::wait_with`]: crate::Completion::wait_with
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HostWait {
    /// Query the driver in a tight loop: the lowest latency (a few µs after
    /// the work ends), and a whole CPU core for as long as the wait lasts.
    Spin,
    /// Sleep in `poll()` on the [`Completion`](crate::Completion)'s eventfd,
    /// which a host function (`cuLaunchHostFunc`) enqueued behind the work
    /// writes: almost no CPU, and the driver's host-function latency
    /// (tens of µs) after the work ends.
    Block,
    /// Spin for `spin` (or the timeout, if shorter), then
    /// [`HostWait::Block`]: short work is seen at the spin floor, long work
    /// costs little CPU.
    ///
    /// On a [`Stream`], it learns how long the stream's waits last. After a
    /// wait of more than 2 and up to 80 spins (100 µs to 4 ms at the default
    /// spin, and at most 200 ms), the next one is *paced*: it sleeps to
    /// halfway through the learned length, queries, sleeps to half a spin
    /// before its end (a timerfd: no timer slack), then spins up to one and
    /// a half spins before it blocks. Work as long as the last is then seen
    /// at the spin floor for two wake-ups and a short spin. Work that turned
    /// shorter is seen late, by at most half the learned length (2 ms at the
    /// default spin), once: the wait learns the shorter length. After a
    /// wait of more than 80 spins the next one blocks at once.
    ///
    /// [`Stream`]: crate::Stream
    Adaptive {
        /// How long to spin before blocking.
        spin: Duration,
    },
    /// The crate's earlier poll, kept for comparison: spin about 20 µs,
    /// yield until about 200 µs, then sleep 50 µs doubling to 1 ms between
    /// queries (so a long wait can end up to about 1 ms late).
    Poll,
}

impl HostWait {
    /// The default: spin 50 µs, then block. GPU work of up to ~50 µs is
    /// seen at the spin floor; on a stream whose waits last 100 µs to 4 ms,
    /// a wait sleeps through most of the learned length and spins at its
    /// end; longer waits block at once.
    pub const ADAPTIVE: HostWait = HostWait::Adaptive {
        spin: Duration::from_micros(50),
    };
}

impl Default for HostWait {
    /// [`HostWait::ADAPTIVE`].
    fn default() -> HostWait {
        HostWait::ADAPTIVE
    }
}

/// What a stream's adaptive waits learned: how long they last, from the call
/// to the work seen done, and how many paced waits in a row woke after the
/// work had ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WaitHistory {
    /// How long this stream's adaptive waits last; `None` until one
    /// measured it.
    lasts: Option<Duration>,
    /// Paced waits in a row that found the work done when they woke: each
    /// shortens `lasts` twice as much as the one before.
    overslept: u32,
}

/// How an adaptive wait spends its time (offsets from the wait's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Spin for the spin, then block: nothing learned yet, or short work.
    SpinThenBlock,
    /// Block at once: work far longer than the spin.
    Block,
    /// Sleep until `check` and query, sleep until `wake` and query, spin
    /// until `spin_end`, then block.
    Pace {
        check: Duration,
        wake: Duration,
        spin_end: Duration,
    },
}

/// Where an adaptive wait saw its work done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// At a paced wait's first query: the work had ended before the wait
    /// began, which says nothing of its length.
    AtOnce,
    /// At a paced wait's check, halfway: the work is much shorter than
    /// learned.
    AtCheck,
    /// When a paced wait woke, just before the learned end: the work may be
    /// a little shorter, or the wake-up late.
    AtWake,
    /// While spinning: the length, to one query.
    Spinning,
    /// By blocking: the length, plus the block's wake-up latency.
    Blocked,
}

impl WaitHistory {
    /// Waits are paced for work of up to this many spins (4 ms at the
    /// default spin); longer work blocks at once. A pace's worst lateness,
    /// when the work turns short at once, is half of this.
    const PACE_SPINS: u32 = 80;

    /// How the next adaptive wait with `spin` waits.
    pub(crate) fn plan(&self, spin: Duration) -> Plan {
        let Some(lasts) = self.lasts.filter(|&lasts| lasts > spin.saturating_mul(2)) else {
            return Plan::SpinThenBlock;
        };
        // Long work: blocking costs little of it. Also work that a pace
        // could not sleep through with a query every BLOCK_SLICE.
        if lasts > spin.saturating_mul(WaitHistory::PACE_SPINS)
            || lasts > BLOCK_SLICE.saturating_mul(2)
        {
            return Plan::Block;
        }
        Plan::Pace {
            check: lasts / 2,
            wake: lasts - spin / 2,
            spin_end: lasts.saturating_add(spin),
        }
    }

    /// Records that a wait with `spin` saw its work done where `seen` says,
    /// `took` after it began.
    pub(crate) fn record(&mut self, spin: Duration, seen: Seen, took: Duration) {
        match seen {
            Seen::AtOnce => {}
            Seen::AtCheck => {
                self.lasts = Some(took / 2);
                self.overslept = 0;
            }
            Seen::AtWake => {
                let shorter = (spin / 2).saturating_mul(1 << self.overslept.min(16));
                self.lasts = self.lasts.map(|lasts| lasts.saturating_sub(shorter));
                self.overslept = self.overslept.saturating_add(1);
            }
            Seen::Spinning | Seen::Blocked => {
                self.lasts = Some(took);
                self.overslept = 0;
            }
        }
    }
}

/// A sleep to a point in time without the timer slack of `nanosleep` and
/// `poll()` (50 µs by default for a normal thread): a timerfd's timer has
/// none. Where no timerfd can be made, it sleeps with `std::thread::sleep`.
pub(crate) struct Alarm(Option<OwnedFd>);

impl Alarm {
    /// A new alarm (one timerfd, closed on drop).
    pub(crate) fn new() -> Alarm {
        Alarm(timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC).ok())
    }

    /// Sleeps until `offset` after `start` (returns at once if that has passed).
    pub(crate) fn sleep_until(&self, start: Instant, offset: Duration) {
        let left = offset.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        if let Some(fd) = &self.0 {
            let alarm = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: Timespec {
                    tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX),
                    tv_nsec: left.subsec_nanos().into(),
                },
            };
            if timerfd_settime(fd, TimerfdTimerFlags::empty(), &alarm).is_ok() {
                let mut expirations = [0u8; 8];
                loop {
                    match rustix::io::read(fd, &mut expirations) {
                        Ok(_) => return,
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(_) => break,
                    }
                }
            }
        }
        std::thread::sleep(offset.saturating_sub(start.elapsed()));
    }
}

/// How long a blocked wait sleeps at most before it queries the driver again.
pub(crate) const BLOCK_SLICE: Duration = Duration::from_millis(100);

/// How long a wait spins between queries before it starts yielding.
const SPIN_FOR: Duration = Duration::from_micros(20);
/// How long a wait yields between queries before it starts sleeping.
const YIELD_UNTIL: Duration = Duration::from_micros(200);
/// The first sleep between queries; each later one doubles, up to [`LONGEST_SLEEP`].
const FIRST_SLEEP: Duration = Duration::from_micros(50);
/// The longest sleep between two queries.
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

/// Calls `is_done` until it answers `true` (then `Ok`), fails (its error), or
/// `timeout` has passed ([`Error::Timeout`]), spinning about 20 µs, yielding
/// until about 200 µs, then sleeping 50 µs doubling to 1 ms ([`HostWait::Poll`]).
pub(crate) fn poll_until(
    timeout: Duration,
    mut is_done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut sleep = FIRST_SLEEP;
    loop {
        if is_done()? {
            return Ok(());
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(Error::Timeout(timeout));
        }
        if elapsed < SPIN_FOR {
            std::hint::spin_loop();
        } else if elapsed < YIELD_UNTIL {
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep.min(timeout - elapsed));
            sleep = (sleep * 2).min(LONGEST_SLEEP);
        }
    }
}

/// Calls `is_done` in a tight loop until it answers `true` (then `Ok`), fails
/// (its error), or `timeout` has passed ([`Error::Timeout`]) ([`HostWait::Spin`]).
pub(crate) fn spin_until(
    timeout: Duration,
    mut is_done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if is_done()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout(timeout));
        }
        std::hint::spin_loop();
    }
}

/// Sleeps in `poll()` until `fd` is readable (then `Ok`) or `timeout` has
/// passed ([`Error::Timeout`]), calling `is_done` first, every
/// [`BLOCK_SLICE`] and at the end: its `true` ends the wait with `Ok`, its
/// error with that error ([`HostWait::Block`]).
pub(crate) fn block_until(
    fd: BorrowedFd<'_>,
    timeout: Duration,
    mut is_done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        if is_done()? {
            return Ok(());
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(Error::Timeout(timeout));
        }
        if readable(fd, left.min(BLOCK_SLICE))? {
            return Ok(());
        }
    }
}

/// Whether `fd` is readable within `within` (zero: right now). An interrupted
/// `poll()` answers `false`; the caller's loop tries again.
pub(crate) fn readable(fd: BorrowedFd<'_>, within: Duration) -> Result<bool> {
    let timeout = Timespec {
        tv_sec: within.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: within.subsec_nanos().into(),
    };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(n) => Ok(n > 0 && fds[0].revents().contains(PollFlags::IN)),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(Error::Unsupported(format!(
            "poll() on a completion's eventfd failed ({e}); wait with HostWait::Spin or HostWait::Poll instead"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn after(seen: Seen, took: Duration) -> WaitHistory {
        let mut history = WaitHistory::default();
        history.record(SPIN, seen, took);
        history
    }

    #[test]
    fn an_adaptive_wait_spins_until_it_learns_long_work_then_paces_it_then_blocks() {
        assert_eq!(WaitHistory::default().plan(SPIN), Plan::SpinThenBlock);
        // Up to two spins: spin, then block.
        assert_eq!(after(Seen::Spinning, us(9)).plan(SPIN), Plan::SpinThenBlock);
        assert_eq!(
            after(Seen::Blocked, SPIN * 2).plan(SPIN),
            Plan::SpinThenBlock
        );
        // Longer, up to 80 spins: sleep to halfway, then to half a spin
        // before the end, spin a spin past it.
        assert_eq!(
            after(Seen::Blocked, us(2000)).plan(SPIN),
            Plan::Pace {
                check: us(1000),
                wake: us(1975),
                spin_end: us(2050)
            }
        );
        assert_eq!(
            after(Seen::Spinning, SPIN * 80).plan(SPIN),
            Plan::Pace {
                check: SPIN * 40,
                wake: SPIN * 80 - SPIN / 2,
                spin_end: SPIN * 81
            }
        );
        // Longer still: block at once.
        let longer = SPIN * 80 + Duration::from_nanos(1);
        assert_eq!(after(Seen::Blocked, longer).plan(SPIN), Plan::Block);
        // Or where a pace would sleep past BLOCK_SLICE without a query.
        let slice = BLOCK_SLICE * 2 + Duration::from_nanos(1);
        let long_spin = Duration::from_secs(1);
        assert!(matches!(
            after(Seen::Blocked, BLOCK_SLICE * 2).plan(long_spin / 100),
            Plan::Pace { .. }
        ));
        assert_eq!(
            after(Seen::Blocked, slice).plan(long_spin / 100),
            Plan::Block
        );
        // A huge spin: never a pace, and no overflow.
        let mut history = after(Seen::Blocked, Duration::from_secs(60));
        assert_eq!(history.plan(Duration::MAX), Plan::SpinThenBlock);
        history.record(Duration::MAX, Seen::Spinning, Duration::MAX);
        assert_eq!(history.plan(Duration::MAX), Plan::SpinThenBlock);
    }

    #[test]
    fn a_paced_wait_that_finds_the_work_done_shortens_what_it_learned() {
        let learned = |history: &WaitHistory| match history.plan(SPIN) {
            Plan::Pace { spin_end, .. } => spin_end - SPIN,
            other => panic!("{other:?}"),
        };
        // Done before the wait began: nothing learned.
        let mut history = after(Seen::Blocked, us(2000));
        history.record(SPIN, Seen::AtOnce, us(1));
        assert_eq!(learned(&history), us(2000));
        // Done at the halfway check: half of that.
        history.record(SPIN, Seen::AtCheck, us(1200));
        assert_eq!(learned(&history), us(600));
        // Done when it woke: shorter by half a spin, then a spin, then two
        // (in a row), and by half a spin again after a spin saw it.
        let mut history = after(Seen::Blocked, us(2000));
        for expected in [1975, 1925, 1825] {
            history.record(SPIN, Seen::AtWake, us(1));
            assert_eq!(learned(&history), us(expected));
        }
        history.record(SPIN, Seen::Spinning, us(1900));
        assert_eq!(learned(&history), us(1900));
        history.record(SPIN, Seen::AtWake, us(1));
        assert_eq!(learned(&history), us(1875));
        // Many in a row: down to a spin-then-block, no overflow.
        for _ in 0..40 {
            history.record(SPIN, Seen::AtWake, us(1));
        }
        assert_eq!(history.plan(SPIN), Plan::SpinThenBlock);
        // A block's measure replaces it, longer or shorter.
        history.record(SPIN, Seen::Blocked, us(3000));
        assert_eq!(learned(&history), us(3000));
    }
}
