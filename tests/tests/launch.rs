//! Tracked kernel launches keep the resources they use alive until the
//! launch completes: against the fake driver and on the real driver.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test launch -- --ignored
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

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cuda_interop::{kernels, CudaDevice, DeviceBuffer, Error as CudaError, Module, Stream};
use cuda_interop_testkit::gpu::pair;
use cuda_interop_testkit::{assert_no_validation_errors, fake, fds};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal};
use vk_export::ExportableBuffer;

/// Case 24, against the fake driver: a kernel launched with
/// `Stream::launch_tracked` keeps every resource it lists (device buffer,
/// level, surface) and its module alive: each drop waits for the pending
/// kernel before it destroys anything; a resource of another device is
/// refused before anything is enqueued; no destroy fails.
#[test]
fn tracked_kernel_launches_keep_their_resources_alive() {
    let _fds = fds::lock();
    fake::run("child_fake_tracked_launches", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of launch.rs, with a fake libcuda: run by tracked_kernel_launches_keep_their_resources_alive"]
fn child_fake_tracked_launches() {
    use cuda_interop::{KernelUses, Module};
    let fake = fake::Fake::open();
    let other_uuid = vk_export::DeviceUuid::from_bytes([8; 16]);
    fake.set_devices(&[fake::UUID, other_uuid]);
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let other = CudaDevice::for_uuid(other_uuid).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let storage = fake::image::<Rgba8Unorm, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: the driver is the fake: it records, holds the fd, and nothing
    // reads or writes memory through the import.
    let imported = unsafe { cuda.import_image_fd(storage, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let module = Module::load_ptx(&cuda, cuda_interop::kernels::COPY_PTX).unwrap();
    let kernel = module.function("array_to_linear_4b_r4").unwrap();
    let pending = Duration::from_millis(300);
    let launch =
        |surface: &cuda_interop::Surface<'_>, buffer: &DeviceBuffer, uses: KernelUses<'_>| {
            let (mut s, mut d, mut p, mut w, mut h) =
                (surface.raw(), buffer.device_ptr(), 256u64, 64u32, 32u32);
            let mut args: [*mut c_void; 5] = [
                (&mut s as *mut u64).cast(),
                (&mut d as *mut u64).cast(),
                (&mut p as *mut u64).cast(),
                (&mut w as *mut u32).cast(),
                (&mut h as *mut u32).cast(),
            ];
            // SAFETY: the fake reads the five parameters of the copy kernel's
            // signature and runs nothing.
            unsafe { stream.launch_tracked(&kernel, [4, 1, 1], [16, 16, 1], 0, &mut args, uses) }
        };

    // Another device's buffer: refused before anything is enqueued.
    let surface = level.surface().unwrap();
    let elsewhere = DeviceBuffer::new(&other, 64 * 32 * 4).unwrap();
    let launches = fake.calls("cuLaunchKernel").len();
    let err = launch(&surface, &elsewhere, KernelUses::new().buffer(&elsewhere)).unwrap_err();
    assert!(matches!(err, CudaError::DeviceMismatch { .. }), "{err}");
    assert_eq!(
        fake.calls("cuLaunchKernel").len(),
        launches,
        "nothing enqueued"
    );

    // A module of another device, launched untracked on this device's
    // stream: refused before the driver sees it (issue 18 item 3).
    let foreign_module = Module::load_ptx(&other, cuda_interop::kernels::COPY_PTX).unwrap();
    let foreign_kernel = foreign_module.function("array_to_linear_4b_r4").unwrap();
    let mut no_args: [*mut c_void; 0] = [];
    // SAFETY: refused before anything reaches the (fake) driver, asserted
    // below; the fake would run nothing anyway.
    let err = unsafe { stream.launch(&foreign_kernel, [1, 1, 1], [1, 1, 1], 0, &mut no_args) }
        .unwrap_err();
    assert!(matches!(err, CudaError::DeviceMismatch { .. }), "{err}");
    assert_eq!(
        fake.calls("cuLaunchKernel").len(),
        launches,
        "nothing enqueued"
    );
    drop(foreign_module);

    // Each listed resource's drop waits for the pending kernel.
    fake.set("latency_ms", pending.as_millis() as i64);
    let buffer = DeviceBuffer::new(&cuda, 64 * 32 * 4).unwrap();
    let start = Instant::now();
    launch(
        &surface,
        &buffer,
        KernelUses::new()
            .buffer(&buffer)
            .level(&level)
            .surface(&surface),
    )
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "the launch does not wait"
    );
    let start = Instant::now();
    drop(surface);
    let took = start.elapsed();
    println!("surface dropped {took:?} after a tracked launch of {pending:?} of work");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    let surface = level.surface().unwrap();
    launch(
        &surface,
        &buffer,
        KernelUses::new().buffer(&buffer).surface(&surface),
    )
    .unwrap();
    let start = Instant::now();
    drop(buffer);
    assert!(start.elapsed() >= pending - Duration::from_millis(50));
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    let spare = DeviceBuffer::new(&cuda, 64 * 32 * 4).unwrap();
    launch(
        &surface,
        &spare,
        KernelUses::new().buffer(&spare).surface(&surface),
    )
    .unwrap();
    let start = Instant::now();
    drop(module);
    assert!(
        start.elapsed() >= pending - Duration::from_millis(50),
        "the module is unloaded after its tracked kernel"
    );
    fake.set("latency_ms", 0);
    drop((surface, spare));
    drop(array);
    drop(imported);
    drop((elsewhere, stream, other));
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
}

/// Case 24 on the GPU: a kernel launched with `Stream::launch_tracked`
/// writes through a mapping for 200 ms; the mapping, its import and the
/// Vulkan buffer are dropped right after the launch. The import's drop
/// waits for the kernel (it cannot free memory the kernel still writes:
/// compute-sanitizer memcheck runs this test too), then the kernel's
/// timestamps were written where they belong and nothing failed.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test launch -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_tracked_kernel_keeps_a_dropped_mapping_and_its_import_alive() {
    let _fds = fds::lock();
    use cuda_interop::KernelUses;
    let (ctx, cuda) = pair();
    let errors = cuda_interop::drop_errors();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let spin = module.function("spin_ns").unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let mut imported = cuda.import_buffer(&buffer).unwrap();
    let mapped = imported.map().unwrap();
    let work = Duration::from_millis(200);
    let (mut ns, mut out) = (work.as_nanos() as u64, mapped.device_ptr());
    let mut args: [*mut c_void; 2] = [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
    // SAFETY: spin_ns(u64 ns, u64 out) writes 16 bytes at `out`, the start
    // of the 1 MiB mapping, which is listed in the uses.
    unsafe {
        stream.launch_tracked(
            &spin,
            [1, 1, 1],
            [1, 1, 1],
            0,
            &mut args,
            KernelUses::new().mapped(&mapped),
        )
    }
    .unwrap();
    let launched = Instant::now();
    drop(mapped);
    drop(imported);
    let waited = launched.elapsed();
    drop(buffer);
    println!("mapping and import dropped {waited:?} after the launch of a {work:?} kernel writing through them");
    assert!(waited >= work - Duration::from_millis(20), "{waited:?}");
    assert!(stream.query().unwrap(), "the kernel had completed");
    assert_eq!(
        cuda_interop::drop_errors(),
        errors,
        "nothing leaked or failed"
    );
    assert_no_validation_errors(&ctx);
}
