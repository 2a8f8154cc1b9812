//! Process-wide locks around driver calls that a driver mishandles when
//! they overlap on several threads (a workaround each, with what showed it).
//!
//! # Contract
//!
//! * Each lock is held only across the driver call it names, never across
//!   a wait, so it cannot deadlock with anything of this crate.

/// Held across every `vkCreateSemaphore` and `vkImportSemaphoreFdKHR` of
/// this process: on NVIDIA's driver 580 a creation that overlaps an import
/// failing (an fd that is no semaphore: "Failed to allocate semaphore device
/// memory") fails with `ERROR_INITIALIZATION_FAILED` (GPU run 22: 4 of 20
/// runs of three such tests on parallel threads, 0 of 20 without the failing
/// import or one at a time). Both calls are rare (setup, not per frame).
pub(crate) fn semaphore_driver_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // Nothing is left half-done under it: a poisoned lock is taken as is.
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
