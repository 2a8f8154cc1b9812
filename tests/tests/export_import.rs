//! Exporting and importing Vulkan images, buffers and semaphore payloads
//! (fault cases of `INTEROP-RULES.md` §A.8; the table is
//! `docs/fault-cases.md`): reads back exactly in a second device, fds that
//! are closed or are not exports, imports through a duplicate, imports that
//! outlive their exporter, requests the driver cannot export, and the raw
//! mistakes the constructors make impossible. Lavapipe in CI, NVIDIA with
//! `--features device-local`; the validation layer is on and any error fails.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test export_import --
//! --ignored --skip child_`. The others run everywhere (lavapipe).
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
use std::time::{Duration, Instant};

use ash::vk;
use cuda_interop_testkit::fds::{
    closed_fd_number, fd_table, identity, not_exports, owned_closed_fd,
};
use cuda_interop_testkit::{
    assert_no_validation_errors, child, fds, open_fd_count, pattern, vulkan, Image, Mem, TIMEOUT,
};
use vk_export::format::{Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, Optimal};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{
    Context, Error, ExportableBuffer, ExportableImage, ImageDesc, SharedLayout, SubmitSync,
    TimelineSemaphore,
};

/// Case 2: a closed fd number handed to every Vulkan import (image, buffer,
/// semaphore) is refused before any driver call (`fstat` fails), comes back
/// in the error, and no other fd of the process is closed.
///
/// The fd table is compared whole, so the body runs in a child process of
/// its own ([`child_closed_fd_number_is_refused`]), where no other test
/// thread can open or close an fd in between: the check is exact.
#[test]
fn a_closed_fd_number_is_refused_before_the_driver_and_closes_nothing() {
    let _fds = fds::lock();
    child::run_marked(
        "child_closed_fd_number_is_refused",
        "CUDA_INTEROP_CHILD_CLOSED_FD",
    );
}

/// The body of [`a_closed_fd_number_is_refused_before_the_driver_and_closes_nothing`],
/// alone in its process.
#[test]
#[ignore = "entry point of a child process of export_import.rs: run by a_closed_fd_number_is_refused_before_the_driver_and_closes_nothing"]
fn child_closed_fd_number_is_refused() {
    child::started_as_child("CUDA_INTEROP_CHILD_CLOSED_FD");
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let before = fd_table();
    let n = closed_fd_number();
    let outcomes = [
        (
            "image",
            // SAFETY: deliberately not: the fd is closed, which is the fault
            // under test; the import refuses it before any driver call.
            unsafe { Image::import_fd(&ctx, &image.record(), owned_closed_fd(n)) }.map(drop),
        ),
        (
            "buffer",
            // SAFETY: as above.
            unsafe { ExportableBuffer::import_fd(&ctx, &buffer.record(), owned_closed_fd(n)) }
                .map(drop),
        ),
        (
            "semaphore",
            // SAFETY: as above.
            unsafe { TimelineSemaphore::import_fd(&ctx, &timeline.record(), owned_closed_fd(n)) }
                .map(drop),
        ),
    ];
    for (what, outcome) in outcomes {
        let err = outcome.expect_err("a closed fd was imported");
        assert!(
            matches!(err.error, Error::Record(_)),
            "{what}: {}",
            err.error
        );
        assert!(err.error.to_string().contains("fstat"), "{}", err.error);
        assert_eq!(err.fd.into_raw_fd(), n, "{what}: the same number came back");
        println!("{what} from closed fd {n}: {}", err.error);
    }
    assert_eq!(fd_table(), before, "no fd was opened or closed");
    assert_no_validation_errors(&ctx);
}

