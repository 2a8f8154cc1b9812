//! Processes: exporters that exit first, importers that are killed,
//! producers that die, resources shared with a child process over a socket,
//! and CUDA in a forked child refused before any driver call. Each parent
//! test runs a `child_*` test of this binary in a process of its own.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test processes -- --ignored
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

use std::ffi::c_int;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cuda_interop::{CudaDevice, Error as CudaError, Stream};
use cuda_interop_testkit::gpu::{pair, time};
use cuda_interop_testkit::{
    assert_no_validation_errors, assert_no_validation_errors_except, child, fake, fds,
    open_fd_count, pattern, vulkan, Image, Mem, IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE,
    TIMEOUT,
};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::socket::Connection;
use vk_export::{
    ExportableBuffer, ExportableImage, ImageDesc, SharedLayout, SubmitSync, TimelineSemaphore,
    WaitStrategy,
};

/// Case 25 (two processes): the exporting process sends its image and
/// buffer and exits before the importer even receives them; the importer
/// then imports and reads exactly what the exporter wrote and released.
#[test]
fn an_exporter_process_that_exits_first_leaves_its_payload_readable() {
    let _fds = fds::lock();
    let (mine, theirs, env) = child::socket_env_for_child();
    let stdout = child::run_with_os(
        "child_exporter_that_exits_after_sending",
        &[env],
        Some(theirs),
    );
    assert!(stdout.contains("sent and exits"), "{stdout}");
    // The exporter is gone: its device, image and buffer were destroyed when
    // its process ended. Only the fds in flight in the socket remain.
    let ctx = vulkan(None);
    let mut received = mine.recv(TIMEOUT).unwrap();
    let image = Image::import_received(
        &ctx,
        received
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    let buffer = ExportableBuffer::import_received(&ctx, received.take_buffer::<Mem>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    // SAFETY: the exporter released the image in GENERAL before sending it.
    unsafe { ctx.assume_image_released(&image, SharedLayout::General) }.unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == pattern(30 * 20 * 4, 250));
    assert_eq!(
        ctx.read_buffer(&buffer, 8192, SubmitSync::new()).unwrap(),
        pattern(8192, 251)
    );
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of a child process of processes.rs: run by an_exporter_process_that_exits_first_leaves_its_payload_readable"]
fn child_exporter_that_exits_after_sending() {
    let connection = child::inherited_connection();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(30, 20)).unwrap();
    ctx.write_image(&image, 0, 0, &pattern(30 * 20 * 4, 250), SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 8192).unwrap();
    ctx.write_buffer(&buffer, &pattern(8192, 251), SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    connection.send_exported(25, &[&image, &buffer]).unwrap();
    assert_no_validation_errors(&ctx);
    println!("exporter {} sent and exits", std::process::id());
}

/// Case 27 (the Vulkan side): an importing process is SIGKILLed while it
/// holds imports of this process's image and buffer; the exporter keeps
/// using both (writes and reads back exactly), drops them cleanly, and its
/// fd count is back at its baseline. (That the GPU memory is freed when the
/// last reference dies is
/// [`a_killed_importer_frees_its_share_and_leaves_the_exporter_working`].)
#[test]
fn a_killed_importer_process_leaves_the_exporter_working() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let image = Image::new(&ctx, ImageDesc::new_2d(32, 32)).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    ctx.write_image(&image, 0, 0, &pattern(32 * 32 * 4, 27), SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    ctx.write_buffer(&buffer, &pattern(4096, 270), SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
    let baseline = open_fd_count();
    let (mine, theirs, env) = child::socket_env_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_importer_that_is_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env.0, env.1)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(theirs);
    mine.send_exported(27, &[&image, &buffer]).unwrap();
    // Wait (bounded) until the child says it holds both imports.
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
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("IMPORTED ") => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the importer never reported its imports ({:?}); it said: {seen:?}",
                    child.wait()
                );
            }
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    reader.join().unwrap();
    println!("importer killed while holding the imports: {status}");
    drop(mine);
    // The exporter is unaffected.
    let again = pattern(32 * 32 * 4, 2727);
    ctx.write_image(&image, 0, 0, &again, SubmitSync::new())
        .unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == again);
    assert_eq!(
        ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
        pattern(4096, 270)
    );
    assert_eq!(open_fd_count(), baseline, "fd count back at baseline");
    drop((image, buffer));
    assert_eq!(vk_export::drop_errors(), 0);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of a child process of processes.rs: run by a_killed_importer_process_leaves_the_exporter_working"]
