// Invariant: a level array cannot outlive its mipmapped array (E0505). Twin: pass/level_within_mipmapped_array.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(image: &ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) -> Result<()> {
    let array = image.map_array()?;
    let level = array.level(0)?;
    drop(array);
    let _ = level.extent();
    Ok(())
}

fn main() {}
