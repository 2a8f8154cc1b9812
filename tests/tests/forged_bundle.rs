//! Issue 18 item 2: a bundle is only as honest as its sender, and a receiver
//! cannot know who sent it (any process of an allowed user can `sendmsg` any
//! record with any fd). A record that claims more memory than its fd holds
//! never becomes a usable import, and the caller keeps its fd:
//!
//! * Vulkan: the importing driver refuses it (`vkAllocateMemory` with the
//!   record's size). Only the driver knows the real size: run-time tests,
//!   lavapipe in CI, the H200 in the GPU bundle.
//! * CUDA: `cuImportExternalMemory` accepts it (H200, driver 580), so the
//!   receive path maps the record's whole size right after the import and
//!   undoes the import when the driver refuses the mapping. Shown here with
//!   the fake driver (which refuses such mappings as the H200's does) and on
//!   the H200.

use std::os::fd::AsFd;
use std::time::Duration;

use cuda_interop::CudaDevice;
use cuda_interop_testkit::{fake, fds, vulkan};
use vk_export::socket::Connection;
use vk_export::wire::{Message, Resource};
use vk_export::{Error, ExportableBuffer};

#[cfg(not(feature = "device-local"))]
type Mem = vk_export::markers::HostVisible;
#[cfg(feature = "device-local")]
type Mem = vk_export::markers::DeviceLocal;

/// Sends `record_of`'s record with a fresh export of `memory_of`'s fd, as a
/// dishonest peer would, and receives it.
fn forged(
    record_of: &ExportableBuffer<Mem>,
    memory_of: &ExportableBuffer<Mem>,
) -> vk_export::ReceivedBuffer<Mem> {
    let (tx, rx) = Connection::pair().unwrap();
    let message = Message {
        tag: 0,
        resources: vec![Resource::Buffer(record_of.info().clone())],
    };
    // SAFETY: deliberately dishonest (the point of these tests): every
    // receiver below must refuse the pair before anything reads or writes
    // the memory.
    unsafe { tx.send(&message, vec![memory_of.export_fd().unwrap()]) }.unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    received.take_buffer::<Mem>(0).unwrap()
}

/// `buffer`'s own record and a fresh export of its fd, received.
fn honest(buffer: &ExportableBuffer<Mem>) -> vk_export::ReceivedBuffer<Mem> {
    let (tx, rx) = Connection::pair().unwrap();
    tx.send_exported(1, &[buffer]).unwrap();
    let mut received = rx.recv(Duration::from_secs(5)).unwrap();
    received.take_buffer::<Mem>(0).unwrap()
}

#[test]
fn a_record_larger_than_its_memory_is_refused_by_the_importing_vulkan_driver() {
    let ctx = vulkan(None);
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let large = ExportableBuffer::<Mem>::new(&ctx, 64 << 20).unwrap();
    let e = match ExportableBuffer::import_received(&ctx, forged(&large, &small)) {
        Ok(_) => panic!(
            "{}: a 64 MiB record over a 4 KiB allocation was imported",
            ctx.identity().name
        ),
        Err(e) => e,
    };
    println!("{}: refused: {}", ctx.identity().name, e.error);
    assert!(matches!(e.error, Error::Vulkan { .. }), "{}", e.error);
    assert!(
        rustix::io::fcntl_getfd(e.fd.as_fd()).is_ok(),
        "the fd came back open"
    );
    // The forged import itself is an application error the layer may
    // report; the honest pairs below must add none.
    let after_forged = ctx.validation_errors();
    println!("validation errors from the forged import: {after_forged}");
    ExportableBuffer::import_received(&ctx, honest(&small)).unwrap();
    ExportableBuffer::import_received(&ctx, honest(&large)).unwrap();
    assert_eq!(ctx.validation_errors(), after_forged);
}

