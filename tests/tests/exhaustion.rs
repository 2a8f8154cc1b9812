//! Exhaustion (issue 22, item 1): with `RLIMIT_NOFILE` lowered until no fd
//! can be made (`EMFILE`), and with the driver answering out-of-memory to
//! imports and mappings, every call returns a typed error, nothing is
//! half-imported, the caller keeps its fd, and the next call after the
//! pressure succeeds.
//!
//! Every body runs in a `child_*` process of its own: the fd limit is
//! process-wide (lowering it here would fail every other test thread), and
//! the fd table is compared whole. The CUDA bodies run against the testkit's
//! fake `libcuda.so.1` (`cuda_interop_testkit::fake`, knobs `import_fail`,
//! `map_fail`): what they show is what the crate does around the driver's
//! answer, never the real driver's. The Vulkan body runs on lavapipe with
//! the validation layer.
//!
//! `child_*` tests are entry points of child processes, run by their parent
//! test of this binary by exact name (`cuda_interop_testkit::child`); they
//! fail when run by hand. Every parent holds `fds::lock()`.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use cuda_interop::CudaDevice;
use cuda_interop_testkit::fds::{fd_table, identity};
use cuda_interop_testkit::{
    assert_no_validation_errors, child, fake, fds, tamper, vulkan, Mem, TIMEOUT,
};
use rustix::process::{getrlimit, setrlimit, Resource as Limit};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::usage;
use vk_export::socket::Connection;
use vk_export::wire::WireError;
use vk_export::{Error, ExportableBuffer};

/// Runs `f` with the soft `RLIMIT_NOFILE` at the lowest free fd number: no
/// new fd can be made (`EMFILE`) while it runs; the limit is restored after.
fn without_free_fds<R>(f: impl FnOnce() -> R) -> R {
    let lowest_free = std::fs::File::open("/dev/null").unwrap().as_raw_fd();
    let old = getrlimit(Limit::Nofile);
    let mut low = old;
    low.current = Some(lowest_free as u64);
    setrlimit(Limit::Nofile, low).unwrap();
    assert!(
        std::fs::File::open("/dev/null").is_err(),
        "the lowered limit leaves no fd free"
    );
    let result = f();
    setrlimit(Limit::Nofile, old).unwrap();
    result
}

/// `EMFILE` as the OS reports it, somewhere in an error's text.
fn says_emfile(message: &str) -> bool {
    message.contains("os error 24") || message.contains("Too many open files")
}

