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

use std::cell::OnceCell;
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
/// repeated work of up to 4 ms and watches its end, and blocks for
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
    /// On a [`Stream`], it learns how long the stream's last four waits
    /// lasted and *paces* the next one: it sleeps (on a timerfd: no timer
    /// slack) to half a spin before the shortest of them (with a look
    /// halfway there, when that is more than four spins or 100 ms away),
    /// spins for the spin, then looks every `step` until a spin past the
    /// longest, then blocks; `step` is the spin, or a sixteenth of the
    /// window where the lengths differ more.
    ///
    /// Work as long as the recent waits' is seen at the spin floor for two
    /// wake-ups and a short spin (at 2 ms, less CPU than the driver's own
    /// blocking wait), where the machine wakes a sleeping thread within
    /// about half a spin; varying work, within a step of its end. Work
    /// shorter than all four is seen late, by at most half the shortest or
    /// four spins (200 µs at the default), whichever is more. Work seen at
    /// the halfway look is learned at once; work seen at the first look of
    /// the watch moves what was learned earlier by half a spin, then by
    /// one, two, four spins for each such wait in a row (a thread woken
    /// late looks the same, and should not unlearn much), so such work is
    /// seen late for a few waits. A wait that finds the work already done
    /// learns nothing. A stream whose shortest recent wait lasted more than 80
    /// spins (4 ms at the default spin, and at most 200 ms) blocks at once.
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
    /// seen at the spin floor; on a stream whose recent waits lasted up to
    /// 4 ms, a wait sleeps through most of the learned length and watches
    /// its end; a stream whose waits all lasted longer blocks at once.
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

/// What a stream's adaptive waits learned: how long its last few waits
/// lasted (from the call to the work seen done), and how many paced waits in
/// a row found the work done when they first looked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WaitHistory {
    /// The last lengths measured, a ring; the first `known` are valid.
    lengths: [Duration; WaitHistory::KEPT],
    known: usize,
    next: usize,
    /// Paced waits in a row that found the work done at their first look:
    /// each shortens what is learned twice as much as the one before.
    overslept: u32,
}

/// How an adaptive wait spends its time (offsets from the wait's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Spin for the spin, then block: nothing learned yet.
    SpinThenBlock,
    /// Block at once: even the shortest recent wait was long.
    Block,
    /// Sleep until `check` (if any) and query; sleep until `from` and
    /// query; spin for the spin (but not past `until`); then sleep `step`
    /// and query, until `until`; then block.
    Pace {
        check: Option<Duration>,
        from: Duration,
        until: Duration,
        step: Duration,
    },
}

/// Where an adaptive wait saw its work done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// At the wait's first query: the work had ended before the wait
    /// began, which says nothing of its length.
    AtOnce,
    /// At a paced wait's check, halfway to its watch: much shorter work
    /// than learned.
    AtCheck,
    /// At a paced wait's first look when its watch began: shorter work than
    /// learned, or a late wake-up.
    AtFrom,
    /// While spinning or polling: the length, to one query or step.
    Watching,
    /// By blocking: the length, plus the block's wake-up latency.
    Blocked,
}

impl WaitHistory {
    /// How many recent lengths a stream keeps: the shortest and the
    /// longest bound the next watch.
    const KEPT: usize = 4;
    /// Waits are paced within this many spins (4 ms at the default spin):
    /// a stream whose shortest recent wait was longer blocks at once, and a
    /// pace blocks from here on.
    const PACE_SPINS: u32 = 80;
    /// A watch polls in at most about this many steps.
    const STEPS: u32 = 16;

    /// How the next adaptive wait with `spin` waits.
    pub(crate) fn plan(&self, spin: Duration) -> Plan {
        let known = &self.lengths[..self.known];
        let (Some(&shortest), Some(&longest)) = (known.iter().min(), known.iter().max()) else {
            return Plan::SpinThenBlock;
        };
        // Past this, blocking costs little of the wait; and a pace sleeps at
        // most BLOCK_SLICE between two queries.
        let limit = spin
            .saturating_mul(WaitHistory::PACE_SPINS)
            .min(BLOCK_SLICE.saturating_mul(2));
        if shortest > limit {
            return Plan::Block;
        }
        let from = shortest.saturating_sub(spin / 2);
        let until = longest.saturating_add(spin).min(limit).max(from);
        let check = (from > spin.saturating_mul(4) || from > BLOCK_SLICE).then_some(from / 2);
        let step = (until.saturating_sub(from).saturating_sub(spin) / WaitHistory::STEPS)
            .max(spin)
            .min(BLOCK_SLICE);
        Plan::Pace {
            check,
            from,
            until,
            step,
        }
    }

