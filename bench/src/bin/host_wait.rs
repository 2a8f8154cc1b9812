//! Benchmark: how soon, and at what CPU cost, does a host thread learn that
//! GPU work has finished, for each way of waiting?
//!
//! For GPU work of 20 µs, 200 µs and 2 ms (the `spin_ns` kernel of
//! [`kernels`], one thread spinning on `%globaltimer`), and for work that
//! varies (2 ms and 200 µs in turn; 2 ms +- 20 %, pseudo-random), each
//! iteration launches the kernel and waits for it on the host, with:
//!
//! * `Spin`: [`HostWait::Spin`], a `cuStreamQuery` loop (the floor);
//! * `cuEventSynchronize (raw)`: a `CU_EVENT_BLOCKING_SYNC` event recorded
//!   after the kernel and `cuEventSynchronize` called directly. **A
//!   benchmark baseline only**: it is unbounded, which the crate's contract
//!   forbids (work behind a semaphore wait nobody signals never completes);
//! * `Block`: [`HostWait::Block`], a host function (`cuLaunchHostFunc`)
//!   writing an eventfd, and `poll()`;
//! * `Adaptive (default)`: [`HostWait::ADAPTIVE`], spin 50 µs then block;
//!   on a stream whose recent waits lasted up to 4 ms, sleep (a timerfd) to
//!   25 µs before the shortest of the last four, spin 50 µs, look every
//!   step until 50 µs past the longest, then block; a stream whose waits
//!   all lasted longer blocks at once;
//! * `Adaptive, 10 / 20 us spin`: [`HostWait::Adaptive`] with a shorter
//!   spin (issue 19 item 5: how much of the default's CPU is its spin);
//! * `helper thread cuEventSynchronize, bounded`: one helper thread makes
//!   the raw blocking-sync call and answers through a channel the caller
//!   waits on with a timeout (bounded for the caller, not for the helper);
//! * `Poll (old)`: [`HostWait::Poll`], the crate's earlier spin/yield/sleep;
//! * `Vulkan counter poll`: the kernel is followed by a CUDA signal of a
//!   Vulkan timeline semaphore, waited for with `WaitStrategy::ADAPTIVE`.
//!
//! The crate's strategies are measured through
//! [`Stream::synchronize_with`], so what they enqueue (a completion) is in
//! the measurement.
//!
//! **Latency after the kernel's end** = (host time from just before the
//! launch to the wait's return) − (the kernel's own duration, measured on
//! the device from `%globaltimer` at its start and end). It therefore also
//! holds the launch latency (enqueue to kernel start), the same for every
//! method: the `Spin` row is the floor, and the ratios compare against it.
//! **CPU** is `getrusage(RUSAGE_SELF)` user + system time over the same
//! windows (so driver threads count) divided by their wall time, in % of one
//! core.
//!
//! Goals checked at the end: work ≤ 50 µs (the 20 µs case): `Adaptive` p50
//! within 1.5x of `Spin`'s; work ≥ 1 ms (the 2 ms case): `Adaptive` at most
//! 5 % of a core, and at most 1.2x the CPU of the raw blocking-sync
//! `cuEventSynchronize` (issue 19 item 5); and no `Adaptive` wait ends 10 ms
//! or more late.
//!
//! ```text
//! cargo run --release -p cuda-interop-bench --bin host_wait -- [ITERATIONS] [--json PATH]
//! ```
//!
//! The JSON goes to `--json PATH`, else `$HOST_WAIT_JSON`, else
//! `$OUT/host_wait.json` when `$OUT` is set.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cuda_interop::sys::{CUresult, Driver};
use cuda_interop::{kernels, CudaDevice, DeviceBuffer, Event, HostWait, Module, Stream};
use vk_export::{Context, HeadlessOptions, TimelineSemaphore, Validation, WaitStrategy};

mod common;
use common::wait_timing::{cpu_time, late_after_kernel};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Warm-up iterations per (work, method), not measured.
const WARM_UP: usize = 20;
/// The bound on every bounded wait here.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    Spin,
    EventSynchronize,
    Block,
    Adaptive,
    AdaptiveSpin10,
    AdaptiveSpin20,
    HelperEventSynchronize,
    Poll,
    VulkanCounter,
}

