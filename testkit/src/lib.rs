//! Test support for the cuda-interop workspace, as code of its own: what the
//! integration tests (`cuda-interop-tests`), the fuzzer (`fuzz/`) and the
//! corpus replay share.
//!
//! * Vulkan contexts with the validation layer required, and the checks of
//!   what it reported ([`vulkan`], [`assert_no_validation_errors`]);
//! * [`app_image`]: an application's own (non-exportable) image to copy from;
//! * [`fds`]: the fd table, fd identities, closed and non-export fds, and the
//!   lock that makes process-wide fd comparisons exact;
//! * [`child`]: running a `child_*` test of the same binary in a process of
//!   its own, and handing it a socket;
//! * [`fake`]: the fake `libcuda.so.1` (`fake_cuda/fake_cuda.c`) and its
//!   control API;
//! * [`gpu`]: the real CUDA driver, for the GPU tests;
//! * records made on the wire ([`sample`], [`tamper`]) and the wire reference
//!   encoder for the fuzzer and its replay ([`wire_gen`]); real exports sent
//!   with the records of other exports ([`export_swap`]).
//!
//! # Contract
//!
//! Nothing here is a hook into the library crates: every helper uses their
//! public API only (records are made by the crate's own decoder), and a
//! helper that cannot do what it says panics with what is missing.

use std::time::Duration;

use vk_export::{Context, HeadlessOptions, Validation};

pub mod app_image;
pub mod child;
pub mod export_swap;
pub mod fake;
pub mod fds;
pub mod gpu;
pub mod sample;
pub mod tamper;
pub mod wire_gen;
pub mod yuv;

pub use fds::open_fd_count;

/// The memory class the Vulkan-only tests export from: lavapipe has no
/// `DeviceLocal` type (every memory type is host-visible), so `HostVisible`,
/// unless the tests are built with `--features device-local` (NVIDIA).
#[cfg(not(feature = "device-local"))]
pub type Mem = vk_export::markers::HostVisible;
/// The memory class the Vulkan-only tests export from (`device-local`).
#[cfg(feature = "device-local")]
pub type Mem = vk_export::markers::DeviceLocal;

/// The image type the Vulkan-only tests export: RGBA8, optimal, in [`Mem`].
pub type Image =
    vk_export::ExportableImage<vk_export::format::Rgba8Unorm, vk_export::markers::Optimal, Mem>;

/// A headless context with the validation layer required, unless
/// `CUDA_INTEROP_VALIDATION=off` (for machines without the layer: never CI).
pub fn vulkan(device_uuid: Option<vk_export::DeviceUuid>) -> Context {
    vulkan_with(HeadlessOptions {
        device_uuid,
        ..HeadlessOptions::default()
    })
}

/// As [`vulkan`], with `options` but for the validation policy.
pub fn vulkan_with(options: HeadlessOptions) -> Context {
    let validation = match std::env::var("CUDA_INTEROP_VALIDATION").as_deref() {
        Ok("off") => Validation::Off,
        _ => Validation::Required,
    };
    Context::headless(&HeadlessOptions {
        validation,
        ..options
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

/// Debian's validation layer 1.3.239 keeps its own list of pending signal
/// operations per `VkSemaphore` and cannot see another device's or CUDA's
/// operations on a shared payload: a host signal of an exported or imported
/// timeline is then reported as `VUID-VkSemaphoreSignalInfo-value-03259`
/// against a "pending signal" that no submission of this process made (seen
/// on the H200: "pending signal operation (0)" on a semaphore nothing here
/// signals). It is the class of shared-payload tracking that upstream VVL
/// removed for its false positives (commit a701959d, "layers: Remove FD
/// payload tracking validation", VVL issue #11900; `INTEROP-RULES.md`
/// rule 17). Tests that host-signal a shared timeline allow exactly this id.
pub const IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE: &str =
    "VUID-VkSemaphoreSignalInfo-value-03259";

/// Asserts that every validation error reported on `ctx` has one of the
/// `allowed` message ids (each a known false positive, cited where defined).
pub fn assert_no_validation_errors_except(ctx: &Context, allowed: &[&str]) {
    let ids = ctx.validation_error_ids();
    let unexpected: Vec<&String> = ids
        .iter()
        .filter(|id| !allowed.contains(&id.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "validation errors on {ctx:?}: {unexpected:?} (see stderr)"
    );
    if !ids.is_empty() {
        println!("allowed validation errors (known false positives): {ids:?}");
    }
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

/// A generous timeout for host waits in tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);
