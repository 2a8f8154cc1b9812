// Invariant: one wait per binary signal (E0382: the token is moved). Twin: pass/value_to_timeline_semaphore.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(semaphore: &ExternalSemaphore<Binary>, stream: &Stream) -> Result<()> {
    let signal = semaphore.signal(stream)?;
    semaphore.wait(stream, signal)?;
    semaphore.wait(stream, signal)?;
    Ok(())
}

fn main() {}
