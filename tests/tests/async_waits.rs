//! Async waits (the `tokio` features): socket receives and accepts, Vulkan
//! timeline waits and CUDA completions as futures complete, time out with
//! typed errors, and leave nothing behind when dropped unfinished: no fd, no
//! reactor registration, no message or connection taken from the socket.
//!
//! The socket and timeline tests run everywhere (lavapipe has timelines,
//! local ones). The completion tests run against the testkit's fake libcuda
//! (whose host functions run on threads of their own) in `child_fake_*`
//! processes, and on the GPU in the tests ignored as "needs an NVIDIA GPU":
//! `cargo test -p cuda-interop-tests --test async_waits -- --ignored --skip
//! child_`.
//!
//! `child_*` tests are entry points of child processes, run by their parent
//! test of this binary by exact name (`cuda_interop_testkit::child`); they fail
//! when run by hand.
//!
//! Fd checks: the fd table and the reactor's registrations are process-wide,
//! so every test of this binary that is not a `child_*` entry point holds
//! `fds::lock()` for its whole run (a `child_*` test runs alone in a process
//! of its own). Each test makes its own tokio runtime (current-thread, I/O
//! and time) before its baseline.

use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use cuda_interop::{kernels, CudaDevice, Error as CudaError, Module, Stream};
use cuda_interop_testkit::fds::{eventfds, readable_within};
use cuda_interop_testkit::gpu::pair;
use cuda_interop_testkit::{
    assert_no_validation_errors, fake, fds, open_fd_count, sample, TIMEOUT,
};
use vk_export::socket::{Connection, Listener};
use vk_export::{Error, TimelineSemaphore};

/// A current-thread runtime with I/O and time, as the futures need.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// How many fds this process's epoll instances watch (the `tfd:` lines of
/// their `/proc/self/fdinfo`, each instance once, though mio holds it under
/// two fds): the reactor's registrations.
fn epoll_registrations() -> usize {
    let instances: std::collections::BTreeMap<String, usize> = fds::fd_table()
        .into_iter()
        .filter(|(_, target)| target.to_string_lossy() == "anon_inode:[eventpoll]")
        .filter_map(|(fd, _)| {
            let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
            let instance = info.lines().find(|l| l.starts_with("ino:"))?.to_string();
            Some((
                instance,
                info.lines().filter(|l| l.starts_with("tfd:")).count(),
            ))
        })
        .collect();
    instances.values().sum()
}

/// Polls `future` once (inside the runtime, so it can register) and says
/// whether it was ready, with its output.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx: &mut TaskContext<'_>| Poll::Ready(Pin::new(&mut *future).poll(cx)))
        .await
}

/// The sample message (tag 77, three resources) sent with three fds of
/// `/dev/null`, closed here once the kernel holds them.
fn send_sample(tx: &Connection) {
    let bytes = sample::message().encode().unwrap();
    let fds: Vec<OwnedFd> = (0..3)
        .map(|_| std::fs::File::open("/dev/null").unwrap().into())
        .collect();
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    // SAFETY: the receiver only counts and drops what it gets; nothing is imported.
    unsafe { tx.send_raw(&bytes, &borrowed) }.unwrap();
}

