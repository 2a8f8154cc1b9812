//! The trust boundary (lavapipe in CI, NVIDIA on the GPU machine): records
//! received from a peer that lies in one field, and fds that are not GPU
//! exports, on the Vulkan and the CUDA receive path. Every case is a typed
//! error, the caller's fd comes back open, and the process's fd count
//! returns to its baseline.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test trust_boundary --
//! --ignored --skip child_`. The others run everywhere (lavapipe).
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use cuda_interop::Stream;
use cuda_interop_testkit::gpu::pair;
use cuda_interop_testkit::{
    assert_no_validation_errors, fds, open_fd_count, pattern, tamper, vulkan, Image, Mem, TIMEOUT,
};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{
    BinarySemaphore, Context, Error, ExportableBuffer, ExportableImage, ImageDesc, SubmitSync,
    TimelineSemaphore,
};

/// One edit of a wire field's bytes.
type Edit = Box<dyn Fn(&mut [u8])>;

/// The trust-boundary tamper list through the CUDA receive path: every
/// single-field lie in a received image or buffer record is a typed error
/// before the driver sees the fd (or at it), the fd comes back open, and an
/// honest record still round-trips exactly.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test trust_boundary -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn every_single_field_tamper_is_refused_by_the_cuda_receive_path() {
    let _fds = fds::lock();
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

/// Whether `ctx` has a device-local, not host-visible memory type for images.
fn has_device_local(ctx: &Context) -> bool {
    !matches!(
        ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal>::new(ctx, ImageDesc::new_2d(16, 16)),
        Err(Error::Unsupported { .. })
    )
}

