//! What the scenarios of both halves share: the image type every scenario
//! uses, the host wait of the C loop, and the bound on every wait.
//!
//! # Contract
//!
//! * Imports nothing of this crate: `scenarios` (one process) and
//!   `two_process` (S7) both import it, and neither imports the other's
//!   internals through it.

use std::time::Duration;

use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::{ExportableImage, WaitStrategy};

/// The images every scenario uses: what a CUDA array copy needs (optimal,
/// device-local, storage usage for a surface).
pub(crate) type Img<F> = ExportableImage<F, Optimal, DeviceLocal, usage::Storage>;

/// A host wait that spins on the counter: the same policy as the C loop.
pub(crate) const SPIN: WaitStrategy = WaitStrategy::Poll {
    spin: Duration::from_secs(5),
    yield_until: Duration::from_secs(5),
    sleep: Duration::from_micros(50),
};
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(5);
