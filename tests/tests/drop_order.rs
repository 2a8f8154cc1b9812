//! Drop order: drops wait (bounded) for pending waits and copies and never
//! hang, foreign stream joins never block and leak nothing, and a pending
//! copy keeps a forgotten mapping, its import and the Vulkan buffer alive.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test drop_order --
//! --ignored --skip child_`. The others run everywhere (lavapipe, the fake
//! driver).
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

use cuda_interop::{drop_errors, CudaDevice, DeviceBuffer, HostWait, Stream, DROP_WAIT_LIMIT};
use cuda_interop_testkit::gpu::{pair, time};
use cuda_interop_testkit::{
    assert_no_validation_errors_except, fake, fds, pattern,
    IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE, TIMEOUT,
};
use vk_export::markers::DeviceLocal;
use vk_export::{ExportableBuffer, SubmitSync, TimelineSemaphore};

/// Case 42 (and the last-use rule for memory), against the fake driver with
/// enqueued work that takes 300 ms: dropping a semaphore with a pending wait,
/// and a mapping and import with a pending copy, waits for that work and
/// destroys afterwards (no stream busy at the destroy, no drop error); a
/// wait that never completes makes the semaphore's drop give up after
/// `DROP_WAIT_LIMIT`, leak it and say so: never a hang, never a destroy
/// under a pending wait.
#[test]
fn drops_wait_for_pending_waits_and_copies_and_never_hang() {
    let _fds = fds::lock();
    fake::run("child_fake_pending_work", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of drop_order.rs, with a fake libcuda: run by drops_wait_for_pending_waits_and_copies_and_never_hang"]
fn child_fake_pending_work() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let pending = Duration::from_millis(300);
    fake.set("latency_ms", pending.as_millis() as i64);
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: the driver is the fake: it records, holds the fds, reads nothing.
    let (semaphore, buffer) = unsafe {
        (
            cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()),
            cuda.import_buffer_fd(fake::buffer(false), fake::some_fd()),
        )
    };
    let (semaphore, mut buffer) = (
        semaphore.map_err(|e| e.error).unwrap(),
        buffer.map_err(|e| e.error).unwrap(),
    );
    let timed = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed()
    };
    semaphore.wait(&stream, 1).unwrap();
    let mut semaphore = Some(semaphore);
    let took = timed(&mut || drop(semaphore.take()));
    println!("semaphore with a 300 ms wait pending dropped in {took:?}");
    assert!(
        took >= pending - Duration::from_millis(50) && took < DROP_WAIT_LIMIT,
        "{took:?}"
    );
    assert_eq!(
        fake.last("cuDestroyExternalSemaphore").get("busy_streams"),
        "0"
    );

    let mut destination = DeviceBuffer::new(&cuda, 1000).unwrap();
    let took = {
        let mapped = buffer.map().unwrap();
        stream
            .copy_device(&mapped.slice(0, 1000).unwrap(), &mut destination)
            .unwrap();
        let mut mapped = Some(mapped);
        timed(&mut || drop(mapped.take()))
    };
    println!("mapping with a 300 ms copy pending dropped in {took:?}");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    drop(buffer);
    assert_eq!(
        fake.last("cuDestroyExternalMemory").get("busy_streams"),
        "0"
    );
    drop((destination, stream));
    assert_eq!(cuda_interop::drop_errors(), errors, "nothing leaked so far");

    // A wait that never completes.
    fake.set("latency_ms", -1);
    let stuck = Stream::new(&cuda).unwrap();
    // SAFETY: as above.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    semaphore.wait(&stuck, 1).unwrap();
    let destroyed = fake.calls("cuDestroyExternalSemaphore").len();
    let mut semaphore = Some(semaphore);
    let took = timed(&mut || drop(semaphore.take()));
    println!("semaphore with a wait that never completes dropped in {took:?}");
    assert!(
        took >= DROP_WAIT_LIMIT && took < DROP_WAIT_LIMIT + Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        cuda_interop::drop_errors(),
        errors + 1,
        "the leak is reported"
    );
    assert_eq!(
        fake.calls("cuDestroyExternalSemaphore").len(),
        destroyed,
        "not destroyed under its pending wait"
    );
    // The stream stays stuck for ever; its drop would leak it as well (on
    // the GPU: semaphore.rs,
    // a_wait_nobody_signals_times_out_and_every_drop_returns_within_its_bound).
    std::mem::forget(stuck);
}

