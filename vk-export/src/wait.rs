//! How a host thread waits for the GPU: one [`WaitStrategy`] for timeline
//! values (`Semaphore::wait`) and for a helper's own submission
//! (`SubmitSync::host_wait`).
//!
//! # Contract
//!
//! * A strategy says how the time is spent, never how long: every wait
//!   that takes one is bounded by its own timeout.

use std::time::Duration;

/// How a host thread waits for a timeline value.
///
/// NVIDIA's Linux driver was measured (H200, driver 580) to wake a thread
/// blocked in `vkWaitSemaphores` about 10 ms after a CUDA stream signalled the
/// semaphore, while `vkGetSemaphoreCounterValue` saw the new value within a
/// microsecond. [`WaitStrategy::Poll`] therefore reads the counter: it spins
/// first (lowest latency), then yields, then sleeps in short steps, so a long
/// wait costs little CPU and a short one costs almost no latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// `vkWaitSemaphores`: no CPU use, but the driver's wake-up latency.
    Block,
    /// Read `vkGetSemaphoreCounterValue` until the value is reached.
    Poll {
        /// Busy-spin for this long.
        spin: Duration,
        /// Then `yield_now` until this much time has passed in all.
        yield_until: Duration,
        /// Then sleep this long between reads.
        sleep: Duration,
    },
}

impl WaitStrategy {
    /// Spin 50 µs, yield up to 2 ms, then poll every 50 µs.
    pub const ADAPTIVE: WaitStrategy = WaitStrategy::Poll {
        spin: Duration::from_micros(50),
        yield_until: Duration::from_millis(2),
        sleep: Duration::from_micros(50),
    };
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::ADAPTIVE
    }
}
