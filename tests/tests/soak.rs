//! Soak: 10^4 create/export/import/destroy cycles on Vulkan, the fake CUDA
//! driver and the real one, with the open fd count, the device's memory
//! (`VK_EXT_memory_budget` on Vulkan, `cuMemGetInfo` on CUDA) and the live
//! driver objects compared exactly before and after. Time per cycle is not
//! checked here (a loaded machine is not a bug): that is the bench's.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test soak -- --ignored
//! --skip child_`. The others run everywhere (lavapipe, the fake driver).
//!
//! The fake-driver tests run their body in a `child_fake_*` process whose
//! `libcuda.so.1` is the testkit's fake (`cuda_interop_testkit::fake`): what
//! they show is what the crate does before and around the driver, never the
//! real driver's answer (that is the GPU tests').
//!
//! `child_*` tests are entry points of child processes, run by their parent
//! test of this binary by exact name (`cuda_interop_testkit::child`); they fail
//! when run by hand.
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use std::time::Instant;

use cuda_interop::{drop_errors, CudaDevice};
use cuda_interop_testkit::gpu::pair;
use cuda_interop_testkit::{
    assert_no_validation_errors, assert_no_validation_errors_except, fake, fds, open_fd_count,
    vulkan, Image, Mem, IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE, TIMEOUT,
};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal};
use vk_export::{
    BinarySemaphore, Context, ExportableBuffer, ExportableImage, ImageDesc, SubmitSync,
    TimelineSemaphore, WaitStrategy,
};

/// Case 48 (the Vulkan side): 10,000 cycles of export, import into a second
/// device and destroy, for an image and a buffer: the fd count is flat after
/// warm-up, no destroy is skipped, and the layer reports nothing (time per
/// cycle is the bench's).
#[test]
fn ten_thousand_vulkan_export_import_cycles_stay_flat() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(64, 64).mip_levels(3)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&a, 1 << 16).unwrap();
    let cycle = || {
        let i = Image::import_from(&b, &image).unwrap();
        let j = ExportableBuffer::import_from(&b, &buffer).unwrap();
        drop((i, j));
    };
    for _ in 0..100 {
        cycle();
    }
    let fds = open_fd_count();
    let errors = vk_export::drop_errors();
    for _ in 0..10 {
        for _ in 0..1000 {
            cycle();
        }
    }
    println!("10000 image+buffer export/import/destroy cycles");
    assert_eq!(open_fd_count(), fds, "fd count is flat");
    assert_eq!(vk_export::drop_errors(), errors, "no destroy was skipped");
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// Case 48 (the crate's bookkeeping), against the fake driver: 10,000
/// cycles of image import, array mapping, level, surface, buffer import and
/// mapping, semaphore import, and destroy: every object the driver made is
/// destroyed, the fd count is flat, and no drop fails (time per cycle is
/// the bench's).
#[test]
fn ten_thousand_cuda_import_map_destroy_cycles_leave_nothing_behind() {
    let _fds = fds::lock();
    fake::run("child_fake_soak", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of soak.rs, with a fake libcuda: run by ten_thousand_cuda_import_map_destroy_cycles_leave_nothing_behind"]
fn child_fake_soak() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 1], 4, 1, false);
    let source = fake::some_fd();
    let cycle = || {
        // SAFETY: the driver is the fake: it records, holds the fds (dups of
        // one memfd), reads nothing.
        let (imported, buffer, semaphore) = unsafe {
            (
                cuda.import_image_fd(image.clone(), source.try_clone().unwrap()),
                cuda.import_buffer_fd(fake::buffer(false), source.try_clone().unwrap()),
                cuda.import_semaphore_fd(fake::timeline(), source.try_clone().unwrap()),
            )
        };
        let (imported, mut buffer, semaphore) = (
            imported.map_err(|e| e.error).unwrap(),
            buffer.map_err(|e| e.error).unwrap(),
            semaphore.map_err(|e| e.error).unwrap(),
        );
        let array = imported.map_array().unwrap();
        let level = array.level(1).unwrap();
        drop(level.surface().unwrap());
        drop(array);
        drop(buffer.map().unwrap());
        drop((imported, buffer, semaphore));
    };
    for _ in 0..100 {
        cycle();
    }
    fake.clear();
    let fds = open_fd_count();
    let errors = cuda_interop::drop_errors();
    for _ in 0..10 {
        for _ in 0..1000 {
            cycle();
        }
        fake.clear();
    }
    println!("10000 CUDA import/map/destroy cycles (fake driver)");
    assert_eq!(open_fd_count(), fds, "fd count is flat");
    assert_eq!(cuda_interop::drop_errors(), errors);
    assert_eq!(fake.all_live(), [], "every driver object destroyed");
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test soak -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn repeated_import_map_destroy_leaks_no_fd_and_no_gpu_memory() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(512, 512).mip_levels(4))
        .unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let cycle = || {
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(1).unwrap();
        let surface = level.surface().unwrap();
        drop(surface);
        drop(array);
        drop(imported);
        let mut b = cuda.import_buffer(&buffer).unwrap();
        let mapped = b.map().unwrap();
        drop(mapped);
        drop(b);
        drop(cuda.import_semaphore(&timeline).unwrap());
    };
    for _ in 0..20 {
        cycle();
    }
    let errors = drop_errors();
    let (fds, (free, _)) = (open_fd_count(), cuda.memory_info().unwrap());
    let start = std::time::Instant::now();
    let cycles = 1000;
    for _ in 0..cycles {
        cycle();
    }
    let per_cycle = start.elapsed() / cycles;
    let (fds_after, (free_after, _)) = (open_fd_count(), cuda.memory_info().unwrap());
    println!(
        "{cycles} cycles (image import+map+level+surface, buffer import+map, semaphore import): {per_cycle:?} each; \
         fds {fds} -> {fds_after}; free GPU memory {free} -> {free_after} bytes"
    );
    assert_eq!(fds_after, fds, "fd count is flat");
    assert_eq!(drop_errors(), errors, "no destroy or free failed");
    assert!(
        free_after + (2 << 20) >= free,
        "GPU free memory is flat (within 2 MiB)"
    );
    assert_no_validation_errors(&ctx);
}