fn child_importer_that_is_killed() {
    let connection = child::inherited_connection();
    let ctx = vulkan(None);
    let mut received = connection.recv(TIMEOUT).unwrap();
    let image = Image::import_received(
        &ctx,
        received
            .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
            .unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    let buffer = ExportableBuffer::import_received(&ctx, received.take_buffer::<Mem>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    // SAFETY: the parent released the image in GENERAL before sending it.
    unsafe { ctx.assume_image_released(&image, SharedLayout::General) }.unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == pattern(32 * 32 * 4, 27));
    assert_eq!(
        ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
        pattern(4096, 270)
    );
    println!("IMPORTED {}", std::process::id());
    std::thread::sleep(Duration::from_secs(60));
}

/// Case 46, against the fake driver: after `fork()`, a child that calls the
/// crate (a new device, a call on the parent's device, a stream) gets
/// `ForkedChild` naming both pids, before any driver call; the parent
/// carries on.
#[test]
fn cuda_in_a_forked_child_is_refused_before_any_driver_call() {
    let _fds = fds::lock();
    fake::run("child_fake_forked", fake::Variant::Full);
}

extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(status: c_int) -> !;
}

/// What the forked child checks; its exit status (0: every call refused).
fn forked_child_checks(cuda: &CudaDevice, parent: u32) -> c_int {
    let me = std::process::id();
    let refused = |e: &CudaError| matches!(e, CudaError::ForkedChild { parent: p, child: c } if *p == parent && *c == me);
    if !matches!(CudaDevice::for_uuid(fake::UUID), Err(ref e) if refused(e)) {
        return 1;
    }
    if !matches!(cuda.memory_info(), Err(ref e) if refused(e)) {
        return 2;
    }
    if !matches!(Stream::new(cuda), Err(ref e) if refused(e)) {
        return 3;
    }
    0
}

#[test]
#[ignore = "entry point of a child process of processes.rs, with a fake libcuda: run by cuda_in_a_forked_child_is_refused_before_any_driver_call"]
fn child_fake_forked() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    cuda.memory_info().unwrap();
    let parent = std::process::id();
    // SAFETY: fork in a process with other threads (the test harness's):
    // the child runs only `forked_child_checks`, whose calls all stop at the
    // crate's fork check (a pid comparison and atomic loads; the error
    // values allocate nothing), and leaves with `_exit`, running nothing of
    // the parent's (no destructors, no atexit handlers, no buffer flushes).
    let pid = unsafe { fork() };
    if pid == 0 {
        let status = forked_child_checks(&cuda, parent);
        // SAFETY: ends the forked child at once, as above.
        unsafe { _exit(status) }
    }
    assert!(pid > 0, "fork failed");
    let mut status: c_int = -1;
    // SAFETY: waits for the child forked above; writes one int.
    let waited = unsafe { waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert_eq!(
        status, 0,
        "the forked child's status (exit code 1, 2 or 3 names the call that was not refused)"
    );
    // The parent is unaffected.
    cuda.memory_info().unwrap();
    let _ = fake;
    println!("forked child {pid}: every call refused with ForkedChild");
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test processes -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn two_processes_export_and_import_into_cuda() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let (w, h) = (128u32, 64u32);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    ctx.write_image(
        &image,
        0,
        0,
        &pattern((w * h * 4) as usize, 1234),
        SubmitSync::new(),
    )
    .unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    ctx.release_image(&image, SubmitSync::new().signal_timeline(&timeline, 1))
        .unwrap();
    // The child inherits its end of the socket.
    let (parent, child_fd, number) = child::socket_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cuda_importer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(child::CHILD_SOCKET_ENV, &number)
        .spawn()
        .unwrap();
    drop(child_fd);
    parent.send_exported(1, &[&image, &timeline]).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the importing child failed: {status}");
    // The child signalled 2 after it read the image.
    assert_eq!(timeline.value().unwrap(), 2);
    assert_no_validation_errors(&ctx);
}

