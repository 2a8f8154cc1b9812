// Twin of fail/level_after_mipmapped_array_dropped.rs.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(image: &ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) -> Result<()> {
    let array = image.map_array()?;
    let level = array.level(0)?;
    let _ = level.extent();
    drop(level);
    drop(array);
    Ok(())
}

fn main() {}
