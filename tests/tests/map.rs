//! Mappings: images and buffers imported into CUDA read and write exactly
//! (every format, surfaces, linear images by row pitch, mip levels and array
//! layers, colour attachments, DLPack hand-out), and an out-of-bounds store
//! through a mapping poisons the process. All need an NVIDIA GPU.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test map -- --ignored
//! --skip child_`. The others run everywhere (lavapipe).
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

use cuda_interop::{kernels, sys, CudaDevice, Error as CudaError, Module, Stream};
use cuda_interop_testkit::gpu::{driver, pair};
use cuda_interop_testkit::{assert_no_validation_errors, child, fds, pattern, TIMEOUT};
use vk_export::format::{Format, R32Sfloat, Rgba16Sfloat, Rgba32Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal, Usage};
use vk_export::{Context, ExportableBuffer, ExportableImage, ImageDesc, SubmitSync};

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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn vulkan_writes_and_cuda_reads_every_format_exactly() {
    let _fds = fds::lock();
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn cuda_writes_through_a_surface_and_vulkan_reads_exactly() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    cuda_writes_vulkan_reads::<Rgba8Unorm>(&ctx, &cuda, &module);
    cuda_writes_vulkan_reads::<R32Sfloat>(&ctx, &cuda, &module);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn buffers_both_ways() {
    let _fds = fds::lock();
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn linear_images_map_as_buffers_with_their_row_pitch_and_textures_exist() {
    let _fds = fds::lock();
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn mip_levels_and_array_layers_map_exactly() {
    let _fds = fds::lock();
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

/// A mapped Vulkan buffer handed out as a DLPack tensor: the tensor's data
/// pointer reads the buffer's bytes, the import outlives every other handle
/// until the consumer's deleter runs, and the deleter frees it once.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_mapped_buffer_handed_out_as_dlpack_reads_back_and_is_freed_by_its_deleter() {
    let _fds = fds::lock();
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

/// Vulkan writes each layer of a 2-layer image of usage `U`; CUDA maps it
/// as an array and reads every layer back exactly.
fn array_reads_back<U: Usage>(ctx: &Context, cuda: &CudaDevice) {
    let (w, h) = (64u32, 32u32);
    let image = ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal, U>::new(
        ctx,
        ImageDesc::new_2d(w, h).array_layers(2),
    )
    .unwrap();
    let mut expected = Vec::new();
    for layer in 0..2 {
        let data = pattern((w * h * Rgba8Unorm::TEXEL_BYTES) as usize, 20 + layer);
        ctx.write_image(&image, 0, layer, &data, SubmitSync::new())
            .unwrap();
        expected.extend(data);
    }
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(cuda).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(out == expected, "usage {:?}: CUDA read other bytes", U::VK);
    println!("usage {:?}: mapped with COLOR_ATTACHMENT, exact", U::VK);
}

/// Case 20: colour-attachment images (with and without storage) map as
/// arrays with the flag derived from their usage, and read back exactly.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn colour_attachment_images_map_and_read_back_exactly() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    array_reads_back::<usage::ColorAttachment>(&ctx, &cuda);
    array_reads_back::<usage::StorageColorAttachment>(&ctx, &cuda);
    assert_no_validation_errors(&ctx);
}

/// Case 21 (the raw driver): INTEROP-RULES expects `cuSurfObjectCreate` to
/// refuse a surface on a level of an array mapped without SURFACE_LDST (a
/// sampled image, for which `surface()` does not compile). Driver 580 on the
/// H200 does not: it makes the surface (first seen in the run of
/// `ce18733`). So the type-level refusal is the only guard; this test pins
/// the driver's answer, and fails (to update the fault table) if a driver
/// starts refusing.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn the_driver_makes_a_raw_surface_on_an_array_without_surface_ldst() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal, usage::Sampled>::new(
        &ctx,
        ImageDesc::new_2d(32, 32),
    )
    .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let create = driver().fns().cuSurfObjectCreate.unwrap();
    let destroy = driver().fns().cuSurfObjectDestroy.unwrap();
    let mut res = sys::CUDA_RESOURCE_DESC {
        resType: sys::CUresourcetype::CU_RESOURCE_TYPE_ARRAY,
        ..Default::default()
    };
    res.res.array.hArray = level.raw();
    let _guard = cuda.enter().unwrap();
    let mut surface: sys::CUsurfObject = 0;
    // SAFETY: a zeroed resource descriptor naming a live level of the
    // current context (mapped without SURFACE_LDST: what is under test);
    // writes one handle.
    let status = unsafe { create(&mut surface, &res) };
    println!("cuSurfObjectCreate on an array without SURFACE_LDST: {status:?}");
    assert_eq!(
        status,
        sys::CUresult::CUDA_SUCCESS,
        "this driver refuses the surface: case 21's raw half now holds, update docs/fault-cases.md"
    );
    // SAFETY: the surface just made, unused, destroyed once.
    assert_eq!(unsafe { destroy(surface) }, sys::CUresult::CUDA_SUCCESS);
    assert!(level.texture().is_ok(), "a texture reads it");
    assert_no_validation_errors(&ctx);
}

/// Case 45 (literally): a kernel stores through a mapped pointer far past
/// the end of its mapping: the fault is reported, and every later call says
/// the process is poisoned. Run in a child process (the error is sticky).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test map -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn an_out_of_bounds_store_through_a_mapping_poisons_the_process() {
    let _fds = fds::lock();
    let stdout = child::run_with(
        "child_out_of_bounds_store",
        &[("CUDA_INTEROP_FAULTS_CHILD", "1")],
    );
    assert!(stdout.contains("poisoned:"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of an_out_of_bounds_store_through_a_mapping_poisons_the_process"]
fn child_out_of_bounds_store() {
    child::started_as_child("CUDA_INTEROP_FAULTS_CHILD");
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let store = module.function("store_u32").unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let mut imported = cuda.import_buffer(&buffer).unwrap();
    let mapped = imported.map().unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let (mut ptr, mut value) = (mapped.device_ptr() + (1u64 << 40), 7u32);
    // SAFETY: deliberately not: the address is 1 TiB past the mapping's
    // end. This is the fault being injected, in a process of its own; the
    // GPU reports it.
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
    assert!(matches!(later, CudaError::Poisoned(_)), "{later}");
    println!("poisoned: {later}");
    // Everything is dropped in the poisoned process here: destructors
    // report their failures and do not crash.
}
