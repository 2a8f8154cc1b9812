//! The fault and bad-input cases of `INTEROP-RULES.md` §A.8 that need the
//! real CUDA driver (the table is `docs/fault-cases.md`; each test names its
//! cases): what the driver answers to raw calls the safe crate makes
//! impossible, fds that are not exports on the CUDA side, exporters and
//! importers that go away, waits that never complete, threads and contexts,
//! an out-of-bounds store through a mapping, a soak. In the style of
//! `gpu.rs`: `#[ignore]`d where there is no GPU; the Khronos validation layer
//! is on; tests that leave the process changed on purpose run their body in
//! a child process (a `child_*` test of this binary).
//!
//! On a machine with an NVIDIA GPU:
//! `cargo test -p cuda-interop-tests --test gpu_faults -- --ignored --skip child_`.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void, CStr};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ash::vk;
use cuda_interop::sys;
use cuda_interop::{drop_errors, kernels, CudaDevice, Error, Module, Stream, DROP_WAIT_LIMIT};
use cuda_interop_testkit::{
    assert_no_validation_errors, assert_no_validation_errors_except, open_fd_count, pattern,
    vulkan, IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE, TIMEOUT,
};
use vk_export::format::{Format, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal, Usage};
use vk_export::socket::Connection;

use vk_export::{
    BinarySemaphore, Context, ExportableBuffer, ExportableImage, ImageDesc, SubmitSync, SyncFd,
    TimelineSemaphore,
};

fn pair() -> (Context, CudaDevice) {
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).expect("a CUDA device with the Vulkan device's UUID");
    (ctx, cuda)
}

fn driver() -> &'static sys::Driver {
    sys::Driver::global().expect("the CUDA driver")
}

/// How long `f` takes.
fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// The process's open fds and what each refers to, less the listing's own.
fn fd_table() -> BTreeMap<i32, PathBuf> {
    let listing = PathBuf::from(format!("/proc/{}/fd", std::process::id()));
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let n: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (target != listing).then_some((n, target))
        })
        .collect()
}

/// `(st_dev, st_ino)`: which open file an fd is.
fn identity(fd: impl AsFd) -> (u64, u64) {
    let st = rustix::fs::fstat(fd).unwrap();
    (st.st_dev, st.st_ino)
}

/// Closes `raw` after a raw driver call refused it, unless the driver
/// closed it already: only if it is still open as the file it was.
fn close_if_still(raw: i32, was: (u64, u64)) {
    // SAFETY: `raw` is only borrowed for the fstat; if it is closed, the
    // call fails with EBADF.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    let now = rustix::fs::fstat(borrowed)
        .ok()
        .map(|st| (st.st_dev, st.st_ino));
    if now == Some(was) {
        // SAFETY: the fd is open and still the file this test duplicated and
        // handed to a driver call that failed (so did not take it); nothing
        // else owns the number.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
    }
}

/// An fd number that is closed now, high above anything this process opens.
fn closed_fd_number() -> i32 {
    let n = 1000;
    assert!(
        std::fs::read_link(format!("/proc/self/fd/{n}")).is_err(),
        "fd {n} is open; pick another"
    );
    n
}

/// Runs the `child_*` test `name` of this binary in a process of its own,
/// with `envs`, bounded (a hang is killed and reported); prints its output,
/// asserts that it passed, and returns its stdout.
fn run_child(name: &str, envs: &[(&str, &str)]) -> String {
    let envs: Vec<(&str, &std::ffi::OsStr)> = envs.iter().map(|(k, v)| (*k, v.as_ref())).collect();
    cuda_interop_testkit::child::run_child_test(name, &envs, None)
}

/// Whether the process was started by a parent test with `marker` set.
fn started_as_child(marker: &str) {
    assert!(
        std::env::var_os(marker).is_some(),
        "started by the parent test"
    );
}

/// Raw `cuImportExternalMemory` of a duplicate of `fd` with the given
/// descriptor fields; destroys the import if the driver made one, closes
/// the duplicate if the driver left it. Returns the driver's answer.
fn raw_memory_import(
    cuda: &CudaDevice,
    fd: &OwnedFd,
    size: u64,
    flags: u32,
    reserved0: u32,
) -> sys::CUresult {
    let import = driver().fns().cuImportExternalMemory.unwrap();
    let destroy = driver().fns().cuDestroyExternalMemory.unwrap();
    let dup = fd.try_clone().unwrap();
    let was = identity(&dup);
    let raw = dup.into_raw_fd();
    let mut desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
        type_: sys::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
        size,
        flags,
        ..Default::default()
    };
    desc.handle.fd = raw;
    desc.reserved[0] = reserved0;
    let _guard = cuda.enter().unwrap();
    let mut handle: sys::CUexternalMemory = std::ptr::null_mut();
    // SAFETY: a descriptor the driver may refuse (what is under test) but
    // that only names an open fd this test owns; the context is current;
    // writes one handle.
    let status = unsafe { import(&mut handle, &desc) };
    if status == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the import just made, unused, destroyed once; the driver
        // owns (and releases) the fd.
        assert_eq!(unsafe { destroy(handle) }, sys::CUresult::CUDA_SUCCESS);
    } else {
        close_if_still(raw, was);
    }
    status
}