/// Case 3: fds that are not exports (an eventfd, `/dev/null`, a pipe, a
/// regular file, a socket, a directory), received with a valid record or
/// handed to the `unsafe` import, are typed errors; each comes back open and
/// still the same file, and the fd table is as before (a debug build's std
/// aborts if an `OwnedFd` is closed twice).
#[test]
fn fds_that_are_not_exports_come_back_open_and_unchanged() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(64, 64)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
    let file = std::env::temp_dir().join(format!("faults-regular-{}", std::process::id()));
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let before = fd_table();
    let mut refused_by_driver = 0;
    // Received with the image's own record: the safe path.
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        let bytes = Message {
            tag: 3,
            resources: vec![Resource::Image(image.info().clone())],
        }
        .encode()
        .unwrap();
        let (tx, rx) = Connection::pair().unwrap();
        // SAFETY: a test of the receiver's refusals: the fd is not an
        // export, and the test asserts its import is refused.
        unsafe { tx.send_raw(&bytes, &[fd.as_fd()]) }.unwrap();
        let bundle = rx
            .recv(TIMEOUT)
            .unwrap()
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap();
        let err = Image::import_received(&ctx, bundle).expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        refused_by_driver += u32::from(matches!(err.error, Error::Vulkan { .. }));
        println!("image from {what}: {}", err.error);
    }
    // The unsafe entry points, for a buffer and a semaphore.
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        // SAFETY: deliberately not: the fd is not an export, which is the
        // fault under test; the import refuses it and hands it back.
        let err =
            unsafe { ExportableBuffer::import_fd(&ctx, &buffer.record(), fd) }.expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        refused_by_driver += u32::from(matches!(err.error, Error::Vulkan { .. }));
        println!("buffer from {what}: {}", err.error);
    }
    for (what, fd) in not_exports(&file) {
        let sent = identity(&fd);
        // SAFETY: as above, for a semaphore.
        let err =
            unsafe { TimelineSemaphore::import_fd(&ctx, &timeline.record(), fd) }.expect_err(what);
        assert_eq!(identity(&err.fd), sent, "{what}: the same file came back");
        println!("semaphore from {what}: {}", err.error);
    }
    std::fs::remove_file(&file).ok();
    assert_eq!(fd_table(), before, "every fd closed exactly once, by us");
    // The layer reports each refusal by the driver once (lavapipe: its own
    // message), never more.
    assert!(ctx.validation_errors() <= refused_by_driver, "see stderr");
}

/// Case 4: a successful import consumes the caller's fd: the number no
/// longer refers to the export afterwards (the driver holds its own
/// duplicate), and once the import is dropped the fd count is back.
#[test]
fn a_successful_import_takes_the_fd_and_closes_the_callers_number() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&a, 4096).unwrap();
    let baseline = open_fd_count();
    let fd = image.export_fd().unwrap();
    let n = fd.as_raw_fd();
    let link = |n: i32| std::fs::read_link(format!("/proc/self/fd/{n}")).ok();
    let exported = link(n).expect("the export is open");
    // SAFETY: `fd` is a fresh export of `image`'s memory and the record is
    // the image's own.
    let imported = unsafe { Image::import_fd(&b, &image.record(), fd) }
        .map_err(|e| e.error)
        .unwrap();
    assert_ne!(
        link(n),
        Some(exported.clone()),
        "fd {n} ({exported:?}) is no longer the caller's"
    );
    let fd = buffer.export_fd().unwrap();
    let m = fd.as_raw_fd();
    // SAFETY: as above, for the buffer.
    let imported_buffer = unsafe { ExportableBuffer::import_fd(&b, &buffer.record(), fd) }
        .map_err(|e| e.error)
        .unwrap();
    assert!(link(m).is_none() || m == n, "fd {m} was closed");
    drop((imported, imported_buffer));
    assert_eq!(open_fd_count(), baseline, "nothing held on to an fd");
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// Case 5: one export, duplicated with `try_clone` (the only way to a
/// second fd), imports into two devices; both imports are the same payload:
/// what the exporter writes both read, and what one importer writes the
/// other reads.
#[test]
fn one_export_duplicated_imports_twice_as_one_payload() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let c = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(40, 24)).unwrap();
    let data = pattern(40 * 24 * 4, 5);
    a.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    a.release_image(&image, SubmitSync::new()).unwrap();
    let fd = image.export_fd().unwrap();
    let dup = fd.try_clone().unwrap();
    // SAFETY: both fds are the same fresh export of `image`'s memory (one a
    // dup of the other), with the image's own record.
    let (on_b, on_c) = unsafe {
        (
            Image::import_fd(&b, &image.record(), fd),
            Image::import_fd(&c, &image.record(), dup),
        )
    };
    let (on_b, on_c) = (
        on_b.map_err(|e| e.error).unwrap(),
        on_c.map_err(|e| e.error).unwrap(),
    );
    for (ctx, imported) in [(&b, &on_b), (&c, &on_c)] {
        // SAFETY: `a` released the image in GENERAL and its helper waited
        // for the release before this call.
        unsafe { ctx.assume_image_released(imported, SharedLayout::General) }.unwrap();
        assert!(ctx.read_image(imported, 0, 0, SubmitSync::new()).unwrap() == data);
    }
    let data2 = pattern(40 * 24 * 4, 55);
    b.write_image(&on_b, 0, 0, &data2, SubmitSync::new())
        .unwrap();
    b.release_image(&on_b, SubmitSync::new()).unwrap();
    // SAFETY: `b` released it in GENERAL, and waited for the release.
    unsafe { c.assume_image_released(&on_c, SharedLayout::General) }.unwrap();
    assert!(
        c.read_image(&on_c, 0, 0, SubmitSync::new()).unwrap() == data2,
        "the second import reads what the first wrote"
    );
    for ctx in [&a, &b, &c] {
        assert_no_validation_errors(ctx);
    }
}