#[test]
#[ignore = "entry point of the child process of two_processes_export_and_import_into_cuda"]
fn child_cuda_importer() {
    let connection = child::inherited_connection();
    let mut received = connection.recv(TIMEOUT).unwrap();
    let image_bundle = received
        .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
        .unwrap();
    let semaphore_bundle = received
        .take_semaphore::<vk_export::semaphore_kinds::Timeline>(1)
        .unwrap();
    let record = image_bundle.record().info().clone();
    // The receiver's own Vulkan device on the same GPU verifies the records.
    let ctx = vulkan(Some(record.device_uuid()));
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let (w, h) = (record.extent()[0], record.extent()[1]);
    let imported = cuda
        .import_received_image(image_bundle)
        .map_err(|e| e.error)
        .unwrap();
    let semaphore = cuda
        .import_received_semaphore(semaphore_bundle)
        .map_err(|e| e.error)
        .unwrap();
    let stream = Stream::new(&cuda).unwrap();
    semaphore.wait(&stream, 1).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let mut out = vec![0u8; level.byte_len().unwrap()];
    level.copy_to_host(&stream, &mut out).unwrap();
    assert!(
        out == pattern((w * h * 4) as usize, 1234),
        "the child read different pixels"
    );
    semaphore.signal(&stream, 2).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    println!(
        "child {}: imported {w}x{h} RGBA8 into CUDA from another process, exact",
        std::process::id()
    );
}

