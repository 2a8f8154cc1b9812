// Twin of fail/value_to_binary_semaphore.rs.
use cuda_interop::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(timeline: &ExternalSemaphore<Timeline>, binary: &ExternalSemaphore<Binary>, stream: &Stream) -> Result<()> {
    timeline.signal(stream, 5)?;
    let signal = binary.signal(stream)?;
    binary.wait(stream, signal)?;
    Ok(())
}

fn main() {}