/// Case 25 (one process): the exporter's image, and its whole device, are
/// dropped before the import; the import still reads the pixels (the
/// payload is reference-counted), and its own drop is clean.
#[test]
fn an_import_outlives_the_exporting_image_and_device() {
    let _fds = fds::lock();
    let b = vulkan(None);
    let data = pattern(48 * 16 * 4, 25);
    let imported = {
        let a = vulkan(Some(b.identity().device_uuid));
        let image = Image::new(&a, ImageDesc::new_2d(48, 16)).unwrap();
        a.write_image(&image, 0, 0, &data, SubmitSync::new())
            .unwrap();
        a.release_image(&image, SubmitSync::new()).unwrap();
        let imported = Image::import_from(&b, &image).unwrap();
        assert_no_validation_errors(&a);
        imported
        // `image` and `a` (its last clone) are dropped here: the exporter's
        // VkImage, VkDeviceMemory and VkDevice are gone.
    };
    // SAFETY: the exporter released the image in GENERAL and waited for it.
    unsafe { b.assume_image_released(&imported, SharedLayout::General) }.unwrap();
    assert!(
        b.read_image(&imported, 0, 0, SubmitSync::new()).unwrap() == data,
        "the import reads the exporter's pixels after the exporter is gone"
    );
    drop(imported);
    assert_eq!(vk_export::drop_errors(), 0);
    assert_no_validation_errors(&b);
}

