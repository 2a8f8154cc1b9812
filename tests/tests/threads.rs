//! Many threads (issue 22, item 3): 16 threads sharing one Vulkan
//! `Context` (lavapipe, validation layer on: core, thread safety,
//! synchronization) and 16 threads sharing one `CudaDevice` (the testkit's
//! fake `libcuda.so.1`), each creating, exporting, sending, receiving,
//! importing, writing, reading, signalling, waiting and dropping at once.
//! Zero validation errors, every byte read back exactly, the fd table
//! exactly as before, the fake's live objects back to none, and the
//! resident memory of the second half no larger than after the first half
//! plus a margin far below what a per-iteration leak would add.
//!
//! The operation counts are printed (`ops` below: one per crate call). The
//! figures are scaled for CI (2 cores, about a minute for the binary):
//! [`VULKAN_ITERATIONS`] and [`CUDA_ITERATIONS`] per thread.
//!
//! Each body runs in a `child_*` process of its own, so that the fd table
//! and the resident memory are this workload's alone; the child is bounded
//! by the runner (killed after 120 s). `child_*` tests are entry points of
//! child processes, run by their parent test of this binary by exact name
//! (`cuda_interop_testkit::child`); they fail when run by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;

use cuda_interop::{CudaDevice, Stream};
use cuda_interop_testkit::fds::fd_table;
use cuda_interop_testkit::{
    assert_no_validation_errors, child, fake, fds, pattern, vulkan, Mem, TIMEOUT,
};
use vk_export::markers::DeviceLocal;
use vk_export::socket::Connection;
use vk_export::wire::Message;
use vk_export::{Context, ExportableBuffer, SubmitSync, TimelineSemaphore, WaitStrategy};

const THREADS: usize = 16;
/// Per thread, each of 8 operations (two halves of this many / 2).
const VULKAN_ITERATIONS: u64 = 600;
/// Per thread, each of 11 operations.
const CUDA_ITERATIONS: u64 = 500;

/// Resident memory of this process in bytes (`/proc/self/statm`).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Runs `half` twice on `THREADS` threads started together; checks the fd
/// table is back after each half and the second half's memory growth stays
/// under `margin`. Returns the operation count.
fn two_halves(name: &str, margin: u64, half: impl Fn(usize, u64, &AtomicU64) + Sync) -> u64 {
    let ops = AtomicU64::new(0);
    let mut marks = Vec::new();
    let before = fd_table();
    for round in 0..2u64 {
        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (start, ops, half) = (&start, &ops, &half);
                s.spawn(move || {
                    start.wait();
                    half(t, round, ops);
                });
            }
        });
        assert_eq!(fd_table(), before, "{name}, half {round}: fds back");
        marks.push(resident());
    }
    let ops = ops.load(Ordering::Relaxed);
    println!(
        "{name}: {ops} operations on {THREADS} threads; fds {} before and after; resident memory \
         {} KiB after the first half, {} KiB after the second",
        before.len(),
        marks[0] / 1024,
        marks[1] / 1024
    );
    assert!(
        marks[1] <= marks[0] + margin,
        "{name}: the second half grew resident memory by {} KiB",
        (marks[1] - marks[0]) / 1024
    );
    ops
}

/// 16 threads on one Vulkan `Context`: each, per iteration, creates an
/// exportable buffer, writes it with a submission that signals its
/// timeline, waits for the value on the host, sends the buffer over its
/// socket (a fresh export), receives it, imports it into the same context,
/// reads it back exactly through the import, and drops both. Zero
/// validation errors (thread safety and synchronization validation on).
#[test]
fn sixteen_threads_share_one_vulkan_context() {
    let _fds = fds::lock();
    let out = child::run_marked("child_vulkan_threads", "CUDA_INTEROP_CHILD_VULKAN_THREADS");
    assert!(out.contains("operations on 16 threads"), "{out}");
}

#[test]
#[ignore = "entry point of a child process of threads.rs: run by sixteen_threads_share_one_vulkan_context"]
fn child_vulkan_threads() {
    child::started_as_child("CUDA_INTEROP_CHILD_VULKAN_THREADS");
    let ctx = vulkan(None);
    assert!(ctx.validation_enabled(), "the layer is on");
    // Warm-up: the first submissions and imports allocate pools for good.
    vulkan_iterations(&ctx, 0, 0, 4, &AtomicU64::new(0));
    let ops = two_halves("Vulkan", 16 << 20, |t, round, ops| {
        vulkan_iterations(&ctx, t, round, VULKAN_ITERATIONS / 2, ops)
    });
    assert_eq!(ops, THREADS as u64 * VULKAN_ITERATIONS * 8);
    assert_no_validation_errors(&ctx);
}