/// Joining a foreign stream of another context of the device to a
/// semaphore wait or signal never blocks the host, whatever the GPU is
/// doing: the join's event is destroyed at once, pending or not, so a wait
/// nobody signals costs neither a bounded drop wait nor a leak. The foreign
/// stream really is ordered after the wait, and the signal after the
/// foreign stream's work.
#[test]
fn foreign_stream_joins_never_block_and_leak_nothing() {
    let _fds = fds::lock();
    fake::run("child_fake_foreign_streams", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of drop_order.rs, with a fake libcuda: run by foreign_stream_joins_never_block_and_leak_nothing"]
fn child_fake_foreign_streams() {
    let fake = fake::Fake::open();
    // Every stream counts as another context's: the join path.
    fake.set("streams_of_another_context", 1);
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let pending = Duration::from_millis(300);
    let (via, foreign) = (Stream::new(&cuda).unwrap(), Stream::new(&cuda).unwrap());
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    // Each join destroys its own event before it returns, pending or not.
    let destroyed = || fake.calls("cuEventDestroy");
    let before = destroyed().len();

    fake.set("latency_ms", pending.as_millis() as i64);
    let start = Instant::now();
    // SAFETY: `foreign` is a live stream of this device for the whole call.
    unsafe { semaphore.wait_raw_stream(foreign.raw(), 1, &via) }.unwrap();
    let took = start.elapsed();
    println!("wait joined to a foreign stream in {took:?}, the wait pending");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert!(!foreign.query().unwrap(), "the foreign stream waits too");
    assert_eq!(destroyed().len(), before + 1, "the join's event is gone");
    assert_eq!(destroyed()[before].get("pending"), "1");
    foreign.synchronize_with(HostWait::Poll, TIMEOUT).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(50));

    // The foreign stream's work orders the signal: a wait enqueued on it
    // keeps it busy, and the signal's stream must wait for that.
    semaphore.wait(&foreign, 1).unwrap();
    let start = Instant::now();
    // SAFETY: as above.
    unsafe { semaphore.signal_raw_stream(foreign.raw(), 2, &via) }.unwrap();
    let took = start.elapsed();
    println!("signal joined to a busy foreign stream in {took:?}");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert_eq!(fake.last("cuSignalExternalSemaphoresAsync").num("value"), 2);
    assert!(
        !via.query().unwrap(),
        "the signal waits for the foreign work"
    );
    assert_eq!(destroyed().len(), before + 2);
    via.synchronize_with(HostWait::Poll, TIMEOUT).unwrap();
    assert!(start.elapsed() >= pending - Duration::from_millis(100));

    // A wait that never completes: the join still returns at once, and
    // nothing is reported leaked (an `Event` dropped pending would wait up
    // to DROP_WAIT_LIMIT for the device, then leak).
    fake.set("latency_ms", -1);
    let (stuck_via, stuck_foreign) = (Stream::new(&cuda).unwrap(), Stream::new(&cuda).unwrap());
    let start = Instant::now();
    // SAFETY: as above.
    unsafe { semaphore.wait_raw_stream(stuck_foreign.raw(), 3, &stuck_via) }.unwrap();
    let took = start.elapsed();
    println!("wait joined behind a wait nobody signals in {took:?}");
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert_eq!(destroyed().len(), before + 3);
    assert_eq!(destroyed()[before + 2].get("pending"), "1");
    assert_eq!(cuda_interop::drop_errors(), errors, "nothing leaked");
    // The semaphore and both streams stay stuck for ever (their drops would
    // leak them, after DROP_WAIT_LIMIT); the process ends here.
    std::mem::forget((semaphore, stuck_via, stuck_foreign, via, foreign));
}

/// A foreign stream of the device's primary context (the runtime's,
/// PyTorch's, CuPy's) takes the semaphore wait and signal itself: one driver
/// call each on that stream, no join (no event made, waited for or
/// destroyed), the use tracked there (the semaphore's drop waits for it),
/// and the signal's value checks unchanged.
#[test]
fn primary_context_foreign_streams_take_the_semaphore_calls_themselves() {
    let _fds = fds::lock();
    fake::run("child_fake_primary_foreign_streams", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of drop_order.rs, with a fake libcuda: run by primary_context_foreign_streams_take_the_semaphore_calls_themselves"]
fn child_fake_primary_foreign_streams() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let (via, foreign) = (Stream::new(&cuda).unwrap(), Stream::new(&cuda).unwrap());
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let joins = || fake.calls("cuStreamWaitEvent").len() + fake.calls("cuEventDestroy").len();
    let before = joins();
    fake.set("latency_ms", 300);
    // SAFETY: `foreign` is a live stream of this device for the whole call.
    unsafe { semaphore.wait_raw_stream(foreign.raw(), 1, &via) }.unwrap();
    assert_eq!(fake.last("cuWaitExternalSemaphoresAsync").num("value"), 1);
    assert!(
        !foreign.query().unwrap(),
        "the wait is on the foreign stream"
    );
    assert!(via.query().unwrap(), "nothing went through `via`");
    assert_eq!(joins(), before, "no join");

    // SAFETY: as above.
    unsafe { semaphore.signal_raw_stream(foreign.raw(), 2, &via) }.unwrap();
    assert_eq!(fake.last("cuSignalExternalSemaphoresAsync").num("value"), 2);
    assert!(via.query().unwrap(), "nothing went through `via`");
    assert_eq!(joins(), before, "no join");
    assert_eq!(semaphore.last_signalled(), 2);
    // The value checks hold on this path too: nothing is enqueued.
    let signals = fake.calls("cuSignalExternalSemaphoresAsync").len();
    // SAFETY: as above.
    let again = unsafe { semaphore.signal_raw_stream(foreign.raw(), 2, &via) };
    assert!(
        matches!(again, Err(cuda_interop::Error::InvalidArgument(_))),
        "{again:?}"
    );
    assert_eq!(fake.calls("cuSignalExternalSemaphoresAsync").len(), signals);

    // The default stream handles (what the C ABI passes for a NULL
    // stream, CU_STREAM_LEGACY, and CU_STREAM_PER_THREAD) are the primary
    // context's: the direct path, no join, the same checks.
    let (legacy, per_thread) = (
        1usize as cuda_interop::sys::CUstream,
        2usize as cuda_interop::sys::CUstream,
    );
    // SAFETY: the default stream handles are valid for any call.
    unsafe { semaphore.wait_raw_stream(legacy, 2, &via) }.unwrap();
    assert_eq!(fake.last("cuWaitExternalSemaphoresAsync").num("value"), 2);
    // SAFETY: as above.
    unsafe { semaphore.signal_raw_stream(per_thread, 3, &via) }.unwrap();
    assert_eq!(fake.last("cuSignalExternalSemaphoresAsync").num("value"), 3);
    assert!(via.query().unwrap(), "nothing went through `via`");
    assert_eq!(joins(), before, "no join");

    // The uses were recorded on the foreign stream: the semaphore's drop
    // waits for them, and destroys it with no stream busy.
    drop(semaphore);
    assert_eq!(
        fake.last("cuDestroyExternalSemaphore").num("busy_streams"),
        0,
        "destroyed under the foreign stream's pending wait"
    );
    assert!(foreign.query().unwrap());
}

/// A device copy is only enqueued: the mapping it reads is forgotten, the
/// import and the Vulkan buffer are dropped while it is still pending, and
/// the import's drop waits for it (its last use), so nothing is freed under
/// the copy (compute-sanitizer memcheck reports no fault) and the
/// destination is exact.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test drop_order -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_pending_copy_keeps_a_forgotten_mapping_its_import_and_the_vulkan_buffer_alive() {
    let _fds = fds::lock();
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