/// Sends `bytes` with `fd` over a fresh socket pair and receives them.
fn round_trip_socket(
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> vk_export::Result<vk_export::wire::Received> {
    let (tx, rx) = Connection::pair().unwrap();
    // SAFETY: a test of the receiver's refusals: the record is tampered on
    // purpose and the test asserts that its import is refused.
    unsafe { tx.send_raw(bytes, fds) }.unwrap();
    rx.recv(TIMEOUT)
}

/// One single-field tamper of the record of `resource` (exported as `fd`):
/// sent with the real fd, received, and handed to `take_and_import`, which
/// must refuse it (and returns how); `fd` is closed afterwards (the callers
/// check the fd count). Prints the outcome under `label`.
fn tamper_is_refused(
    label: &str,
    resource: Resource,
    fields: &[(&str, usize, usize)],
    fd: OwnedFd,
    field: &str,
    edit: impl FnOnce(&mut [u8]),
    take_and_import: impl FnOnce(&mut vk_export::wire::Received) -> String,
) {
    let (bytes, decoded) = tamper::edit(resource, fields, field, edit);
    let outcome = match decoded {
        Err(e) => format!("rejected by the decoder: {e}"),
        Ok(_) => take_and_import(&mut round_trip_socket(&bytes, &[fd.as_fd()]).unwrap()),
    };
    drop(fd);
    println!("{label} {field:>18}: {outcome}");
}

/// One single-field tamper of a received image record: the import is a
/// typed error, the fd comes back open, and the fd count is unchanged.
fn image_tamper_is_refused<M: MemoryLocation>(
    ctx: &Context,
    field: &str,
    edit: impl FnOnce(&mut [u8]),
) {
    let image =
        ExportableImage::<Rgba8Unorm, Optimal, M>::new(ctx, ImageDesc::new_2d(256, 128)).unwrap();
    let baseline = open_fd_count();
    let resource = Resource::Image(image.info().clone());
    let fd = image.export_fd().unwrap();
    tamper_is_refused(
        "image",
        resource,
        tamper::IMAGE_FIELDS,
        fd,
        field,
        edit,
        |received| match received.take_image::<Rgba8Unorm, Optimal, M, usage::Storage>(0) {
            Err(e) => format!("rejected when typed: {e}"),
            Ok(bundle) => match ExportableImage::import_received(ctx, bundle) {
                Ok(_) => panic!("a record with a tampered {field} was imported"),
                Err(e) => {
                    assert!(
                        rustix::io::fcntl_getfd(&e.fd).is_ok(),
                        "the fd came back open"
                    );
                    assert!(
                        matches!(e.error, Error::Record(_) | Error::Unsupported { .. }),
                        "{}",
                        e.error
                    );
                    format!("refused at import: {}", e.error)
                }
            },
        },
    );
    assert_eq!(
        open_fd_count(),
        baseline,
        "fd count after tampering {field}"
    );
}

/// As [`image_tamper_is_refused`], for a buffer record.
fn buffer_tamper_is_refused<M: MemoryLocation>(
    ctx: &Context,
    field: &str,
    edit: impl FnOnce(&mut [u8]),
) {
    let buffer = ExportableBuffer::<M>::new(ctx, 100_000).unwrap();
    let baseline = open_fd_count();
    let resource = Resource::Buffer(buffer.info().clone());
    let fd = buffer.export_fd().unwrap();
    tamper_is_refused(
        "buffer",
        resource,
        tamper::BUFFER_FIELDS,
        fd,
        field,
        edit,
        |received| match received.take_buffer::<M>(0) {
            Err(e) => format!("rejected when typed: {e}"),
            Ok(bundle) => match ExportableBuffer::import_received(ctx, bundle) {
                Ok(_) => panic!("a record with a tampered {field} was imported"),
                Err(e) => {
                    assert!(rustix::io::fcntl_getfd(&e.fd).is_ok());
                    format!("refused at import: {}", e.error)
                }
            },
        },
    );
    assert_eq!(
        open_fd_count(),
        baseline,
        "fd count after tampering {field}"
    );
}

/// Both cases count open fds, so they run in one test, in order, in a test
/// binary of their own (a parallel test would move the count).
#[test]
fn received_records_and_fds_at_the_trust_boundary() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    every_single_field_tamper_of_a_received_record_is_a_typed_error(&ctx);
    assert_no_validation_errors(&ctx);
    let ctx = vulkan(None);
    let refused_by_driver = non_gpu_fds_are_refused_and_handed_back_open(&ctx);
    // An import the driver refused may be reported once through the layer
    // (lavapipe: the layer reports the result code for each; NVIDIA: the
    // driver's own message for the semaphores only): never more than one per
    // refusal, and nothing else.
    println!(
        "{refused_by_driver} imports refused by the driver; validation messages: {:?}",
        ctx.validation_error_ids()
    );
    assert!(ctx.validation_errors() <= refused_by_driver, "see stderr");
}