/// A producer process dies (SIGKILL) while this consumer waits for its next
/// frame, on a CUDA stream and on the host: both waits return `Timeout`
/// within their bound; once the consumer unblocks its own stream (a host
/// signal of its imported timeline) and drops everything, its fd count and
/// free GPU memory are back at their baselines.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test processes -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_killed_producer_leaves_the_consumer_with_bounded_waits_and_no_leak() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let stream_warmup = Stream::new(&cuda).unwrap();
    drop(stream_warmup);
    let fds_before = open_fd_count();
    let (free_before, _) = cuda.memory_info().unwrap();
    let (consumer, producer_fd, number) = child::socket_for_child();
    let mut producer = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_producer_that_dies",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(child::CHILD_SOCKET_ENV, &number)
        .spawn()
        .unwrap();
    drop(producer_fd);
    let mut received = consumer.recv(Duration::from_secs(30)).unwrap();
    let image = cuda
        .import_received_image(
            received
                .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
                .unwrap(),
        )
        .map_err(|e| e.error)
        .unwrap();
    let cuda_timeline = cuda
        .import_received_semaphore(received.take_semaphore::<vk_export::Timeline>(1).unwrap())
        .map_err(|e| e.error)
        .unwrap();
    let vk_timeline = TimelineSemaphore::import_received(
        &ctx,
        received.take_semaphore::<vk_export::Timeline>(2).unwrap(),
    )
    .map_err(|e| e.error)
    .unwrap();
    drop(received);
    producer.kill().unwrap();
    let status = producer.wait().unwrap();
    println!("producer killed: {status}");
    let bound = Duration::from_millis(300);
    let stream = Stream::new(&cuda).unwrap();
    cuda_timeline.wait(&stream, 5).unwrap();
    let array = image.map_array().unwrap();
    let start = Instant::now();
    let err = stream.synchronize(bound).unwrap_err();
    let cuda_took = start.elapsed();
    assert!(matches!(err, CudaError::Timeout(_)), "{err}");
    let start = Instant::now();
    let err = vk_timeline
        .wait(5, bound, WaitStrategy::ADAPTIVE)
        .unwrap_err();
    let vk_took = start.elapsed();
    assert!(matches!(err, vk_export::Error::Timeout(_)), "{err}");
    assert!(
        cuda_took < bound * 2 && vk_took < bound * 2,
        "{cuda_took:?} {vk_took:?}"
    );
    println!("producer dead: CUDA stream wait Timeout after {cuda_took:?}, Vulkan host wait Timeout after {vk_took:?}");
    // The consumer owns its imports: it signals its own timeline to release
    // the stuck stream, then drops everything, each drop timed.
    vk_timeline.signal(5).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    let drops = [
        ("array", time(|| drop(array))),
        ("stream", time(|| drop(stream))),
        ("CUDA semaphore", time(|| drop(cuda_timeline))),
        ("Vulkan semaphore", time(|| drop(vk_timeline))),
        ("image import", time(|| drop(image))),
        ("socket", time(|| drop(consumer))),
    ];
    for (what, took) in drops {
        println!("drop {what}: {took:?}");
        assert!(took < Duration::from_secs(1), "{what} took {took:?}");
    }
    let fds_after = open_fd_count();
    let (free_after, _) = cuda.memory_info().unwrap();
    println!("fds {fds_before} -> {fds_after}; free GPU memory {free_before} -> {free_after}");
    assert_eq!(
        fds_after, fds_before,
        "the consumer's fd count is back at baseline"
    );
    assert!(
        free_after + (2 << 20) >= free_before,
        "free GPU memory back within 2 MiB: {free_before} -> {free_after}"
    );
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// Issue 18 item 9: after a dead exporter, an importer that dropped every
/// import, socket and pipe had one fd more than before (26 -> 27, its
/// Context alive). With no warm-up at all, three cycles of the killed
/// producer above (receive, import into CUDA and Vulkan, wait, kill, drop
/// everything): whatever the first cycle adds must be an fd the driver opens
/// once and keeps (printed with its target), and the second and third
/// cycles add nothing: a leak would grow with every cycle.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test processes -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn fds_after_dead_exporters_grow_once_not_per_cycle() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let cuda = CudaDevice::for_vulkan(&ctx).unwrap();
    let before = fds::fd_table();
    let mut after_each = Vec::new();
    for cycle in 1..=3 {
        let (consumer, producer_fd, number) = child::socket_for_child();
        let mut producer = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_producer_that_dies",
                "--ignored",
                "--test-threads=1",
            ])
            .env(child::CHILD_SOCKET_ENV, &number)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        drop(producer_fd);
        let mut received = consumer.recv(Duration::from_secs(30)).unwrap();
        let image = cuda
            .import_received_image(
                received
                    .take_image::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>(0)
                    .unwrap(),
            )
            .map_err(|e| e.error)
            .unwrap();
        let cuda_timeline = cuda
            .import_received_semaphore(received.take_semaphore::<vk_export::Timeline>(1).unwrap())
            .map_err(|e| e.error)
            .unwrap();
        let vk_timeline = TimelineSemaphore::import_received(
            &ctx,
            received.take_semaphore::<vk_export::Timeline>(2).unwrap(),
        )
        .map_err(|e| e.error)
        .unwrap();
        drop(received);
        producer.kill().unwrap();
        producer.wait().unwrap();
        let stream = Stream::new(&cuda).unwrap();
        cuda_timeline.wait(&stream, 5).unwrap();
        let array = image.map_array().unwrap();
        vk_timeline.signal(5).unwrap();
        stream.synchronize(TIMEOUT).unwrap();
        drop(array);
        drop((stream, cuda_timeline, vk_timeline, image, consumer));
        let now = fds::fd_table();
        let added: Vec<_> = now
            .iter()
            .filter(|(n, t)| before.get(n) != Some(t))
            .collect();
        let gone: Vec<_> = before
            .iter()
            .filter(|(n, t)| now.get(n) != Some(t))
            .collect();
        println!(
            "after cycle {cycle}: {} fds ({} before); added {added:?}; gone {gone:?}",
            now.len(),
            before.len()
        );
        after_each.push(now);
    }
    assert_eq!(
        after_each[1], after_each[0],
        "the second cycle adds or closes no fd: the first cycle's extra fds (if any) are opened once"
    );
    assert_eq!(after_each[2], after_each[0], "nor does the third");
    assert_no_validation_errors_except(&ctx, &[IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE]);
}

