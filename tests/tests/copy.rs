//! Level <-> linear copies (`cuda-interop/src/copy.rs`): checked,
//! stream-ordered and tracked against the fake driver; exact for 4-, 8- and
//! 16-byte texels, with and without storage usage, on the real driver.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test copy -- --ignored
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

use std::time::{Duration, Instant};

use cuda_interop::{CudaDevice, DeviceBuffer, Error as CudaError, Stream};
use cuda_interop_testkit::gpu::{pair, time};
use cuda_interop_testkit::{
    assert_no_validation_errors, assert_no_validation_errors_except, fake, fds, pattern,
    IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE, TIMEOUT,
};
use vk_export::format::{Format, R32Sfloat, Rgba16Sfloat, Rgba32Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::{Context, ExportableImage, ImageDesc, SubmitSync, TimelineSemaphore};

/// Stream-ordered level copies, against the fake driver: layouts the level
/// cannot have (a pitch under one row, a range too short for the last row, a
/// buffer or stream of another device) are refused before any driver call;
/// a storage level with 4-, 8- or 16-byte texels is copied by the copy
/// kernel with the parameters, grid and block of `copy.cu` (module loaded
/// and surface made once); other levels, misaligned pitches and
/// `CopyEngine::Driver` go to `cuMemcpy3DAsync` with the pitch given; the
/// copies return before the work completes, and the buffer's, level's and
/// import's drops wait for it; the module is unloaded with the device.
#[test]
fn level_copies_are_checked_stream_ordered_and_tracked() {
    let _fds = fds::lock();
    fake::run("child_fake_level_copies", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of copy.rs, with a fake libcuda: run by level_copies_are_checked_stream_ordered_and_tracked"]
fn child_fake_level_copies() {
    use cuda_interop::{CopyEngine, Pitched, PitchedMut};
    use vk_export::format::{R16Sfloat, Rgba32Sfloat};
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
    let (row, rows) = (64 * 4u64, 32u64);
    let mut tight = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let mut pitched = DeviceBuffer::new(&cuda, (512 * (rows - 1) + row) as usize).unwrap();
    let short = DeviceBuffer::new(&cuda, (row * rows - 1) as usize).unwrap();
    let mut elsewhere = DeviceBuffer::new(&other, (row * rows) as usize).unwrap();
    let stream_elsewhere = Stream::new(&other).unwrap();

    // Refused before the driver.
    let before = fake.log().len();
    let invalid = [
        (
            "pitch under a row",
            level.enqueue_copy_to(
                &stream,
                PitchedMut::buffer(&mut tight).with_row_pitch(row - 4),
            ),
        ),
        (
            "last row one byte past the end",
            level.enqueue_copy_to(
                &stream,
                PitchedMut::buffer(&mut pitched).with_row_pitch(513),
            ),
        ),
        (
            "tight source one byte short",
            level.enqueue_copy_from(&stream, Pitched::buffer(&short)),
        ),
        (
            "kernel with a pitch that is no multiple of the texel",
            level.enqueue_copy_to_with(
                &stream,
                PitchedMut::buffer(&mut pitched).with_row_pitch(row + 2),
                CopyEngine::Kernel,
            ),
        ),
    ];
    for (what, result) in invalid {
        let err = result.unwrap_err();
        assert!(
            matches!(err, CudaError::InvalidArgument(_)),
            "{what}: {err}"
        );
        println!("{what}: {err}");
    }
    let mut synchronous_short = DeviceBuffer::new(&cuda, 100).unwrap();
    let err = level
        .copy_to_device(&stream, &mut synchronous_short)
        .unwrap_err();
    assert!(matches!(err, CudaError::InvalidArgument(_)), "{err}");
    for (what, result) in [
        (
            "a buffer of another device",
            level.enqueue_copy_to(&stream, PitchedMut::buffer(&mut elsewhere)),
        ),
        (
            "a stream of another device",
            level.enqueue_copy_to(&stream_elsewhere, PitchedMut::buffer(&mut tight)),
        ),
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, CudaError::DeviceMismatch { .. }),
            "{what}: {err}"
        );
    }
    assert_eq!(fake.log().len(), before, "no driver call for a refusal");

    // The kernel: both directions, the grid and block of copy.cu (16 x 16
    // threads, 4 rows each), parameters in the kernel's order.
    let surfaces = fake.live("surface");
    let used = level
        .enqueue_copy_to(
            &stream,
            PitchedMut::buffer(&mut pitched).with_row_pitch(512),
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Kernel);
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "array_to_linear_4b_r4");
    assert_eq!(
        (call.get("grid"), call.get("block"), call.num("shared")),
        ("4,1,1", "16,16,1", 0)
    );
    assert_eq!(
        (call.num("a1"), call.num("a2")),
        (pitched.device_ptr(), 512)
    );
    assert_eq!((call.num("width"), call.num("height")), (64, 32));
    assert_eq!((call.get("surface_ok"), call.get("extra_null")), ("1", "1"));
    let surface = call.num("a0");
    let used = level
        .enqueue_copy_from(&stream, Pitched::buffer(&tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Kernel);
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "linear_to_array_4b_r4");
    assert_eq!(
        (call.num("a0"), call.num("a1"), call.num("a2")),
        (tight.device_ptr(), row, surface),
        "src, pitch, the same surface"
    );
    assert_eq!(call.get("surface_ok"), "1");
    // Foreign memory goes the same way.
    // SAFETY: the fake copies nothing; the buffer outlives the copy anyway.
    let foreign = unsafe { PitchedMut::foreign(tight.device_ptr(), tight.len() as u64) };
    level.enqueue_copy_to(&stream, foreign).unwrap();
    assert_eq!(fake.last("cuLaunchKernel").num("a1"), tight.device_ptr());
    assert_eq!(fake.calls("cuModuleLoadData").len(), 1, "loaded once");
    assert_eq!(fake.last("cuModuleLoadData").get("copy_kernels"), "1");
    assert_eq!(
        fake.live("surface"),
        surfaces + 1,
        "one surface for all copies"
    );

    // The driver: on request, and for a misaligned pitch under Auto.
    let used = level
        .enqueue_copy_to_with(
            &stream,
            PitchedMut::buffer(&mut pitched).with_row_pitch(512),
            CopyEngine::Driver,
        )
        .unwrap();
    assert_eq!(used, CopyEngine::Driver);
    let call = fake.last("cuMemcpy3DAsync");
    assert_eq!(
        (call.num("src_type"), call.num("dst_type")),
        (3, 2),
        "array to device"
    );
    assert_eq!(
        (
            call.num("dst_device"),
            call.num("dst_pitch"),
            call.num("dst_height")
        ),
        (pitched.device_ptr(), 512, 32)
    );
    assert_eq!(
        (
            call.num("width_bytes"),
            call.num("height"),
            call.num("depth")
        ),
        (row, 32, 1)
    );
    assert_eq!(call.get("array_is_level"), "1");
    let used = level
        .enqueue_copy_from(&stream, Pitched::buffer(&pitched).with_row_pitch(row + 2))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "misaligned pitch: not the kernel");
    let call = fake.last("cuMemcpy3DAsync");
    assert_eq!((call.num("src_type"), call.num("dst_type")), (2, 3));
    assert_eq!(call.num("src_pitch"), row + 2);

    // 16-byte texels at an odd size: the 16-byte kernel, grid rounded up.
    let wide = fake::image::<Rgba32Sfloat, usage::Storage>([1000, 37, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_wide = unsafe { cuda.import_image_fd(wide, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_wide = imported_wide.map_array().unwrap();
    let level_wide = array_wide.level(0).unwrap();
    let mut wide_buffer = DeviceBuffer::new(&cuda, 16_384 * 37).unwrap();
    level_wide
        .enqueue_copy_to(
            &stream,
            PitchedMut::buffer(&mut wide_buffer).with_row_pitch(16_384),
        )
        .unwrap();
    let call = fake.last("cuLaunchKernel");
    assert_eq!(
        (call.get("kernel"), call.get("grid")),
        ("array_to_linear_16b_r4", "63,1,1")
    );
    assert_eq!(
        (call.num("a2"), call.num("width"), call.num("height")),
        (16_384, 1000, 37)
    );

    // Without storage usage (no SURFACE_LDST), or with 2-byte texels: the
    // driver under Auto, Unsupported for the kernel; no surface is made.
    let surfaces = fake.live("surface");
    let sampled = fake::image::<Rgba8Unorm, usage::Sampled>([64, 32, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_sampled = unsafe { cuda.import_image_fd(sampled, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_sampled = imported_sampled.map_array().unwrap();
    let level_sampled = array_sampled.level(0).unwrap();
    let launches = fake.calls("cuLaunchKernel").len();
    let used = level_sampled
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver);
    assert_eq!(fake.last("cuMemcpy3DAsync").num("dst_pitch"), row);
    let err = level_sampled
        .enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut tight), CopyEngine::Kernel)
        .unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    println!("kernel on a sampled image: {err}");
    let half = fake::image::<R16Sfloat, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: as for the first import.
    let imported_half = unsafe { cuda.import_image_fd(half, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_half = imported_half.map_array().unwrap();
    let level_half = array_half.level(0).unwrap();
    let used = level_half
        .enqueue_copy_from(&stream, Pitched::buffer(&tight))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "2-byte texels");
    assert_eq!(fake.last("cuMemcpy3DAsync").num("width_bytes"), 128);
    assert_eq!(fake.calls("cuLaunchKernel").len(), launches);
    // A level of a 3-D image whose depth has shrunk to 1 (64x64x2, level 1:
    // 32x32x1) is still a level of a 3-D CUDA array, which the kernels' 2-D
    // surface accesses do not address: the driver under Auto, Unsupported
    // for the kernel (found by review: it launched the 2-D kernel).
    let volume = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 2], 2, 1, false);
    // SAFETY: as for the first import.
    let imported_volume = unsafe { cuda.import_image_fd(volume, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_volume = imported_volume.map_array().unwrap();
    let level_volume = array_volume.level(1).unwrap();
    assert_eq!(level_volume.extent(), [32, 32, 1]);
    let mut small = DeviceBuffer::new(&cuda, 32 * 32 * 4).unwrap();
    let err = level_volume
        .enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut small), CopyEngine::Kernel)
        .unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    let used = level_volume
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut small))
        .unwrap();
    assert_eq!(used, CopyEngine::Driver, "a 3-D image's level");
    assert_eq!(fake.calls("cuLaunchKernel").len(), launches);
    drop((array_volume, small));
    drop(imported_volume);
    assert_eq!(fake.live("surface"), surfaces);
    drop(array_half);
    drop(imported_half);
    drop(array_sampled);
    drop(imported_sampled);
    drop(array_wide);
    drop((imported_wide, wide_buffer));
    stream.synchronize(TIMEOUT).unwrap();

    // Nothing waits for the copy; the destination's drop does.
    let pending = Duration::from_millis(300);
    fake.set("latency_ms", pending.as_millis() as i64);
    let mut destination = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let start = Instant::now();
    level
        .enqueue_copy_to(&stream, PitchedMut::buffer(&mut destination))
        .unwrap();
    let enqueued = start.elapsed();
    assert!(enqueued < Duration::from_millis(100), "{enqueued:?}");
    assert!(!stream.query().unwrap(), "the copy is still pending");
    let start = Instant::now();
    drop(destination);
    let took = start.elapsed();
    println!("copy enqueued in {enqueued:?}; its destination dropped in {took:?}");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    // The blocking wrapper waits for its copy.
    let mut back = DeviceBuffer::new(&cuda, (row * rows) as usize).unwrap();
    let start = Instant::now();
    level.copy_to_device(&stream, &mut back).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(50));
    assert!(stream.query().unwrap());
    // The array's drop waits for the copies through its levels' surfaces
    // before it destroys them.
    level
        .enqueue_copy_from(&stream, Pitched::buffer(&back))
        .unwrap();
    let surfaces = fake.live("surface");
    let start = Instant::now();
    drop(array);
    let took = start.elapsed();
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(
        fake.live("surface"),
        surfaces - 1,
        "destroyed after the copy"
    );
    assert_eq!(
        fake.last("cuMipmappedArrayDestroy").get("busy_streams"),
        "0"
    );
    fake.set("latency_ms", 0);

    drop((imported, tight, pitched, short, back, synchronous_short));
    drop((elsewhere, stream_elsewhere, other, stream));
    assert!(fake.calls("cuModuleUnload").is_empty(), "the device lives");
    drop(cuda);
    assert_eq!(
        fake.calls("cuModuleUnload").len(),
        1,
        "unloaded with the device"
    );
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
    assert!(!fake.log().contains("error="), "{}", fake.log());
    assert_eq!(fake.all_live(), []);
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test copy -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn level_copies_with_pitched_linear_memory_are_exact_for_4_8_and_16_byte_texels() {
    let _fds = fds::lock();
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test copy -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn level_copies_without_storage_usage_fall_back_to_the_driver() {
    let _fds = fds::lock();
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
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test copy -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn level_copies_are_stream_ordered_and_never_wait_on_the_host() {
    let _fds = fds::lock();
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