impl Method {
    const ALL: [Method; 9] = [
        Method::Spin,
        Method::EventSynchronize,
        Method::Block,
        Method::Adaptive,
        Method::AdaptiveSpin10,
        Method::AdaptiveSpin20,
        Method::HelperEventSynchronize,
        Method::Poll,
        Method::VulkanCounter,
    ];
    fn name(self) -> &'static str {
        match self {
            Method::Spin => "Spin (cuStreamQuery loop)",
            Method::EventSynchronize => "cuEventSynchronize (raw, unbounded)",
            Method::Block => "Block (hostfunc + eventfd)",
            Method::Adaptive => "Adaptive (default, 50 us spin)",
            Method::AdaptiveSpin10 => "Adaptive, 10 us spin",
            Method::AdaptiveSpin20 => "Adaptive, 20 us spin",
            Method::HelperEventSynchronize => "helper thread cuEventSynchronize, bounded",
            Method::Poll => "Poll (old spin/yield/sleep)",
            Method::VulkanCounter => "Vulkan counter poll (ADAPTIVE)",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Method::Spin => "spin",
            Method::EventSynchronize => "cu_event_synchronize_raw",
            Method::Block => "block",
            // Adaptive paces waits of up to 80 spins (keys of their own:
            // runs 59-60 spun before every block, runs 62-63 skipped the
            // spin after long waits).
            Method::Adaptive => "adaptive_default_paced",
            Method::AdaptiveSpin10 => "adaptive_spin_10us_paced",
            Method::AdaptiveSpin20 => "adaptive_spin_20us_paced",
            Method::HelperEventSynchronize => "helper_thread_event_synchronize",
            Method::Poll => "poll_old",
            Method::VulkanCounter => "vulkan_counter_poll",
        }
    }
}

/// The GPU work of one cell's waits: the same every wait, or varying.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    Fixed(Duration),
    /// `a`, `b`, `a`, `b`, ...: work whose length changes every wait.
    Alternating(Duration, Duration),
    /// `center` +- 20 %, pseudo-random (the same sequence every run).
    Jitter(Duration),
}

impl Work {
    /// The kernel's length in the `i`-th wait.
    fn at(self, i: usize) -> Duration {
        match self {
            Work::Fixed(d) => d,
            Work::Alternating(a, b) => [a, b][i % 2],
            Work::Jitter(center) => {
                // A 64-bit LCG (Knuth's MMIX constants), its top bits.
                let x = (i as u64 + 1)
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let fraction = (x >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
                center.mul_f64(0.8 + 0.4 * fraction)
            }
        }
    }
    fn label(self) -> String {
        match self {
            Work::Fixed(d) => format!("{d:?}"),
            Work::Alternating(a, b) => format!("{a:?}/{b:?}"),
            Work::Jitter(d) => format!("{d:?}+-20%"),
        }
    }
    /// The JSON `work_us` (the center, or the first of an alternation),
    /// and for varying work a `work` naming it.
    fn json(self) -> String {
        match self {
            Work::Fixed(d) => format!("\"work_us\":{}", d.as_micros()),
            Work::Alternating(d, _) | Work::Jitter(d) => {
                format!("\"work_us\":{},\"work\":{:?}", d.as_micros(), self.label())
            }
        }
    }
}

/// One (work, method) cell.
struct Row {
    work: Work,
    method: Method,
    /// Latency after the kernel's end, per iteration, sorted.
    latency: Vec<Duration>,
    /// CPU time / wall time over the wait windows, in % of one core.
    cpu_percent: f64,
}

impl Row {
    fn quantile(&self, q: f64) -> Duration {
        self.latency[((self.latency.len() as f64 - 1.0) * q).round() as usize]
    }
    fn max(&self) -> Duration {
        *self.latency.last().unwrap()
    }
}

type EventSynchronize = unsafe extern "C" fn(cuda_interop::sys::CUevent) -> CUresult;

/// A bounded wait built on the unbounded `cuEventSynchronize`: one helper
/// thread, started once, makes the call on a blocking-sync event and
/// answers through a channel; the caller waits on the channel with a
/// timeout. The caller's wait is bounded; the helper's is not (work that
/// never ends keeps it blocked, and its next request is refused): what a
/// crate API built this way would have to accept.
struct SyncHelper {
    requests: mpsc::Sender<usize>,
    answers: mpsc::Receiver<CUresult>,
    /// A request is outstanding (its answer not yet received).
    busy: std::cell::Cell<bool>,
}

impl SyncHelper {
    fn start(cuda: &CudaDevice, event_synchronize: EventSynchronize) -> SyncHelper {
        let (requests, inbox) = mpsc::channel::<usize>();
        let (outbox, answers) = mpsc::channel();
        let cuda = cuda.clone();
        std::thread::spawn(move || {
            let Ok(_context) = cuda.enter() else { return };
            while let Ok(event) = inbox.recv() {
                // SAFETY: the raw handle of a live blocking-sync event of this
                // context (the caller keeps it alive until the answer came;
                // benchmark only: the call is unbounded).
                let status = unsafe { event_synchronize(event as cuda_interop::sys::CUevent) };
                if outbox.send(status).is_err() {
                    return;
                }
            }
        });
        SyncHelper {
            requests,
            answers,
            busy: std::cell::Cell::new(false),
        }
    }