    /// Records that a wait with `spin`, planned by `plan`, saw its work done
    /// where `seen` says, `took` after it began.
    pub(crate) fn record(&mut self, spin: Duration, plan: Plan, seen: Seen, took: Duration) {
        let length = match (seen, plan) {
            (Seen::AtOnce, _) => return,
            // Much shorter work: half of when it was seen.
            (Seen::AtCheck, _) => took / 2,
            // It ended before the watch: earlier by half a spin, then a
            // spin, two, ... for each such wait in a row (a late wake-up
            // looks the same, so one such wait does not unlearn much). A
            // look the timeout brought forward was at `took`, not `from`.
            (Seen::AtFrom, Plan::Pace { from, .. }) => {
                let earlier = (spin / 2).saturating_mul(1 << self.overslept.min(16));
                self.overslept = self.overslept.saturating_add(1);
                self.push(from.min(took).saturating_sub(earlier));
                return;
            }
            _ => took,
        };
        self.overslept = 0;
        self.push(length);
    }

    fn push(&mut self, length: Duration) {
        self.lengths[self.next] = length;
        self.next = (self.next + 1) % WaitHistory::KEPT;
        self.known = (self.known + 1).min(WaitHistory::KEPT);
    }
}

/// A sleep to a point in time without the timer slack of `nanosleep` and
/// `poll()` (50 µs by default for a normal thread): a timerfd's timer has
/// none. Where no timerfd can be made, it sleeps with `std::thread::sleep`.
#[derive(Default)]
pub(crate) struct Alarm(OnceCell<Option<OwnedFd>>);

impl Alarm {
    /// A new alarm: its timerfd is made at its first sleep (a wait that
    /// never sleeps makes none), and closed on drop.
    pub(crate) fn new() -> Alarm {
        Alarm::default()
    }