/// The tamper list of the trust-boundary issue, for images and buffers (and
/// semaphores where the driver exports them), on every memory class the
/// driver has.
fn every_single_field_tamper_of_a_received_record_is_a_typed_error(ctx: &Context) {
    let image_edits: Vec<(&str, Edit)> = vec![
        ("format", Box::new(|b: &mut [u8]| tamper::set(100)(b))), // R32_SFLOAT: same texel size
        (
            "usage",
            Box::new(|b: &mut [u8]| tamper::set(0x1 | 0x2 | 0x4)(b)),
        ),
        ("tiling", Box::new(|b: &mut [u8]| tamper::set(1)(b))),
        ("device_uuid", Box::new(|b: &mut [u8]| tamper::flip()(b))),
        ("driver_uuid", Box::new(|b: &mut [u8]| tamper::flip()(b))),
        (
            "allocation_size",
            Box::new(|b: &mut [u8]| tamper::add(65536)(b)),
        ),
        (
            "allocation_size",
            Box::new(|b: &mut [u8]| tamper::add(-4096)(b)),
        ),
        ("dedicated", Box::new(|b: &mut [u8]| b[0] ^= 1)),
        ("width", Box::new(|b: &mut [u8]| tamper::set(128)(b))),
        ("height", Box::new(|b: &mut [u8]| tamper::set(64)(b))),
        ("mip_levels", Box::new(|b: &mut [u8]| tamper::set(2)(b))),
        ("array_layers", Box::new(|b: &mut [u8]| tamper::set(2)(b))),
        (
            "memory_type_index",
            Box::new(|b: &mut [u8]| tamper::add(1)(b)),
        ),
        (
            "alignment",
            Box::new(|b: &mut [u8]| tamper::set(1 << 20)(b)),
        ),
    ];
    let buffer_edits: Vec<(&str, Edit)> = vec![
        ("usage", Box::new(|b: &mut [u8]| tamper::set(0x20)(b))),
        ("device_uuid", Box::new(|b: &mut [u8]| tamper::flip()(b))),
        ("driver_uuid", Box::new(|b: &mut [u8]| tamper::flip()(b))),
        (
            "allocation_size",
            Box::new(|b: &mut [u8]| tamper::add(65536)(b)),
        ),
        ("size", Box::new(|b: &mut [u8]| tamper::add(4_000_000)(b))),
        ("dedicated", Box::new(|b: &mut [u8]| b[0] ^= 1)),
        (
            "memory_type_index",
            Box::new(|b: &mut [u8]| tamper::add(1)(b)),
        ),
        ("memory_flags", Box::new(|b: &mut [u8]| tamper::set(0)(b))),
    ];
    for (field, edit) in &image_edits {
        image_tamper_is_refused::<Mem>(ctx, field, edit);
    }
    for (field, edit) in &buffer_edits {
        buffer_tamper_is_refused::<Mem>(ctx, field, edit);
    }
    if has_device_local(ctx) {
        for (field, edit) in &image_edits {
            image_tamper_is_refused::<DeviceLocal>(ctx, field, edit);
        }
        for (field, edit) in &buffer_edits {
            buffer_tamper_is_refused::<DeviceLocal>(ctx, field, edit);
        }
    } else {
        println!(
            "{} has no DeviceLocal memory class: tampers ran on HostVisible only",
            ctx.identity().name
        );
    }
    if ctx.supports_semaphore_fds() {
        for kind in ["timeline", "binary"] {
            for (field, edit) in [
                (
                    "semaphore_type",
                    tamper::set(if kind == "timeline" { 0 } else { 1 }),
                ),
                ("device_uuid", tamper::set(0xab)),
                ("driver_uuid", tamper::set(0xab)),
            ] {
                let baseline = open_fd_count();
                let (fd, info) = if kind == "timeline" {
                    let s = TimelineSemaphore::new(ctx).unwrap();
                    (s.export_fd().unwrap(), s.record().into_info())
                } else {
                    let s = BinarySemaphore::new(ctx).unwrap();
                    (s.export_fd().unwrap(), s.record().into_info())
                };
                let (bytes, _) = tamper::edit(
                    Resource::Semaphore(info),
                    tamper::SEMAPHORE_FIELDS,
                    field,
                    edit,
                );
                let mut received = round_trip_socket(&bytes, &[fd.as_fd()]).unwrap();
                let outcome = if kind == "timeline" {
                    match received.take_semaphore::<vk_export::Timeline>(0) {
                        Err(e) => format!("rejected when typed: {e}"),
                        Ok(b) => format!(
                            "refused at import: {}",
                            TimelineSemaphore::import_received(ctx, b)
                                .unwrap_err()
                                .error
                        ),
                    }
                } else {
                    match received.take_semaphore::<vk_export::Binary>(0) {
                        Err(e) => format!("rejected when typed: {e}"),
                        Ok(b) => format!(
                            "refused at import: {}",
                            BinarySemaphore::import_received(ctx, b).unwrap_err().error
                        ),
                    }
                };
                drop((fd, received));
                assert_eq!(open_fd_count(), baseline);
                println!("{kind} semaphore {field:>14}: {outcome}");
            }
        }
    } else {
        println!(
            "{}: no exportable semaphores, semaphore tampers not run here",
            ctx.identity().name
        );
    }
}

