// Twin of fail/surface_after_mipmapped_array_dropped.rs: the level view is a temporary, the surface and texture live on while the mapped array does.
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
    let surface = array.level(0)?.surface()?;
    let texture = array.level(0)?.texture()?;
    let _ = (surface.raw(), texture.raw());
    drop((surface, texture));
    drop(array);
    Ok(())
}

fn main() {}
