// Twin of fail/host_visible_image_as_array.rs.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(image: &ImportedImage<Rgba32Sfloat, Optimal, DeviceLocal, usage::Storage>) {
    let _ = image.map_array();
}

fn main() {}
