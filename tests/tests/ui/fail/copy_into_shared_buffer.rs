// Invariant: a copy writes linear memory only through an exclusive borrow (E0308: PitchedMut, not Pitched). Twin: pass/copy_into_exclusive_buffer.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;

fn check(level: &LevelArray<Rgba8Unorm, usage::Storage>, stream: &Stream, shared: &DeviceBuffer) {
    let _ = level.enqueue_copy_to(stream, Pitched::buffer(shared));
}

fn main() {}