/// Cases 1, 7, 8, 11, 13 (the raw driver, which the safe crate never calls
/// like this): fd -1 and a mapping past the end of an import are driver
/// errors; an undefined flag, a non-zero reserved word, a dedicated flag that
/// does not match the allocation, and buffer descriptors with flags or
/// reserved words set, are tried and their answers printed. None crashes,
/// the context is not poisoned, and the fd table is as before.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn raw_driver_calls_with_bad_fds_and_descriptors_fail_without_harm() {
    let (ctx, cuda) = pair();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let size = buffer.info().allocation_size();
    // Warm-up: the driver opens what it needs for imports and mappings on
    // first use.
    {
        let mut warm = cuda.import_buffer(&buffer).unwrap();
        drop(warm.map().unwrap());
    }
    let export = buffer.export_fd().unwrap();
    let before = fd_table();
    let import = driver().fns().cuImportExternalMemory.unwrap();

    // Case 1: fd -1 (no OwnedFd can hold it; the raw API can be given it).
    let mut desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
        type_: sys::CUexternalMemoryHandleType::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
        size,
        ..Default::default()
    };
    desc.handle.fd = -1;
    let mut handle: sys::CUexternalMemory = std::ptr::null_mut();
    let status = {
        let _guard = cuda.enter().unwrap();
        // SAFETY: a zeroed descriptor naming fd -1 (the fault under test);
        // no fd changes hands; the context is current; writes one handle.
        unsafe { import(&mut handle, &desc) }
    };
    println!("cuImportExternalMemory(fd -1): {status:?}");
    assert_ne!(status, sys::CUresult::CUDA_SUCCESS, "fd -1 was imported");
    assert!(handle.is_null(), "nothing imported");

    // Cases 7, 8, 13: what the crate never builds, documented.
    for (what, flags, reserved0) in [
        ("flags 0x2 (undefined)", 0x2, 0),
        ("reserved[0] = 1", 0, 1),
        (
            "CUDA_EXTERNAL_MEMORY_DEDICATED on a non-dedicated allocation",
            sys::CUDA_EXTERNAL_MEMORY_DEDICATED,
            0,
        ),
        ("the crate's own descriptor", 0, 0),
    ] {
        let status = raw_memory_import(&cuda, &export, size, flags, reserved0);
        println!("cuImportExternalMemory with {what}: {status:?}");
    }
    assert!(
        !buffer.info().dedicated(),
        "the buffer was not a dedicated allocation (the dedicated case above is a mismatch)"
    );
    assert_eq!(
        raw_memory_import(&cuda, &export, size, 0, 0),
        sys::CUresult::CUDA_SUCCESS,
        "the crate's own descriptor imports"
    );

    // Cases 11, 13: mappings the crate never asks for.
    let imported = cuda.import_buffer(&buffer).unwrap();
    let map = driver().fns().cuExternalMemoryGetMappedBuffer.unwrap();
    let free = driver().fns().cuMemFree.unwrap();
    let try_map = |offset: u64, len: u64, flags: u32, reserved0: u32| {
        let mut desc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset,
            size: len,
            flags,
            ..Default::default()
        };
        desc.reserved[0] = reserved0;
        let _guard = cuda.enter().unwrap();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a live import of the current context; the descriptor may
        // be refused (what is under test); writes one address.
        let status = unsafe { map(&mut ptr, imported.external_memory().raw(), &desc) };
        if status == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the mapping just made, unused, freed once before the
            // import is dropped.
            assert_eq!(unsafe { free(ptr) }, sys::CUresult::CUDA_SUCCESS);
        }
        status
    };
    let past_the_end = try_map(size - 4096, 8192, 0, 0);
    println!("mapping past the end of the import: {past_the_end:?}");
    assert_ne!(past_the_end, sys::CUresult::CUDA_SUCCESS, "out of range");
    for (what, flags, reserved0) in [("flags 1", 1, 0), ("reserved[0] = 1", 0, 1)] {
        println!(
            "cuExternalMemoryGetMappedBuffer with {what}: {:?}",
            try_map(0, 4096, flags, reserved0)
        );
    }
    let unaligned = try_map(1, 4096, 0, 0);
    println!("mapping at offset 1 (case 12, never asked for by the crate): {unaligned:?}");
    drop(imported);
    let (free_bytes, _) = cuda.memory_info().expect("the context is not poisoned");
    assert!(free_bytes > 0);
    assert_eq!(fd_table(), before, "no fd opened or closed by the refusals");
    drop(export);
    assert_no_validation_errors(&ctx);
}

