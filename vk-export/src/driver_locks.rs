//! Process-wide locks around driver calls that a driver mishandles when
//! they overlap on several threads (a workaround each, with what showed it).
//!
//! # Contract
//!
//! * Each lock is held only across the driver call it names, never across
//!   a wait, so it cannot deadlock with anything of this crate.

/// Held across every `vkCreateSemaphore` and `vkImportSemaphoreFdKHR` of
/// this process. NVIDIA's driver 580 fails a creation that runs beside an
/// import failing on an fd that is no semaphore ("Failed to allocate
/// semaphore device memory") with `ERROR_INITIALIZATION_FAILED`: GPU run
/// 22a, three such tests on parallel threads: 4 of 20 runs, 0 of 20 without
/// the failing import. Serializing the calls does not remove it (run 22b,
/// with this lock: 5 of 20), so the driver's failure outlives the failed
/// call; the creation's error stays a typed `Error::Vulkan`, and
/// `tests/tests/semaphore_handles.rs` runs its tests one at a time (0 of 20
/// in both runs). Kept: the calls are rare (setup, not per frame), and it
/// keeps the two off each other's path.
pub(crate) fn semaphore_driver_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // Nothing is left half-done under it: a poisoned lock is taken as is.
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
