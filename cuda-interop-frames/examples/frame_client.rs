//! A Rust CUDA receiver (`cuda_receiver::CudaReceiver`), the baseline for
//! the Python receivers: connects to `frame_server` or `renderer` by name
//! or path, then per frame enqueues the wait for "produced" on its stream
//! (an image ring's array is usable then), checks the demo pattern (unless
//! `--no-check`; an image ring's frame copied out of its array for that)
//! and releases the slot after its reads with a GPU signal. A multi-image
//! ring (`frame_server --with-depth`): every part of every frame copied out
//! and every texel checked against its part's pattern. Needs a ring with timelines in device-local memory (a GPU whose
//! driver exports semaphores); the refusal of any other says what to run.
//!
//! At the end it prints frames received and checked, bad ones (the exit
//! status is non-zero if any), dropped ones, frames/s, and the *hand-off*
//! (from the frame message's arrival to "produced" waited on the GPU, the
//! frame usable by CUDA, as in GPU runs 19-21; median
//! and p99: the lines `frames_matrix.sh` and `frames_measure.sh` read) and
//! the latency from the sender's timestamp to that point. `--host-staging`
//! is the baseline the zero-copy path is measured against: each frame
//! copied whole to pageable host memory and uploaded into a CUDA buffer of
//! its own (`common::cuda_host`). `--help` lists every option.

mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::cuda_host::{self, Checker, Staging};
use common::{Cli, Opt};
use cuda_interop::Stream;
use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::sender::monotonic_ns;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let mut opts = Opt::table(&[
        "--name NAME -- the sender's name (default: connect to --socket)",
        "--socket PATH -- the sender's socket (default /tmp/cuda-interop-frames.sock)",
        "--frames N -- frames to receive (default 300)",
        "--no-check -- leave out the pattern check (the hand-off alone)",
        "--hold-ms MS -- hold each frame this long before releasing it (default 0)",
        "--host-staging -- the baseline: each frame through host memory into CUDA memory",
        "--list -- list the named senders and exit",
    ]);
    opts.extend(common::receiver_opts(10.0));
    let about = "A CUDA receiver of frame_server and renderer: hand-off timing and pattern check.";
    let cli = Cli::parse("frame_client", about, &opts);
    match cli.flag("--list") {
        true => common::finish("frame_client", common::list_senders()),
        false => common::finish("frame_client", receive(&cli)),
    }
}

fn receive(cli: &Cli) -> Res<u64> {
    let (delivery, timeout) = (cli.delivery(), cli.seconds("--timeout", 10.0)?);
    let (frames, check) = (cli.num("--frames", 300u64)?, !cli.flag("--no-check"));
    let hold = Duration::try_from_secs_f64(cli.num("--hold-ms", 0.0)? / 1e3)
        .map_err(|_| "--hold-ms needs a number of milliseconds, 0 or more")?;
    let rx = match cli.value("--name") {
        Some(name) => CudaReceiver::connect_named_any(name, delivery, timeout)?,
        None => {
            let socket = cli
                .value("--socket")
                .unwrap_or("/tmp/cuda-interop-frames.sock");
            CudaReceiver::connect_any(socket, delivery, timeout)?
        }
    };
    let layout = *rx.layout();
    let mut stream = Stream::new(rx.cuda())?;
    stream.set_timeout(timeout);
    let mut staging = match cli.flag("--host-staging") {
        true => Some(Staging::new(rx.cuda(), &layout)?),
        false => None,
    };
    let mut checker = Checker::new(&rx)?;
    let ring = cuda_host::ring_words(&layout);
    let (path, usable_at) = match staging {
        Some(_) => (
            "staged through host memory (baseline)",
            "staged into CUDA memory",
        ),
        None => ("zero copy", "CUDA waited"),
    };
    println!(
        "[frame_client] {} on CUDA device {}: {} slots of {}x{}, {ring}, {delivery:?} delivery, {path}",
        rx.cuda().name(),
        rx.cuda().ordinal(),
        layout.slots,
        layout.width,
        layout.height,
    );
    let (mut bad, mut start, mut dropped_at_start) = (0u64, Instant::now(), 0u64);
    let (mut handoff_us, mut latency_us) = (Vec::new(), Vec::new());
    for i in 0..frames {
        let frame = rx.next(timeout)?;
        let arrived = Instant::now();
        // Timing starts after the first frame (the import and warm-up).
        if i == 1 {
            (start, dropped_at_start) = (arrived, rx.session().stats().dropped);
        }
        // The hand-off: "produced" waited on the GPU (an image ring's array
        // is readable then; its packed copy is the check's, below).
        rx.wait_produced(&frame, &stream)?;
        if staging.is_some() && layout.is_image_ring() {
            rx.wait_on(&frame, &stream)?; // the packed copy staging reads
        }
        stream.synchronize(timeout)?;
        if let Some(staging) = staging.as_mut() {
            staging.stage(&rx, &frame, &stream, timeout)?;
        }
        if i >= 1 {
            handoff_us.push(arrived.elapsed().as_secs_f64() * 1e6);
            latency_us.push(monotonic_ns().saturating_sub(frame.timestamp_ns()) as f64 / 1e3);
        }
        let f = frame.sequence();
        let host = staging.as_ref().map(Staging::host);
        if check && !checker.check(&rx, &frame, &stream, host, timeout)? {
            bad += 1;
            if bad <= 5 {
                eprintln!("[frame_client] frame {f} (slot {}) is wrong", frame.slot());
            }
        }
        std::thread::sleep(hold);
        rx.release_after(frame, &stream)?;
    }
    stream.synchronize(timeout)?;
    let stats = rx.session().stats();
    if frames > 1 {
        let secs = start.elapsed().as_secs_f64();
        let ((h50, h99), (l50, l99)) = (
            common::median_p99(&mut handoff_us),
            common::median_p99(&mut latency_us),
        );
        println!(
            "[frame_client] {} frames ({} checked, {bad} bad), {} dropped ({} after the first), \
             {:.1} frames/s, {:.3} ms/frame; hand-off (packet -> {usable_at}) median {h50:.1} us \
             p99 {h99:.1} us; present-to-usable latency median {l50:.1} us p99 {l99:.1} us",
            stats.received,
            if check { stats.received } else { 0 },
            stats.dropped,
            stats.dropped - dropped_at_start,
            (frames - 1) as f64 / secs,
            secs * 1e3 / (frames - 1) as f64,
        );
    }
    Ok(bad)
}
