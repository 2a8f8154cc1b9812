//! Host waits: completions whose fd becomes readable when the work
//! completes, every `HostWait` strategy, timeouts, and drops before the host
//! function has run; against the fake driver and a real kernel.
//!
//! The tests ignored as "needs an NVIDIA GPU" need the real CUDA driver; on the
//! GPU machine: `cargo test -p cuda-interop-tests --test host_wait -- --ignored
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

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cuda_interop::{
    kernels, CudaDevice, Error as CudaError, ExternalSemaphore, HostWait, Module, Stream,
};
use cuda_interop_testkit::fds::{eventfds, readable_within};
use cuda_interop_testkit::gpu::pair;
use cuda_interop_testkit::{assert_no_validation_errors, fake, fds, open_fd_count, TIMEOUT};
use vk_export::semaphore_kinds::Timeline;

/// How far past its bound, or its work's end, a wait must run to count as
/// hung: far beyond any scheduling delay, so that no assertion here depends
/// on the machine's load. How soon waits return is the bench's to measure
/// (`host_wait`), not the tests'.
const HANG: Duration = Duration::from_secs(2);

/// Waits (bounded) until the fake has returned from `n` host functions.
fn host_functions_returned(fake: &fake::Fake, n: usize) {
    let start = Instant::now();
    while fake.calls("host_function_returned").len() < n {
        assert!(start.elapsed() < TIMEOUT, "{}", fake.log());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fake work: each `on` signals the fake timeline's next value on a stream,
/// which completes `latency` after it is enqueued.
struct FakeWork<'a> {
    fake: &'a fake::Fake,
    semaphore: &'a ExternalSemaphore<Timeline>,
    value: u64,
}

impl FakeWork<'_> {
    fn on(&mut self, stream: &Stream, latency: Duration) {
        self.fake.set("latency_ms", latency.as_millis() as i64);
        self.value += 1;
        self.semaphore.signal(stream, self.value).unwrap();
    }
}

/// Every host-wait strategy, the default first.
const STRATEGIES: [HostWait; 5] = [
    HostWait::ADAPTIVE,
    HostWait::Spin,
    HostWait::Block,
    HostWait::Adaptive {
        spin: Duration::from_millis(20),
    },
    HostWait::Poll,
];

