// Twin of fail/import_dropped_while_mapped.rs.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(image: ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) -> Result<()> {
    let array = image.map_array()?;
    let _ = array.levels();
    drop(array);
    drop(image);
    Ok(())
}

fn main() {}