/// Case 38 (the raw driver): a timeline semaphore's fd imported as a binary
/// one (OPAQUE_FD) and a binary one's as TIMELINE_SEMAPHORE_FD, which the
/// crate cannot build (the handle type follows the kind); the answers are
/// printed, nothing crashes, the context stays usable.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn raw_semaphore_imports_of_the_other_kind_are_documented() {
    let (ctx, cuda) = pair();
    let import = driver().fns().cuImportExternalSemaphore.unwrap();
    let destroy = driver().fns().cuDestroyExternalSemaphore.unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let binary = BinarySemaphore::new(&ctx).unwrap();
    for (what, fd, kind) in [
        (
            "a timeline as OPAQUE_FD",
            timeline.export_fd().unwrap(),
            sys::CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD,
        ),
        (
            "a binary semaphore as TIMELINE_SEMAPHORE_FD",
            binary.export_fd().unwrap(),
            sys::CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
        ),
    ] {
        let was = identity(&fd);
        let raw = fd.into_raw_fd();
        let mut desc = sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
            type_: kind,
            ..Default::default()
        };
        desc.handle.fd = raw;
        let _guard = cuda.enter().unwrap();
        let mut handle: sys::CUexternalSemaphore = std::ptr::null_mut();
        // SAFETY: a zeroed descriptor naming an open semaphore export this
        // test owns, with the other kind's handle type (what is under test);
        // the context is current; writes one handle.
        let status = unsafe { import(&mut handle, &desc) };
        println!("cuImportExternalSemaphore of {what}: {status:?}");
        if status == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the import just made, never signalled or waited on,
            // destroyed once.
            assert_eq!(unsafe { destroy(handle) }, sys::CUresult::CUDA_SUCCESS);
        } else {
            close_if_still(raw, was);
        }
    }
    cuda.memory_info().expect("the context is not poisoned");
    assert_no_validation_errors(&ctx);
}

/// Fds that are not GPU exports, named (an eventfd whose read would not
/// block, `/dev/null`, a pipe, a regular file, a socket).
fn not_exports(file: &std::path::Path) -> Vec<(&'static str, OwnedFd)> {
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let (socket, _peer) = Connection::pair().unwrap();
    vec![
        (
            "an eventfd",
            rustix::event::eventfd(1, rustix::event::EventfdFlags::CLOEXEC).unwrap(),
        ),
        (
            "/dev/null",
            std::fs::File::open("/dev/null").unwrap().into(),
        ),
        ("a pipe", pipe_r),
        ("a regular file", std::fs::File::open(file).unwrap().into()),
        ("a socket", socket.into_fd()),
    ]
}

