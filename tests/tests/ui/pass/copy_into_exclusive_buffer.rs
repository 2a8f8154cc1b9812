// Twin of fail/copy_into_shared_buffer.rs: the destination is borrowed exclusively, a source may be shared.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;

#[allow(dead_code)]
fn check(level: &LevelArray<Rgba8Unorm, usage::Storage>, stream: &Stream, mine: &mut DeviceBuffer, shared: &DeviceBuffer) {
    let _ = level.enqueue_copy_to(stream, PitchedMut::buffer(mine));
    let _ = level.enqueue_copy_from(stream, Pitched::buffer(shared));
}

fn main() {}