/// CUDA imports and socket receives with no fd free: the import's
/// duplicate cannot be made, so the import fails before the driver with the
/// caller's own fd back; a message whose fd the kernel cannot install is
/// refused as control-truncated (the kernel closes the fd it could not
/// install); with the limit restored, the same fd imports and the next
/// message arrives whole. The fd table and the fake's live objects are
/// exact.
#[test]
fn with_no_fd_free_cuda_imports_and_receives_fail_typed_and_then_succeed() {
    let _fds = fds::lock();
    fake::run("child_fake_fd_exhaustion", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of exhaustion.rs, with a fake libcuda: run by with_no_fd_free_cuda_imports_and_receives_fail_typed_and_then_succeed"]
fn child_fake_fd_exhaustion() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 1], 1, 1, false);
    let (tx, rx) = Connection::pair().unwrap();
    let before = fd_table();
    let in_flight = fake::some_fd();

    let (buffer_fd, image_fd, semaphore_fd) = (fake::some_fd(), fake::some_fd(), fake::some_fd());
    let kept: Vec<(i32, (u64, u64))> = [&buffer_fd, &image_fd, &semaphore_fd]
        .iter()
        .map(|fd| (fd.as_raw_fd(), identity(fd)))
        .collect();
    let message = vk_export::wire::Message {
        tag: 1,
        resources: vec![cuda_interop_testkit::sample::message().resources[1].clone()],
    }
    .encode()
    .unwrap();
    // SAFETY: the receiver refuses or only counts what it receives; nothing
    // is imported from it.
    unsafe { tx.send_raw(&message, &[in_flight.as_fd()]) }.unwrap();
    let (buffer_err, image_err, semaphore_err, received) = without_free_fds(|| {
        // SAFETY: the driver is the fake; no import reaches it.
        unsafe {
            (
                cuda.import_buffer_fd(fake::buffer(false), buffer_fd)
                    .unwrap_err(),
                cuda.import_image_fd(image.clone(), image_fd).unwrap_err(),
                cuda.import_semaphore_fd(fake::timeline(), semaphore_fd)
                    .unwrap_err(),
                rx.recv(TIMEOUT),
            )
        }
    });
    for (what, err) in [
        ("buffer", &buffer_err),
        ("image", &image_err),
        ("semaphore", &semaphore_err),
    ] {
        let message = err.error.to_string();
        println!("{what} import with no fd free: {message}");
        assert!(
            matches!(err.error, cuda_interop::Error::InvalidArgument(_)) && says_emfile(&message),
            "{what}: {message}"
        );
    }
    let back: Vec<(i32, (u64, u64))> = [&buffer_err.fd, &image_err.fd, &semaphore_err.fd]
        .iter()
        .map(|fd| (fd.as_raw_fd(), identity(fd)))
        .collect();
    assert_eq!(back, kept, "each caller's own fd came back, unchanged");
    assert!(
        fake.calls("cuImportExternalMemory").is_empty()
            && fake.calls("cuImportExternalSemaphore").is_empty(),
        "no driver call without the duplicate"
    );
    let err = received.unwrap_err();
    println!("recv with no fd free: {err}");
    assert!(
        matches!(err, Error::Wire(WireError::ControlTruncated)),
        "{err}"
    );

    // The pressure is gone: the same fds import, the next message arrives.
    // SAFETY: the driver is the fake: it holds the fds and reads nothing.
    let (buffer, image, semaphore) = unsafe {
        (
            cuda.import_buffer_fd(fake::buffer(false), buffer_err.fd)
                .map_err(|e| e.error)
                .unwrap(),
            cuda.import_image_fd(image, image_err.fd)
                .map_err(|e| e.error)
                .unwrap(),
            cuda.import_semaphore_fd(fake::timeline(), semaphore_err.fd)
                .map_err(|e| e.error)
                .unwrap(),
        )
    };
    assert_eq!(fake.live("memory"), 2);
    // SAFETY: as above: nothing is imported from the message.
    unsafe { tx.send_raw(&message, &[in_flight.as_fd()]) }.unwrap();
    let received = rx.recv(TIMEOUT).unwrap();
    assert_eq!(received.message().resources.len(), 1);
    drop((received, buffer, image, semaphore, in_flight));
    assert_eq!(fd_table(), before, "every fd closed exactly once");
    drop(cuda);
    assert_eq!(fake.all_live(), [], "everything destroyed");
}

