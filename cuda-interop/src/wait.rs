//! Bounded host waits for GPU work.
//!
//! # Contract
//!
//! * Every host wait of the crate polls a driver query (`cuStreamQuery`,
//!   `cuEventQuery`) through [`poll_until`], never a blocking
//!   `cuStreamSynchronize`, `cuEventSynchronize` or `cuCtxSynchronize`: work
//!   queued behind a semaphore wait nobody signals never completes, and a
//!   blocking call would never return.
//! * A wait spins for about 20 µs (most short GPU work completes in that time
//!   and a sleep would add its wake-up latency), then yields the thread until
//!   about 200 µs, then sleeps in steps of 50 µs doubling up to 1 ms; it
//!   returns [`Error::Timeout`] once the bound has passed and a last query
//!   still says "not yet".

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a wait spins between queries before it starts yielding.
const SPIN_FOR: Duration = Duration::from_micros(20);
/// How long a wait yields between queries before it starts sleeping.
const YIELD_UNTIL: Duration = Duration::from_micros(200);
/// The first sleep between queries; each later one doubles, up to [`LONGEST_SLEEP`].
const FIRST_SLEEP: Duration = Duration::from_micros(50);
/// The longest sleep between two queries.
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

/// Calls `is_done` until it answers `true` (then `Ok`), fails (its error), or
/// `timeout` has passed ([`Error::Timeout`]).
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
