//! GPU tests: real Vulkan ⇄ CUDA interop on an NVIDIA GPU, with the Khronos
//! validation layer on. Every test checks exact data.
//!
//! They are `#[ignore]`d where there is no GPU (CI). To run them on a machine
//! with an NVIDIA driver: `cargo test -p cuda-interop-tests --test gpu -- --ignored --skip child_`,
//! or build here with `scripts/gpu-bundle.sh` and run `.gpu/bundle/run.sh` there.
//!
//! Tests that leave the process changed on purpose (a sticky fault, a
//! semaphore leaked by design, drop errors counted process-wide, an extra
//! context) run their body in a child process: a `child_*` test of this
//! binary, started by the parent test with an environment variable.

use std::ffi::{c_uint, c_void, CStr};
use std::os::fd::OwnedFd;
use std::process::Command;
use std::time::{Duration, Instant};

use ash::vk;
use cuda_interop::sys;
use cuda_interop::{
    drop_errors, kernels, CudaDevice, DeviceBuffer, Error, Event, HostWait, Module, Stream,
    DROP_WAIT_LIMIT,
};
use cuda_interop_testkit::{
    assert_no_validation_errors, assert_no_validation_errors_except, open_fd_count, pattern,
    vulkan, IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE, TIMEOUT,
};
use vk_export::format::{Format, R32Sfloat, Rgba16Sfloat, Rgba32Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{
    BinarySemaphore, Context, ExportableBuffer, ExportableImage, ImageDesc, SubmitSync,
    TimelineSemaphore, WaitStrategy,
};

fn pair() -> (Context, CudaDevice) {
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).expect("a CUDA device with the Vulkan device's UUID");
    (ctx, cuda)
}

fn launch_2d(
    stream: &Stream,
    module: &Module,
    name: &str,
    width: u32,
    height: u32,
    args: &mut [*mut c_void],
) {
    let f = module.function(name).unwrap();
    let grid = [width.div_ceil(16), height.div_ceil(16), 1];
    // SAFETY: the kernels in `kernels::PTX` take exactly the arguments passed
    // by each caller, and the surfaces outlive the stream synchronisation.
    unsafe { stream.launch(&f, grid, [16, 16, 1], 0, args) }.unwrap();
}

/// Runs the `child_*` test `name` of this binary in a process of its own,
/// with `marker` set in its environment, prints what it printed, asserts
/// that it passed, and returns its stdout.
fn run_child(name: &str, marker: &str) -> String {
    cuda_interop_testkit::child::run_child_test(name, &[(marker, "1".as_ref())], None)
}