/// The driver answers `CUDA_ERROR_OUT_OF_MEMORY` to imports (buffer, image,
/// semaphore) and to mappings (buffer, mipmapped array): each is a typed
/// driver error naming the code and the hint, the import's fd comes back
/// (imports) or the import stays whole and usable (mappings), no object is
/// left behind, and once the driver has memory again the same calls
/// succeed.
#[test]
fn out_of_memory_from_the_driver_is_typed_and_leaves_nothing_half_imported() {
    let _fds = fds::lock();
    fake::run("child_fake_out_of_memory", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of exhaustion.rs, with a fake libcuda: run by out_of_memory_from_the_driver_is_typed_and_leaves_nothing_half_imported"]
fn child_fake_out_of_memory() {
    const OUT_OF_MEMORY: i64 = 2;
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let image = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 1], 1, 1, false);
    let before = fd_table();
    let is_oom = |e: &cuda_interop::Error| {
        let message = e.to_string();
        matches!(e, cuda_interop::Error::Driver(_))
            && message.contains("CUDA_ERROR_OUT_OF_MEMORY")
            && message.contains("out of memory")
    };

    fake.set("import_fail", OUT_OF_MEMORY);
    let fds: Vec<OwnedFd> = (0..3).map(|_| fake::some_fd()).collect();
    let kept: Vec<_> = fds
        .iter()
        .map(|fd| (fd.as_raw_fd(), identity(fd)))
        .collect();
    let mut fds = fds.into_iter();
    // SAFETY: the driver is the fake, which refuses every import now.
    let errs = unsafe {
        [
            cuda.import_buffer_fd(fake::buffer(false), fds.next().unwrap())
                .map(drop)
                .unwrap_err(),
            cuda.import_image_fd(image.clone(), fds.next().unwrap())
                .map(drop)
                .unwrap_err(),
            cuda.import_semaphore_fd(fake::timeline(), fds.next().unwrap())
                .map(drop)
                .unwrap_err(),
        ]
    };
    for (err, kept) in errs.iter().zip(&kept) {
        println!("import, out of memory: {}", err.error);
        assert!(is_oom(&err.error), "{}", err.error);
        assert_eq!(
            (err.fd.as_raw_fd(), identity(&err.fd)),
            *kept,
            "own fd back"
        );
    }
    assert_eq!(fake.all_live(), [], "nothing half-imported");
    fake.set("import_fail", 0);

    // Mappings: the import stays, the mapping fails typed, then works.
    let [buffer_fd, image_fd, _] = errs.map(|e| e.fd);
    // SAFETY: the driver is the fake: it holds the fds and reads nothing.
    let (mut buffer, image) = unsafe {
        (
            cuda.import_buffer_fd(fake::buffer(false), buffer_fd)
                .map_err(|e| e.error)
                .unwrap(),
            cuda.import_image_fd(image, image_fd)
                .map_err(|e| e.error)
                .unwrap(),
        )
    };
    fake.set("map_fail", OUT_OF_MEMORY);
    let err = buffer.map().map(drop).unwrap_err();
    println!("buffer mapping, out of memory: {err}");
    assert!(is_oom(&err), "{err}");
    let err = image.map_array().map(drop).unwrap_err();
    println!("array mapping, out of memory: {err}");
    assert!(is_oom(&err), "{err}");
    assert_eq!(
        fake.all_live(),
        [("memory", 2)],
        "no mapping half-made; both imports still whole"
    );
    fake.set("map_fail", 0);
    let mapped = buffer.map().unwrap();
    assert_eq!(mapped.len(), buffer_len());
    drop(mapped);
    let array = image.map_array().unwrap();
    drop(array);
    drop((buffer, image));
    assert_eq!(fd_table(), before, "every fd closed exactly once");
    drop(cuda);
    assert_eq!(fake.all_live(), [], "everything destroyed");
}

/// The wire sample's buffer size (what `fake::buffer` records).
fn buffer_len() -> u64 {
    fake::buffer(false).info().size()
}

/// Vulkan with no fd free (lavapipe): creating an exportable buffer (its
/// memory is an fd on lavapipe), exporting one, importing an fd and making a
/// socket pair each fail with a typed error; the import hands the caller's
/// fd back; nothing is left open; once the limit is back every one of them
/// works, with no validation error.
#[test]
fn with_no_fd_free_vulkan_exports_and_imports_fail_typed_and_then_succeed() {
    let _fds = fds::lock();
    child::run_marked(
        "child_vulkan_fd_exhaustion",
        "CUDA_INTEROP_CHILD_VULKAN_FD_EXHAUSTION",
    );
}

