// Invariant: a binary semaphore signal takes no value (E0061). Twin: pass/value_to_timeline_semaphore.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(semaphore: &ExternalSemaphore<Binary>, stream: &Stream) {
    let _ = semaphore.signal(stream, 5);
}

fn main() {}