/// Entry point of the producer process above: exports an image and a
/// timeline (twice: one fd for CUDA, one for Vulkan), sends them, then
/// waits to be killed.
#[test]
#[ignore = "entry point of the child process of a_killed_producer_leaves_the_consumer_with_bounded_waits_and_no_leak"]
fn child_producer_that_dies() {
    let connection = child::inherited_connection();
    let ctx = vulkan(None);
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(640, 480)).unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    connection
        .send_exported(9, &[&image, &timeline, &timeline])
        .unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

/// Case 27: an importing process (its own Vulkan device and CUDA context,
/// a mapped import of this process's 64 MiB buffer) is SIGKILLed. The
/// exporter keeps reading its buffer exactly; free GPU memory comes back to
/// what it was with the buffer alive once the importer's context is gone,
/// and to the baseline once the exporter drops the buffer (the payload is
/// freed with its last reference).
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test processes -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn a_killed_importer_frees_its_share_and_leaves_the_exporter_working() {
    let _fds = fds::lock();
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
    let (mine, theirs, number) = child::socket_for_child();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cuda_importer_that_is_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(child::CHILD_SOCKET_ENV, number)
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
    let connection = child::inherited_connection();
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

/// Fills an image, sends it to a child process over a socket; the child
/// imports it into its own Vulkan device and checks every byte.
#[test]
fn image_and_buffer_shared_with_a_child_process_over_a_socket() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    let image =
        ExportableImage::<Rgba8Unorm, Optimal, Mem>::new(&ctx, ImageDesc::new_2d(40, 30)).unwrap();
    ctx.write_image(&image, 0, 0, &pattern(40 * 30 * 4, 99), SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 4096).unwrap();
    ctx.write_buffer(&buffer, &pattern(4096, 100), SubmitSync::new())
        .unwrap();
    ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();

    let dir = std::env::temp_dir().join(format!("vk-export-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let _ = std::fs::remove_file(&path);
    let listener = vk_export::socket::Listener::bind(&path).unwrap();
    let mode = std::fs::metadata(&path)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .unwrap();
    assert_eq!(mode & 0o777, 0o600, "the socket is private to its owner");

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_importer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VK_EXPORT_TEST_SOCKET", &path)
        .spawn()
        .unwrap();
    let connection = match listener.accept(TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            let _ = child.kill();
            panic!(
                "the child never connected ({e}); its status: {:?}",
                child.wait()
            );
        }
    };
    connection.send_exported(42, &[&image, &buffer]).unwrap();
    let status = child.wait().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(status.success(), "the child process failed: {status}");
    assert_no_validation_errors(&ctx);
}

/// Entry point of the child process above; not a test of its own.
#[test]
#[ignore = "run by image_and_buffer_shared_with_a_child_process_over_a_socket in a child process"]
fn child_process_importer() {
    let path = std::env::var_os("VK_EXPORT_TEST_SOCKET").expect("started by the parent test");
    let ctx = vulkan(None);
    let connection = Connection::connect(path).unwrap();
    let mut received = connection.recv(TIMEOUT).unwrap();
    assert_eq!(received.message().tag, 42);
    let bundle = received
        .take_image::<Rgba8Unorm, Optimal, Mem, usage::Storage>(0)
        .unwrap();
    let image = Image::import_received(&ctx, bundle).unwrap();
    // SAFETY: the parent released the image in GENERAL before sending it.
    unsafe { ctx.assume_image_released(&image, SharedLayout::General) }.unwrap();
    let pixels = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
    assert!(
        pixels == pattern(40 * 30 * 4, 99),
        "image pixels differ in the child"
    );
    let bundle = received.take_buffer::<Mem>(1).unwrap();
    let buffer = ExportableBuffer::import_received(&ctx, bundle).unwrap();
    assert_eq!(
        ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
        pattern(4096, 100)
    );
    assert_no_validation_errors(&ctx);
    println!("child {}: image and buffer verified", std::process::id());
}