/// How long `f` takes.
fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn pairing_matches_uuid_and_shares_the_primary_context() {
    let (ctx, cuda) = pair();
    assert_eq!(cuda.uuid(), ctx.identity().device_uuid);
    println!(
        "Vulkan {} <-> CUDA [{}] {} ({:?})",
        ctx.identity().name,
        cuda.ordinal(),
        cuda.name(),
        cuda
    );
    // Another user of the primary context (what the CUDA runtime does on its
    // first call) gets the same context.
    let driver = sys::Driver::global().unwrap();
    let retain = driver.fns().cuDevicePrimaryCtxRetain.unwrap();
    let release = driver.fns().cuDevicePrimaryCtxRelease.unwrap();
    let get_current = driver.fns().cuCtxGetCurrent.unwrap();
    let mut other: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: retains the primary context of a valid device; released below.
    let status = unsafe { retain(&mut other, cuda.raw_device()) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(other, cuda.raw_context(), "the same primary context");
    let mut current: sys::CUcontext = std::ptr::null_mut();
    {
        let _guard = cuda.enter().unwrap();
        // SAFETY: writes one handle.
        unsafe { get_current(&mut current) };
        assert_eq!(current, cuda.raw_context());
    }
    // SAFETY: as above.
    unsafe { get_current(&mut current) };
    assert!(
        current.is_null(),
        "the guard restored the previous (no) context"
    );
    // SAFETY: balances the retain.
    unsafe { release(cuda.raw_device()) };
    // Usable and droppable from another thread.
    let moved = cuda.clone();
    std::thread::spawn(move || {
        let (free, total) = moved.memory_info().unwrap();
        assert!(free > 0 && free <= total);
        drop(moved);
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_foreign_uuid_is_refused_before_any_driver_call_and_the_fd_comes_back() {
    let (ctx, cuda) = pair();
    let err = CudaDevice::for_uuid([0xab; 16]).unwrap_err();
    assert!(matches!(err, Error::NoMatchingDevice { .. }), "{err}");
    assert!(
        err.to_string().contains(&cuda.name().to_string()),
        "lists the devices: {err}"
    );
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let baseline = open_fd_count();
    let info = cuda_interop_testkit::tamper::image(
        image.info(),
        "device_uuid",
        cuda_interop_testkit::tamper::set(0xab),
    );
    let record = info
        .typed::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>()
        .unwrap();
    let fd = image.export_fd().unwrap();
    // SAFETY: the record is the image's own but for its device UUID, which is
    // what is under test: the import is refused before the driver sees it.
    let err = unsafe { cuda.import_image_fd(record, fd) }.unwrap_err();
    assert!(
        matches!(err.error, Error::DeviceMismatch { .. }),
        "{}",
        err.error
    );
    println!("{}", err.error);
    drop(err.fd); // returned to us, closed exactly once here
    assert_eq!(open_fd_count(), baseline);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_bad_fd_is_a_clear_error_and_stays_with_the_caller() {
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let baseline = open_fd_count();
    let not_gpu: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    // A peer sends /dev/null with a valid record: the safe receive path.
    let (tx, rx) = Connection::pair().unwrap();
    let message = Message {
        tag: 0,
        resources: vec![Resource::Image(image.info().clone())],
    };
    // SAFETY: a test of the receiver's refusals: /dev/null under a genuine
    // record, and the test asserts the import is refused.
    unsafe { tx.send(&message, vec![not_gpu]) }.unwrap();
    let bundle = rx
        .recv(TIMEOUT)
        .unwrap()
        .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
        .unwrap();
    drop((tx, rx));
    let err = cuda.import_received_image(bundle).unwrap_err();
    assert!(
        rustix::io::fcntl_getfd(&err.fd).is_ok(),
        "the fd came back open"
    );
    println!("/dev/null import: {}", err.error);
    assert!(
        err.error.to_string().contains("cuImportExternalMemory"),
        "{}",
        err.error
    );
    drop(err.fd);
    assert_eq!(
        open_fd_count(),
        baseline,
        "the fd was closed exactly once, by us"
    );
}

fn vulkan_writes_cuda_reads<F: Format>(ctx: &Context, cuda: &CudaDevice) {
    let (w, h) = (64u32, 32u32);
    let image = ExportableImage::<F>::new(ctx, ImageDesc::new_2d(w, h)).unwrap();
    let data = pattern((w * h * F::TEXEL_BYTES) as usize, F::VK.as_raw() as u32);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(cuda).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(
        out == data,
        "{}: CUDA read different bytes than Vulkan wrote",
        F::NAME
    );
    println!(
        "{}: {} bytes, import size {} (dedicated {}), exact",
        F::NAME,
        out.len(),
        image.info().allocation_size(),
        image.info().dedicated()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn vulkan_writes_and_cuda_reads_every_format_exactly() {
    let (ctx, cuda) = pair();
    vulkan_writes_cuda_reads::<Rgba8Unorm>(&ctx, &cuda);
    vulkan_writes_cuda_reads::<Rgba16Sfloat>(&ctx, &cuda);
    vulkan_writes_cuda_reads::<R32Sfloat>(&ctx, &cuda);
    vulkan_writes_cuda_reads::<Rgba32Sfloat>(&ctx, &cuda);
    assert_no_validation_errors(&ctx);
}

fn cuda_writes_vulkan_reads<F: Format>(ctx: &Context, cuda: &CudaDevice, module: &Module) {
    assert_eq!(F::TEXEL_BYTES, 4);
    let (w, h, seed) = (100u32, 60u32, 0x5a5a_0000u32);
    let image = ExportableImage::<F>::new(ctx, ImageDesc::new_2d(w, h)).unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let surface = level.surface().unwrap();
    let stream = Stream::new(cuda).unwrap();
    let (mut s, mut wa, mut ha, mut sd) = (surface.raw(), w, h, seed);
    launch_2d(
        &stream,
        module,
        "fill_b32",
        w,
        h,
        &mut [
            (&mut s as *mut u64).cast(),
            (&mut wa as *mut u32).cast(),
            (&mut ha as *mut u32).cast(),
            (&mut sd as *mut u32).cast(),
        ],
    );
    stream.synchronize(TIMEOUT).unwrap();
    let got = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
    let expected: Vec<u8> = (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| kernels::fill_b32_value(x, y, w, seed).to_le_bytes())
        })
        .collect();
    assert!(
        got == expected,
        "{}: Vulkan read different texels than CUDA wrote",
        F::NAME
    );
    println!(
        "{}: CUDA surface writes read back by Vulkan, exact",
        F::NAME
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn cuda_writes_through_a_surface_and_vulkan_reads_exactly() {
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    cuda_writes_vulkan_reads::<Rgba8Unorm>(&ctx, &cuda, &module);
    cuda_writes_vulkan_reads::<R32Sfloat>(&ctx, &cuda, &module);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn buffers_both_ways() {
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let len = 1 << 20;
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, len).unwrap();
    let data = pattern(len as usize, 3);
    ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let mut imported = cuda.import_buffer(&buffer).unwrap();
    let mapped = imported.map().unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut out = vec![0u8; len as usize];
    mapped.copy_to_host(&stream, &mut out).unwrap();
    assert!(out == data, "CUDA read different bytes than Vulkan wrote");
    assert!(mapped.slice(len - 10, 11).is_err(), "bounds are checked");
    let f = module.function("xor_bytes").unwrap();
    let (mut ptr, mut n, mut key) = (mapped.device_ptr(), len, 0xa5u32);
    // SAFETY: xor_bytes(u64, u64, u32) over the mapping's `len` bytes.
    unsafe {
        stream.launch(
            &f,
            [(len as u32).div_ceil(256), 1, 1],
            [256, 1, 1],
            0,
            &mut [
                (&mut ptr as *mut u64).cast(),
                (&mut n as *mut u64).cast(),
                (&mut key as *mut u32).cast(),
            ],
        )
    }
    .unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    let back = ctx.read_buffer(&buffer, len, SubmitSync::new()).unwrap();
    assert!(
        back.iter().zip(&data).all(|(b, d)| *b == d ^ 0xa5),
        "Vulkan read different bytes than CUDA wrote"
    );
    println!("buffer of {len} bytes: Vulkan -> CUDA and CUDA -> Vulkan exact");
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn linear_images_map_as_buffers_with_their_row_pitch_and_textures_exist() {
    use vk_export::markers::{HostVisible, Linear};
    let (ctx, cuda) = pair();
    let (w, h) = (61u32, 17u32);
    let image = ExportableImage::<Rgba8Unorm, Linear, HostVisible, usage::Transfer>::new(
        &ctx,
        ImageDesc::new_2d(w, h),
    )
    .unwrap();
    let data = pattern((w * h * 4) as usize, 61);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let mut imported = cuda.import_image(&image).unwrap();
    let mapped = imported.map_buffer().unwrap();
    let pitch = mapped.row_pitch().unwrap() as usize;
    assert!(pitch >= (w * 4) as usize, "row pitch {pitch}");
    let stream = Stream::new(&cuda).unwrap();
    let mut raw = vec![0u8; pitch * h as usize];
    mapped.copy_to_host(&stream, &mut raw).unwrap();
    let row = (w * 4) as usize;
    for y in 0..h as usize {
        assert!(
            raw[y * pitch..y * pitch + row] == data[y * row..(y + 1) * row],
            "row {y} differs"
        );
    }
    let mut device = cuda_interop::DeviceBuffer::new(&cuda, row).unwrap();
    stream
        .copy_device(
            &mapped.slice(pitch as u64, row as u64).unwrap(),
            &mut device,
        )
        .unwrap();
    let mut second_row = vec![0u8; row];
    stream.copy_to_host(&device, &mut second_row).unwrap();
    assert!(second_row == data[row..2 * row]);
    println!("linear {w}x{h} RGBA8 (host-visible): row pitch {pitch}, mapped as a buffer, exact");

    // A sampled (no storage) optimal image: a texture object, no surface.
    let sampled = ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal, usage::Sampled>::new(
        &ctx,
        ImageDesc::new_2d(32, 32),
    )
    .unwrap();
    let imported = cuda.import_image(&sampled).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let texture = level.texture().unwrap();
    assert_ne!(texture.raw(), 0);
    println!(
        "texture object {} created on a sampled image's level",
        texture.raw()
    );
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn mip_levels_and_array_layers_map_exactly() {
    let (ctx, cuda) = pair();
    let desc = ImageDesc::new_2d(64, 64).mip_levels(3).array_layers(4);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, desc).unwrap();
    let mut expected_levels = Vec::new();
    for level in 0..3 {
        let e = image.info().level_extent(level).unwrap();
        let mut all_layers = Vec::new();
        for layer in 0..4 {
            let data = pattern((e[0] * e[1] * 4) as usize, level * 100 + layer);
            ctx.write_image(&image, level, layer, &data, SubmitSync::new())
                .unwrap();
            all_layers.extend(data);
        }
        expected_levels.push(all_layers);
    }
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    assert_eq!(array.levels(), 3);
    let stream = Stream::new(&cuda).unwrap();
    for (level, expected) in expected_levels.iter().enumerate() {
        let l = array.level(level as u32).unwrap();
        let mut out = vec![0u8; l.byte_len().unwrap()];
        l.copy_to_host(&stream, &mut out).unwrap();
        assert!(&out == expected, "level {level} (4 layers) differs");
    }
    assert!(array.level(3).is_err());
    println!("3 levels x 4 layers: exact");
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn semaphores_order_gpu_work_both_ways() {
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let (w, h) = (256u32, 128u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let surface = level.surface().unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let color = vk::ClearColorValue {
        float32: [0.2, 0.4, 0.6, 1.0],
    };
    let expected = |v: f32| 255 - (v * 255.0).round() as u8;
    let invert = |stream: &Stream| {
        let (mut s, mut wa, mut ha) = (surface.raw(), w, h);
        launch_2d(
            stream,
            &module,
            "invert_rgba8",
            w,
            h,
            &mut [
                (&mut s as *mut u64).cast(),
                (&mut wa as *mut u32).cast(),
                (&mut ha as *mut u32).cast(),
            ],
        );
    };
    let check = |pixels: &[u8], what: &str| {
        let px = [expected(0.2), expected(0.4), expected(0.6), 255];
        assert!(
            pixels.chunks(4).all(|p| p == px),
            "{what}: first pixel {:?}, expected {px:?}",
            &pixels[..4]
        );
    };

    // Timeline: Vulkan clears and signals 1; CUDA waits 1, inverts, signals 2;
    // Vulkan waits 2 on the GPU and reads back.
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let cuda_timeline = cuda.import_semaphore(&timeline).unwrap();
    ctx.clear_image(&image, color, SubmitSync::new()).unwrap();
    ctx.release_image(&image, SubmitSync::new().signal_timeline(&timeline, 1))
        .unwrap();
    cuda_timeline.wait(&stream, 1).unwrap();
    invert(&stream);
    cuda_timeline.signal(&stream, 2).unwrap();
    assert!(
        cuda_timeline.signal(&stream, 2).is_err(),
        "timeline values only go up"
    );
    let pixels = ctx
        .read_image(&image, 0, 0, SubmitSync::new().wait_timeline(&timeline, 2))
        .unwrap();
    check(&pixels, "timeline");

    // Binary, both ways.
    let to_cuda = BinarySemaphore::new(&ctx).unwrap();
    let to_vulkan = BinarySemaphore::new(&ctx).unwrap();
    let cuda_in = cuda.import_semaphore(&to_cuda).unwrap();
    let cuda_out = cuda.import_semaphore(&to_vulkan).unwrap();
    ctx.clear_image(&image, color, SubmitSync::new()).unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let token = ctx.signal_binary(&to_cuda, SubmitSync::new()).unwrap();
    cuda_in.wait(&stream, token).unwrap();
    invert(&stream);
    let token = cuda_out.signal(&stream).unwrap();
    assert!(
        cuda_out.signal(&stream).is_err(),
        "a second binary signal while one is pending is refused"
    );
    let pixels = ctx
        .read_image(
            &image,
            0,
            0,
            SubmitSync::new().wait_binary(&to_vulkan, token),
        )
        .unwrap();
    check(&pixels, "binary");

    // Host wait for a CUDA signal, both strategies (timing: examples/host_wait).
    cuda_timeline.signal(&stream, 3).unwrap();
    timeline.wait(3, TIMEOUT, WaitStrategy::ADAPTIVE).unwrap();
    cuda_timeline.signal(&stream, 4).unwrap();
    timeline.wait(4, TIMEOUT, WaitStrategy::Block).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    println!("timeline and binary semaphores ordered Vulkan -> CUDA -> Vulkan; host waits ok");
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn two_processes_export_and_import_into_cuda() {
    let ctx = vulkan(None);
    let (w, h) = (128u32, 64u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    ctx.write_image(
        &image,
        0,
        0,
        &pattern((w * h * 4) as usize, 1234),
        SubmitSync::new(),
    )
    .unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    ctx.release_image(&image, SubmitSync::new().signal_timeline(&timeline, 1))
        .unwrap();
    // The child inherits its end of the socket.
    let (parent, child_fd, number) = cuda_interop_testkit::child::socket_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cuda_importer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(cuda_interop_testkit::child::CHILD_SOCKET_ENV, &number)
        .spawn()
        .unwrap();
    drop(child_fd);
    parent.send_exported(1, &[&image, &timeline]).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the importing child failed: {status}");
    // The child signalled 2 after it read the image.
    assert_eq!(timeline.value().unwrap(), 2);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of the child process of two_processes_export_and_import_into_cuda"]
fn child_cuda_importer() {
    let connection = cuda_interop_testkit::child::inherited_connection();
    let mut received = connection.recv(TIMEOUT).unwrap();
    let image_bundle = received
        .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
        .unwrap();
    let semaphore_bundle = received
        .take_semaphore::<vk_export::semaphore_kinds::Timeline>(1)
        .unwrap();
    let record = image_bundle.record().info().clone();
    // The receiver's own Vulkan device on the same GPU verifies the records.
    let ctx = vulkan(Some(record.device_uuid()));
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let (w, h) = (record.extent()[0], record.extent()[1]);
    let imported = cuda
        .import_received_image(image_bundle)
        .map_err(|e| e.error)
        .unwrap();
    let semaphore = cuda
        .import_received_semaphore(semaphore_bundle)
        .map_err(|e| e.error)
        .unwrap();
    let stream = Stream::new(&cuda).unwrap();
    semaphore.wait(&stream, 1).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(
        out == pattern((w * h * 4) as usize, 1234),
        "the child read different pixels"
    );
    semaphore.signal(&stream, 2).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    println!(
        "child {}: imported {w}x{h} RGBA8 into CUDA from another process, exact",
        std::process::id()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn repeated_import_map_destroy_leaks_no_fd_and_no_gpu_memory() {
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

/// A kernel writes to an illegal address in a child process: the error is
/// reported, and every later call says the context is poisoned.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_sticky_fault_poisons_the_process_and_later_calls_say_so() {
    let stdout = run_child("child_poisoned", "CUDA_INTEROP_POISON_CHILD");
    assert!(stdout.contains("poisoned:"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of a_sticky_fault_poisons_the_process_and_later_calls_say_so"]
fn child_poisoned() {
    assert!(
        std::env::var_os("CUDA_INTEROP_POISON_CHILD").is_some(),
        "started by the parent test"
    );
    let (_ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let store = module.function("store_u32").unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let (mut ptr, mut value) = (16u64, 7u32);
    // SAFETY: deliberately not: the address is illegal. This is the fault
    // being injected, in a process of its own; the GPU reports it.
    unsafe {
        stream.launch(
            &store,
            [1, 1, 1],
            [1, 1, 1],
            0,
            &mut [
                (&mut ptr as *mut u64).cast(),
                (&mut value as *mut u32).cast(),
            ],
        )
    }
    .unwrap();
    let err = stream.synchronize(TIMEOUT).unwrap_err();
    println!("fault: {err}");
    assert!(
        err.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{err}"
    );
    let later = cuda.memory_info().unwrap_err();
    assert!(matches!(later, Error::Poisoned(_)), "{later}");
    println!("poisoned: {later}");
}

/// A stream waits on a timeline value nobody signals: every bounded wait
/// returns `Timeout` within about twice its bound, a host copy on the stream
/// refuses instead of blocking in the driver, and the semaphore, the stream
/// and the import all drop within their bounds. Only the semaphore, whose
/// wait is still pending, may be leaked, and only if its drop reported it.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_wait_nobody_signals_times_out_and_every_drop_returns_within_its_bound() {
    run_child("child_wait_nobody_signals", "CUDA_INTEROP_STUCK_CHILD");
}

#[test]
#[ignore = "entry point of the child process of a_wait_nobody_signals_times_out_and_every_drop_returns_within_its_bound"]
fn child_wait_nobody_signals() {
    assert!(
        std::env::var_os("CUDA_INTEROP_STUCK_CHILD").is_some(),
        "started by the parent test"
    );
    let (ctx, cuda) = pair();
    let bound = Duration::from_millis(200);
    // Warm up, so that the baseline includes what the context allocates on
    // its first stream and event.
    {
        let warm = Stream::new(&cuda).unwrap();
        let event = Event::new_blocking_sync(&cuda).unwrap();
        warm.record(&event).unwrap();
        event.synchronize(TIMEOUT).unwrap();
        warm.synchronize(TIMEOUT).unwrap();
    }
    let errors_before = drop_errors();
    let fds_before = open_fd_count();
    let (free_before, total) = cuda.memory_info().unwrap();
    println!("baseline: {fds_before} fds, {free_before} of {total} bytes free, {errors_before} drop errors");

    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let mut imported = cuda.import_buffer(&buffer).unwrap();
    let semaphore = cuda.import_semaphore(&timeline).unwrap();
    let mut stream = Stream::new(&cuda).unwrap();
    stream.set_timeout(bound);
    assert_eq!(stream.timeout(), bound);
    semaphore.wait(&stream, 1).unwrap(); // nobody signals 1
    let event = Event::new_blocking_sync(&cuda).unwrap();
    stream.record(&event).unwrap();

    let start = Instant::now();
    let err = stream.synchronize(bound).unwrap_err();
    let took = start.elapsed();
    println!("Stream::synchronize({bound:?}): {err} after {took:?}");
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(took >= bound && took < 2 * bound, "took {took:?}");
    assert!(!stream.query().unwrap(), "the stream is still waiting");
    assert!(!event.query().unwrap(), "so is the event recorded after it");

    let start = Instant::now();
    let err = event.synchronize(bound).unwrap_err();
    let took = start.elapsed();
    println!("Event::synchronize({bound:?}): {err} after {took:?}");
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(took >= bound && took < 2 * bound, "took {took:?}");

    // A host copy behind the wait would block inside the driver for ever: it
    // waits for the stream to drain first, bounded by the stream's timeout,
    // and enqueues nothing.
    {
        let mapped = imported.map().unwrap();
        let mut out = vec![0u8; 4096];
        let start = Instant::now();
        let err = mapped.copy_to_host(&stream, &mut out).unwrap_err();
        let took = start.elapsed();
        println!("MappedBuffer::copy_to_host on the stuck stream: {err} after {took:?}");
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        assert!(took < 2 * bound, "took {took:?}");
        // Freeing the mapping (cuMemFree) would wait for the whole device,
        // and so for the stuck stream, for ever: the drop sees the pending
        // external wait, gives up after its bound and leaks the mapping.
        let before = drop_errors();
        let took = time(|| drop(mapped));
        println!(
            "mapping dropped in {took:?} behind the stuck stream; drop errors {before} -> {}",
            drop_errors()
        );
        assert!(
            took < DROP_WAIT_LIMIT + Duration::from_secs(1),
            "took {took:?}"
        );
        assert_eq!(drop_errors(), before + 1, "the leaked mapping is reported");
    }

    let drop_bound = DROP_WAIT_LIMIT + Duration::from_secs(1);
    let errors_before_semaphore = drop_errors();
    let took_semaphore = time(|| drop(semaphore));
    println!(
        "semaphore with a pending wait dropped in {took_semaphore:?} (limit {DROP_WAIT_LIMIT:?})"
    );
    assert!(took_semaphore < drop_bound, "took {took_semaphore:?}");
    assert_eq!(
        drop_errors(),
        errors_before_semaphore + 1,
        "the semaphore's wait never completes: its drop gives up after the limit, leaks it, and says so"
    );
    let errors_before_rest = drop_errors();
    eprintln!("dropping the event recorded behind the stuck wait");
    let took_event = time(|| drop(event));
    eprintln!("dropping the stuck stream");
    let took_stream = time(|| drop(stream));
    eprintln!("dropping the import");
    let took_import = time(|| drop(imported));
    println!(
        "event dropped in {took_event:?}, stream in {took_stream:?}, import in {took_import:?}; \
         drop errors {errors_before_rest} -> {}",
        drop_errors()
    );
    for (what, took) in [
        ("event", took_event),
        ("stream", took_stream),
        ("import", took_import),
    ] {
        assert!(took < Duration::from_secs(1), "{what}: took {took:?}");
    }
    assert_eq!(
        drop_errors(),
        errors_before_rest + 3,
        "the pending event, the stuck stream and the import are leaked too (destroying them could \
         wait for the stuck device), and each is reported"
    );
    let leaks = drop_errors() - errors_before;

    // The stuck wait completes once its value comes: the device settles, and
    // what is created and dropped afterwards is freed again.
    timeline.signal(1).unwrap();
    {
        let again = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
        let mut imported = cuda.import_buffer(&again).unwrap();
        let mapped = imported.map().unwrap();
        let took = time(|| drop(mapped));
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
    assert_eq!(
        drop_errors(),
        errors_before + leaks,
        "nothing more leaked once settled"
    );
    drop(buffer);
    drop(timeline);
    let (free_after, _) = cuda.memory_info().unwrap();
    let fds_after = open_fd_count();
    println!(
        "after: {fds_after} fds (baseline {fds_before}), {free_after} bytes free (baseline {free_before}), \
         {leaks} reported leaks (a mapping, a semaphore, an event, a stream, a 1 MiB import)"
    );
    // The leaked import keeps its 1 MiB (and the fd the driver may hold for it).
    assert!(
        fds_after <= fds_before + leaks as usize,
        "fds {fds_before} -> {fds_after}"
    );
    assert!(
        free_after + (4 << 20) >= free_before,
        "free GPU memory {free_before} -> {free_after} (the leaked 1 MiB import and 2 MiB slack allowed)"
    );
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// A device copy is only enqueued: the mapping it reads is forgotten, the
/// import and the Vulkan buffer are dropped while it is still pending, and
/// the import's drop waits for it (its last use), so nothing is freed under
/// the copy (compute-sanitizer memcheck reports no fault) and the
/// destination is exact.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_pending_copy_keeps_a_forgotten_mapping_its_import_and_the_vulkan_buffer_alive() {
    let (ctx, cuda) = pair();
    let len: u64 = 256 << 20;
    let data = pattern(len as usize, 256);
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, len).unwrap();
    ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let gate = cuda.import_semaphore(&timeline).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut destination = DeviceBuffer::new(&cuda, len as usize).unwrap();
    let errors_before = drop_errors();

    let mut imported = cuda.import_buffer(&buffer).unwrap();
    let mapping = imported.map().unwrap();
    // The copy waits behind a gate the host opens later, so it is still
    // pending when everything it reads is dropped.
    gate.wait(&stream, 1).unwrap();
    stream
        .copy_device(&mapping.slice(0, len).unwrap(), &mut destination)
        .unwrap();
    std::mem::forget(mapping);
    let hold = Duration::from_millis(300);
    let (import_drop, still_waiting) = std::thread::scope(|scope| {
        let dropper = scope.spawn(move || time(|| drop(imported)));
        std::thread::sleep(hold);
        let still_waiting = !dropper.is_finished();
        timeline.signal(1).unwrap();
        (dropper.join().unwrap(), still_waiting)
    });
    println!(
        "import dropped in {import_drop:?} with its copy gated for {hold:?}; still waiting at the gate: {still_waiting}"
    );
    assert!(
        still_waiting,
        "the import's drop waited for the pending copy"
    );
    assert!(
        import_drop >= hold && import_drop < DROP_WAIT_LIMIT,
        "took {import_drop:?}"
    );
    let buffer_drop = time(|| drop(buffer));
    println!("Vulkan buffer dropped in {buffer_drop:?}");

    stream.synchronize(TIMEOUT).unwrap();
    let mut out = vec![0u8; len as usize];
    stream.copy_to_host(&destination, &mut out).unwrap();
    assert!(
        out == data,
        "the copy's destination differs from the source"
    );
    assert_eq!(drop_errors(), errors_before, "nothing was leaked or failed");
    drop(gate);
    println!("256 MiB copied from a forgotten mapping of an import dropped mid-copy: exact");
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// A versioned driver symbol (not in the bindings' table) by its exact
/// exported name, so that the ABI is the one the name fixes (`cuCtxCreate`
/// through `cuGetProcAddress` resolves to another ABI on CUDA 13 drivers).
fn driver_function(name: &CStr) -> *mut c_void {
    static LIBRARY: std::sync::OnceLock<libloading::Library> = std::sync::OnceLock::new();
    // SAFETY: libcuda is already loaded by this process (the driver table);
    // loading it again runs no initialisers twice.
    let library =
        LIBRARY.get_or_init(|| unsafe { libloading::Library::new("libcuda.so.1") }.unwrap());
    // SAFETY: only the address is read here; the caller transmutes it to the
    // symbol's documented signature.
    let symbol = unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) }
        .unwrap_or_else(|e| panic!("{name:?}: {e}"));
    let pointer = *symbol;
    assert!(!pointer.is_null(), "{name:?}");
    pointer
}

/// Code inside a guard's scope creates (and so pushes) another context and
/// leaves it current: the guard's drop reports the unbalanced stack, leaves
/// that context current, and removes its own from beneath it, so once the
/// other context is popped the previous context is current again.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_context_guard_restores_the_previous_context_after_a_pop_mismatch() {
    run_child("child_context_pop_mismatch", "CUDA_INTEROP_CONTEXT_CHILD");
}

#[test]
#[ignore = "entry point of the child process of a_context_guard_restores_the_previous_context_after_a_pop_mismatch"]
fn child_context_pop_mismatch() {
    assert!(
        std::env::var_os("CUDA_INTEROP_CONTEXT_CHILD").is_some(),
        "started by the parent test"
    );
    type CtxCreate =
        unsafe extern "C" fn(*mut sys::CUcontext, c_uint, sys::CUdevice) -> sys::CUresult;
    type CtxDestroy = unsafe extern "C" fn(sys::CUcontext) -> sys::CUresult;
    let (_ctx, cuda) = pair();
    // SAFETY: cuCtxCreate_v2's C signature is CUresult (CUcontext *,
    // unsigned int, CUdevice).
    let create = unsafe {
        std::mem::transmute::<*mut c_void, CtxCreate>(driver_function(c"cuCtxCreate_v2"))
    };
    // SAFETY: cuCtxDestroy_v2, CUresult (CUcontext).
    let destroy = unsafe {
        std::mem::transmute::<*mut c_void, CtxDestroy>(driver_function(c"cuCtxDestroy_v2"))
    };
    let driver = sys::Driver::global().unwrap();
    let get_current = driver.fns().cuCtxGetCurrent.unwrap();
    let pop = driver.fns().cuCtxPopCurrent.unwrap();
    let current = || {
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        let status = unsafe { get_current(&mut context) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        context
    };
    let before = current();
    assert!(
        before.is_null(),
        "a fresh test thread has no current context"
    );
    let errors_before = drop_errors();

    let mut intruder: sys::CUcontext = std::ptr::null_mut();
    {
        let guard = cuda.enter().unwrap();
        assert_eq!(current(), cuda.raw_context());
        // SAFETY: writes one context handle; cuCtxCreate pushes the new
        // context on this thread's stack, above the guard's.
        let status = unsafe { create(&mut intruder, 0, cuda.raw_device()) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(current(), intruder);
        drop(guard);
    }
    let errors_after = drop_errors();
    println!(
        "primary {:?}, intruder {intruder:?}; drop errors {errors_before} -> {errors_after}",
        cuda.raw_context()
    );
    assert_eq!(
        errors_after,
        errors_before + 1,
        "the guard reported the unbalanced stack"
    );
    assert_eq!(current(), intruder, "the intruder was pushed back, current");
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops this thread's stack; writes one handle.
    let status = unsafe { pop(&mut popped) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(popped, intruder);
    assert_eq!(
        current(),
        before,
        "beneath the intruder, the previous context: the guard removed its own"
    );
    // SAFETY: the context this test created, popped, used by nothing else.
    let status = unsafe { destroy(intruder) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS);

    // Balanced use afterwards: nothing reported, the previous context restored.
    {
        let _guard = cuda.enter().unwrap();
        assert_eq!(current(), cuda.raw_context());
        let (free, total) = cuda.memory_info().unwrap();
        assert!(free > 0 && free <= total);
    }
    assert_eq!(current(), before);
    assert_eq!(drop_errors(), errors_after);

    // Code inside the scope pops the guard's own context: the guard finds
    // nothing to pop, reports it, and pushes nothing.
    {
        let guard = cuda.enter().unwrap();
        // SAFETY: pops this thread's stack; writes one handle.
        let status = unsafe { pop(&mut popped) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        assert_eq!(popped, cuda.raw_context());
        drop(guard);
    }
    println!(
        "after an inner pop of the guard's context: {} drop errors",
        drop_errors()
    );
    assert!(drop_errors() > errors_after, "the empty stack was reported");
    assert_eq!(current(), before);
    println!("the guard restored the previous context after a pop mismatch");
}

/// One edit of a wire field's bytes.
type Edit = Box<dyn Fn(&mut [u8])>;

/// The trust-boundary tamper list through the CUDA receive path: every
/// single-field lie in a received image or buffer record is a typed error
/// before the driver sees the fd (or at it), the fd comes back open, and an
/// honest record still round-trips exactly.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn every_single_field_tamper_is_refused_by_the_cuda_receive_path() {
    use cuda_interop_testkit::tamper;
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(1920, 1080)).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let image_edits: Vec<(&str, Edit)> = vec![
        ("format", Box::new(tamper::set(100))),
        ("usage", Box::new(tamper::set(0x1 | 0x2 | 0x4))),
        ("tiling", Box::new(tamper::set(1))),
        ("device_uuid", Box::new(tamper::flip())),
        ("driver_uuid", Box::new(tamper::flip())),
        ("allocation_size", Box::new(tamper::add(65536))),
        ("allocation_size", Box::new(tamper::add(-65536))),
        ("dedicated", Box::new(|b: &mut [u8]| b[0] ^= 1)),
        ("width", Box::new(tamper::set(960))),
        ("height", Box::new(tamper::set(540))),
        ("mip_levels", Box::new(tamper::set(2))),
        ("array_layers", Box::new(tamper::set(2))),
        ("memory_type_index", Box::new(tamper::add(1))),
        ("memory_flags", Box::new(tamper::set(0))),
    ];
    let baseline = open_fd_count();
    let (free_before, _) = cuda.memory_info().unwrap();
    for (field, edit) in &image_edits {
        let fd = image.export_fd().unwrap();
        let (bytes, decoded) = tamper::edit(
            Resource::Image(image.info().clone()),
            tamper::IMAGE_FIELDS,
            field,
            edit,
        );
        let outcome = match decoded {
            Err(e) => format!("rejected by the decoder: {e}"),
            Ok(_) => {
                let (tx, rx) = Connection::pair().unwrap();
                // SAFETY: a test of the receiver's refusals: the record is
                // tampered on purpose and the test asserts its import is refused.
                unsafe { tx.send_raw(&bytes, &[std::os::fd::AsFd::as_fd(&fd)]) }.unwrap();
                let mut received = rx.recv(TIMEOUT).unwrap();
                match received.take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0) {
                    Err(e) => format!("rejected when typed: {e}"),
                    Ok(bundle) => match cuda.import_received_image(bundle) {
                        Ok(_) => panic!("CUDA imported a record with a tampered {field}"),
                        Err(e) => {
                            assert!(rustix::io::fcntl_getfd(&e.fd).is_ok());
                            format!("refused: {}", e.error)
                        }
                    },
                }
            }
        };
        drop(fd);
        println!("image {field:>17}: {outcome}");
    }
    let buffer_edits: Vec<(&str, Edit)> = vec![
        ("device_uuid", Box::new(tamper::flip())),
        ("driver_uuid", Box::new(tamper::flip())),
        ("allocation_size", Box::new(tamper::add(1 << 20))),
        ("size", Box::new(tamper::add(4096))),
        ("dedicated", Box::new(|b: &mut [u8]| b[0] ^= 1)),
        ("memory_type_index", Box::new(tamper::add(1))),
    ];
    for (field, edit) in &buffer_edits {
        let fd = buffer.export_fd().unwrap();
        let (bytes, decoded) = tamper::edit(
            Resource::Buffer(buffer.info().clone()),
            tamper::BUFFER_FIELDS,
            field,
            edit,
        );
        let outcome = match decoded {
            Err(e) => format!("rejected by the decoder: {e}"),
            Ok(_) => {
                let (tx, rx) = Connection::pair().unwrap();
                // SAFETY: a test of the receiver's refusals: the record is
                // tampered on purpose and the test asserts its import is refused.
                unsafe { tx.send_raw(&bytes, &[std::os::fd::AsFd::as_fd(&fd)]) }.unwrap();
                let mut received = rx.recv(TIMEOUT).unwrap();
                match received.take_buffer::<DeviceLocal>(0) {
                    Err(e) => format!("rejected when typed: {e}"),
                    Ok(bundle) => match cuda.import_received_buffer(bundle) {
                        Ok(_) => panic!("CUDA imported a buffer record with a tampered {field}"),
                        Err(e) => {
                            assert!(rustix::io::fcntl_getfd(&e.fd).is_ok());
                            format!("refused: {}", e.error)
                        }
                    },
                }
            }
        };
        drop(fd);
        println!("buffer {field:>16}: {outcome}");
    }
    assert_eq!(open_fd_count(), baseline, "no fd lost or left open");
    // The honest record still round-trips exactly through the same path.
    let data = pattern(1920 * 1080 * 4, 77);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let (tx, rx) = Connection::pair().unwrap();
    tx.send_exported(1, &[&image]).unwrap();
    let bundle = rx
        .recv(TIMEOUT)
        .unwrap()
        .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
        .unwrap();
    let imported = cuda
        .import_received_image(bundle)
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(out == data, "the honest record's round trip differs");
    let _ = level;
    drop(array);
    drop(imported);
    drop((stream, tx, rx));
    let (free_after, _) = cuda.memory_info().unwrap();
    println!(
        "honest record: exact; fds {baseline} -> {}; free GPU memory {free_before} -> {free_after}",
        open_fd_count()
    );
    assert_no_validation_errors(&ctx);
}

/// A producer process dies (SIGKILL) while this consumer waits for its next
/// frame, on a CUDA stream and on the host: both waits return `Timeout`
/// within their bound; once the consumer unblocks its own stream (a host
/// signal of its imported timeline) and drops everything, its fd count and
/// free GPU memory are back at their baselines.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_killed_producer_leaves_the_consumer_with_bounded_waits_and_no_leak() {
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let stream_warmup = Stream::new(&cuda).unwrap();
    drop(stream_warmup);
    let fds_before = open_fd_count();
    let (free_before, _) = cuda.memory_info().unwrap();
    let (consumer, producer_fd, number) = cuda_interop_testkit::child::socket_for_child();
    let mut producer = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_producer_that_dies",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(cuda_interop_testkit::child::CHILD_SOCKET_ENV, &number)
        .spawn()
        .unwrap();
    drop(producer_fd);
    let mut received = consumer.recv(Duration::from_secs(30)).unwrap();
    let image = cuda
        .import_received_image(
            received
                .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
                .unwrap(),
        )
        .map_err(|e| e.error)
        .unwrap();
    let cuda_timeline = cuda
        .import_received_semaphore(received.take_semaphore::<vk_export::Timeline>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    let vk_timeline = TimelineSemaphore::import_received(
        &ctx,
        received.take_semaphore::<vk_export::Timeline>(2).unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    drop(received);
    producer.kill().unwrap();
    let status = producer.wait().unwrap();
    println!("producer killed: {status}");
    let bound = Duration::from_millis(300);
    let stream = Stream::new(&cuda).unwrap();
    cuda_timeline.wait(&stream, 5).unwrap();
    let array = image.map_array().unwrap();
    let start = Instant::now();
    let err = stream.synchronize(bound).unwrap_err();
    let cuda_took = start.elapsed();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    let start = Instant::now();
    let err = vk_timeline
        .wait(5, bound, WaitStrategy::ADAPTIVE)
        .unwrap_err();
    let vk_took = start.elapsed();
    assert!(matches!(err, vk_export::Error::Timeout(_)), "{err}");
    assert!(
        cuda_took < bound * 2 && vk_took < bound * 2,
        "{cuda_took:?} {vk_took:?}"
    );
    println!("producer dead: CUDA stream wait Timeout after {cuda_took:?}, Vulkan host wait Timeout after {vk_took:?}");
    // The consumer owns its imports: it signals its own timeline to release
    // the stuck stream, then drops everything, each drop timed.
    vk_timeline.signal(5).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    let drops = [
        ("array", time(|| drop(array))),
        ("stream", time(|| drop(stream))),
        ("CUDA semaphore", time(|| drop(cuda_timeline))),
        ("Vulkan semaphore", time(|| drop(vk_timeline))),
        ("image import", time(|| drop(image))),
        ("socket", time(|| drop(consumer))),
    ];
    for (what, took) in drops {
        println!("drop {what}: {took:?}");
        assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    }
    let fds_after = open_fd_count();
    let (free_after, _) = cuda.memory_info().unwrap();
    println!("fds {fds_before} -> {fds_after}; free GPU memory {free_before} -> {free_after}");
    assert_eq!(
        fds_after, fds_before,
        "the consumer's fd count is back at baseline"
    );
    assert!(
        free_after + (2 << 20) >= free_before,
        "free GPU memory back within 2 MiB: {free_before} -> {free_after}"
    );
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// Entry point of the producer process above: exports an image and a
/// timeline (twice: one fd for CUDA, one for Vulkan), sends them, then
/// waits to be killed.
#[test]
#[ignore = "entry point of the child process of a_killed_producer_leaves_the_consumer_with_bounded_waits_and_no_leak"]
fn child_producer_that_dies() {
    let connection = cuda_interop_testkit::child::inherited_connection();
    let ctx = vulkan(None);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(640, 480)).unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    connection
        .send_exported(9, &[&image, &timeline, &timeline])
        .unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// 10,000 cycles of timeline export, import into a second device, signal on
/// one side and wait on the other, and destroy: 0 validation errors.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn ten_thousand_timeline_export_import_cycles_without_validation_errors() {
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

/// A mapped Vulkan buffer handed out as a DLPack tensor: the tensor's data
/// pointer reads the buffer's bytes, the import outlives every other handle
/// until the consumer's deleter runs, and the deleter frees it once.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_mapped_buffer_handed_out_as_dlpack_reads_back_and_is_freed_by_its_deleter() {
    use cuda_interop::dlpack::{DLDataType, DLDataTypeCode, DL_CUDA};
    let (ctx, cuda) = pair();
    let len = 1usize << 20;
    let data = pattern(len, 4242);
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, len as u64).unwrap();
    ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let (free_before, _) = cuda.memory_info().unwrap();
    let imported = cuda.import_buffer(&buffer).unwrap();
    drop(buffer); // the import keeps the Vulkan buffer alive
    let tensor = imported
        .into_dlpack(
            DLDataType::scalar(DLDataTypeCode::UInt, 8),
            &[(len / 1024) as i64, 1024],
            None,
            true,
        )
        .unwrap();
    let managed = tensor.into_versioned();
    // SAFETY: `managed` came from into_versioned; its data pointer maps
    // `len` bytes on this device, read here once, then deleted once.
    unsafe {
        let dl = &(*managed).dl_tensor;
        assert_eq!(dl.device.device_type, DL_CUDA);
        assert_eq!(dl.device.device_id, cuda.ordinal());
        let mut out = vec![0u8; len];
        let _guard = cuda.enter().unwrap();
        let copy = sys::Driver::global().unwrap().fns().cuMemcpyDtoH.unwrap();
        assert_eq!(
            copy(out.as_mut_ptr().cast(), dl.data as u64, len),
            sys::CUresult::CUDA_SUCCESS
        );
        drop(_guard);
        assert!(out == data, "the tensor reads the Vulkan buffer's bytes");
        ((*managed).deleter.unwrap())(managed);
    }
    let (free_after, _) = cuda.memory_info().unwrap();
    println!("DLPack tensor over a 1 MiB mapped buffer: exact; free GPU memory {free_before} -> {free_after}");
    assert_eq!(cuda_interop::drop_errors(), 0);
    assert_no_validation_errors(&ctx);
}

/// Launches `spin_ns` (one thread) for `ns` nanoseconds of GPU time.
fn launch_spin(stream: &Stream, module: &Module, ns: u64) {
    let f = module.function("spin_ns").unwrap();
    let (mut ns, mut out) = (ns, 0u64);
    let mut args: [*mut c_void; 2] = [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
    // SAFETY: spin_ns(u64 ns, u64 out) with out = 0 touches no memory.
    unsafe { stream.launch(&f, [1, 1, 1], [1, 1, 1], 0, &mut args) }.unwrap();
}

/// Whether `fd` is readable within `within`.
fn readable_within(fd: impl std::os::fd::AsFd, within: Duration) -> bool {
    let timeout = rustix::event::Timespec {
        tv_sec: within.as_secs() as i64,
        tv_nsec: within.subsec_nanos().into(),
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&timeout)).unwrap() == 1
}

/// Every host-wait strategy waits for a real kernel (on the stream and on a
/// completion, which is waited for on another thread), none returns before
/// the kernel's end, a short bound on a long kernel is `Error::Timeout`, and
/// a completion's eventfd becomes readable through `poll()` when the kernel
/// ends and not before.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn every_host_wait_strategy_waits_for_a_real_kernel_and_the_completion_fd_polls() {
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    launch_spin(&stream, &module, 1000);
    stream.synchronize(TIMEOUT).unwrap(); // warm up
    let fds = open_fd_count();
    let kernel = Duration::from_millis(2);
    for strategy in [
        HostWait::ADAPTIVE,
        HostWait::Spin,
        HostWait::Block,
        HostWait::Adaptive {
            spin: Duration::from_millis(5),
        },
        HostWait::Poll,
    ] {
        let start = Instant::now();
        launch_spin(&stream, &module, kernel.as_nanos() as u64);
        stream.synchronize_with(strategy, TIMEOUT).unwrap();
        let on_stream = start.elapsed();
        assert!(stream.query().unwrap());

        let start = Instant::now();
        launch_spin(&stream, &module, kernel.as_nanos() as u64);
        let done = stream.completion().unwrap();
        let waiter = std::thread::spawn(move || {
            done.wait_with(strategy, TIMEOUT).unwrap();
            done
        });
        let done = waiter.join().unwrap();
        let on_completion = start.elapsed();
        assert!(done.is_done().unwrap());
        // A wait that spun on the event can return before the driver has
        // run the host function that makes the fd readable (run 8 on the
        // H200: not yet readable at once after an Adaptive wait).
        assert!(readable_within(&done, Duration::from_millis(100)));
        println!("{strategy:?}: a {kernel:?} kernel seen after {on_stream:?} on the stream, {on_completion:?} on a completion");
        for took in [on_stream, on_completion] {
            assert!(
                took >= kernel && took < kernel + Duration::from_millis(50),
                "{strategy:?}: {took:?}"
            );
        }
    }

    // A bound shorter than the kernel: a timeout, then the real wait.
    launch_spin(&stream, &module, 200_000_000);
    let done = stream.completion().unwrap();
    let start = Instant::now();
    let err = done.wait(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(start.elapsed() < Duration::from_millis(100));
    let err = stream
        .synchronize_with(HostWait::Block, Duration::from_millis(20))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    // The fd: not readable while the kernel runs, readable when it ends.
    assert!(!readable_within(&done, Duration::from_millis(50)));
    assert!(!done.is_done().unwrap());
    assert!(readable_within(&done, TIMEOUT));
    let took = start.elapsed();
    println!("a 200 ms kernel's completion fd became readable after {took:?}");
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(done.is_done().unwrap());
    done.wait(Duration::ZERO).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    drop(done);
    drop(stream);
    assert_eq!(open_fd_count(), fds, "every eventfd is closed");
    assert_no_validation_errors(&ctx);
}

// ---- Level <-> pitched linear copies (cuda-interop/src/copy.rs) ----

/// `rows` rows of `row` bytes from `tight`, laid out `pitch` bytes apart,
/// the gaps filled with `gap`; exactly `pitch * (rows - 1) + row` bytes.
fn pitched_layout(tight: &[u8], row: usize, pitch: usize, gap: u8) -> Vec<u8> {
    let rows = tight.len() / row;
    let mut out = vec![gap; pitch * (rows - 1) + row];
    for (y, src) in tight.chunks_exact(row).enumerate() {
        out[y * pitch..y * pitch + row].copy_from_slice(src);
    }
    out
}

/// Vulkan writes a pattern into a `w x h` storage image of `F`; CUDA copies
/// the level into linear memory with a pitch that is not tight (gaps keep
/// their bytes), with the kernel, then with the driver, both exact; then a
/// second pattern goes from pitched linear memory into the level with the
/// kernel, and Vulkan and CUDA (a driver copy) read it back exactly.
fn level_copies_round_trip<F: Format>(ctx: &Context, cuda: &CudaDevice, w: u32, h: u32) {
    use cuda_interop::{CopyEngine, Pitched, PitchedMut};
    let image = ExportableImage::<F>::new(ctx, ImageDesc::new_2d(w, h)).unwrap();
    let row = w as usize * F::TEXEL_BYTES as usize;
    let pitch = (row + 1).next_multiple_of(256);
    let seed = F::VK.as_raw() as u32 ^ w;
    let data = pattern(row * h as usize, seed);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(cuda).unwrap();
    let expected = pitched_layout(&data, row, pitch, 0xab);
    let mut linear = DeviceBuffer::new(cuda, expected.len()).unwrap();
    for engine in [CopyEngine::Kernel, CopyEngine::Driver] {
        stream
            .copy_from_host(&vec![0xab; expected.len()], &mut linear)
            .unwrap();
        let used = level
            .enqueue_copy_to_with(
                &stream,
                PitchedMut::buffer(&mut linear).with_row_pitch(pitch as u64),
                engine,
            )
            .unwrap();
        assert_eq!(used, engine);
        let mut got = vec![0u8; expected.len()];
        stream.copy_to_host(&linear, &mut got).unwrap();
        if let Some(i) = got.iter().zip(&expected).position(|(a, b)| a != b) {
            panic!(
                "{} {w}x{h} array->linear ({engine:?}, pitch {pitch}): byte {i} (row {}, column byte {}) is {:#x}, expected {:#x}",
                F::NAME,
                i / pitch,
                i % pitch,
                got[i],
                expected[i]
            );
        }
    }
    // Linear -> array with the kernel (Auto picks it), read back by Vulkan
    // and by CUDA.
    let back = pattern(row * h as usize, seed ^ 0xffff);
    stream
        .copy_from_host(&pitched_layout(&back, row, pitch, 0xcd), &mut linear)
        .unwrap();
    let used = level
        .enqueue_copy_from(
            &stream,
            Pitched::buffer(&linear).with_row_pitch(pitch as u64),
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Kernel);
    stream.synchronize(TIMEOUT).unwrap();
    let mut by_cuda = vec![0u8; back.len()];
    level.copy_to_host(&stream, &mut by_cuda).unwrap();
    assert!(
        by_cuda == back,
        "{} {w}x{h} linear->array: CUDA reads other bytes",
        F::NAME
    );
    let by_vulkan = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
    assert!(
        by_vulkan == back,
        "{} {w}x{h} linear->array: Vulkan reads other bytes",
        F::NAME
    );
    // The blocking wrappers, tightly packed, through the kernel.
    let mut tight = DeviceBuffer::new(cuda, back.len()).unwrap();
    level.copy_to_device(&stream, &mut tight).unwrap();
    let mut got = vec![0u8; back.len()];
    stream.copy_to_host(&tight, &mut got).unwrap();
    assert!(got == back, "{} {w}x{h} copy_to_device", F::NAME);
    println!(
        "{} {w}x{h}: array->linear (pitch {pitch}, kernel and driver), linear->array (kernel), exact",
        F::NAME
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn level_copies_with_pitched_linear_memory_are_exact_for_4_8_and_16_byte_texels() {
    let (ctx, cuda) = pair();
    for (w, h) in [(1000, 37), (3840, 2160)] {
        level_copies_round_trip::<Rgba8Unorm>(&ctx, &cuda, w, h);
        level_copies_round_trip::<Rgba16Sfloat>(&ctx, &cuda, w, h);
        level_copies_round_trip::<Rgba32Sfloat>(&ctx, &cuda, w, h);
    }
    level_copies_round_trip::<R32Sfloat>(&ctx, &cuda, 17, 3);
    assert_no_validation_errors(&ctx);
}

/// Without storage usage there is no surface: `Auto` copies with the driver
/// (`cuMemcpy3DAsync`), exactly, with the pitch given, and the kernel is
/// refused.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn level_copies_without_storage_usage_fall_back_to_the_driver() {
    use cuda_interop::{CopyEngine, PitchedMut};
    let (ctx, cuda) = pair();
    let (w, h) = (1000u32, 37u32);
    let image = ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal, usage::Sampled>::new(
        &ctx,
        ImageDesc::new_2d(w, h),
    )
    .unwrap();
    let row = w as usize * 4;
    let pitch = 4096;
    let data = pattern(row * h as usize, 77);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let expected = pitched_layout(&data, row, pitch, 0x11);
    let mut linear = DeviceBuffer::new(&cuda, expected.len()).unwrap();
    stream
        .copy_from_host(&vec![0x11; expected.len()], &mut linear)
        .unwrap();
    let err = level
        .enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut linear), CopyEngine::Kernel)
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    let used = level
        .enqueue_copy_to(
            &stream,
            PitchedMut::buffer(&mut linear).with_row_pitch(pitch as u64),
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Driver);
    let mut got = vec![0u8; expected.len()];
    stream.copy_to_host(&linear, &mut got).unwrap();
    assert!(got == expected, "driver copy with pitch {pitch}");
    assert_no_validation_errors(&ctx);
}

/// Nothing waits for a copy until the caller does: a copy enqueued behind a
/// CUDA wait on a timeline value nobody has signalled yet returns at once
/// and stays pending; once Vulkan signals, it completes, exact; the
/// destination's drop would have waited for it.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn level_copies_are_stream_ordered_and_never_wait_on_the_host() {
    use cuda_interop::{CopyEngine, PitchedMut};
    let (ctx, cuda) = pair();
    let (w, h) = (3840u32, 2160u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    let data = pattern((w * h * 4) as usize, 5);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let cuda_timeline = cuda.import_semaphore(&timeline).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut linear = DeviceBuffer::new(&cuda, data.len()).unwrap();
    // Warm up: the module loads and the surface is made on the first copy.
    level
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut linear))
        .unwrap();
    stream.synchronize(TIMEOUT).unwrap();

    cuda_timeline.wait(&stream, 1).unwrap();
    let mut used = CopyEngine::Auto;
    let took = time(|| {
        used = level
            .enqueue_copy_to(&stream, PitchedMut::buffer(&mut linear))
            .unwrap();
    });
    assert_eq!(used, CopyEngine::Kernel);
    println!("copy behind an unsignalled wait enqueued in {took:?}");
    assert!(took < Duration::from_millis(50), "{took:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!stream.query().unwrap(), "the copy waits on the GPU");
    timeline.signal(1).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    let mut got = vec![0u8; data.len()];
    stream.copy_to_host(&linear, &mut got).unwrap();
    assert!(got == data, "the gated copy is exact");
    drop(linear);
    drop(cuda_timeline);
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// Case 24 on the GPU: a kernel launched with `Stream::launch_tracked`
/// writes through a mapping for 200 ms; the mapping, its import and the
/// Vulkan buffer are dropped right after the launch. The import's drop
/// waits for the kernel (it cannot free memory the kernel still writes:
/// compute-sanitizer memcheck runs this test too), then the kernel's
/// timestamps were written where they belong and nothing failed.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_tracked_kernel_keeps_a_dropped_mapping_and_its_import_alive() {
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