/// Cases 2, 3 (the CUDA side, real driver): a closed fd number, and fds
/// that are not exports, handed to every CUDA import (image, buffer,
/// semaphore) are typed errors; each fd comes back open and still the same
/// file (the closed one as the same number), no other fd is closed, and the
/// context is not poisoned.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn closed_and_non_gpu_fds_come_back_from_every_cuda_import() {
    let (ctx, cuda) = pair();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(64, 64)).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 16).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let file = std::env::temp_dir().join(format!("gpu-faults-regular-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    // Warm-up: each kind of import once, so that what the driver opens on
    // first use is in the baseline.
    {
        let warm = cuda.import_image(&image).unwrap();
        drop(warm.map_array().unwrap());
    }
    drop(cuda.import_buffer(&buffer).unwrap());
    drop(cuda.import_semaphore(&timeline).unwrap());
    let errors = drop_errors();
    let before = fd_table();
    for kind in ["image", "buffer", "semaphore"] {
        let import = |fd: OwnedFd| {
            // SAFETY: deliberately not: the fd is not an export of what the
            // record describes, which is the fault under test; the driver
            // refuses it (asserted below) and the fd comes back.
            unsafe {
                match kind {
                    "image" => cuda.import_image_fd(image.record(), fd).map(drop),
                    "buffer" => cuda.import_buffer_fd(buffer.record(), fd).map(drop),
                    _ => cuda.import_semaphore_fd(timeline.record(), fd).map(drop),
                }
            }
        };
        let n = closed_fd_number();
        // SAFETY: deliberately not: `n` is closed (checked), the fault under
        // test; it is never closed through this value (taken back below).
        let err = import(unsafe { OwnedFd::from_raw_fd(n) }).expect_err("a closed fd was imported");
        println!("{kind} from closed fd {n}: {}", err.error);
        assert_eq!(err.fd.into_raw_fd(), n);
        for (what, fd) in not_exports(&file) {
            let sent = identity(&fd);
            let err = import(fd).expect_err(what);
            println!("{kind} from {what}: {}", err.error);
            // An eventfd, a pipe and a socket are refused by the crate's fd
            // check before any driver call (their kinds can never be an
            // export); /dev/null and a regular file pass that check and the
            // driver refuses them.
            if ["an eventfd", "a pipe", "a socket"].contains(&what) {
                assert!(
                    matches!(err.error, Error::Vulkan(vk_export::Error::Record(_))),
                    "{}",
                    err.error
                );
            } else {
                assert!(matches!(err.error, Error::Driver(_)), "{}", err.error);
            }
            assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        }
    }
    std::fs::remove_file(&file).ok();
    assert_eq!(fd_table(), before, "every fd closed exactly once, by us");
    cuda.memory_info().expect("the context is not poisoned");
    assert_eq!(drop_errors(), errors);
    assert_no_validation_errors(&ctx);
}

/// Case 5 (CUDA): one export duplicated with `try_clone` imports twice into
/// CUDA; both mappings read what Vulkan wrote, what CUDA writes through one
/// the other reads, and the fd count is back once both are dropped.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn one_export_duplicated_imports_twice_into_cuda() {
    let (ctx, cuda) = pair();
    let len = 1u64 << 20;
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, len).unwrap();
    let data = pattern(len as usize, 5);
    ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    // Warm-up: an import, a mapping and a copy, as below.
    {
        let mut warm = cuda.import_buffer(&buffer).unwrap();
        let mapped = warm.map().unwrap();
        mapped.copy_to_host(&stream, &mut [0u8; 4096]).unwrap();
    }
    let baseline = open_fd_count();
    {
        let fd = buffer.export_fd().unwrap();
        let dup = fd.try_clone().unwrap();
        // SAFETY: both fds are the same fresh export of `buffer`'s memory
        // (one a dup of the other), with the buffer's own record.
        let (first, second) = unsafe {
            (
                cuda.import_buffer_fd(buffer.record(), fd),
                cuda.import_buffer_fd(buffer.record(), dup),
            )
        };
        let (mut first, mut second) = (
            first.map_err(|e| e.error).unwrap(),
            second.map_err(|e| e.error).unwrap(),
        );
        let (a, b) = (first.map().unwrap(), second.map().unwrap());
        for mapped in [&a, &b] {
            let mut out = vec![0u8; len as usize];
            mapped.copy_to_host(&stream, &mut out).unwrap();
            assert!(out == data, "an import reads what Vulkan wrote");
        }
        let data2 = pattern(len as usize, 55);
        a.copy_from_host(&stream, &data2).unwrap();
        let mut out = vec![0u8; len as usize];
        b.copy_to_host(&stream, &mut out).unwrap();
        assert!(out == data2, "the second import reads what the first wrote");
    }
    assert_eq!(open_fd_count(), baseline, "no fd left behind");
    println!("one export, two CUDA imports through a dup: one payload");
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn colour_attachment_images_map_and_read_back_exactly() {
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
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn the_driver_makes_a_raw_surface_on_an_array_without_surface_ldst() {
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

/// Case 25 (one process): the application drops its Vulkan image and its
/// last handle to the Vulkan device before the CUDA import; the import
/// (which keeps the image alive) still maps and reads the pixels, and its
/// drop then frees everything without a drop error.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_cuda_import_outlives_the_vulkan_image_and_device_handles() {
    let (w, h) = (96u32, 40u32);
    let data = pattern((w * h * 4) as usize, 25);
    let (cuda, imported) = {
        let ctx = vulkan(None);
        // Not paired through `for_vulkan`, which would keep a handle to the
        // Vulkan device: the import's own keep-alive is all that is left.
        let cuda = CudaDevice::for_uuid(ctx.identity().device_uuid).unwrap();
        let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
        ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
            .unwrap();
        ctx.release_image(&image, SubmitSync::new()).unwrap();
        let imported = cuda.import_image(&image).unwrap();
        assert_no_validation_errors(&ctx);
        (cuda, imported)
        // The application's `image` and `ctx` are dropped here.
    };
    let vk_errors = vk_export::drop_errors();
    let cuda_errors = drop_errors();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(
        out == data,
        "the import reads the pixels after the app dropped its handles"
    );
    drop(array);
    drop(imported);
    assert_eq!(vk_export::drop_errors(), vk_errors);
    assert_eq!(drop_errors(), cuda_errors);
    println!("{w}x{h} read through an import that outlived the app's Vulkan handles: exact");
}

/// Case 27: an importing process (its own Vulkan device and CUDA context,
/// a mapped import of this process's 64 MiB buffer) is SIGKILLed. The
/// exporter keeps reading its buffer exactly; free GPU memory comes back to
/// what it was with the buffer alive once the importer's context is gone,
/// and to the baseline once the exporter drops the buffer (the payload is
/// freed with its last reference).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_killed_importer_frees_its_share_and_leaves_the_exporter_working() {
    let (ctx, cuda) = pair();
    let slack = 32usize << 20;
    let free = || cuda.memory_info().unwrap().0;
    let free_without = free();
    let len = 64u64 << 20;
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, len).unwrap();
    let head = pattern(1 << 20, 27);
    ctx.write_buffer(&buffer, &head, SubmitSync::new()).unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let free_with = free();
    let (mine, theirs, number) = cuda_interop_testkit::child::socket_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cuda_importer_that_is_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(cuda_interop_testkit::child::CHILD_SOCKET_ENV, number)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(theirs);
    mine.send_exported(27, &[&buffer]).unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("IMPORTED ") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the importer never reported its import ({:?}): {seen:?}",
                    child.wait()
                );
            }
        }
    }
    let free_with_importer = free();
    child.kill().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    drop(mine);
    // The driver releases a dead process's context asynchronously: wait for
    // it, bounded.
    let start = Instant::now();
    while free() + slack < free_with && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let free_after_kill = free();
    println!(
        "importer {status}; free GPU memory: {free_without} without the buffer, {free_with} with it, \
         {free_with_importer} with the importer alive, {free_after_kill} after the kill"
    );
    assert!(
        free_after_kill + slack >= free_with,
        "the importer's share was freed: {free_with} -> {free_after_kill}"
    );
    assert!(
        ctx.read_buffer(&buffer, 1 << 20, SubmitSync::new())
            .unwrap()
            == head,
        "the exporter still reads its buffer"
    );
    drop(buffer);
    let start = Instant::now();
    while free() + slack < free_without && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let free_at_end = free();
    println!("after the exporter dropped the buffer: {free_at_end}");
    assert!(
        free_at_end + slack >= free_without,
        "the payload was freed with its last reference: {free_without} -> {free_at_end}"
    );
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of the child process of a_killed_importer_frees_its_share_and_leaves_the_exporter_working"]
fn child_cuda_importer_that_is_killed() {
    let connection = cuda_interop_testkit::child::inherited_connection();
    let mut received = connection.recv(TIMEOUT).unwrap();
    let bundle = received.take_buffer::<DeviceLocal>(0).unwrap();
    let ctx = vulkan(Some(bundle.record().info().device_uuid()));
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let mut imported = cuda
        .import_received_buffer(bundle)
        .map_err(|e| e.error)
        .unwrap();
    let mapped = imported.map().unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let mut out = vec![0u8; 1 << 20];
    mapped.copy_to_host(&stream, &mut out).unwrap();
    assert!(out == pattern(1 << 20, 27), "the importer reads the buffer");
    println!("IMPORTED {}", std::process::id());
    std::thread::sleep(Duration::from_secs(60));
}