/// 10,000 cycles of timeline export, import into a second device, signal on
/// one side and wait on the other, and destroy: 0 validation errors.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test soak -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn ten_thousand_timeline_export_import_cycles_without_validation_errors() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let mut fds = open_fd_count();
    let fds_before_warm_up = fds;
    let start = Instant::now();
    for i in 0..10_000u64 {
        if i == 100 {
            // The driver opens a few fds of its own on first use: the soak
            // asserts the count is flat from here on.
            fds = open_fd_count();
        }
        let timeline = TimelineSemaphore::new(&a).unwrap();
        let imported = TimelineSemaphore::import_from(&b, &timeline).unwrap();
        timeline.signal(1 + i % 7).unwrap();
        imported
            .wait(1 + i % 7, TIMEOUT, WaitStrategy::ADAPTIVE)
            .unwrap();
        b.submit_and_wait(SubmitSync::new().signal_timeline(&imported, 100), |_, _| {})
            .unwrap();
        timeline.wait(100, TIMEOUT, WaitStrategy::ADAPTIVE).unwrap();
    }
    println!(
        "10000 timeline export/import cycles in {:?}; validation errors: {} + {} (ids: {:?}); fds {} before, {} after 100 cycles, {} after 10000",
        start.elapsed(),
        a.validation_errors(),
        b.validation_errors(),
        a.validation_error_ids().into_iter().collect::<std::collections::BTreeSet<_>>(),
        fds_before_warm_up,
        fds,
        open_fd_count()
    );
    assert_eq!(open_fd_count(), fds);
    assert_no_validation_errors_except(&a, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
    assert_no_validation_errors(&b);
}

/// Case 48: 10,000 cycles of image import, array mapping, level, surface,
/// buffer import and mapping, semaphore import, and destroy: the fd count
/// and free GPU memory are flat, and no destroy fails (time per cycle is
/// the bench's).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test soak -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn ten_thousand_import_map_destroy_cycles_stay_flat() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(512, 512).mip_levels(4))
        .unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let cycle = || {
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(1).unwrap();
        drop(level.surface().unwrap());
        drop(array);
        drop(imported);
        let mut b = cuda.import_buffer(&buffer).unwrap();
        drop(b.map().unwrap());
        drop(b);
        drop(cuda.import_semaphore(&timeline).unwrap());
    };
    for _ in 0..100 {
        cycle();
    }
    let errors = drop_errors();
    let (fds, (free, _)) = (open_fd_count(), cuda.memory_info().unwrap());
    for _ in 0..10 {
        for _ in 0..1000 {
            cycle();
        }
    }
    let (fds_after, (free_after, _)) = (open_fd_count(), cuda.memory_info().unwrap());
    println!("10000 cycles: fds {fds} -> {fds_after}; free GPU memory {free} -> {free_after}");
    assert_eq!(fds_after, fds, "fd count is flat");
    assert_eq!(drop_errors(), errors, "no destroy failed");
    assert!(
        free_after + (2 << 20) >= free,
        "free GPU memory is flat (within 2 MiB)"
    );
    assert_no_validation_errors(&ctx);
}

const CYCLES: usize = 10_000;
const WARM_UP: usize = 100;

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
        (0..CYCLES).for_each(cycle);
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
    }
    if a.supports_semaphore_fds() {
        let semaphore_cycle = |i: usize| {
            if i.is_multiple_of(2) {
                let s = TimelineSemaphore::new(a).unwrap();
                drop(TimelineSemaphore::import_from(b, &s).unwrap());
            } else {
                let s = BinarySemaphore::new(a).unwrap();
                drop(BinarySemaphore::import_from(b, &s).unwrap());
            }
        };
        (0..WARM_UP).for_each(semaphore_cycle);
        let fds = open_fd_count();
        (0..CYCLES).for_each(semaphore_cycle);
        println!("semaphore export/import: fds {fds} -> {}", open_fd_count());
        assert_eq!(open_fd_count(), fds, "semaphores: fd count flat");
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
fn ten_thousand_vulkan_export_import_cycles_leak_nothing() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    vulkan_soak::<Mem>(&a, &b);
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// 10^4 cycles of CUDA import, map, level, surface and destroy for an image,
/// import and map for a buffer, and import of a binary and a timeline
/// semaphore, with `cuMemGetInfo` and the fd count flat.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test soak -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn ten_thousand_cuda_import_cycles_leak_nothing() {
    let _fds = fds::lock();
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
        (0..CYCLES).for_each(cycle);
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
    }
    assert_no_validation_errors(&ctx);
}
