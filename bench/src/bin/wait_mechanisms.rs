//! Experiment: where the CPU time of a blocking host wait goes, to see
//! whether a bounded wait can cost as little as `cuEventSynchronize` on a
//! `CU_EVENT_BLOCKING_SYNC` event (which the crate cannot offer: it is
//! unbounded).
//!
//! For GPU work of 200 µs and 2 ms (the `spin_ns` kernel), each iteration
//! launches the kernel and waits with:
//!
//! * `sleep (no wait)`: `std::thread::sleep` for the work plus 200 µs, then
//!   one `cuStreamQuery`: the cost of the launch and of the process's
//!   background (driver threads) with no wake-up mechanism at all;
//! * `cuEventSynchronize (raw)`: a blocking-sync event, unbounded;
//! * `HostWait::Block`: the crate's (a new eventfd and host function per
//!   wait, `poll`);
//! * `hostfunc + one eventfd`: `cuLaunchHostFunc` writing an eventfd made
//!   once, `poll` and `read`: Block without the per-wait eventfd;
//! * `helper thread`: a thread that calls `cuEventSynchronize` on a
//!   blocking-sync event and then writes an eventfd the caller `poll`s
//!   (bounded for the caller; a never-completing event would keep the
//!   helper, not the caller).
//!
//! CPU is `getrusage(RUSAGE_SELF)` over the wait windows, % of one core,
//! as in `host_wait`.
//!
//! ```text
//! cargo run --release -p cuda-interop-bench --bin wait_mechanisms -- [ITERATIONS]
//! ```

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cuda_interop::sys::{CUevent, CUresult, CUstream, Driver};
use cuda_interop::{kernels, CudaDevice, DeviceBuffer, Event, HostWait, Module, Stream};
use vk_export::{Context, HeadlessOptions, Validation};

mod common;
use common::wait_timing::{cpu_time, late_after_kernel};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WARM_UP: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(10);

fn eventfd() -> Res<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC,
    )?)
}

