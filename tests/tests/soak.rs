//! Soak: 10^4 create/export/import/destroy cycles, with the open fd count,
//! the device's memory (`VK_EXT_memory_budget` on Vulkan, `cuMemGetInfo` on
//! CUDA) and the time per cycle of the first and last thousand cycles
//! compared. Its own test binary, one test at a time: the fd count is
//! process-wide.

use std::time::{Duration, Instant};

use cuda_interop::CudaDevice;
use cuda_interop_testkit::{assert_no_validation_errors, open_fd_count, vulkan};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{MemoryLocation, Optimal};
use vk_export::{
    BinarySemaphore, Context, ExportableBuffer, ExportableImage, ImageDesc, TimelineSemaphore,
};

/// Lavapipe has no `DeviceLocal` class; NVIDIA puts optimal images only in
/// device-local memory (the GPU bundle builds with `device-local`).
#[cfg(not(feature = "device-local"))]
type Mem = vk_export::markers::HostVisible;
#[cfg(feature = "device-local")]
type Mem = vk_export::markers::DeviceLocal;

const CYCLES: usize = 10_000;
const WARM_UP: usize = 100;

/// Runs `cycle` `CYCLES` times and returns the mean time per cycle of the
/// first and the last thousand.
fn timed(mut cycle: impl FnMut(usize)) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let start = Instant::now();
        cycle(i);
        times.push(start.elapsed());
    }
    let mean = |s: &[Duration]| s.iter().sum::<Duration>() / s.len() as u32;
    (mean(&times[..1000]), mean(&times[CYCLES - 1000..]))
}

/// The last thousand cycles may not be much slower than the first.
fn assert_no_drift(what: &str, first: Duration, last: Duration) {
    println!("{what}: first 1000 cycles {first:?}/cycle, last 1000 {last:?}/cycle");
    assert!(
        last <= first * 3 / 2 + Duration::from_micros(50),
        "{what}: time per cycle drifted from {first:?} to {last:?}"
    );
}

/// Resident memory of this process in KiB (`VmRSS`): where the driver keeps
/// device memory in host memory (lavapipe), a leak shows here.
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Heap usage summed over the device's heaps (`VK_EXT_memory_budget`).
fn heap_usage(ctx: &Context) -> Option<u64> {
    ctx.memory_budget()
        .map(|heaps| heaps.iter().map(|h| h.1).sum())
}

fn vulkan_soak<M: MemoryLocation>(a: &Context, b: &Context) {
    let image_cycle = |_| {
        let image =
            ExportableImage::<Rgba8Unorm, Optimal, M>::new(a, ImageDesc::new_2d(64, 64)).unwrap();
        let imported = ExportableImage::import_from(b, &image).unwrap();
        drop(imported);
        drop(image);
    };
    let buffer_cycle = |_| {
        let buffer = ExportableBuffer::<M>::new(a, 64 << 10).unwrap();
        let imported = ExportableBuffer::import_from(b, &buffer).unwrap();
        drop(imported);
        drop(buffer);
    };
    for (what, cycle) in [
        ("image export/import", &image_cycle as &dyn Fn(usize)),
        ("buffer export/import", &buffer_cycle),
    ] {
        (0..WARM_UP).for_each(cycle);
        let fds = open_fd_count();
        let usage = (heap_usage(a), heap_usage(b));
        let rss = resident_kib();
        let (first, last) = timed(cycle);
        let usage_after = (heap_usage(a), heap_usage(b));
        let rss_after = resident_kib();
        println!(
            "{what}: fds {fds} -> {}; heap usage (exporter, importer) {usage:?} -> {usage_after:?}; \
             resident {rss} -> {rss_after} KiB",
            open_fd_count()
        );
        assert!(
            rss_after <= rss + 16 * 1024,
            "{what}: resident memory grew {rss} -> {rss_after} KiB over {CYCLES} cycles"
        );
        assert_eq!(open_fd_count(), fds, "{what}: fd count flat");
        if let ((Some(a0), Some(b0)), (Some(a1), Some(b1))) = (usage, usage_after) {
            assert!(
                a1 <= a0 + (1 << 20) && b1 <= b0 + (1 << 20),
                "{what}: heap usage grew"
            );
        } else {
            println!(
                "{what}: VK_EXT_memory_budget not offered by this driver: heap usage not measured"
            );
        }
        assert_no_drift(what, first, last);
    }
    if a.supports_semaphore_fds() {
        let semaphore_cycle = |i: usize| {
            if i % 2 == 0 {
                let s = TimelineSemaphore::new(a).unwrap();
                drop(TimelineSemaphore::import_from(b, &s).unwrap());
            } else {
                let s = BinarySemaphore::new(a).unwrap();
                drop(BinarySemaphore::import_from(b, &s).unwrap());
            }
        };
        (0..WARM_UP).for_each(semaphore_cycle);
        let fds = open_fd_count();
        let (first, last) = timed(semaphore_cycle);
        println!("semaphore export/import: fds {fds} -> {}", open_fd_count());
        assert_eq!(open_fd_count(), fds, "semaphores: fd count flat");
        assert_no_drift("semaphore export/import", first, last);
    } else {
        println!(
            "{}: no exportable semaphores (VK_KHR_external_semaphore_fd): semaphore soak not run here",
            a.identity().name
        );
    }
}

/// 10^4 image and 10^4 buffer export/import cycles between two Vulkan
/// devices (and semaphores where the driver exports them).
#[test]
fn ten_thousand_vulkan_export_import_cycles_leak_nothing_and_do_not_drift() {
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    vulkan_soak::<Mem>(&a, &b);
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// 10^4 cycles of CUDA import, map, level, surface and destroy for an image,
/// import and map for a buffer, and import of a binary and a timeline
/// semaphore, with `cuMemGetInfo`, the fd count and the time per cycle flat.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test soak -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn ten_thousand_cuda_import_cycles_leak_nothing_and_do_not_drift() {
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(512, 512).mip_levels(4))
        .unwrap();
    let buffer = ExportableBuffer::<vk_export::markers::DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let binary = BinarySemaphore::new(&ctx).unwrap();
    let memory_cycle = |_| {
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(1).unwrap();
        drop(level.surface().unwrap());
        drop(array);
        drop(imported);
        let mut b = cuda.import_buffer(&buffer).unwrap();
        drop(b.map().unwrap());
        drop(b);
    };
    let semaphore_cycle = |_| {
        drop(cuda.import_semaphore(&timeline).unwrap());
        drop(cuda.import_semaphore(&binary).unwrap());
    };
    for (what, cycle) in [
        (
            "image and buffer import/map/destroy",
            &memory_cycle as &dyn Fn(usize),
        ),
        (
            "binary and timeline semaphore import/destroy",
            &semaphore_cycle,
        ),
    ] {
        (0..WARM_UP).for_each(cycle);
        let fds = open_fd_count();
        let (free, _) = cuda.memory_info().unwrap();
        let errors = cuda_interop::drop_errors();
        let (first, last) = timed(cycle);
        let (free_after, _) = cuda.memory_info().unwrap();
        println!(
            "{what}: fds {fds} -> {}; free GPU memory {free} -> {free_after}; drop errors {errors} -> {}",
            open_fd_count(),
            cuda_interop::drop_errors()
        );
        assert_eq!(open_fd_count(), fds, "{what}: fd count flat");
        assert_eq!(free_after, free, "{what}: cuMemGetInfo flat");
        assert_eq!(
            cuda_interop::drop_errors(),
            errors,
            "{what}: no failed destroy"
        );
        assert_no_drift(what, first, last);
    }
    assert_no_validation_errors(&ctx);
}
