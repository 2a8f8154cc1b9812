// Twin of fail/context_guard_sent_to_another_thread.rs: the guard is made and dropped on one thread; the device (Send + Sync) goes to another thread, which enters it there.
use cuda_interop::*;
#[allow(unused_imports)]
use vk_export::format::*;
#[allow(unused_imports)]
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(device: &CudaDevice) -> Result<()> {
    let guard = device.enter()?;
    let _ = device.memory_info()?;
    drop(guard);
    let moved = device.clone();
    std::thread::spawn(move || -> Result<()> {
        let _guard = moved.enter()?;
        Ok(())
    })
    .join()
    .expect("the thread ran")?;
    std::thread::scope(|scope| {
        scope.spawn(|| device.enter().map(drop));
    });
    Ok(())
}

fn main() {}