/// Case 33: the raw mistakes `ExportableImage` makes impossible are real
/// mistakes the validation layer reports (so the zero-error assertions of
/// every other test mean something): an external image created
/// PREINITIALIZED (01443), an image without `VkExternalMemoryImageCreateInfo`
/// bound to imported memory (02729; 02989 in newer layers) and to exportable
/// memory (02728). The crate's own image and import on the same device add
/// no error.
#[test]
fn the_layer_reports_the_raw_mistakes_the_constructors_make_impossible() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let device = ctx.device();
    let source = Image::new(&ctx, ImageDesc::new_2d(16, 16)).unwrap();
    let ids_after = |what: &str, ctx: &Context| {
        let ids = ctx.validation_error_ids();
        println!("after {what}: {ids:?}");
        ids
    };
    let base = vk::ImageCreateInfo::default()
        .image_type(vk::ImageType::TYPE_2D)
        .format(vk::Format::R8G8B8A8_UNORM)
        .extent(vk::Extent3D {
            width: 16,
            height: 16,
            depth: 1,
        })
        .mip_levels(1)
        .array_layers(1)
        .samples(vk::SampleCountFlags::TYPE_1)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // 1. External, PREINITIALIZED.
    let mut external = vk::ExternalMemoryImageCreateInfo::default()
        .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
    let info = base
        .tiling(vk::ImageTiling::LINEAR)
        .usage(vk::ImageUsageFlags::TRANSFER_SRC)
        .initial_layout(vk::ImageLayout::PREINITIALIZED)
        .push_next(&mut external);
    // SAFETY: a valid create info (apart from the rule under test), living
    // across the call; the image is destroyed below and never used.
    let image = unsafe { device.create_image(&info, None) }.unwrap();
    // SAFETY: created above, unused.
    unsafe { device.destroy_image(image, None) };
    let ids = ids_after("a PREINITIALIZED external image", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-VkImageCreateInfo-pNext-01443"),
        "{ids:?}"
    );
    // 2. No external info, bound to memory imported from `source`.
    let plain = base
        .tiling(vk::ImageTiling::OPTIMAL)
        .usage(
            vk::ImageUsageFlags::TRANSFER_SRC
                | vk::ImageUsageFlags::TRANSFER_DST
                | vk::ImageUsageFlags::SAMPLED
                | vk::ImageUsageFlags::STORAGE,
        )
        .initial_layout(vk::ImageLayout::UNDEFINED);
    let record = source.info();
    let fd = source.export_fd().unwrap();
    let raw = fd.into_raw_fd();
    let mut import = vk::ImportMemoryFdInfoKHR::default()
        .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD)
        .fd(raw);
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(record.allocation_size())
        .memory_type_index(record.memory_type_index())
        .push_next(&mut import);
    // SAFETY: the chain lives across the call; `raw` is a fresh export of
    // this device's memory with its own size and type, owned by the driver
    // on success (on failure it is left open and the test fails).
    let memory = unsafe { device.allocate_memory(&alloc, None) }.unwrap();
    // SAFETY: a valid create info without the external info (the mistake).
    let image = unsafe { device.create_image(&plain, None) }.unwrap();
    // SAFETY: fresh image and memory of this device; the bind is what the
    // layer checks. Both are destroyed below, unused.
    let bound = unsafe { device.bind_image_memory(image, memory, 0) };
    // SAFETY: created above; nothing uses them.
    unsafe {
        device.destroy_image(image, None);
        device.free_memory(memory, None);
    }
    println!("bind of imported memory without external info: {bound:?}");
    let ids = ids_after("binding imported memory", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-vkBindImageMemory-memory-02729"
                || i == "VUID-vkBindImageMemory-memory-02989"),
        "{ids:?}"
    );
    // 3. No external info, bound to exportable memory.
    let mut export = vk::ExportMemoryAllocateInfo::default()
        .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
    // SAFETY: a valid create info without the external info (the mistake).
    let image = unsafe { device.create_image(&plain, None) }.unwrap();
    // SAFETY: a live image of this device.
    let reqs = unsafe { device.get_image_memory_requirements(image) };
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(reqs.size)
        .memory_type_index(reqs.memory_type_bits.trailing_zeros())
        .push_next(&mut export);
    // SAFETY: the chain lives across the call.
    let memory = unsafe { device.allocate_memory(&alloc, None) }.unwrap();
    // SAFETY: fresh image and memory; destroyed below, unused.
    let bound = unsafe { device.bind_image_memory(image, memory, 0) };
    // SAFETY: created above; nothing uses them.
    unsafe {
        device.destroy_image(image, None);
        device.free_memory(memory, None);
    }
    println!("bind of exportable memory without external info: {bound:?}");
    let ids = ids_after("binding exportable memory", &ctx);
    assert!(
        ids.iter()
            .any(|i| i == "VUID-vkBindImageMemory-memory-02728"),
        "{ids:?}"
    );
    // The crate's own recipe on the same device: nothing more reported.
    let reported = ctx.validation_errors();
    let other = vulkan(Some(ctx.identity().device_uuid));
    let image = Image::new(&ctx, ImageDesc::new_2d(16, 16)).unwrap();
    let imported = Image::import_from(&other, &image).unwrap();
    drop((imported, image, source));
    assert_eq!(ctx.validation_errors(), reported, "see stderr");
    assert_no_validation_errors(&other);
}

