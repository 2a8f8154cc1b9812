// Invariant: a surface object may outlive the level view it came from, never its mapped array (E0505). Twin: pass/surface_outlives_level_view.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(image: &ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) -> Result<()> {
    let array = image.map_array()?;
    let surface = array.level(0)?.surface()?;
    drop(array);
    let _ = surface.raw();
    Ok(())
}

fn main() {}
