// Invariant: a surface needs storage usage (E0277, SurfaceUsage). Twin: pass/surface_with_storage_usage.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(level: &LevelArray<Rgba8Unorm, usage::Sampled>) {
    let _ = level.surface();
}

fn main() {}