/// Case 34 (what lavapipe can show): a request beyond the driver's limits
/// for an exportable image is `Unsupported` from the preflight, which
/// creates nothing, and the constructor gives the same answer before it
/// creates anything (the layer, which checks `vkCreateImage` against the
/// external-memory capabilities, reports nothing).
#[test]
fn requests_the_driver_cannot_export_are_refused_by_the_preflight() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let huge = ImageDesc::new_2d(1 << 20, 1 << 20);
    let by_preflight = ExportableImage::<Rgba16Sfloat, Optimal, Mem>::preflight(&ctx, &huge)
        .unwrap_err()
        .to_string();
    let by_new = ExportableImage::<Rgba16Sfloat, Optimal, Mem>::new(&ctx, huge)
        .unwrap_err()
        .to_string();
    assert_eq!(by_preflight, by_new);
    assert!(by_new.contains("not supported"), "{by_new}");
    let capability = Image::preflight(&ctx, &ImageDesc::new_2d(64, 64)).unwrap();
    println!(
        "{}: {by_new}; a 64x64 RGBA8 export is dedicated-only: {}",
        ctx.identity().name,
        capability.dedicated_only
    );
    assert_no_validation_errors(&ctx);
}

#[test]
fn image_exported_and_imported_in_a_second_device_reads_back_exactly() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let desc = ImageDesc::new_2d(64, 48).mip_levels(2).array_layers(2);
    let image = Image::new(&a, desc).unwrap();
    let info = image.info().clone();
    assert!(info.allocation_size() >= 64 * 48 * 4, "{info:?}");
    for (level, layer) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let e = info.level_extent(level).unwrap();
        let data = pattern((e[0] * e[1] * 4) as usize, level * 10 + layer);
        a.write_image(&image, level, layer, &data, SubmitSync::new())
            .unwrap();
    }
    a.release_image(&image, SubmitSync::new()).unwrap();

    let imported = Image::import_from(&b, &image).unwrap();
    // SAFETY: `a` released the image in GENERAL, and that submission
    // completed (the helper waited for it) before this call.
    unsafe { b.assume_image_released(&imported, SharedLayout::General) }.unwrap();
    for (level, layer) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        let e = info.level_extent(level).unwrap();
        let expected = pattern((e[0] * e[1] * 4) as usize, level * 10 + layer);
        let got = b
            .read_image(&imported, level, layer, SubmitSync::new())
            .unwrap();
        assert!(got == expected, "level {level} layer {layer} differs");
    }
    assert_eq!(
        imported.info(),
        image.info(),
        "the importer's record equals the exporter's"
    );
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

#[test]
fn buffer_exported_and_imported_in_a_second_device_reads_back_exactly() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let buffer = ExportableBuffer::<Mem>::new(&a, 100_000).unwrap();
    let data = pattern(100_000, 7);
    a.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    a.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let imported = ExportableBuffer::import_from(&b, &buffer).unwrap();
    assert_eq!(
        b.read_buffer(&imported, 100_000, SubmitSync::new())
            .unwrap(),
        data
    );
    // And back: the importer writes, the exporter reads.
    let data2 = pattern(100_000, 8);
    b.write_buffer(&imported, &data2, SubmitSync::new())
        .unwrap();
    assert_eq!(
        a.read_buffer(&buffer, 100_000, SubmitSync::new()).unwrap(),
        data2
    );
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

#[test]
fn unsupported_requests_fail_before_anything_is_created() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let err =
        ExportableImage::<Rgba8Unorm, Optimal, Mem>::new(&a, ImageDesc::new_2d(0, 16)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = ExportableImage::<Rgba8Unorm, Optimal, Mem>::new(
        &a,
        ImageDesc::new_2d(16, 16).mip_levels(6),
    )
    .unwrap_err();
    assert!(err.to_string().contains("at most 5"), "{err}");
    let err =
        ExportableImage::<Rgba8Unorm, Optimal, Mem>::new(&a, ImageDesc::new_2d(16, 8).cube(6))
            .unwrap_err();
    assert!(err.to_string().contains("cube"), "{err}");
    let huge = ImageDesc::new_2d(1 << 20, 1 << 20);
    let err = ExportableImage::<Rgba16Sfloat, Optimal, Mem>::new(&a, huge).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert_no_validation_errors(&a);
}

