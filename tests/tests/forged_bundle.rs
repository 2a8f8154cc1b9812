//! Issue 18 item 2: a bundle is only as honest as its sender, and a receiver
//! cannot know who sent it (any process of an allowed user can `sendmsg` any
//! record with any fd). What the importing side's Vulkan driver checks, on
//! the machine this runs on: a record that claims more memory than the fd
//! holds is refused by the import, and the caller keeps its fd.
//!
//! This is a run-time test on purpose: only the driver knows the real size
//! of the allocation behind an fd. The GPU bundle runs it on the H200.

use std::os::fd::AsFd;
use std::time::Duration;

use cuda_interop_testkit::vulkan;
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{Error, ExportableBuffer};

#[cfg(not(feature = "device-local"))]
type Mem = vk_export::markers::HostVisible;
#[cfg(feature = "device-local")]
type Mem = vk_export::markers::DeviceLocal;

#[test]
fn a_record_larger_than_its_memory_is_refused_by_the_importing_driver() {
    let ctx = vulkan(None);
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let large = ExportableBuffer::<Mem>::new(&ctx, 64 << 20).unwrap();
    let (tx, rx) = Connection::pair().unwrap();
    let message = Message {
        tag: 0,
        resources: vec![Resource::Buffer(large.info().clone())],
    };
    // SAFETY: deliberately dishonest (the point of the test): the receiver
    // below only imports into Vulkan, whose driver is what is under test,
    // and nothing reads or writes the import.
    unsafe { tx.send(&message, vec![small.export_fd().unwrap()]) }.unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    let bundle = received.take_buffer::<Mem>(0).unwrap();
    // The check the CUDA side runs before `cuImportExternalMemory`.
    let (record, fd, peer) = bundle.into_parts();
    let checked = ctx.check_buffer_memory(&record, &fd);
    assert!(matches!(checked, Err(Error::Vulkan { .. })), "{checked:?}");
    println!("check_buffer_memory: {}", checked.unwrap_err());
    let honest = small.record();
    ctx.check_buffer_memory(&honest, &small.export_fd().unwrap())
        .unwrap();
    drop((record, fd, peer));
    let (tx, rx) = Connection::pair().unwrap();
    // SAFETY: as above.
    unsafe { tx.send(&message, vec![small.export_fd().unwrap()]) }.unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    let bundle = received.take_buffer::<Mem>(0).unwrap();
    let refused = ExportableBuffer::import_received(&ctx, bundle);
    let e = match refused {
        Ok(_) => panic!(
            "{}: a 64 MiB record over a 4 KiB allocation was imported",
            ctx.identity().name
        ),
        Err(e) => e,
    };
    println!("{}: refused: {}", ctx.identity().name, e.error);
    assert!(matches!(e.error, Error::Vulkan { .. }), "{}", e.error);
    // The caller's fd came back open.
    assert!(rustix::io::fcntl_getfd(e.fd.as_fd()).is_ok());
    // The forged import itself is an application error the layer may
    // report; the honest pair below must add none.
    let after_forged = ctx.validation_errors();
    println!("validation errors from the forged import: {after_forged}");
    // The honest pair imports.
    let (tx, rx) = Connection::pair().unwrap();
    tx.send_exported(1, &[&small]).unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    ExportableBuffer::import_received(&ctx, received.take_buffer::<Mem>(0).unwrap()).unwrap();
    assert_eq!(ctx.validation_errors(), after_forged);
}

/// The CUDA receive path with the same forged bundle: the paired Vulkan
/// device imports a duplicate of the fd first, so `cuImportExternalMemory`
/// never sees a record larger than its memory (on the H200 at `abff57a`,
/// CUDA accepted the 64 MiB record over the 4 KiB allocation and only
/// `cuExternalMemoryGetMappedBuffer` failed, one call late).
#[test]
#[ignore = "needs an NVIDIA GPU: run by the GPU bundle"]
fn a_forged_bundle_never_reaches_cuda() {
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let large = ExportableBuffer::<Mem>::new(&ctx, 64 << 20).unwrap();
    let message = Message {
        tag: 0,
        resources: vec![Resource::Buffer(large.info().clone())],
    };
    let (tx, rx) = Connection::pair().unwrap();
    // SAFETY: deliberately dishonest: the receive path under test must
    // refuse it before CUDA imports anything.
    unsafe { tx.send(&message, vec![small.export_fd().unwrap()]) }.unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    let e = cuda
        .import_received_buffer(received.take_buffer::<Mem>(0).unwrap())
        .unwrap_err();
    println!("CUDA receive path: {}", e.error);
    assert!(
        matches!(&e.error, cuda_interop::Error::Vulkan(Error::Vulkan { .. })),
        "refused by the Vulkan pre-import, not later: {}",
        e.error
    );
    assert!(rustix::io::fcntl_getfd(e.fd.as_fd()).is_ok());
    // The honest bundle imports and maps.
    let (tx, rx) = Connection::pair().unwrap();
    tx.send_exported(1, &[&large]).unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    let mut imported = cuda
        .import_received_buffer(received.take_buffer::<Mem>(0).unwrap())
        .unwrap();
    imported.map().unwrap();
}

/// Honest bundles of several sizes, in this process, through the Vulkan and
/// the CUDA receive paths (the pre-import of a duplicate must not refuse an
/// honest fd of any size, dedicated or not).
#[test]
#[ignore = "needs an NVIDIA GPU: run by the GPU bundle"]
fn honest_buffers_of_every_size_pass_the_receive_paths() {
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let mut failures = Vec::new();
    for size in [4096u64, 1 << 20, 16 << 20, 64 << 20] {
        let buffer = ExportableBuffer::<Mem>::new(&ctx, size).unwrap();
        let send = || {
            let (tx, rx) = Connection::pair().unwrap();
            tx.send_exported(0, &[&buffer]).unwrap();
            let mut received = rx.recv(Duration::from_secs(5)).unwrap();
            received.take_buffer::<Mem>(0).unwrap()
        };
        let (record, fd, _) = send().into_parts();
        let check = ctx
            .check_buffer_memory(&record, &fd)
            .map_err(|e| e.to_string());
        let vulkan = ExportableBuffer::import_received(&ctx, send())
            .map(drop)
            .map_err(|e| e.error.to_string());
        let cuda_import = cuda
            .import_received_buffer(send())
            .map(drop)
            .map_err(|e| e.error.to_string());
        println!(
            "{size:>9} bytes, dedicated {}: check {check:?}, Vulkan {vulkan:?}, CUDA {cuda_import:?}",
            buffer.info().dedicated()
        );
        if check.is_err() || vulkan.is_err() || cuda_import.is_err() {
            failures.push(size);
        }
    }
    assert!(
        failures.is_empty(),
        "refused honest buffers of {failures:?} bytes"
    );
}
