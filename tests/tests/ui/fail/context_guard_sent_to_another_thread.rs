// Invariant: a ContextGuard pops the context stack of the thread that pushed it, so it cannot be moved to (or shared with) another thread (E0277). Twin: pass/context_guard_stays_on_its_thread.rs
use cuda_interop::*;
#[allow(unused_imports)]
use vk_export::format::*;
#[allow(unused_imports)]
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(device: &CudaDevice) -> Result<()> {
    let guard = device.enter()?;
    std::thread::scope(|scope| {
        scope.spawn(move || drop(guard));
    });
    Ok(())
}

fn main() {}