/// Case 35 (the raw rule behind the typestate): a CUDA wait on a binary
/// semaphore that nothing signalled (a token minted with the `unsafe`
/// `assume_signalled`, which is the lie under test) never completes: the
/// stream's bounded wait times out, and only a real signal (from Vulkan,
/// afterwards) lets it finish. Run in a child process.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_binary_wait_without_a_signal_hangs_until_its_bound() {
    let stdout = run_child(
        "child_binary_wait_without_a_signal",
        &[("CUDA_INTEROP_FAULTS_CHILD", "1")],
    );
    assert!(stdout.contains("released by a real signal"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of a_binary_wait_without_a_signal_hangs_until_its_bound"]
fn child_binary_wait_without_a_signal() {
    started_as_child("CUDA_INTEROP_FAULTS_CHILD");
    let (ctx, cuda) = pair();
    let binary = BinarySemaphore::new(&ctx).unwrap();
    let imported = cuda.import_semaphore(&binary).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: deliberately false: no signal was submitted. This is the
    // fault under test (what the raw API allows and the typestate forbids);
    // the wait below hangs until the Vulkan signal after it.
    let token = unsafe { imported.assume_signalled() }.unwrap();
    imported.wait(&stream, token).unwrap();
    let bound = Duration::from_millis(300);
    let start = Instant::now();
    let err = stream.synchronize(bound).unwrap_err();
    let took = start.elapsed();
    println!("a wait with no signal: {err} after {took:?}");
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(took >= bound && took < 2 * bound, "{took:?}");
    assert!(!stream.query().unwrap(), "still waiting");
    // A real signal releases it.
    let signal = ctx.signal_binary(&binary, SubmitSync::new()).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    // The wait above consumed the payload; the bookkeeping of this token is
    // dropped with the test.
    drop(signal);
    println!("released by a real signal from Vulkan");
    drop((stream, imported));
    assert_no_validation_errors(&ctx);
}

/// Case 39 (the validation layer on NVIDIA; lavapipe has no semaphore fds):
/// a timeline semaphore's fd imported with `VK_SEMAPHORE_IMPORT_TEMPORARY_BIT`
/// is reported (VUID 03323); the crate's own import of the same export
/// (always permanent: no temporary import exists for timelines) adds no
/// error.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_temporary_timeline_import_is_reported_and_the_crates_is_not() {
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let timeline = TimelineSemaphore::new(&a).unwrap();
    let target = TimelineSemaphore::new_local(&b).unwrap();
    let loader = ash::khr::external_semaphore_fd::Device::new(b.instance(), b.device());
    let fd = timeline.export_fd().unwrap();
    let was = identity(&fd);
    let raw = fd.into_raw_fd();
    let info = vk::ImportSemaphoreFdInfoKHR::default()
        .semaphore(target.raw())
        .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
        .flags(vk::SemaphoreImportFlags::TEMPORARY)
        .fd(raw);
    // SAFETY: imports an open semaphore export this test owns into a fresh
    // semaphore of `b` with no pending operation; TEMPORARY for a timeline
    // is the rule under test (the layer reports it and may stop the call).
    let result = unsafe { loader.import_semaphore_fd(&info) };
    println!("temporary import of a timeline: {result:?}");
    if result.is_err() {
        close_if_still(raw, was);
    }
    let ids = b.validation_error_ids();
    assert!(
        ids.iter()
            .any(|i| i == "VUID-VkImportSemaphoreFdInfoKHR-flags-03323"),
        "{ids:?}"
    );
    drop(target);
    let reported = b.validation_errors();
    let imported = TimelineSemaphore::import_from(&b, &timeline).unwrap();
    drop(imported);
    assert_eq!(
        b.validation_errors(),
        reported,
        "the crate's import is permanent"
    );
    assert_no_validation_errors(&a);
}

/// Case 41: where the driver can import SYNC_FD, `SyncFd::AlreadySignaled`
/// (fd -1) imports, and a wait on it completes at once. Where it cannot
/// (lavapipe has no semaphore fds), the test says so and shows nothing.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn a_sync_fd_of_minus_one_imports_as_already_signalled() {
    let ctx = vulkan(None);
    let mut type_info =
        vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::BINARY);
    let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
        .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD)
        .push_next(&mut type_info);
    let mut props = vk::ExternalSemaphoreProperties::default();
    // SAFETY: a plain query on the context's live physical device; the
    // chain lives across the call.
    unsafe {
        ctx.instance()
            .get_physical_device_external_semaphore_properties(
                ctx.physical_device(),
                &info,
                &mut props,
            )
    };
    let features = props.external_semaphore_features;
    if !ctx.supports_semaphore_fds()
        || !features.contains(vk::ExternalSemaphoreFeatureFlags::IMPORTABLE)
    {
        println!(
            "{}: SYNC_FD import is not supported ({features:?}): case 41 not observable here",
            ctx.identity().name
        );
        return;
    }
    let mut target = BinarySemaphore::new_local(&ctx).unwrap();
    // The import of an already signalled sync file mints its token.
    let token = target
        .import_sync_fd(SyncFd::AlreadySignaled)
        .map_err(|e| e.0)
        .unwrap();
    let start = Instant::now();
    ctx.submit_and_wait(
        SubmitSync::new()
            .wait_binary(&target, token)
            .timeout(Duration::from_secs(2)),
        |_, _| {},
    )
    .unwrap();
    let took = start.elapsed();
    println!("wait on an imported SYNC_FD -1: done after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_no_validation_errors(&ctx);
}