/// The CUDA receive path's size probe, against the fake driver: a fake whose
/// allocations are 4 KiB accepts the import of a 64 MiB record, refuses the
/// probe's mapping, and the receive path undoes the import and hands the
/// fd back; an honest record passes, with one mapping made and freed.
#[test]
fn the_cuda_receive_path_refuses_a_record_larger_than_its_memory() {
    let _fds = fds::lock();
    fake::run("child_fake_size_probe", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of forged_bundle.rs, with a fake libcuda: run by the_cuda_receive_path_refuses_a_record_larger_than_its_memory"]
fn child_fake_size_probe() {
    let fake = fake::Fake::open();
    let ctx = vulkan(None);
    // The fake's one device gets the Vulkan device's UUID, so that the
    // receive path can verify records on it.
    fake.set_devices(&[ctx.identity().device_uuid]);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let large = ExportableBuffer::<Mem>::new(&ctx, 64 << 20).unwrap();
    let count = |call: &str| fake.calls(call).len();
    let (imports, maps, destroys, frees) = (
        count("cuImportExternalMemory"),
        count("cuExternalMemoryGetMappedBuffer"),
        count("cuDestroyExternalMemory"),
        count("cuMemFree"),
    );
    fake.set("alloc_size", 4096);
    let e = cuda
        .import_received_buffer(forged(&large, &small))
        .unwrap_err();
    println!("refused: {}", e.error);
    assert!(
        matches!(&e.error, cuda_interop::Error::InvalidArgument(m) if m.contains("smaller")),
        "{}",
        e.error
    );
    assert!(
        rustix::io::fcntl_getfd(e.fd.as_fd()).is_ok(),
        "the fd came back open"
    );
    assert_eq!(count("cuImportExternalMemory"), imports + 1);
    assert_eq!(count("cuExternalMemoryGetMappedBuffer"), maps + 1);
    assert_eq!(
        count("cuDestroyExternalMemory"),
        destroys + 1,
        "the import was undone"
    );
    // The honest record of a buffer as large as the fake's allocations.
    let imported = cuda.import_received_buffer(honest(&small)).unwrap();
    assert_eq!(count("cuExternalMemoryGetMappedBuffer"), maps + 2);
    assert_eq!(
        count("cuMemFree"),
        frees + 1,
        "the probe's mapping was freed"
    );
    drop(imported);
    fake.set("alloc_size", 0);
}

/// The same forged bundle on the H200's driver, through the CUDA receive
/// path; then honest bundles of several sizes (dedicated or not) through
/// the Vulkan and the CUDA receive paths.
#[test]
#[ignore = "needs an NVIDIA GPU: run by the GPU bundle"]
fn on_the_gpu_a_forged_bundle_never_becomes_a_cuda_import_and_honest_ones_do() {
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let small = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    let large = ExportableBuffer::<Mem>::new(&ctx, 64 << 20).unwrap();
    let e = cuda
        .import_received_buffer(forged(&large, &small))
        .unwrap_err();
    println!("CUDA receive path: {}", e.error);
    assert!(
        matches!(&e.error, cuda_interop::Error::InvalidArgument(m) if m.contains("smaller")),
        "{}",
        e.error
    );
    assert!(rustix::io::fcntl_getfd(e.fd.as_fd()).is_ok());
    let mut imported = cuda.import_received_buffer(honest(&large)).unwrap();
    imported.map().unwrap();
    drop(imported);
    let mut failures = Vec::new();
    for size in [4096u64, 1 << 20, 16 << 20, 64 << 20] {
        let buffer = ExportableBuffer::<Mem>::new(&ctx, size).unwrap();
        let vulkan = ExportableBuffer::import_received(&ctx, honest(&buffer))
            .map(drop)
            .map_err(|e| e.error.to_string());
        let cuda_import = cuda
            .import_received_buffer(honest(&buffer))
            .map(drop)
            .map_err(|e| e.error.to_string());
        println!(
            "{size:>9} bytes, dedicated {}: Vulkan {vulkan:?}, CUDA {cuda_import:?}",
            buffer.info().dedicated()
        );
        if vulkan.is_err() || cuda_import.is_err() {
            failures.push(size);
        }
    }
    assert!(
        failures.is_empty(),
        "refused honest buffers of {failures:?} bytes"
    );
}