/// A fresh directory for a listener's socket file.
fn socket_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("async-waits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `accept_async` takes a connection and `recv_async` a message with all
/// its fds (the fd count rises by three while it is held and falls back
/// when it drops); the futures are `Send`.
#[test]
fn accept_async_and_recv_async_take_a_connection_and_a_message_with_its_fds() {
    let _fds = fds::lock();
    let rt = runtime();
    let dir = socket_dir("accept");
    let listener = Listener::bind(dir.join("s")).unwrap();
    let path = listener.path().to_path_buf();
    let baseline = open_fd_count();
    // Connects and sends while the accept is (or may be) pending; its own
    // three fds are closed once it has returned.
    let sender = std::thread::spawn(move || {
        let tx = Connection::connect(&path).unwrap();
        send_sample(&tx);
        tx
    });
    let accepted = listener.accept_async(TIMEOUT);
    assert_send(&accepted);
    let rx = rt.block_on(accepted).unwrap();
    assert_eq!(rx.peer().uid, rustix::process::getuid().as_raw());
    let receiving = rx.recv_async(TIMEOUT);
    assert_send(&receiving);
    let received = rt.block_on(receiving).unwrap();
    assert_eq!(received.message(), &sample::message());
    let tx = sender.join().unwrap();
    assert_eq!(
        open_fd_count(),
        baseline + 2 + 3,
        "both ends of the connection, and the message's three fds"
    );
    drop(received);
    drop((tx, rx));
    assert_eq!(open_fd_count(), baseline);
    drop(listener);
    std::fs::remove_dir_all(&dir).ok();
}

fn assert_send<T: Send>(_: &T) {}

/// A `recv_async` dropped while pending, even after its message arrived and
/// woke it, has received nothing: its duplicate fd and its registration are
/// gone at once, and the message comes whole, with its three fds, to the
/// next receive. And a future that is driven on is either still pending
/// with the message untouched in the socket, or done with all of it: never
/// pending with the message taken.
#[test]
fn a_dropped_recv_async_takes_nothing_and_a_message_is_received_whole_or_not_at_all() {
    let _fds = fds::lock();
    let rt = runtime();
    let (tx, rx) = Connection::pair().unwrap();
    let fds_before = open_fd_count();
    let registrations = epoll_registrations();
    rt.block_on(async {
        let mut pending = Box::pin(rx.recv_async(TIMEOUT));
        assert!(poll_once(&mut pending).await.is_pending());
        assert_eq!(open_fd_count(), fds_before + 1, "the registered duplicate");
        assert_eq!(epoll_registrations(), registrations + 1);
        send_sample(&tx);
        // Let the reactor see the message and wake the future; then drop it
        // without polling it again.
        tokio::task::yield_now().await;
        drop(pending);
    });
    assert_eq!(open_fd_count(), fds_before, "the duplicate is closed");
    assert_eq!(epoll_registrations(), registrations, "and deregistered");
    let received = rx.recv(TIMEOUT).unwrap();
    assert_eq!(received.message().tag, 77);
    assert_eq!(open_fd_count(), fds_before + 3, "all three fds came");
    drop(received);
    assert_eq!(open_fd_count(), fds_before);

    send_sample(&tx);
    let received = rt.block_on(async {
        let mut receiving = Box::pin(rx.recv_async(TIMEOUT));
        let start = Instant::now();
        loop {
            match poll_once(&mut receiving).await {
                Poll::Ready(received) => break received.unwrap(),
                Poll::Pending => assert!(
                    readable_within(&rx, Duration::ZERO),
                    "pending with the message gone from the socket"
                ),
            }
            assert!(start.elapsed() < TIMEOUT);
            tokio::task::yield_now().await;
        }
    });
    assert_eq!(received.message(), &sample::message());
    assert!(!readable_within(&rx, Duration::ZERO), "taken, once");
    assert_eq!(open_fd_count(), fds_before + 3);
    drop(received);
    assert_eq!(open_fd_count(), fds_before);
    assert_eq!(epoll_registrations(), registrations);
}

/// Two `recv_async`s, and two `accept_async`s, wait on one socket at once
/// (each registers a duplicate, so the second registration is not refused):
/// the message (the connection) goes to one, the other times out, typed.
#[test]
fn several_futures_wait_on_one_socket_and_one_takes_what_comes() {
    let _fds = fds::lock();
    let rt = runtime();
    let bound = Duration::from_millis(200);
    let (tx, rx) = Connection::pair().unwrap();
    let dir = socket_dir("several");
    let listener = Listener::bind(dir.join("s")).unwrap();
    let fds_before = open_fd_count();
    let registrations = epoll_registrations();
    rt.block_on(async {
        let mut first = Box::pin(rx.recv_async(bound));
        let mut second = Box::pin(rx.recv_async(bound));
        assert!(poll_once(&mut first).await.is_pending());
        assert!(poll_once(&mut second).await.is_pending());
        assert_eq!(epoll_registrations(), registrations + 2);
        send_sample(&tx);
        assert_eq!(first.await.unwrap().message().tag, 77);
        let late = second.await.unwrap_err();
        assert!(matches!(late, Error::Timeout(b) if b == bound), "{late}");

        let mut first = Box::pin(listener.accept_async(bound));
        let mut second = Box::pin(listener.accept_async(bound));
        assert!(poll_once(&mut first).await.is_pending());
        assert!(poll_once(&mut second).await.is_pending());
        assert_eq!(epoll_registrations(), registrations + 2);
        let client = Connection::connect(listener.path()).unwrap();
        let server = first.await.unwrap();
        let late = second.await.unwrap_err();
        assert!(matches!(late, Error::Timeout(b) if b == bound), "{late}");
        drop((client, server));
    });
    assert_eq!(open_fd_count(), fds_before);
    assert_eq!(epoll_registrations(), registrations);
    drop(listener);
    std::fs::remove_dir_all(&dir).ok();
}

/// Nothing comes: `recv_async` and `accept_async` end in `Error::Timeout`
/// with the caller's bound, not before it, and close what they opened; an
/// unbounded wait (`Duration::MAX`) does not overflow.
#[test]
fn async_socket_waits_time_out_typed() {
    let _fds = fds::lock();
    let rt = runtime();
    let bound = Duration::from_millis(50);
    let (tx, rx) = Connection::pair().unwrap();
    let dir = socket_dir("timeout");
    let listener = Listener::bind(dir.join("s")).unwrap();
    let fds_before = open_fd_count();
    let start = Instant::now();
    let err = rt.block_on(rx.recv_async(bound)).unwrap_err();
    assert!(matches!(err, Error::Timeout(b) if b == bound), "{err}");
    assert!(start.elapsed() >= bound);
    let start = Instant::now();
    let err = rt.block_on(listener.accept_async(bound)).unwrap_err();
    assert!(matches!(err, Error::Timeout(b) if b == bound), "{err}");
    assert!(start.elapsed() >= bound);
    assert_eq!(open_fd_count(), fds_before);
    send_sample(&tx);
    let received = rt.block_on(rx.recv_async(Duration::MAX)).unwrap();
    assert_eq!(received.message().tag, 77);
    drop(received);
    assert_eq!(open_fd_count(), fds_before);
    drop(listener);
    std::fs::remove_dir_all(&dir).ok();
}

/// A Vulkan timeline wait as a future (lavapipe: a local timeline): ready at
/// its first poll when the value is already reached; pending until a host
/// signal from another thread reaches it; `Error::Timeout` with the caller's
/// bound when it is not reached (the value unchanged); a future dropped
/// while pending leaves the semaphore usable and opens no fd; no validation
/// error.
#[test]
fn a_timeline_future_completes_at_its_value_and_times_out_typed() {
    let _fds = fds::lock();
    let rt = runtime();
    let ctx = cuda_interop_testkit::vulkan(None);
    let timeline = Arc::new(TimelineSemaphore::new_local(&ctx).unwrap());
    let fds_before = open_fd_count();
    rt.block_on(async {
        // Reached already (0): ready at once.
        let mut reached = Box::pin(timeline.wait_async(0, TIMEOUT));
        assert_send(&reached);
        assert!(matches!(poll_once(&mut reached).await, Poll::Ready(Ok(()))));

        // Pending until another thread signals 1.
        let mut waiting = Box::pin(timeline.wait_async(1, TIMEOUT));
        assert!(poll_once(&mut waiting).await.is_pending());
        let signaller = {
            let timeline = Arc::clone(&timeline);
            std::thread::spawn(move || timeline.signal(1).unwrap())
        };
        waiting.await.unwrap();
        signaller.join().unwrap();
        assert_eq!(timeline.value().unwrap(), 1);

        // Not reached: typed timeout, not before the bound.
        let bound = Duration::from_millis(30);
        let start = Instant::now();
        let err = timeline.wait_async(5, bound).await.unwrap_err();
        assert!(matches!(err, Error::Timeout(b) if b == bound), "{err}");
        assert!(start.elapsed() >= bound);
        assert_eq!(timeline.value().unwrap(), 1);

        // Dropped while pending: the semaphore goes on.
        let mut dropped = Box::pin(timeline.wait_async(2, TIMEOUT));
        assert!(poll_once(&mut dropped).await.is_pending());
        drop(dropped);
        timeline.signal(2).unwrap();
        timeline.wait_async(2, Duration::MAX).await.unwrap();
    });
    assert_eq!(open_fd_count(), fds_before);
    drop(timeline);
    assert_no_validation_errors(&ctx);
}

/// Waits (bounded) until the fake has returned from `n` host functions.
fn host_functions_returned(fake: &fake::Fake, n: usize) {
    let start = Instant::now();
    while fake.calls("host_function_returned").len() < n {
        assert!(start.elapsed() < TIMEOUT, "{}", fake.log());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A completion as a future, against the fake driver: it completes when
/// its work completes (not before), at its first poll when the work is done,
/// with `Error::Timeout` and the caller's bound when the work is late, and
/// a future dropped while pending closes the completion's eventfd and its
/// duplicate and its registration at once, while its host function, which
/// runs later, finds nothing to write to and returns cleanly.
#[test]
fn a_completion_future_completes_times_out_typed_and_drops_clean() {
    let _fds = fds::lock();
    fake::run("child_fake_completion_futures", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of async_waits.rs, with a fake libcuda: run by a_completion_future_completes_times_out_typed_and_drops_clean"]
fn child_fake_completion_futures() {
    let fake = fake::Fake::open();
    let rt = runtime();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    // SAFETY: the driver is the fake: it records, holds the fd, reads nothing.
    let semaphore = unsafe { cuda.import_semaphore_fd(fake::timeline(), fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let mut value = 0;
    let mut enqueue = |latency_ms: i64| {
        fake.set("latency_ms", latency_ms);
        value += 1;
        semaphore.signal(&stream, value).unwrap();
    };
    let before = eventfds();
    let registrations = epoll_registrations();

    // Completes when the work does, not before.
    enqueue(200);
    let start = Instant::now();
    let done = stream.completion().unwrap();
    assert_eq!(
        eventfds(),
        before + 2,
        "its eventfd and the host function's"
    );
    let waiting = done.wait_async(TIMEOUT);
    assert_send(&waiting);
    let waiting: Pin<Box<dyn Future<Output = _> + Send + 'static>> = Box::pin(waiting);
    rt.block_on(waiting).unwrap();
    let took = start.elapsed();
    println!("a completion future behind 200 ms of work was ready after {took:?}");
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(stream.query().unwrap());
    host_functions_returned(&fake, 1);
    assert_eq!(eventfds(), before, "the completion went with its future");

    // Done already: ready at the first poll.
    let done = stream.completion().unwrap();
    host_functions_returned(&fake, 2);
    rt.block_on(async {
        let mut ready = Box::pin(done.wait_async(TIMEOUT));
        assert!(matches!(poll_once(&mut ready).await, Poll::Ready(Ok(()))));
    });

    // Late work: a typed timeout with the caller's bound, not before it.
    enqueue(400);
    let bound = Duration::from_millis(30);
    let start = Instant::now();
    let late = rt.block_on(stream.completion().unwrap().wait_async(bound));
    assert!(
        matches!(late, Err(CudaError::Timeout(b)) if b == bound),
        "{late:?}"
    );
    assert!(start.elapsed() >= bound);
    assert_eq!(eventfds(), before, "the timed-out completion is dropped");
    host_functions_returned(&fake, 3);

    // Dropped while pending: everything of the completion goes at once;
    // its host function still runs, later, and finds nothing to write to.
    enqueue(300);
    let done = stream.completion().unwrap();
    rt.block_on(async {
        let mut pending = Box::pin(done.wait_async(TIMEOUT));
        assert!(poll_once(&mut pending).await.is_pending());
        assert_eq!(eventfds(), before + 2);
        assert_eq!(epoll_registrations(), registrations + 1);
        drop(pending);
    });
    let ran_before_drop = fake.calls("host_function_returned").len() > 3;
    println!("the host function had run before the drop: {ran_before_drop} (expected: false)");
    assert_eq!(
        eventfds(),
        before,
        "both fds closed with the dropped future"
    );
    assert_eq!(epoll_registrations(), registrations, "and deregistered");
    host_functions_returned(&fake, 4);
    assert_eq!(eventfds(), before);
    let log = fake.log();
    assert!(
        !log.contains("error="),
        "no CUDA call in a host function:\n{log}"
    );
    stream.synchronize(TIMEOUT).unwrap();
    drop(stream);
    assert_eq!(cuda_interop::drop_errors(), errors);
    drop(semaphore);
    assert_eq!(fake.all_live(), []);
}

/// Launches `spin_ns` (one thread) for `ns` nanoseconds of GPU time.
fn launch_spin(stream: &Stream, module: &Module, ns: u64) {
    let f = module.function("spin_ns").unwrap();
    let (mut ns, mut out) = (ns, 0u64);
    let mut args: [*mut std::ffi::c_void; 2] =
        [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
    // SAFETY: spin_ns(u64 ns, u64 out) with out = 0 touches no memory.
    unsafe { stream.launch(&f, [1, 1, 1], [1, 1, 1], 0, &mut args) }.unwrap();
}

/// On the GPU: a completion future waits for a real kernel (and is not
/// ready before its end), one dropped while its kernel runs leaves no fd
/// and no registration behind, and a Vulkan timeline future sees a value
/// that a CUDA stream signals after a kernel.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test async_waits -- --ignored --skip child_, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn futures_wait_for_real_kernels_and_cuda_signals() {
    let _fds = fds::lock();
    let rt = runtime();
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    launch_spin(&stream, &module, 1000);
    stream.synchronize(TIMEOUT).unwrap(); // warm up
    rt.block_on(stream.completion().unwrap().wait_async(TIMEOUT))
        .unwrap();
    let fds_before = open_fd_count();
    let registrations = epoll_registrations();

    let kernel = Duration::from_millis(20);
    let start = Instant::now();
    launch_spin(&stream, &module, kernel.as_nanos() as u64);
    rt.block_on(stream.completion().unwrap().wait_async(TIMEOUT))
        .unwrap();
    let took = start.elapsed();
    println!("a completion future behind a {kernel:?} kernel was ready after {took:?}");
    assert!(took >= kernel, "{took:?}");
    assert!(stream.query().unwrap());

    launch_spin(&stream, &module, 200_000_000);
    let done = stream.completion().unwrap();
    rt.block_on(async {
        let mut pending = Box::pin(done.wait_async(TIMEOUT));
        assert!(poll_once(&mut pending).await.is_pending());
        drop(pending);
    });
    assert_eq!(open_fd_count(), fds_before);
    assert_eq!(epoll_registrations(), registrations);
    stream.synchronize(TIMEOUT).unwrap();

    let timeline = TimelineSemaphore::new(&ctx).unwrap();
    let cuda_timeline = cuda.import_semaphore(&timeline).unwrap();
    launch_spin(&stream, &module, kernel.as_nanos() as u64);
    cuda_timeline.signal(&stream, 1).unwrap();
    let start = Instant::now();
    rt.block_on(timeline.wait_async(1, TIMEOUT)).unwrap();
    println!(
        "a timeline future saw a CUDA signal behind a {kernel:?} kernel after {:?}",
        start.elapsed()
    );
    assert_eq!(timeline.value().unwrap(), 1);
    stream.synchronize(TIMEOUT).unwrap();
    drop(cuda_timeline);
    drop(timeline);
    drop(stream);
    assert_eq!(open_fd_count(), fds_before);
    assert_no_validation_errors(&ctx);
}
