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
//!   ([`HostWait::Adaptive`], the default), or the crate's older poll with
//!   sleeps ([`HostWait::Poll`]).
//! * A blocked wait wakes at least every [`BLOCK_SLICE`] to query the driver,
//!   so a driver error (a poisoned context) or work that completed while its
//!   host function was delayed ends the wait instead of the timeout.
//! * Destructor waits (the last-use rule) still use [`poll_until`]: they run
//!   rarely, and enqueue no work (the most they add is one event record
//!   behind a stream's uses, `crate::events`).

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

use crate::error::{Error, Result};

/// How a host thread waits for GPU work ([`Stream::synchronize_with`],
/// [`Completion::wait_with`]).
///
/// Measured on an H100 (driver 580) for a 2 ms kernel: spinning learns of
/// the end ~10-20 µs after it at a whole core; blocking on an eventfd
/// ([`HostWait::Block`]) ~150-200 µs after it at 5-7 % of a core.
/// [`HostWait::Adaptive`] gets the first for short work and the second for
/// long work; `cargo run --release -p cuda-interop-bench --bin host_wait`
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
    /// costs little CPU. On a [`Stream`], a wait after an adaptive wait
    /// that lasted more than twice `spin` blocks at once, without spinning
    /// (its work is long, and the spin would only burn a core); every
    /// eighth such wait spins again, to notice work that turned short.
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
    /// seen at the spin floor; longer work costs ~50 µs of spinning per
    /// wait, then a sleep, and a stream whose waits last over 100 µs skips
    /// the spin (seven waits in eight).
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

/// What a stream's adaptive waits learned: whether its waits are long
/// (more than twice the spin), and how many spins were skipped since the
/// last one that spun.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpinHistory {
    long: bool,
    skipped: u32,
}

impl SpinHistory {
    /// Every this many waits after long ones, one spins (a probe: the work
    /// may have turned short, and a blocked wait's own wake-up latency
    /// would keep it looking long).
    const PROBE_EVERY: u32 = 8;

    /// How long the next adaptive wait spins: not at all after a long
    /// wait, but for a probe; else `spin`.
    pub(crate) fn spin(&mut self, spin: Duration) -> Duration {
        if self.long && self.skipped + 1 < SpinHistory::PROBE_EVERY {
            self.skipped += 1;
            Duration::ZERO
        } else {
            self.skipped = 0;
            spin
        }
    }

    /// Records how long a wait with `spin` took.
    pub(crate) fn record(&mut self, spin: Duration, took: Duration) {
        self.long = took > spin.saturating_mul(2);
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

    #[test]
    fn an_adaptive_wait_spins_unless_the_previous_one_lasted_over_twice_its_spin() {
        let after = |took: Duration| {
            let mut history = SpinHistory::default();
            history.spin(SPIN);
            history.record(SPIN, took);
            history.spin(SPIN)
        };
        assert_eq!(SpinHistory::default().spin(SPIN), SPIN);
        assert_eq!(after(Duration::from_micros(9)), SPIN);
        assert_eq!(after(SPIN * 2), SPIN);
        assert_eq!(after(SPIN * 2 + Duration::from_nanos(1)), Duration::ZERO);
        assert_eq!(after(Duration::from_millis(2)), Duration::ZERO);
        let mut history = SpinHistory::default();
        history.record(Duration::MAX, Duration::from_secs(60));
        assert_eq!(history.spin(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn every_eighth_wait_after_long_ones_spins_and_a_short_one_resets() {
        let long = Duration::from_millis(2);
        let mut history = SpinHistory::default();
        let mut spins = Vec::new();
        for _ in 0..17 {
            let spin = history.spin(SPIN);
            spins.push(spin == SPIN);
            history.record(SPIN, long);
        }
        // The first wait spins (no history), then seven skip and one
        // probes, twice.
        let expected: Vec<bool> = (0..17).map(|n| n % 8 == 0).collect();
        assert_eq!(spins, expected);
        // A probe that finds short work: the next wait spins.
        history.record(SPIN, Duration::from_micros(30));
        assert_eq!(history.spin(SPIN), SPIN);
    }
}
