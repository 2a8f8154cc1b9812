// Invariant: the import cannot be destroyed while a mapping lives (E0505). Twin: pass/import_dropped_after_mapping.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(image: ImportedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) -> Result<()> {
    let array = image.map_array()?;
    drop(image);
    let _ = array.levels();
    Ok(())
}

fn main() {}