/// Case 42: an imported semaphore dropped while a CUDA wait on it is
/// pending: the drop waits for the wait (the host signals the value 300 ms
/// later), destroys afterwards with no drop error, and the stream drains.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn dropping_a_semaphore_with_a_pending_wait_waits_for_it() {
    let (ctx, cuda) = pair();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let imported = cuda.import_semaphore(&timeline).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let errors = drop_errors();
    imported.wait(&stream, 1).unwrap();
    let hold = Duration::from_millis(300);
    let (took, still_waiting) = std::thread::scope(|scope| {
        let dropper = scope.spawn(move || time(|| drop(imported)));
        std::thread::sleep(hold);
        let still_waiting = !dropper.is_finished();
        timeline.signal(1).unwrap();
        (dropper.join().unwrap(), still_waiting)
    });
    println!("semaphore dropped in {took:?} with its wait pending for {hold:?}");
    assert!(still_waiting, "the drop waited for the pending wait");
    assert!(took >= hold && took < DROP_WAIT_LIMIT, "{took:?}");
    stream.synchronize(TIMEOUT).unwrap();
    assert_eq!(drop_errors(), errors, "destroyed, not leaked, no error");
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// A versioned driver symbol by its exact exported name (as `gpu.rs`).
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

/// The calling thread's current context.
fn current() -> sys::CUcontext {
    let get = driver().fns().cuCtxGetCurrent.unwrap();
    let mut context: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle.
    assert_eq!(unsafe { get(&mut context) }, sys::CUresult::CUDA_SUCCESS);
    context
}