/// Issue 21: the headline `DeviceLocal` image (and buffer) on a driver with no
/// device-local memory that is not host-visible (lavapipe) fails with an
/// error that names the fix (`HostVisible`) and where to look (the doctor);
/// on a driver that has such memory (NVIDIA) both are made.
#[test]
fn a_missing_memory_class_names_the_fix() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(16, 16));
    let buffer = ExportableBuffer::<vk_export::markers::DeviceLocal>::new(&ctx, 4096);
    let lavapipe = ctx.identity().driver_id == vk::DriverId::MESA_LLVMPIPE;
    for (what, result) in [("image", image.map(drop)), ("buffer", buffer.map(drop))] {
        match result {
            Err(err) => {
                let message = err.to_string();
                println!("DeviceLocal {what}: {message}");
                assert!(matches!(err, Error::Unsupported { .. }), "{message}");
                for part in [
                    "no memory type of the class",
                    "HostVisible",
                    "cargo xtask doctor",
                ] {
                    assert!(message.contains(part), "{what}: no {part:?} in {message}");
                }
            }
            Ok(()) => assert!(!lavapipe, "lavapipe has no device-local-only memory"),
        }
    }
    assert_no_validation_errors(&ctx);
}

/// Four threads share one context: each runs helpers on its own resources
/// and creates and drops images, buffers and semaphores. The validation
/// layer (thread-safety and synchronization checks on) must report nothing.
#[test]
fn four_threads_sharing_a_context_race_nothing() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                let image = Image::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
                for i in 0..40u32 {
                    let data = pattern(32 * 32 * 4, t * 1000 + i);
                    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
                        .unwrap();
                    assert_eq!(
                        ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap(),
                        data
                    );
                    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
                    ctx.write_buffer(&buffer, &pattern(4096, i), SubmitSync::new())
                        .unwrap();
                    let scratch = Image::new(&ctx, ImageDesc::new_2d(8, 8)).unwrap();
                    ctx.clear_image(&scratch, vk::ClearColorValue::default(), SubmitSync::new())
                        .unwrap();
                    let timeline = TimelineSemaphore::new_local(&ctx).unwrap();
                    ctx.submit_and_wait(SubmitSync::new().signal_timeline(&timeline, 1), |_, _| {})
                        .unwrap();
                    drop((buffer, scratch, timeline));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_resource_of_another_context_is_a_typed_error() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let b = vulkan(Some(a.identity().device_uuid));
    let image = Image::new(&a, ImageDesc::new_2d(16, 16)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&a, 256).unwrap();
    let timeline = TimelineSemaphore::new_local(&a).unwrap();
    let err = b
        .clear_image(&image, vk::ClearColorValue::default(), SubmitSync::new())
        .unwrap_err();
    assert!(matches!(err, Error::ForeignResource(_)), "{err}");
    assert!(matches!(
        b.read_buffer(&buffer, 16, SubmitSync::new()),
        Err(Error::ForeignResource(_))
    ));
    assert!(matches!(
        b.release_image(&image, SubmitSync::new()),
        Err(Error::ForeignResource(_))
    ));
    let err = b
        .submit_and_wait(SubmitSync::new().signal_timeline(&timeline, 1), |_, _| {})
        .unwrap_err();
    assert!(matches!(err, Error::ForeignResource(_)), "{err}");
    println!("{err}");
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// An eventfd whose counter is 0 (a driver that reads it would block for
/// ever) is refused before the driver, and comes back open.
#[test]
fn an_eventfd_is_refused_before_the_driver() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(16, 16)).unwrap();
    let eventfd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let record = image.record();
    let start = Instant::now();
    // SAFETY: deliberately not: the fd is no export; the import must refuse
    // it before any driver call (the fault under test).
    let err = unsafe { Image::import_fd(&ctx, &record, eventfd) }.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(err.error.to_string().contains("eventfd"), "{}", err.error);
    assert!(
        rustix::io::fcntl_getfd(&err.fd).is_ok(),
        "the fd came back open"
    );
    assert_no_validation_errors(&ctx);
}