/// Host waits against the fake driver, whose host functions
/// (`cuLaunchHostFunc`) run on a thread of their own when the stream's
/// earlier work completes, with CUDA calls refused: a completion's fd
/// becomes readable when its work completes and not before, `is_done`
/// agrees, every strategy returns `Ok` on completed work and waits for
/// pending work, from another thread too, and the eventfd is closed once
/// both the completion and its host function are done with it.
#[test]
fn a_completion_becomes_readable_when_its_work_completes_and_every_strategy_sees_it() {
    let _fds = fds::lock();
    fake::run("child_fake_completions", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of host_wait.rs, with a fake libcuda: run by a_completion_becomes_readable_when_its_work_completes_and_every_strategy_sees_it"]
fn child_fake_completions() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let semaphore = fake::import_timeline(&cuda);
    let mut work_on = FakeWork {
        fake: &fake,
        semaphore: &semaphore,
        value: 0,
    };
    let mut enqueue = |latency: Duration| work_on.on(&stream, latency);
    let before = eventfds();

    // Readable when the work completes, and not before (with 850 ms to
    // spare for the look before it).
    let work = Duration::from_millis(1000);
    let start = Instant::now();
    enqueue(work);
    let done = stream.completion().unwrap();
    assert_eq!(
        eventfds(),
        before + 2,
        "per completion: its eventfd and the host function's duplicate"
    );
    assert!(!done.is_done().unwrap());
    assert!(!readable_within(&done, Duration::from_millis(150)));
    assert!(
        !done.is_done().unwrap(),
        "still pending at {:?}",
        start.elapsed()
    );
    assert!(readable_within(&done, TIMEOUT));
    let seen = start.elapsed();
    println!("a completion behind {work:?} of work became readable after {seen:?}");
    assert!(seen >= work - Duration::from_millis(10), "{seen:?}");
    assert!(done.is_done().unwrap());
    assert!(readable_within(&done, Duration::ZERO), "it stays readable");

    // Every strategy returns Ok at once on completed work: the stream's
    // first query says done, and nothing is enqueued.
    let launched = fake.calls("cuLaunchHostFunc").len();
    for strategy in STRATEGIES {
        done.wait_with(strategy, Duration::from_millis(100))
            .unwrap();
        let queries = fake.queries("cuStreamQuery");
        stream
            .synchronize_with(strategy, Duration::from_millis(100))
            .unwrap();
        assert_eq!(
            fake.queries("cuStreamQuery") - queries,
            1,
            "{strategy:?}: one query"
        );
    }
    assert_eq!(
        fake.calls("cuLaunchHostFunc").len(),
        launched,
        "nothing enqueued"
    );

    // Every strategy waits for pending work, on the stream or a completion,
    // and a completion can be waited for on another thread.
    let work = Duration::from_millis(100);
    for strategy in STRATEGIES {
        enqueue(work);
        let start = Instant::now();
        stream.synchronize_with(strategy, TIMEOUT).unwrap();
        let waited = start.elapsed();
        assert!(stream.query().unwrap());
        enqueue(work);
        let start = Instant::now();
        let completion = stream.completion().unwrap();
        let on_thread = std::thread::spawn(move || {
            completion.wait_with(strategy, TIMEOUT).unwrap();
            assert!(completion.is_done().unwrap());
        });
        on_thread.join().unwrap();
        let waited_elsewhere = start.elapsed();
        println!("{strategy:?}: {waited:?} on the stream, {waited_elsewhere:?} on another thread");
        for took in [waited, waited_elsewhere] {
            assert!(
                took >= work - Duration::from_millis(10) && took < work + HANG,
                "{strategy:?}: {took:?}"
            );
        }
    }

    drop(done);
    let launched = fake.calls("cuLaunchHostFunc").len();
    assert!(launched >= 2, "{}", fake.log());
    host_functions_returned(&fake, launched);
    drop(stream);
    assert_eq!(eventfds(), before, "every eventfd is closed");
    let log = fake.log();
    assert!(
        !log.contains("error="),
        "no CUDA call in a host function:\n{log}"
    );
    assert_eq!(cuda_interop::drop_errors(), errors);
    drop(semaphore);
    assert_eq!(fake.all_live(), []);
}

/// Bounded waits against the fake driver: a wait on work that does not
/// complete in time returns `Error::Timeout` with every strategy; dropping a
/// completion before its host function runs is safe and closes both its fds
/// at once (the host function runs later and finds nothing to write to);
/// repeated timed-out stream waits share one pending completion; and a host
/// function that never runs (work behind a wait nobody signals) leaks no fd:
/// the completion's event and fds go with it.
#[test]
fn completion_waits_time_out_and_drops_before_the_host_function_are_safe() {
    let _fds = fds::lock();
    fake::run("child_fake_completion_timeouts", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of host_wait.rs, with a fake libcuda: run by completion_waits_time_out_and_drops_before_the_host_function_are_safe"]
fn child_fake_completion_timeouts() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let semaphore = fake::import_timeline(&cuda);
    let before = eventfds();

    // Work that completes late: every strategy times out, within its bound.
    fake.set("latency_ms", 400);
    semaphore.signal(&stream, 1).unwrap();
    // The signal's use is a ticket of the stream's track: no event.
    let events = fake.live("event");
    let done = stream.completion().unwrap();
    let bound = Duration::from_millis(30);
    for strategy in STRATEGIES {
        let start = Instant::now();
        let waited = done.wait_with(strategy, bound);
        assert!(
            matches!(waited, Err(CudaError::Timeout(t)) if t == bound),
            "{strategy:?}: {waited:?}"
        );
        let took = start.elapsed();
        assert!(
            took >= bound && took < bound + HANG,
            "{strategy:?}: {took:?}"
        );
    }
    // Two timed-out stream waits enqueue one host function between them.
    let launched = fake.calls("cuLaunchHostFunc").len();
    for _ in 0..2 {
        assert!(matches!(
            stream.synchronize_with(HostWait::Block, bound),
            Err(CudaError::Timeout(_))
        ));
    }
    assert_eq!(fake.calls("cuLaunchHostFunc").len(), launched + 1);
    assert!(!done.is_done().unwrap());
    // Dropped before its host function runs: both its fds close at once;
    // the host function still runs, later, and finds nothing to write to.
    drop(done);
    assert_eq!(
        eventfds(),
        before + 2,
        "only the stream's kept completion (its eventfd and duplicate)"
    );
    assert_eq!(fake.calls("host_function_returned").len(), 0);
    host_functions_returned(&fake, 2);
    assert_eq!(
        eventfds(),
        before + 2,
        "the stream keeps its last completion"
    );
    stream.synchronize(TIMEOUT).unwrap();
    drop(stream);
    assert_eq!(eventfds(), before);
    assert_eq!(fake.live("event"), events, "events destroyed");
    let log = fake.log();
    assert!(!log.contains("error="), "{log}");

    // Work that never completes: the host function is never called; the
    // completion's event is destroyed and its fds closed: no fd leaks.
    fake.set("latency_ms", -1);
    let stuck = Stream::new(&cuda).unwrap();
    semaphore.signal(&stuck, 2).unwrap();
    let done = stuck.completion().unwrap();
    assert_eq!(fake.last("cuLaunchHostFunc").get("never"), "1");
    let start = Instant::now();
    assert!(matches!(done.wait(bound), Err(CudaError::Timeout(_))));
    assert!(start.elapsed() < bound + HANG);
    assert!(matches!(
        stuck.synchronize(bound),
        Err(CudaError::Timeout(_))
    ));
    drop(done);
    assert_eq!(
        fake.live("event"),
        events + 1,
        "the stream's kept completion"
    );
    assert_eq!(
        eventfds(),
        before + 2,
        "the stuck stream's kept completion, nothing of the dropped one"
    );
    assert_eq!(cuda_interop::drop_errors(), errors);
    // The semaphore's last use never completes (its drop would leak it
    // after DROP_WAIT_LIMIT); the stream is destroyed (no external wait),
    // recording first the event behind that use, which the forgotten
    // semaphore's list keeps (through the stream's track): leaked with it.
    std::mem::forget(semaphore);
    drop(stuck);
    assert_eq!(fake.live("event"), events + 1);
    assert_eq!(eventfds(), before, "no fd outlives its completion");
}

/// A stream wait that blocks on a completion behind its work goes on by
/// polling the stream when the completion fails (its `cuEventQuery` errs
/// partway through the wait: the completion says nothing more about the
/// work), but only for what is left of its bound: `Block` and the default
/// time out at their bound, not a whole bound after the failure.
///
/// The completion fails after 30 of its queries (one per 100 ms slice of
/// the block: about 3 s into the 6 s bound); polling a whole bound after
/// that would end past `bound + HANG`.
#[test]
fn a_stream_wait_whose_completion_fails_still_times_out_at_its_bound() {
    let _fds = fds::lock();
    fake::run("child_fake_failing_completion", fake::Variant::Full);
}

#[test]
#[ignore = "child"]
fn child_fake_failing_completion() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let semaphore = fake::import_timeline(&cuda);
    let fds_before = eventfds();
    let bound = Duration::from_secs(6);
    for (value, strategy) in [(1, HostWait::Block), (2, HostWait::ADAPTIVE)] {
        // Work that completes only when released.
        fake.set("latency_ms", -1);
        fake.set("release_stuck", 0);
        let stream = Stream::new(&cuda).unwrap();
        semaphore.signal(&stream, value).unwrap();
        let injected = || fake.log().matches("cuEventQuery error=injected").count();
        let failures = injected();
        fake.set("event_query_fail_at", fake.queries("cuEventQuery") + 30);
        let start = Instant::now();
        let waited = stream.synchronize_with(strategy, bound);
        let took = start.elapsed();
        fake.set("event_query_fail_at", 0);
        assert!(
            injected() > failures,
            "{strategy:?}: the completion failed during the wait"
        );
        assert!(
            matches!(waited, Err(CudaError::Timeout(t)) if t == bound),
            "{strategy:?}: {waited:?}"
        );
        assert!(
            took >= bound && took < bound + HANG,
            "{strategy:?}: {took:?} for a bound of {bound:?}"
        );
        fake.set("release_stuck", 1);
        stream.synchronize(TIMEOUT).unwrap();
        drop(stream);
    }
    // The host functions of work that was never to complete never run;
    // they hold no fd.
    assert_eq!(eventfds(), fds_before, "no fd outlives its completion");
}

/// `HostWait::Adaptive` on a stream learns how long its waits last: with no
/// history it spins, then blocks; after waits of up to 80 spins it paces the
/// next one, sleeping through most of the work and seeing its end by a
/// short spin (no block, and under half a core); work longer than learned
/// blocks after the pace's window, and the wider window of the next waits
/// is watched by polling (no block, under half a core); after waits of more
/// than 80 spins it blocks at once (the queries of the block alone); a wait
/// that finds the work done learns nothing.
///
/// Every contrast is tens of ms wide, and a late start only moves the work's
/// end earlier in the wait: the outcomes hold on a loaded machine.
#[test]
fn an_adaptive_wait_learns_long_work_then_paces_it_or_blocks_at_once() {
    let _fds = fds::lock();
    fake::run("child_fake_adaptive_history", fake::Variant::Full);
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[test]
#[ignore = "entry point of a child process of host_wait.rs, with a fake libcuda: run by an_adaptive_wait_learns_long_work_then_paces_it_or_blocks_at_once"]
fn child_fake_adaptive_history() {
    let fake = fake::Fake::open();
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let semaphore = fake::import_timeline(&cuda);
    let spin_out = HostWait::Adaptive {
        spin: Duration::from_secs(30),
    };
    // 100 ms is 10 of these spins: a pace.
    let pace = HostWait::Adaptive {
        spin: Duration::from_millis(10),
    };
    // 100 ms is 1000 of these spins: a block at once (past 80, 8 ms).
    let block = HostWait::Adaptive {
        spin: Duration::from_micros(100),
    };
    let blocks = || fake.calls("cuLaunchHostFunc").len();
    let mut work_on = FakeWork {
        fake: &fake,
        semaphore: &semaphore,
        value: 0,
    };
    let mut work = |stream: &Stream, ms: u64| work_on.on(stream, Duration::from_millis(ms));
    let paced = |stream: &Stream| {
        let (cpu, wall) = (thread_cpu(), Instant::now());
        stream.synchronize_with(pace, TIMEOUT).unwrap();
        let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
        assert!(
            cpu < wall / 2,
            "{cpu:?} of CPU in {wall:?}: it did not sleep through the work"
        );
    };

    // No history, a spin longer than the work: it spins the work out.
    let fresh = Stream::new(&cuda).unwrap();
    work(&fresh, 100);
    fresh.synchronize_with(spin_out, TIMEOUT).unwrap();
    assert_eq!(blocks(), 0, "no block");

    // No history, a 10 ms spin: the first wait spins, then blocks, and
    // learns that the stream's waits last about 100 ms.
    let stream = Stream::new(&cuda).unwrap();
    work(&stream, 100);
    stream.synchronize_with(pace, TIMEOUT).unwrap();
    assert_eq!(blocks(), 1);
    // The next one is paced: it sleeps to 47.5 ms, then to 95 ms, spins
    // from there, and would block only after 110 ms.
    work(&stream, 100);
    paced(&stream);
    assert_eq!(blocks(), 1, "no block");

    // Work longer than learned (190 ms): the pace blocks after 110 ms.
    work(&stream, 190);
    stream.synchronize_with(pace, TIMEOUT).unwrap();
    assert_eq!(blocks(), 2);
    // The window of the next waits is 95-200 ms: work of 150 ms is seen by
    // polling (sleeps of 10 ms from 105 ms), with no block.
    work(&stream, 150);
    paced(&stream);
    assert_eq!(blocks(), 2, "no block");

    // A wait that finds the work done learns nothing...
    stream.synchronize_with(block, TIMEOUT).unwrap();
    stream.synchronize_with(spin_out, TIMEOUT).unwrap();
    // ... so with a 100 us spin, 100 ms is still past 80 spins: a block at
    // once (a spin of any length would query more).
    work(&stream, 100);
    let queries = fake.queries("cuStreamQuery");
    stream.synchronize_with(block, TIMEOUT).unwrap();
    let made = fake.queries("cuStreamQuery") - queries;
    assert!(made <= 3, "{made} queries: it spun");
    assert_eq!(blocks(), 3);
    drop((fresh, stream, semaphore));
}

/// Launches `spin_ns` (one thread) for `ns` nanoseconds of GPU time.
fn launch_spin(stream: &Stream, module: &Module, ns: u64) {
    let f = module.function("spin_ns").unwrap();
    let (mut ns, mut out) = (ns, 0u64);
    let mut args: [*mut c_void; 2] = [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
    // SAFETY: spin_ns(u64 ns, u64 out) with out = 0 touches no memory.
    unsafe { stream.launch(&f, [1, 1, 1], [1, 1, 1], 0, &mut args) }.unwrap();
}

/// Every host-wait strategy waits for a real kernel (on the stream and on a
/// completion, which is waited for on another thread), none returns before
/// the kernel's end, a short bound on a long kernel is `CudaError::Timeout`, and
/// a completion's eventfd becomes readable through `poll()` when the kernel
/// ends and not before.
#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test host_wait -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
fn every_host_wait_strategy_waits_for_a_real_kernel_and_the_completion_fd_polls() {
    let _fds = fds::lock();
    let (ctx, cuda) = pair();
    let module = Module::load_ptx(&cuda, kernels::PTX).unwrap();
    let stream = Stream::new(&cuda).unwrap();
    launch_spin(&stream, &module, 1000);
    stream.synchronize(TIMEOUT).unwrap(); // warm up
    let fds = open_fd_count();
    let kernel = Duration::from_millis(2);
    for strategy in [
        HostWait::ADAPTIVE,
        HostWait::Spin,
        HostWait::Block,
        HostWait::Adaptive {
            spin: Duration::from_millis(5),
        },
        HostWait::Poll,
    ] {
        let start = Instant::now();
        launch_spin(&stream, &module, kernel.as_nanos() as u64);
        stream.synchronize_with(strategy, TIMEOUT).unwrap();
        let on_stream = start.elapsed();
        assert!(stream.query().unwrap());

        let start = Instant::now();
        launch_spin(&stream, &module, kernel.as_nanos() as u64);
        let done = stream.completion().unwrap();
        let waiter = std::thread::spawn(move || {
            done.wait_with(strategy, TIMEOUT).unwrap();
            done
        });
        let done = waiter.join().unwrap();
        let on_completion = start.elapsed();
        assert!(done.is_done().unwrap());
        // A wait that spun on the event can return before the driver has
        // run the host function that makes the fd readable (run 8 on the
        // H200: not yet readable at once after an Adaptive wait).
        assert!(readable_within(&done, HANG));
        println!("{strategy:?}: a {kernel:?} kernel seen after {on_stream:?} on the stream, {on_completion:?} on a completion");
        for took in [on_stream, on_completion] {
            assert!(
                took >= kernel && took < kernel + HANG,
                "{strategy:?}: {took:?}"
            );
        }
    }

    // A bound shorter than the kernel: a timeout, then the real wait.
    launch_spin(&stream, &module, 1_000_000_000);
    let done = stream.completion().unwrap();
    let start = Instant::now();
    let err = done.wait(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, CudaError::Timeout(_)), "{err}");
    assert!(start.elapsed() < Duration::from_millis(20) + HANG);
    let err = stream
        .synchronize_with(HostWait::Block, Duration::from_millis(20))
        .unwrap_err();
    assert!(matches!(err, CudaError::Timeout(_)), "{err}");
    // The fd: not readable while the kernel runs, readable when it ends.
    assert!(!readable_within(&done, Duration::from_millis(50)));
    assert!(!done.is_done().unwrap());
    assert!(readable_within(&done, TIMEOUT));
    let took = start.elapsed();
    println!("a 1 s kernel's completion fd became readable after {took:?}");
    assert!(took >= Duration::from_millis(990), "{took:?}");
    assert!(done.is_done().unwrap());
    done.wait(Duration::ZERO).unwrap();
    stream.synchronize(TIMEOUT).unwrap();
    drop(done);
    drop(stream);
    assert_eq!(open_fd_count(), fds, "every eventfd is closed");
    assert_no_validation_errors(&ctx);
}