    /// Waits, at most `timeout`, for `event`'s last record to complete.
    fn wait(&self, event: &Event, timeout: Duration) -> Res<()> {
        if self.busy.get() {
            return Err("the helper is still blocked on an earlier event".into());
        }
        self.requests
            .send(event.raw() as usize)
            .map_err(|_| "the helper thread ended")?;
        self.busy.set(true);
        let status = match self.answers.recv_timeout(timeout) {
            Ok(status) => status,
            Err(e) => {
                // The helper may still be inside cuEventSynchronize on the
                // event: exit before anything destroys it.
                eprintln!("host_wait: the helper did not answer within {timeout:?} ({e}); exiting");
                std::process::exit(1);
            }
        };
        self.busy.set(false);
        if status != CUresult::CUDA_SUCCESS {
            return Err(format!("cuEventSynchronize (helper): {status:?}").into());
        }
        Ok(())
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let mut iterations = 300usize;
    let mut json_path = std::env::var_os("HOST_WAIT_JSON").map(std::path::PathBuf::from);
    while let Some(arg) = args.next() {
        if arg == "--json" {
            json_path = Some(args.next().ok_or("--json needs a path")?.into());
        } else {
            iterations = arg.parse()?;
        }
    }
    if json_path.is_none() {
        json_path =
            std::env::var_os("OUT").map(|d| std::path::Path::new(&d).join("host_wait.json"));
    }

    let ctx = Context::headless(&HeadlessOptions {
        validation: Validation::Off, // measure the driver, not the layer
        ..Default::default()
    })?;
    let cuda = CudaDevice::for_vulkan(&ctx)?;
    let driver = cuda_interop::driver_version()?;
    println!(
        "{} / CUDA [{}] {} / driver {driver:?}",
        ctx.identity().name,
        cuda.ordinal(),
        cuda.name()
    );
    let timeline = TimelineSemaphore::new(&ctx)?;
    let cuda_timeline = cuda.import_semaphore(&timeline)?;
    let module = Module::load_ptx(&cuda, kernels::PTX)?;
    let spin = module.function("spin_ns")?;
    let stream = Stream::new(&cuda)?;
    let blocking_event = Event::new_blocking_sync(&cuda)?;
    let event_synchronize = Driver::global()
        .map_err(|e| e.to_string())?
        .fns()
        .cuEventSynchronize
        .ok_or("the driver has no cuEventSynchronize")?;
    let helper = SyncHelper::start(&cuda, event_synchronize);
    let slots = iterations + WARM_UP;
    let stamps = DeviceBuffer::new(&cuda, slots * 16)?;
    let mut value = 0u64;

    let works = [
        Work::Fixed(Duration::from_micros(20)),
        Work::Fixed(Duration::from_micros(200)),
        Work::Fixed(Duration::from_millis(2)),
        // What the adaptive pace costs where the length it learns is wrong:
        // every wait, or by up to 20 %.
        Work::Alternating(Duration::from_millis(2), Duration::from_micros(200)),
        Work::Jitter(Duration::from_millis(2)),
    ];
    let mut rows = Vec::new();
    let run_start = Instant::now();
    for work in works {
        for method in Method::ALL {
            let mut windows = Vec::with_capacity(iterations);
            let mut cpu = Duration::ZERO;
            let mut wall = Duration::ZERO;
            for i in 0..slots {
                let (mut ns, mut out) = (
                    work.at(i).as_nanos() as u64,
                    stamps.device_ptr() + 16 * i as u64,
                );
                let mut kernel_args: [*mut c_void; 2] =
                    [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
                let cpu0 = cpu_time();
                let start = Instant::now();
                // SAFETY: spin_ns(u64 ns, u64 out) writes two u64 at `out`,
                // slot i of `stamps`, which lives until the end of main, after
                // the last synchronize.
                unsafe { stream.launch(&spin, [1, 1, 1], [1, 1, 1], 0, &mut kernel_args) }?;
                match method {
                    Method::Spin => stream.synchronize_with(HostWait::Spin, TIMEOUT)?,
                    Method::Block => stream.synchronize_with(HostWait::Block, TIMEOUT)?,
                    Method::Adaptive => stream.synchronize_with(HostWait::ADAPTIVE, TIMEOUT)?,
                    Method::AdaptiveSpin10 => stream.synchronize_with(
                        HostWait::Adaptive {
                            spin: Duration::from_micros(10),
                        },
                        TIMEOUT,
                    )?,
                    Method::AdaptiveSpin20 => stream.synchronize_with(
                        HostWait::Adaptive {
                            spin: Duration::from_micros(20),
                        },
                        TIMEOUT,
                    )?,
                    Method::HelperEventSynchronize => {
                        stream.record(&blocking_event)?;
                        helper.wait(&blocking_event, TIMEOUT)?;
                    }
                    Method::Poll => stream.synchronize_with(HostWait::Poll, TIMEOUT)?,
                    Method::EventSynchronize => {
                        stream.record(&blocking_event)?;
                        let _guard = cuda.enter()?;
                        // SAFETY: a live event of the device's context, which
                        // the guard keeps current; recorded just after a
                        // kernel that always ends (benchmark only: unbounded).
                        let status = unsafe { event_synchronize(blocking_event.raw()) };
                        if status != CUresult::CUDA_SUCCESS {
                            return Err(format!("cuEventSynchronize: {status:?}").into());
                        }
                    }
                    Method::VulkanCounter => {
                        value += 1;
                        cuda_timeline.signal(&stream, value)?;
                        timeline.wait(value, TIMEOUT, WaitStrategy::ADAPTIVE)?;
                    }
                }
                let window = start.elapsed();
                let used = cpu_time() - cpu0;
                if i >= WARM_UP {
                    windows.push(window);
                    cpu += used;
                    wall += window;
                }
            }
            let latency = late_after_kernel(&stream, &stamps, &windows, WARM_UP, TIMEOUT)?;
            rows.push(Row {
                work,
                method,
                latency,
                cpu_percent: 100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
            });
        }
    }
    let took = run_start.elapsed();

    // The table.
    println!(
        "\nhost wake-up after GPU work ends: {iterations} iterations per cell after {WARM_UP} warm-up, {took:.1?} in all"
    );
    println!("latency = host wait window (launch -> wait returns) - kernel duration (device %globaltimer); includes launch latency, as the Spin floor does");
    println!(
        "{:>11}  {:36} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "work", "method", "p50 us", "p99 us", "max us", "CPU %", "p50/spin"
    );
    let floor = |work: Work| {
        rows.iter()
            .find(|r| r.work == work && r.method == Method::Spin)
            .map(|r| r.quantile(0.5))
            .unwrap()
    };
    for row in &rows {
        println!(
            "{:>11}  {:36} {:9.1} {:9.1} {:9.1} {:7.1} {:9.2}",
            row.work.label(),
            row.method.name(),
            us(row.quantile(0.5)),
            us(row.quantile(0.99)),
            us(row.max()),
            row.cpu_percent,
            row.quantile(0.5).as_secs_f64() / floor(row.work).as_secs_f64()
        );
    }

    // The goals, for the default strategy.
    let cell = |work: Work, method: Method| {
        rows.iter()
            .find(|r| r.work == work && r.method == method)
            .unwrap()
    };
    let short = cell(works[0], Method::Adaptive);
    let short_ratio = short.quantile(0.5).as_secs_f64() / floor(works[0]).as_secs_f64();
    let long = cell(works[2], Method::Adaptive);
    let worst = rows
        .iter()
        .filter(|r| r.method == Method::Adaptive)
        .map(Row::max)
        .max()
        .unwrap();
    let goals = [
        (
            "work <= 50 us: Adaptive p50 within 1.5x of the spin floor",
            short_ratio <= 1.5,
            format!("{short_ratio:.2}x"),
        ),
        (
            "work >= 1 ms: Adaptive at most 5% of a core",
            long.cpu_percent <= 5.0,
            format!("{:.1}%", long.cpu_percent),
        ),
        (
            "work >= 1 ms: Adaptive's CPU within 1.2x of the raw blocking-sync cuEventSynchronize's",
            long.cpu_percent <= 1.2 * cell(works[2], Method::EventSynchronize).cpu_percent,
            format!(
                "{:.1}% against {:.1}%; bounded alternatives: Block {:.1}%, spin 20 us {:.1}%, spin 10 us {:.1}%, helper thread {:.1}%",
                long.cpu_percent,
                cell(works[2], Method::EventSynchronize).cpu_percent,
                cell(works[2], Method::Block).cpu_percent,
                cell(works[2], Method::AdaptiveSpin20).cpu_percent,
                cell(works[2], Method::AdaptiveSpin10).cpu_percent,
                cell(works[2], Method::HelperEventSynchronize).cpu_percent
            ),
        ),
        (
            "never a 10 ms path: every Adaptive wait under 10 ms late",
            worst < Duration::from_millis(10),
            format!("max {:.1} us", us(worst)),
        ),
    ];
    println!("\ngoals (Adaptive, the default):");
    for (goal, held, measured) in &goals {
        println!(
            "  [{}] {goal} ({measured})",
            if *held { "holds" } else { "MISSED" }
        );
    }

    if let Some(path) = json_path {
        let mut json = String::new();
        write!(
            json,
            "{{\"device\":{:?},\"driver\":{:?},\"iterations\":{iterations},\"warm_up\":{WARM_UP},\
             \"latency\":\"host window (launch to return) minus device-measured kernel duration\",\
             \"cpu\":\"getrusage(RUSAGE_SELF) user+sys over the windows / their wall time, % of one core\",\
             \"seconds\":{:.3},\"rows\":[",
            cuda.name(),
            format!("{driver:?}"),
            took.as_secs_f64()
        )?;
        for (n, row) in rows.iter().enumerate() {
            write!(
                json,
                "{}{{{},\"method\":\"{}\",\"p50_us\":{:.2},\"p99_us\":{:.2},\"max_us\":{:.2},\
                 \"cpu_percent\":{:.2},\"p50_over_spin\":{:.3}}}",
                if n == 0 { "" } else { "," },
                row.work.json(),
                row.method.key(),
                us(row.quantile(0.5)),
                us(row.quantile(0.99)),
                us(row.max()),
                row.cpu_percent,
                row.quantile(0.5).as_secs_f64() / floor(row.work).as_secs_f64()
            )?;
        }
        json.push_str("],\"goals\":[");
        for (n, (goal, held, measured)) in goals.iter().enumerate() {
            write!(
                json,
                "{}{{\"goal\":{goal:?},\"holds\":{held},\"measured\":{measured:?}}}",
                if n == 0 { "" } else { "," }
            )?;
        }
        json.push_str("]}\n");
        std::fs::write(&path, json)?;
        println!("JSON written to {}", path.display());
    }
    Ok(())
}
