// Twin of fail/surface_without_storage_usage.rs; textures need no storage usage.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(level: &LevelArray<Rgba8Unorm, usage::Storage>, sampled: &LevelArray<Rgba8Unorm, usage::Sampled>) {
    let _ = level.surface();
    let _ = sampled.texture();
}

fn main() {}