fn vulkan_iterations(ctx: &Context, t: usize, round: u64, n: u64, ops: &AtomicU64) {
    let timeline = TimelineSemaphore::new_local(ctx).unwrap();
    let (tx, rx) = Connection::pair().unwrap();
    for i in 0..n {
        let buffer = ExportableBuffer::<Mem>::new(ctx, 4096).unwrap();
        let data = pattern(4096, (t as u32) << 16 | (round as u32) << 12 | i as u32);
        ctx.write_buffer(
            &buffer,
            &data,
            SubmitSync::new().signal_timeline(&timeline, i + 1),
        )
        .unwrap();
        timeline.wait(i + 1, TIMEOUT, WaitStrategy::Block).unwrap();
        tx.send_exported(i, &[&buffer]).unwrap();
        let mut received = rx.recv(TIMEOUT).unwrap();
        assert_eq!(received.message().tag, i);
        let bundle = received.take_buffer::<Mem>(0).unwrap();
        let imported = ExportableBuffer::<Mem>::import_received(ctx, bundle)
            .map_err(|e| e.error)
            .unwrap();
        let back = ctx.read_buffer(&imported, 4096, SubmitSync::new()).unwrap();
        assert!(back == data, "thread {t}, iteration {i}: the bytes differ");
        drop((imported, received, buffer));
        // create, write, wait, export+send, recv, import, read, drop
        ops.fetch_add(8, Ordering::Relaxed);
    }
}

/// 16 threads on one `CudaDevice` (the fake driver): each, per iteration,
/// receives a buffer record with an fd from its socket, imports it, maps
/// it, copies to and from it, imports a timeline semaphore, signals and
/// waits on it on its stream, synchronizes, and drops everything. Every
/// byte read back exactly; the fake counts no live object afterwards.
#[test]
fn sixteen_threads_share_one_cuda_device() {
    let _fds = fds::lock();
    let out = fake::run("child_fake_threads", fake::Variant::Full);
    assert!(out.contains("operations on 16 threads"), "{out}");
}

#[test]
#[ignore = "entry point of a child process of threads.rs, with a fake libcuda: run by sixteen_threads_share_one_cuda_device"]
fn child_fake_threads() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    cuda_iterations(&cuda, 0, 0, 4, &AtomicU64::new(0));
    let ops = two_halves("CUDA (fake driver)", 16 << 20, |t, round, ops| {
        cuda_iterations(&cuda, t, round, CUDA_ITERATIONS / 2, ops)
    });
    assert_eq!(ops, THREADS as u64 * CUDA_ITERATIONS * 11);
    drop(cuda);
    assert_eq!(fake.all_live(), [], "everything destroyed");
}

fn cuda_iterations(cuda: &CudaDevice, t: usize, round: u64, n: u64, ops: &AtomicU64) {
    let stream = Stream::new(cuda).unwrap();
    let (tx, rx) = Connection::pair().unwrap();
    let record = vk_export::wire::Resource::Buffer(fake::buffer(false).into_info());
    for i in 0..n {
        let message = Message {
            tag: i,
            resources: vec![record.clone()],
        };
        // SAFETY: the receiver imports into the fake driver, which holds
        // the fd and reads nothing; the memfd stands for the export.
        unsafe { tx.send(&message, vec![fake::some_fd()]) }.unwrap();
        let mut received = rx.recv(TIMEOUT).unwrap();
        let (record, fd, _) = received.take_buffer::<DeviceLocal>(0).unwrap().into_parts();
        // SAFETY: the fake holds the fd and reads nothing (a received
        // record is verified on a Vulkan device first, which the fake has
        // not: the unsafe import is the one a fake can take).
        let mut imported = unsafe { cuda.import_buffer_fd(record, fd) }
            .map_err(|e| e.error)
            .unwrap();
        let mapped = imported.map().unwrap();
        let data = pattern(
            mapped.len() as usize,
            (t as u32) << 16 | (round as u32) << 12 | i as u32,
        );
        mapped.copy_from_host(&stream, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        mapped.copy_to_host(&stream, &mut back).unwrap();
        assert!(back == data, "thread {t}, iteration {i}: the bytes differ");
        // SAFETY: the fake holds the fd and reads nothing.
        let timeline = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
            .map_err(|e| e.error)
            .unwrap();
        timeline.signal(&stream, 1).unwrap();
        timeline.wait(&stream, 1).unwrap();
        stream.synchronize(TIMEOUT).unwrap();
        drop(mapped);
        drop((imported, timeline, received));
        // send, recv, import, map, copy in, copy out, import semaphore,
        // signal, wait, synchronize, drop
        ops.fetch_add(11, Ordering::Relaxed);
    }
}
