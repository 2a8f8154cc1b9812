//! Shared helpers for the integration tests.

use std::time::Duration;

use vk_export::{Context, HeadlessOptions, Validation};

/// A headless context with the validation layer required, unless
/// `CUDA_INTEROP_VALIDATION=off` (for machines without the layer: never CI).
pub fn vulkan(device_uuid: Option<[u8; 16]>) -> Context {
    let validation = match std::env::var("CUDA_INTEROP_VALIDATION").as_deref() {
        Ok("off") => Validation::Off,
        _ => Validation::Required,
    };
    Context::headless(&HeadlessOptions {
        device_uuid,
        validation,
    })
    .unwrap_or_else(|e| panic!("a Vulkan device with external memory is needed for this test: {e}"))
}

/// Asserts that the validation layer reported no error on `ctx`.
pub fn assert_no_validation_errors(ctx: &Context) {
    assert_eq!(
        ctx.validation_errors(),
        0,
        "validation errors on {ctx:?} (see stderr)"
    );
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// Open fds of this process (`/proc/self/fd`), less the one used to list them.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// A generous timeout for host waits in tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);
