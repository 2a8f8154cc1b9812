//! What the scenarios of both halves share: the image type every scenario
//! uses, the host wait of the C loop, the bound on every wait, and the
//! guard that drains a stream before what its raw work uses is freed.
//!
//! # Contract
//!
//! * Imports nothing of this crate: `scenarios` (one process) and
//!   `two_process` (S7) both import it, and neither imports the other's
//!   internals through it.

use std::time::Duration;

use cuda_interop::Stream;
use vk_export::ash::vk;
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::{Context, ExportableImage, WaitStrategy};

/// The images every scenario uses: what a CUDA array copy needs (optimal,
/// device-local, storage usage for a surface).
pub(crate) type Img<F> = ExportableImage<F, Optimal, DeviceLocal, usage::Storage>;

/// Whether the device has memory of the `DeviceLocal` class (device-local,
/// not host-visible); lavapipe has none, and the Vulkan-only parts run in
/// the class it has.
pub(crate) fn has_device_local_only(ctx: &Context) -> bool {
    // SAFETY: the context's physical device of its live instance.
    let memory = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    memory.memory_types[..memory.memory_type_count as usize]
        .iter()
        .any(|t| {
            t.property_flags
                .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
                && !t
                    .property_flags
                    .contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
        })
}

/// A host wait that spins on the counter: the same policy as the C loop.
pub(crate) const SPIN: WaitStrategy = WaitStrategy::Poll {
    spin: Duration::from_secs(5),
    yield_until: Duration::from_secs(5),
    sleep: Duration::from_micros(50),
};
pub(crate) const WAIT_LIMIT: Duration = Duration::from_secs(5);

/// Drains a stream when dropped: declared after the resources that raw
/// (untracked) work on the stream uses, it runs before they drop, also on
/// an early return. If the stream does not drain in time, the process exits
/// rather than free memory the GPU may still use.
pub(crate) struct Drain<'s>(pub(crate) &'s Stream);

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.synchronize(WAIT_LIMIT) {
            eprintln!("bench: a stream did not drain ({e}); exiting without freeing its resources");
            std::process::exit(1);
        }
    }
}
