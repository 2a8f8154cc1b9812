// Invariant: only device-local images map as CUDA arrays (E0277, ArrayMemory). Twin: pass/device_local_image_as_array.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(image: &ImportedImage<Rgba8Unorm, Optimal, HostVisible, usage::Storage>) {
    let _ = image.map_array();
}

fn main() {}