#[test]
#[ignore = "entry point of a child process of exhaustion.rs: run by with_no_fd_free_vulkan_exports_and_imports_fail_typed_and_then_succeed"]
fn child_vulkan_fd_exhaustion() {
    child::started_as_child("CUDA_INTEROP_CHILD_VULKAN_FD_EXHAUSTION");
    let ctx = vulkan(None);
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let exported = buffer.export_fd().unwrap();
    let kept = (exported.as_raw_fd(), identity(&exported));
    let before = fd_table();
    let (created, export, import, pair) = without_free_fds(|| {
        (
            ExportableBuffer::<Mem>::new(&ctx, 4096).map(drop),
            buffer.export_fd(),
            // SAFETY: `exported` is a fresh export of `buffer` with its record.
            unsafe { ExportableBuffer::<Mem>::import_fd(&ctx, &buffer.record(), exported) },
            Connection::pair().map(drop),
        )
    });
    println!("create with no fd free: {created:?}");
    println!("export with no fd free: {:?}", export.as_ref().map(drop));
    println!("socket pair with no fd free: {pair:?}");
    let export_err = export.map(drop).unwrap_err();
    assert!(
        matches!(export_err, Error::Vulkan { .. }),
        "the export failed typed: {export_err}"
    );
    let import_err = import.map(drop).unwrap_err();
    println!("import with no fd free: {}", import_err.error);
    assert_eq!(
        (import_err.fd.as_raw_fd(), identity(&import_err.fd)),
        kept,
        "the caller's fd came back"
    );
    assert!(
        says_emfile(&import_err.error.to_string()),
        "{}",
        import_err.error
    );
    let pair_err = pair.unwrap_err();
    assert!(
        matches!(&pair_err, Error::Socket { source, .. } if source.raw_os_error() == Some(24)),
        "{pair_err}"
    );
    assert_eq!(fd_table(), before, "nothing left open, nothing closed");

    // The pressure is gone: every call works.
    ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    drop(buffer.export_fd().unwrap());
    // SAFETY: as above.
    let imported =
        unsafe { ExportableBuffer::<Mem>::import_fd(&ctx, &buffer.record(), import_err.fd) }
            .map_err(|e| e.error)
            .unwrap();
    drop(Connection::pair().unwrap());
    drop(imported);
    // Lavapipe backs exportable memory with a memfd: with no fd free the
    // allocation is out of device memory, which Mesa itself reports through
    // the debug messenger (its `vk_error` at the failing line, not a layer
    // VUID); a driver whose allocation needs no fd creates the buffer.
    match created {
        Err(Error::Vulkan {
            result: ash::vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
            ..
        }) => {
            let ids = ctx.validation_error_ids();
            assert!(
                ids.iter().all(|id| !id.starts_with("VUID-")),
                "only the driver's report of the allocation's result, no layer VUID: {ids:?}"
            );
        }
        Err(e) => panic!("creating failed, but not as out of memory: {e}"),
        Ok(()) => assert_no_validation_errors(&ctx),
    }
}

/// The size of the heap that memory type `index` of `ctx`'s device draws on.
fn heap_size(ctx: &vk_export::Context, index: u32) -> u64 {
    // SAFETY: a plain query of the context's live physical device.
    let props = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    let heap = props.memory_types[index as usize].heap_index;
    props.memory_heaps[heap as usize].size
}

/// An allocation larger than its memory type's heap is invalid usage
/// (`VUID-vkAllocateMemory-pAllocateInfo-01713`), not an out-of-memory
/// answer: a buffer of the heap's size plus 64 KiB, and a peer's record of
/// such a buffer over a real 4 KiB export's fd, are refused before
/// `vkAllocateMemory` with an error naming the heap; the importer gets its fd
/// back and nothing else is left open; the layer reports nothing. (Without the check, lavapipe's 2 GiB
/// heap took a 3 GiB exportable buffer with a 01713 report, and `Ok`.)
#[test]
fn allocations_larger_than_their_heap_are_refused_before_the_driver() {
    use vk_export::wire::{Message, Resource};
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let heap = heap_size(&ctx, small.info().memory_type_index());
    let too_large = (heap + (64 << 10)).next_multiple_of(64 << 10);
    let says_heap = |e: &Error| e.to_string().contains("memory heap");

    let created = ExportableBuffer::<Mem>::new(&ctx, too_large).map(drop);
    println!("a buffer of {too_large} bytes (heap: {heap}): {created:?}");
    let lavapipe = ctx.identity().driver_id == ash::vk::DriverId::MESA_LLVMPIPE;
    match &created {
        Err(e @ Error::InvalidArgument(_)) if says_heap(e) => {}
        // A driver may refuse the buffer itself (before any allocation).
        Err(Error::Vulkan {
            call: "vkCreateBuffer",
            result: ash::vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
            ..
        }) if !lavapipe => {}
        other => panic!("not refused as larger than the heap: {other:?}"),
    }

    // An image too: 16384 x 16384 RGBA8 layers, one more than the heap holds.
    let layer = 16384u64 * 16384 * 4;
    let layers = u32::try_from(heap / layer + 1).unwrap();
    let desc = vk_export::ImageDesc {
        array_layers: layers,
        ..vk_export::ImageDesc::new_2d(16384, 16384)
    };
    let image = cuda_interop_testkit::Image::new(&ctx, desc).map(drop);
    println!("an image of {layers} layers of {layer} bytes: {image:?}");
    match &image {
        Err(e @ Error::InvalidArgument(_)) if says_heap(e) => {}
        // A driver may refuse the image itself (limits, or before memory).
        Err(
            Error::Unsupported { .. }
            | Error::Vulkan {
                call: "vkCreateImage",
                ..
            },
        ) if !lavapipe => {}
        other => panic!("the image was not refused as larger than the heap: {other:?}"),
    }

    // The peer's word: a record of a buffer that large, over a 4 KiB fd
    // (the allocation first: the decoder refuses one below the size).
    let forged = tamper::buffer(small.info(), "allocation_size", tamper::set(too_large));
    let forged = tamper::buffer(&forged, "size", tamper::set(too_large));
    let (tx, rx) = Connection::pair().unwrap();
    let before = fd_table();
    let message = Message {
        tag: 1,
        resources: vec![Resource::Buffer(forged)],
    };
    let fd = small.export_fd().unwrap();
    let sent = (fd.as_raw_fd(), identity(&fd));
    // SAFETY: deliberately not: the record is not the fd's export's (the
    // fault under test); the receiver refuses it before any import.
    unsafe { tx.send(&message, vec![fd]) }.unwrap();
    let bundle = rx.recv(TIMEOUT).unwrap().take_buffer::<Mem>(0).unwrap();
    let refused = ExportableBuffer::<Mem>::import_received(&ctx, bundle)
        .map(drop)
        .unwrap_err();
    println!("the forged record: {}", refused.error);
    match &refused.error {
        e @ Error::Record(_) if says_heap(e) => {}
        Error::Vulkan {
            call: "vkCreateBuffer",
            result: ash::vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
            ..
        } if !lavapipe => {}
        other => panic!("the forged record was not refused as larger than the heap: {other}"),
    }
    // The fd came back: another number, since it crossed the socket, but
    // the same open file as the export sent.
    assert_eq!(identity(&refused.fd), sent.1, "the importer's fd came back");
    drop(refused);
    assert_eq!(fd_table(), before, "no duplicate left behind");
    assert_no_validation_errors(&ctx);
}