/// Fds that are not exports, as memory and as semaphores: a typed error, the
/// fd handed back open and unchanged, nothing closed twice (a debug build's
/// std aborts on a double close of an OwnedFd). Returns how many the driver
/// itself refused.
fn non_gpu_fds_are_refused_and_handed_back_open(ctx: &Context) -> u32 {
    let mut refused_by_driver = 0;
    let image = Image::new(ctx, ImageDesc::new_2d(64, 64)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(ctx, 4096).unwrap();
    let baseline = open_fd_count();
    let file_path = std::env::temp_dir().join(format!("vk-export-regular-{}", std::process::id()));
    std::fs::write(&file_path, vec![0u8; 1 << 20]).unwrap();
    let candidates = || -> Vec<(&str, OwnedFd)> {
        let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
        vec![
            (
                "/dev/null",
                std::fs::File::open("/dev/null").unwrap().into(),
            ),
            ("a pipe", pipe_r),
            (
                "a regular file",
                std::fs::File::open(&file_path).unwrap().into(),
            ),
        ]
    };
    for (what, fd) in candidates() {
        let raw = fd.as_raw_fd();
        let bytes = Message {
            tag: 0,
            resources: vec![Resource::Image(image.info().clone())],
        }
        .encode()
        .unwrap();
        let mut received = round_trip_socket(&bytes, &[fd.as_fd()]).unwrap();
        drop(fd);
        let bundle = received
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap();
        match Image::import_received(ctx, bundle) {
            Ok(_) => println!(
                "image from {what}: the driver accepted it (lavapipe imports any mappable file)"
            ),
            Err(e) => {
                assert!(
                    rustix::io::fcntl_getfd(&e.fd).is_ok(),
                    "{what}: the fd came back open"
                );
                refused_by_driver += u32::from(matches!(e.error, Error::Vulkan { .. }));
                println!("image from {what} (fd {raw}): {}", e.error);
            }
        }
    }
    for (what, fd) in candidates() {
        let bytes = Message {
            tag: 0,
            resources: vec![Resource::Buffer(buffer.info().clone())],
        }
        .encode()
        .unwrap();
        let mut received = round_trip_socket(&bytes, &[fd.as_fd()]).unwrap();
        drop(fd);
        let bundle = received.take_buffer::<Mem>(0).unwrap();
        match ExportableBuffer::import_received(ctx, bundle) {
            Ok(_) => println!("buffer from {what}: the driver accepted it"),
            Err(e) => {
                assert!(rustix::io::fcntl_getfd(&e.fd).is_ok());
                refused_by_driver += u32::from(matches!(e.error, Error::Vulkan { .. }));
                println!("buffer from {what}: {}", e.error);
            }
        }
    }
    if ctx.supports_semaphore_fds() {
        let s = TimelineSemaphore::new(ctx).unwrap();
        for (what, fd) in candidates() {
            let bytes = Message {
                tag: 0,
                resources: vec![Resource::Semaphore(s.record().into_info())],
            }
            .encode()
            .unwrap();
            let mut received = round_trip_socket(&bytes, &[fd.as_fd()]).unwrap();
            drop(fd);
            let bundle = received.take_semaphore::<vk_export::Timeline>(0).unwrap();
            let e = TimelineSemaphore::import_received(ctx, bundle).unwrap_err();
            assert!(rustix::io::fcntl_getfd(&e.fd).is_ok());
            refused_by_driver += u32::from(matches!(e.error, Error::Vulkan { .. }));
            println!("semaphore from {what}: {}", e.error);
        }
    }
    std::fs::remove_file(&file_path).ok();
    assert_eq!(open_fd_count(), baseline, "every fd closed exactly once");
    refused_by_driver
}