    /// Sleeps until `offset` after `start` (returns at once if that has passed).
    pub(crate) fn sleep_until(&self, start: Instant, offset: Duration) {
        let left = offset.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        let fd = self
            .0
            .get_or_init(|| timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC).ok());
        if let Some(fd) = fd {
            let alarm = Itimerspec {
                it_interval: timespec(Duration::ZERO),
                it_value: timespec(left),
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
    let timeout = timespec(within);
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(n) => Ok(n > 0 && fds[0].revents().contains(PollFlags::IN)),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(Error::Unsupported(format!(
            "poll() on a completion's eventfd failed ({e}); wait with HostWait::Spin or HostWait::Poll instead"
        ))),
    }
}

/// `d` as a `Timespec` (a duration past `i64::MAX` seconds as that many).
fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX),
        tv_nsec: d.subsec_nanos().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn after(lengths: &[u64]) -> WaitHistory {
        let mut history = WaitHistory::default();
        for &n in lengths {
            history.record(SPIN, Plan::SpinThenBlock, Seen::Watching, us(n));
        }
        history
    }

    /// A pace's plan; its step computed as `plan` does.
    fn pace(check: bool, from: u64, until: u64) -> Plan {
        let (from, until) = (us(from), us(until));
        Plan::Pace {
            check: check.then_some(from / 2),
            from,
            until,
            step: ((until.saturating_sub(from).saturating_sub(SPIN)) / 16).max(SPIN),
        }
    }

    #[test]
    fn an_adaptive_wait_spins_until_it_learns_then_paces_between_the_recent_lengths() {
        assert_eq!(WaitHistory::default().plan(SPIN), Plan::SpinThenBlock);
        // Repeated 2 ms: sleep to halfway and to 25 us before the end, spin
        // 50 us (to the end of the window: no poll), block from 2.05 ms.
        assert_eq!(after(&[2000]).plan(SPIN), pace(true, 1975, 2050));
        assert_eq!(
            pace(true, 1975, 2050),
            Plan::Pace {
                check: Some(us(1975) / 2),
                from: us(1975),
                until: us(2050),
                step: SPIN
            }
        );
        // Short work: spin from the start (a 20 us wait: from 0).
        assert_eq!(after(&[20]).plan(SPIN), pace(false, 0, 70));
        assert_eq!(after(&[200]).plan(SPIN), pace(false, 175, 250));
        // 2 ms and 200 us in turn: watch from 175 us to 2.05 ms, spinning
        // 50 us, then polling in 16 steps of 114 us.
        let mut history = after(&[2000, 200, 2000, 200]);
        assert_eq!(history.plan(SPIN), pace(false, 175, 2050));
        assert_eq!(
            pace(false, 175, 2050),
            Plan::Pace {
                check: None,
                from: us(175),
                until: us(2050),
                step: us(1825) / 16
            }
        );
        // The four last lengths count: four more of 2 ms push out both
        // 200 us.
        for _ in 0..3 {
            history.record(SPIN, history.plan(SPIN), Seen::Watching, us(2000));
            assert_eq!(history.plan(SPIN), pace(false, 175, 2050));
        }
        history.record(SPIN, history.plan(SPIN), Seen::Watching, us(2000));
        assert_eq!(history.plan(SPIN), pace(true, 1975, 2050));
        // Up to 80 spins (4 ms); longer: block at once, and a pace watches
        // no further.
        assert_eq!(after(&[4000]).plan(SPIN), pace(true, 3975, 4000));
        assert_eq!(after(&[4001]).plan(SPIN), Plan::Block);
        assert_eq!(after(&[1000, 9000]).plan(SPIN), pace(true, 975, 4000));
        // A huge spin: no overflow.
        let mut history = after(&[60_000_000]);
        assert_eq!(history.plan(Duration::MAX), Plan::Block);
        history.record(Duration::MAX, Plan::Block, Seen::Blocked, Duration::MAX);
        assert_eq!(history.plan(Duration::MAX), Plan::Block);
    }

    #[test]
    fn a_pace_never_sleeps_longer_than_a_block_slice_without_a_query() {
        for spin in [SPIN, us(1000), us(3000), Duration::from_secs(1)] {
            for lengths in [
                [1u64, 1],
                [50_000, 50_000],
                [199_999, 200_000],
                [1, 200_000],
            ] {
                let mut history = WaitHistory::default();
                for n in lengths {
                    history.record(spin, Plan::SpinThenBlock, Seen::Watching, us(n) * 1000);
                }
                if let Plan::Pace {
                    check,
                    from,
                    until,
                    step,
                } = history.plan(spin)
                {
                    let first = check.unwrap_or(from);
                    assert!(first <= BLOCK_SLICE, "{spin:?} {lengths:?}");
                    assert!(from - first <= BLOCK_SLICE, "{spin:?} {lengths:?}");
                    assert!(
                        step <= BLOCK_SLICE && until <= BLOCK_SLICE * 2,
                        "{spin:?} {lengths:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn what_a_wait_saw_shortens_or_replaces_what_was_learned() {
        let from = |history: &WaitHistory| match history.plan(SPIN) {
            Plan::Pace { from, .. } => from,
            other => panic!("{other:?}"),
        };
        let mut history = after(&[2000]);
        let plan = history.plan(SPIN);
        // Done before the wait began: nothing learned.
        history.record(SPIN, plan, Seen::AtOnce, us(1));
        assert_eq!(history, after(&[2000]));
        // Done at the check: half of when it was seen.
        history.record(SPIN, plan, Seen::AtCheck, us(1000));
        assert_eq!(from(&history), us(475));
        // Done at the first look: earlier than that look by half a spin,
        // then a spin, then two (in a row), then half a spin again after a
        // watch saw it.
        // The look comes at `from` (or a late wake-up after it).
        let at_from = |history: &mut WaitHistory, late: u64| {
            let plan = history.plan(SPIN);
            let took = from(history) + us(late);
            history.record(SPIN, plan, Seen::AtFrom, took);
        };
        let mut history = after(&[2000]);
        for (expected, late) in [(1925, 0), (1850, 30), (1725, 0)] {
            at_from(&mut history, late);
            assert_eq!(from(&history), us(expected));
        }
        let plan = history.plan(SPIN);
        history.record(SPIN, plan, Seen::Watching, us(1800));
        at_from(&mut history, 0);
        assert_eq!(from(&history), us(1725 - 25 - 25));
        // Many in a row: down to a watch from the start, no overflow.
        for _ in 0..40 {
            at_from(&mut history, 0);
        }
        assert_eq!(from(&history), Duration::ZERO);
        // A look the timeout brought forward (1 ms into a 1.975 ms sleep)
        // learns no more than the wait lasted.
        let mut history = after(&[2000]);
        let plan = history.plan(SPIN);
        history.record(SPIN, plan, Seen::AtFrom, us(1000));
        assert_eq!(from(&history), us(1000 - 25 - 25));
        // A block's measure counts as a length.
        history.record(SPIN, Plan::Block, Seen::Blocked, us(3000));
        history.record(SPIN, Plan::Block, Seen::Blocked, us(3000));
        history.record(SPIN, Plan::Block, Seen::Blocked, us(3000));
        history.record(SPIN, Plan::Block, Seen::Blocked, us(3000));
        assert_eq!(from(&history), us(2975));
    }
}