/// Real device memory runs out (an NVIDIA GPU): exportable buffers of an
/// eighth of the device-local heap are made until `vkAllocateMemory` says
/// `ERROR_OUT_OF_DEVICE_MEMORY`, a typed error with nothing half-made; while
/// the memory is full, a CUDA import and mapping of one of the live buffers
/// either works or fails typed; once one buffer is dropped the next
/// allocation succeeds; no validation error.
#[test]
#[ignore = "needs an NVIDIA GPU (a real allocation beyond device memory): cargo test -p cuda-interop-tests --features device-local --test exhaustion -- --ignored --skip child_, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn real_device_memory_runs_out_with_a_typed_error_and_comes_back() {
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let probe = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let heap = heap_size(&ctx, probe.info().memory_type_index());
    drop(probe);
    let chunk = (heap / 8).next_multiple_of(1 << 30);
    let mut live = Vec::new();
    let error = loop {
        assert!(
            live.len() <= 16,
            "{} buffers of {chunk} bytes fit a heap of {heap} bytes",
            live.len()
        );
        match ExportableBuffer::<Mem>::new(&ctx, chunk) {
            Ok(b) => live.push(b),
            Err(e) => break e,
        }
    };
    println!(
        "heap {heap} bytes: {} buffers of {chunk} bytes, then: {error}",
        live.len()
    );
    assert!(
        !live.is_empty(),
        "at least one buffer of an eighth of the heap"
    );
    assert!(
        matches!(
            error,
            Error::Vulkan {
                call: "vkAllocateMemory",
                result: ash::vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
                ..
            }
        ),
        "out of device memory, typed: {error}"
    );
    match cuda.import_buffer(&live[0]) {
        Ok(mut imported) => match imported.map() {
            Ok(mapping) => println!(
                "with the memory full, a CUDA import and map work ({} bytes)",
                mapping.len()
            ),
            Err(e) => println!("with the memory full, the CUDA mapping failed typed: {e}"),
        },
        Err(e) => println!("with the memory full, the CUDA import failed typed: {e}"),
    }
    live.pop();
    let again = ExportableBuffer::<Mem>::new(&ctx, chunk);
    assert!(
        again.is_ok(),
        "with one buffer dropped, the next one fits: {:?}",
        again.err()
    );
    drop(again);
    drop(live);
    assert_no_validation_errors(&ctx);
}