/// Cases 43, 44: handles used on a thread with no context and on a thread
/// where another context is current, and dropped on fresh threads. Run in a
/// child process (it creates a context of its own).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn handles_work_and_drop_on_threads_with_no_or_another_context() {
    let stdout = run_child(
        "child_threads_and_contexts",
        &[("CUDA_INTEROP_FAULTS_CHILD", "1")],
    );
    assert!(stdout.contains("every thread"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of handles_work_and_drop_on_threads_with_no_or_another_context"]
fn child_threads_and_contexts() {
    started_as_child("CUDA_INTEROP_FAULTS_CHILD");
    type CtxCreate =
        unsafe extern "C" fn(*mut sys::CUcontext, c_uint, sys::CUdevice) -> sys::CUresult;
    type CtxDestroy = unsafe extern "C" fn(sys::CUcontext) -> sys::CUresult;
    let (ctx, cuda) = pair();
    // SAFETY: cuCtxCreate_v2's C signature is CUresult (CUcontext *,
    // unsigned int, CUdevice).
    let create = unsafe {
        std::mem::transmute::<*mut c_void, CtxCreate>(driver_function(c"cuCtxCreate_v2"))
    };
    // SAFETY: cuCtxDestroy_v2, CUresult (CUcontext).
    let destroy = unsafe {
        std::mem::transmute::<*mut c_void, CtxDestroy>(driver_function(c"cuCtxDestroy_v2"))
    };
    let errors = drop_errors();
    let (w, h) = (64u32, 64u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    let pixels = pattern((w * h * 4) as usize, 43);
    ctx.write_image(&image, 0, 0, &pixels, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let buffer = ExportableBuffer::<DeviceLocal>::new(&ctx, 1 << 20).unwrap();
    let bytes = pattern(1 << 20, 44);
    ctx.write_buffer(&buffer, &bytes, SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let imported_image = cuda.import_image(&image).unwrap();
    let mut imported_buffer = cuda.import_buffer(&buffer).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let imported_timeline = cuda.import_semaphore(&timeline).unwrap();
    std::thread::scope(|s| {
        // No context current.
        s.spawn(|| {
            assert!(current().is_null(), "a fresh thread has no context");
            let mapped = imported_buffer.map().unwrap();
            let stream = Stream::new(&cuda).unwrap();
            let mut out = vec![0u8; 1 << 20];
            mapped.copy_to_host(&stream, &mut out).unwrap();
            assert!(out == bytes);
            assert!(current().is_null(), "still none afterwards");
            drop((mapped, stream));
            assert!(current().is_null());
        })
        .join()
        .unwrap();
        // Another context current.
        s.spawn(|| {
            let mut intruder: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one context handle; cuCtxCreate pushes the new
            // context on this thread's stack (it is current afterwards);
            // destroyed below.
            let status = unsafe { create(&mut intruder, 0, cuda.raw_device()) };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
            assert_eq!(current(), intruder);
            {
                let array = imported_image.map_array().unwrap();
                let level = array.level(0).unwrap();
                let stream = Stream::new(&cuda).unwrap();
                let mut out = vec![0u8; level.byte_len().unwrap()];
                level.copy_to_host(&stream, &mut out).unwrap();
                assert!(out == pixels);
                imported_timeline.signal(&stream, 1).unwrap();
                stream.synchronize(TIMEOUT).unwrap();
                assert_eq!(current(), intruder, "the other context is current again");
            }
            assert_eq!(current(), intruder, "also after the drops");
            // SAFETY: the context this thread created, current and used by
            // nothing else; destroying it pops it.
            let status = unsafe { destroy(intruder) };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        })
        .join()
        .unwrap();
    });
    timeline
        .wait(1, TIMEOUT, vk_export::WaitStrategy::ADAPTIVE)
        .unwrap();
    // Dropped on fresh threads that never touched CUDA.
    std::thread::spawn(move || drop(imported_timeline))
        .join()
        .unwrap();
    std::thread::spawn(move || drop(imported_image))
        .join()
        .unwrap();
    std::thread::spawn(move || drop(imported_buffer))
        .join()
        .unwrap();
    assert_eq!(drop_errors(), errors, "every destroy succeeded");
    cuda.memory_info().unwrap();
    println!("every thread: the work was exact and the previous context current again");
    assert_no_validation_errors(&ctx);
}

/// Case 45 (literally): a kernel stores through a mapped pointer far past
/// the end of its mapping: the fault is reported, and every later call says
/// the process is poisoned. Run in a child process (the error is sticky).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn an_out_of_bounds_store_through_a_mapping_poisons_the_process() {
    let stdout = run_child(
        "child_out_of_bounds_store",
        &[("CUDA_INTEROP_FAULTS_CHILD", "1")],
    );
    assert!(stdout.contains("poisoned:"), "{stdout}");
}

#[test]
#[ignore = "entry point of the child process of an_out_of_bounds_store_through_a_mapping_poisons_the_process"]
fn child_out_of_bounds_store() {
    started_as_child("CUDA_INTEROP_FAULTS_CHILD");
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
    assert!(matches!(later, Error::Poisoned(_)), "{later}");
    println!("poisoned: {later}");
    // Everything is dropped in the poisoned process here: destructors
    // report their failures and do not crash.
}

/// Case 37 (CUDA stream signals): 0, the last value and below it are
/// refused before anything is enqueued; where the device bounds the step
/// (`maxTimelineSemaphoreValueDifference`), a signal beyond it is refused.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn cuda_timeline_signals_out_of_order_are_refused_before_enqueue() {
    let (ctx, cuda) = pair();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let imported = cuda.import_semaphore(&timeline).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    let err = imported.signal(&stream, 0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    imported.signal(&stream, 3).unwrap();
    for value in [3, 2, 0] {
        let err = imported.signal(&stream, value).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{value}: {err}");
    }
    match imported.max_difference() {
        Some(max) if max < u64::MAX - 4 => {
            let err = imported.signal(&stream, 3 + max + 1).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
            println!("maxTimelineSemaphoreValueDifference {max}: {err}");
        }
        other => println!("maxTimelineSemaphoreValueDifference {other:?}: no value is too far"),
    }
    stream.synchronize(TIMEOUT).unwrap();
    assert_eq!(timeline.value().unwrap(), 3, "only the valid signal ran");
    drop((imported, stream));
    assert_no_validation_errors(&ctx);
}

/// Case 48: 10,000 cycles of image import, array mapping, level, surface,
/// buffer import and mapping, semaphore import, and destroy: the fd count
/// and free GPU memory are flat, no destroy fails, and the time per cycle
/// does not drift.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test gpu_faults -- --ignored, or scripts/gpu-bundle.sh then .gpu/bundle/run.sh there"]
fn ten_thousand_import_map_destroy_cycles_stay_flat() {
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
    let windows: Vec<Duration> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..1000 {
                cycle();
            }
            start.elapsed() / 1000
        })
        .collect();
    let (fds_after, (free_after, _)) = (open_fd_count(), cuda.memory_info().unwrap());
    println!(
        "10000 cycles, per cycle by window of 1000: {windows:?}; fds {fds} -> {fds_after}; \
         free GPU memory {free} -> {free_after}"
    );
    assert_eq!(fds_after, fds, "fd count is flat");
    assert_eq!(drop_errors(), errors, "no destroy failed");
    assert!(
        free_after + (2 << 20) >= free,
        "free GPU memory is flat (within 2 MiB)"
    );
    assert_no_drift(&windows);
    assert_no_validation_errors(&ctx);
}

/// The time per cycle does not drift: the median of the last half of the
/// windows is at most twice that of the first half (medians, so that one
/// window slowed by another process on a shared machine does not count).
fn assert_no_drift(windows: &[Duration]) {
    let median = |w: &[Duration]| {
        let mut w = w.to_vec();
        w.sort();
        w[w.len() / 2]
    };
    let (first, last) = windows.split_at(windows.len() / 2);
    assert!(
        median(last) <= median(first) * 2 + Duration::from_micros(50),
        "time per cycle drifts: {windows:?}"
    );
}