/// Waits (bounded) until `fd` is readable, then reads it (resets it).
fn wait_fd(fd: &OwnedFd) -> Res<()> {
    let timeout = rustix::event::Timespec {
        tv_sec: TIMEOUT.as_secs() as i64,
        tv_nsec: 0,
    };
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    loop {
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => return Err("timed out".into()),
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let mut word = [0u8; 8];
    rustix::io::read(fd.as_fd(), &mut word)?;
    Ok(())
}

/// The host function: writes 1 to the eventfd whose number `data` holds.
unsafe extern "C" fn write_eventfd(data: *mut c_void) {
    let fd = data as usize as libc::c_int;
    let one = 1u64.to_ne_bytes();
    // SAFETY: `fd` is the eventfd `main` keeps open for the whole run;
    // writes 8 bytes from a live buffer.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

#[derive(Clone, Copy, PartialEq)]
enum Method {
    Sleep,
    EventSynchronize,
    Block,
    HostFuncOneFd,
    Helper,
}

const METHODS: [(Method, &str); 5] = [
    (Method::Sleep, "sleep (no wait mechanism)"),
    (
        Method::EventSynchronize,
        "cuEventSynchronize (raw, unbounded)",
    ),
    (Method::Block, "HostWait::Block (crate)"),
    (Method::HostFuncOneFd, "hostfunc + one eventfd + poll"),
    (
        Method::Helper,
        "helper thread: cuEventSynchronize + eventfd",
    ),
];

fn main() -> Res<()> {
    let iterations: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200);
    let ctx = Context::headless(&HeadlessOptions {
        validation: Validation::Off,
        ..Default::default()
    })?;
    let cuda = CudaDevice::for_vulkan(&ctx)?;
    let fns = Driver::global().map_err(|e| e.to_string())?.fns();
    let event_synchronize = fns.cuEventSynchronize.ok_or("no cuEventSynchronize")?;
    let launch_host_func = fns.cuLaunchHostFunc.ok_or("no cuLaunchHostFunc")?;
    let stream_query = fns.cuStreamQuery.ok_or("no cuStreamQuery")?;
    let module = Module::load_ptx(&cuda, kernels::PTX)?;
    let spin = module.function("spin_ns")?;
    let stream = Stream::new(&cuda)?;
    let blocking_event = Event::new_blocking_sync(&cuda)?;
    let one_fd = eventfd()?;
    let helper_fd = eventfd()?;
    let helper_signal = helper_fd.try_clone()?;
    let slots = iterations + WARM_UP;
    let stamps = DeviceBuffer::new(&cuda, slots * 16)?;

    // The helper: waits for each event it is sent, then writes its eventfd.
    let (to_helper, events) = mpsc::channel::<usize>();
    let helper_device = cuda.clone();
    let helper = std::thread::spawn(move || -> Result<(), String> {
        let _guard = helper_device.enter().map_err(|e| e.to_string())?;
        for event in events {
            // SAFETY: a live event of the device's context (current on this
            // thread), recorded by main before sending it; main waits for
            // this thread's signal before recording it again.
            let status = unsafe { event_synchronize(event as CUevent) };
            if status != CUresult::CUDA_SUCCESS {
                return Err(format!("cuEventSynchronize: {status:?}"));
            }
            let one = 1u64.to_ne_bytes();
            rustix::io::write(&helper_signal, &one).map_err(|e| e.to_string())?;
        }
        Ok(())
    });

    println!(
        "{:>7}  {:46} {:>9} {:>9} {:>7}",
        "work", "method", "p50 us", "p99 us", "CPU %"
    );
    for work in [Duration::from_micros(200), Duration::from_millis(2)] {
        for (method, name) in METHODS {
            let (mut cpu, mut wall) = (Duration::ZERO, Duration::ZERO);
            let mut windows = Vec::new();
            for i in 0..slots {
                let (mut ns, mut out) =
                    (work.as_nanos() as u64, stamps.device_ptr() + 16 * i as u64);
                let mut args: [*mut c_void; 2] =
                    [(&mut ns as *mut u64).cast(), (&mut out as *mut u64).cast()];
                let cpu0 = cpu_time();
                let start = Instant::now();
                // SAFETY: spin_ns(u64 ns, u64 out) writes two u64 at slot i
                // of `stamps`, which outlives every wait below.
                unsafe { stream.launch(&spin, [1, 1, 1], [1, 1, 1], 0, &mut args) }?;
                match method {
                    Method::Sleep => {
                        std::thread::sleep(work + Duration::from_micros(200));
                        let _guard = cuda.enter()?;
                        // SAFETY: a live stream of the current context.
                        let _ = unsafe { stream_query(stream.raw()) };
                    }
                    Method::EventSynchronize => {
                        stream.record(&blocking_event)?;
                        let _guard = cuda.enter()?;
                        // SAFETY: a live event of the current context,
                        // recorded after a kernel that always ends.
                        let status = unsafe { event_synchronize(blocking_event.raw()) };
                        if status != CUresult::CUDA_SUCCESS {
                            return Err(format!("cuEventSynchronize: {status:?}").into());
                        }
                    }
                    Method::Block => stream.synchronize_with(HostWait::Block, TIMEOUT)?,
                    Method::HostFuncOneFd => {
                        {
                            let _guard = cuda.enter()?;
                            // SAFETY: a live stream of the current context;
                            // the function writes the eventfd, open until
                            // the end of main, whose number is the data.
                            let status = unsafe {
                                launch_host_func(
                                    stream.raw() as CUstream,
                                    Some(write_eventfd),
                                    one_fd.as_raw_fd() as usize as *mut c_void,
                                )
                            };
                            if status != CUresult::CUDA_SUCCESS {
                                return Err(format!("cuLaunchHostFunc: {status:?}").into());
                            }
                        }
                        wait_fd(&one_fd)?;
                    }
                    Method::Helper => {
                        stream.record(&blocking_event)?;
                        to_helper.send(blocking_event.raw() as usize)?;
                        wait_fd(&helper_fd)?;
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
            let late = late_after_kernel(&stream, &stamps, &windows, WARM_UP, TIMEOUT)?;
            let q = |p: f64| late[((late.len() as f64 - 1.0) * p).round() as usize];
            println!(
                "{:>7}  {:46} {:9.1} {:9.1} {:7.1}",
                format!("{work:?}"),
                name,
                q(0.5).as_secs_f64() * 1e6,
                q(0.99).as_secs_f64() * 1e6,
                100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
            );
        }
    }
    drop(to_helper);
    helper.join().map_err(|_| "helper panicked")??;
    Ok(())
}
