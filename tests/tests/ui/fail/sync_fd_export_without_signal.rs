// Invariant: a SYNC_FD export (a copy-transference wait) needs the token of a submitted signal (E0061). Twin: pass/sync_fd_export_with_signal.rs
use vk_export::BinarySemaphore;

fn export(semaphore: &BinarySemaphore) {
    let _ = semaphore.export_sync_fd();
}

fn main() {}
