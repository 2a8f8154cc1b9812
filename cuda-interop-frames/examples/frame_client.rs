//! A Rust CUDA receiver of `frame_server`: the baseline for the Python
//! receivers. It connects by name or path in latest (default) or lossless
//! mode, imports the ring into CUDA once, then for each frame waits on the
//! GPU for the sender's "produced" value, optionally copies five sampled rows
//! (the first, the band's first and last, the row after the band, the last)
//! back and checks every pixel of them against the sequence number, and
//! releases the slot with a GPU signal of its "released" timeline.
//!
//! An image ring (`frame_server --image`, OPTIMAL RGBA8 or RGBA16F) is
//! imported as CUDA arrays (`import_received_image`, `map_array`); the check
//! then copies the whole level back (`LevelArray::copy_to_host`) and checks
//! every row (as `u32` words), and the first line says `image ring of
//! R8G8B8A8_UNORM arrays` (or `R16G16B16A16_SFLOAT`) instead of the row
//! pitch.
//!
//! ```text
//! cargo run --release -p cuda-interop-frames --example frame_client -- \
//!     [--name NAME | --socket PATH] [--lossless] [--frames 300] [--timeout 10] \
//!     [--no-check] [--hold-ms 0] [--host-staging]
//! cargo run --release -p cuda-interop-frames --example frame_client -- --list
//! ```
//!
//! Prints, at the end: frames received and checked, bad ones (the exit
//! status is non-zero if any), dropped frames (sequence gaps: latest mode
//! skips what it did not ask for), frames/s, and per frame the *hand-off*
//! (from the frame packet's arrival to the CUDA stream having waited for
//! "produced", i.e. the frame usable by CUDA; median and p99) and the
//! latency from the sender's presentation timestamp (`CLOCK_MONOTONIC`) to
//! that point. `--no-check` leaves out the row copies (the hand-off alone);
//! `--hold-ms` holds each frame that long before releasing it (a slow
//! receiver). Every wait is bounded by `--timeout`.
//!
//! `--host-staging` is the baseline the zero-copy path is measured against:
//! what a pipeline without interop does. After the "produced" wait each
//! frame is copied whole to host memory (pageable, as a socket or a file
//! would need it) and uploaded into a CUDA buffer of the receiver's own;
//! the hand-off then ends when that upload is done, and the check (unless
//! `--no-check`) reads the host copy.

mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop::{DeviceBuffer, Stream};
use cuda_interop_frames::discovery::{self, Directory};
use cuda_interop_frames::protocol;
use cuda_interop_frames::receiver::{Delivery, FrameReceiver};
use cuda_interop_frames::sender::monotonic_ns;
use cuda_interop_frames::{consumer, producer};
use vk_export::format::{Format, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, Optimal};
use vk_export::semaphore_kinds::Timeline;
use vk_export::wire::Resource;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    name: Option<String>,
    socket: String,
    delivery: Delivery,
    frames: u64,
    timeout: Duration,
    check: bool,
    hold: Duration,
    host_staging: bool,
}

fn main() -> ExitCode {
    let cli = common::Cli::parse(
        USAGE,
        &["--list", "--lossless", "--no-check", "--host-staging"],
        &["--socket", "--name", "--frames", "--timeout", "--hold-ms"],
    );
    if cli.flag("--list") {
        return match discovery::list_senders() {
            Ok(senders) => {
                for s in senders {
                    println!(
                        "{}: {}x{} {} {:?} ring of {} slots, {:.1} frames/s, pid {}",
                        s.name, s.width, s.height, s.format, s.kind, s.slots, s.fps, s.pid
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("frame_client: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let parsed = (|| -> Result<Args, String> {
        Ok(Args {
            name: cli.value("--name").map(str::to_string),
            socket: cli
                .value("--socket")
                .unwrap_or("/tmp/cuda-interop-frames.sock")
                .to_string(),
            delivery: cli.delivery(),
            frames: cli.num("--frames", 300u64)?,
            timeout: cli.seconds("--timeout", 10.0)?,
            check: !cli.flag("--no-check"),
            hold: Duration::from_secs_f64(cli.num("--hold-ms", 0.0f64)? / 1e3),
            host_staging: cli.flag("--host-staging"),
        })
    })();
    let a = match parsed {
        Ok(a) => a,
        Err(e) => {
            eprintln!("frame_client: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(bad) => {
            eprintln!("frame_client: {bad} bad frames");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("frame_client FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn run(a: &Args) -> Res<u64> {
    let rx = match &a.name {
        Some(name) => {
            FrameReceiver::connect_named(&Directory::from_env()?, name, a.delivery, a.timeout)?
        }
        None => FrameReceiver::connect(&a.socket, a.delivery, a.timeout)?,
    };
    let hello = *rx.layout();
    let format = hello.format;
    if !hello.is_image_ring() || format == Rgba8Unorm::VK.as_raw() as u32 {
        receive::<Rgba8Unorm>(a, rx)
    } else if format == Rgba16Sfloat::VK.as_raw() as u32 {
        receive::<Rgba16Sfloat>(a, rx)
    } else {
        Err(format!(
            "the sender's images are VkFormat {format}; this client reads \
             R8G8B8A8_UNORM and R16G16B16A16_SFLOAT"
        )
        .into())
    }
}

/// Receives with `F` the images' format (unused for a buffer ring).
fn receive<F: Format>(a: &Args, mut rx: FrameReceiver) -> Res<u64> {
    let hello = *rx.layout();
    let n = hello.slot as usize;
    let mut setup = rx.take_setup().expect("a new receiver has its setup");
    consumer::check_setup(&hello, &setup)?;
    let image_ring = hello.is_image_ring();
    // check_setup: at least the n slots' resources are there.
    let uuid = match &setup.message().resources[0] {
        Resource::Image(info) => info.device_uuid(),
        Resource::Buffer(info) => info.device_uuid(),
        _ => return Err("the ring's first resource is neither a buffer nor an image".into()),
    };
    let cuda = consumer::cuda_device_for(uuid)?;
    let (mut buffer_imports, mut image_imports) = (Vec::new(), Vec::new());
    for i in 0..n {
        if image_ring {
            let image = setup.take_image::<F, Optimal, DeviceLocal, usage::Storage>(i)?;
            image_imports.push(
                cuda.import_received_image(image)
                    .map_err(|e| e.into_error())?,
            );
        } else {
            let buffer = setup.take_buffer::<DeviceLocal>(i)?;
            buffer_imports.push(
                cuda.import_received_buffer(buffer)
                    .map_err(|e| e.into_error())?,
            );
        }
    }
    let mut semaphore = |i: usize| -> Res<_> {
        let received = setup.take_semaphore::<Timeline>(i)?;
        Ok(cuda
            .import_received_semaphore(received)
            .map_err(|e| e.into_error())?)
    };
    let produced = semaphore(n)?;
    let released = (0..n)
        .map(|i| semaphore(n + 1 + i))
        .collect::<Res<Vec<_>>>()?;
    let maps = buffer_imports
        .iter_mut()
        .map(|b| b.map())
        .collect::<cuda_interop::Result<Vec<_>>>()?;
    let arrays = image_imports
        .iter()
        .map(|i| i.map_array())
        .collect::<cuda_interop::Result<Vec<_>>>()?;
    let levels = arrays
        .iter()
        .map(|a| a.level(0))
        .collect::<cuda_interop::Result<Vec<_>>>()?;
    let mut stream = Stream::new(&cuda)?;
    stream.set_timeout(a.timeout);
    let row = u64::from(hello.width) * 4;
    let mut rows: Vec<DeviceBuffer> = (0..5)
        .map(|_| DeviceBuffer::new(&cuda, row as usize))
        .collect::<cuda_interop::Result<_>>()?;
    let mut host = vec![0u8; row as usize];
    let image_row = u64::from(hello.width) * u64::from(F::TEXEL_BYTES);
    // Image rings: tightly packed rows (check_setup checked the hello's
    // layout); buffer rings: pitched rows, the last one only as wide as the
    // frame.
    let frame_bytes = consumer::frame_bytes_of(&hello)? as usize;
    let mut frame_host = vec![
        0u8;
        if image_ring || a.host_staging {
            frame_bytes
        } else {
            0
        }
    ];
    // --host-staging: the receiver's own CUDA copy of each frame.
    let mut uploaded = if a.host_staging {
        Some(DeviceBuffer::new(&cuda, frame_bytes)?)
    } else {
        None
    };
    let layout = if image_ring {
        format!("image ring of {} arrays", F::NAME)
    } else {
        format!("row pitch {}", hello.row_pitch)
    };
    let path = if a.host_staging {
        "staged through host memory (baseline)"
    } else {
        "zero copy"
    };
    println!(
        "[frame_client] {} on CUDA device {}: {n} slots of {}x{}, {layout}, {:?} delivery, {path}",
        cuda.name(),
        cuda.ordinal(),
        hello.width,
        hello.height,
        a.delivery
    );

    let (mut bad, mut start, mut dropped_at_start) = (0u64, None, 0u64);
    let (mut handoff_us, mut latency_us) = (Vec::new(), Vec::new());
    for i in 0..a.frames {
        let frame = rx.next_frame(a.timeout)?;
        let arrived = Instant::now();
        // Timing starts after the first frame (ring import and warm-up).
        if i == 1 {
            start = Some(arrived);
            dropped_at_start = rx.stats().dropped;
        }
        let (slot, f) = (frame.slot as usize, frame.sequence);
        produced.wait(&stream, f)?;
        stream.synchronize(a.timeout)?;
        if let Some(uploaded) = uploaded.as_mut() {
            // Each copy waits until it is done (pageable host memory).
            if image_ring {
                levels[slot].copy_to_host(&stream, &mut frame_host)?;
            } else {
                maps[slot].copy_to_host(&stream, &mut frame_host)?;
            }
            stream.copy_from_host(&frame_host, uploaded)?;
        }
        let usable = Instant::now();
        if i >= 1 {
            handoff_us.push((usable - arrived).as_secs_f64() * 1e6);
            latency_us.push(monotonic_ns().saturating_sub(frame.timestamp_ns) as f64 / 1e3);
        }
        if a.check && image_ring {
            if !a.host_staging {
                levels[slot].copy_to_host(&stream, &mut frame_host)?;
            }
            let ok = frame_host
                .chunks_exact(image_row as usize)
                .zip(0..)
                .all(|(pixels, y)| producer::check_demo_row(pixels, f, y, hello.height));
            if !ok {
                bad += 1;
                if bad <= 5 {
                    eprintln!("[frame_client] frame {f} (slot {slot}) is wrong");
                }
            }
        } else if a.check {
            let (band_start, band_end) = protocol::band_rows(f, hello.height);
            let last = hello.height - 1;
            let sampled = [0, band_start, band_end - 1, band_end.min(last), last];
            if !a.host_staging {
                for (dst, &y) in rows.iter_mut().zip(&sampled) {
                    let slice = maps[slot].slice(u64::from(y) * hello.row_pitch, row)?;
                    stream.copy_device(&slice, dst)?;
                }
            }
            let mut ok = true;
            for (src, &y) in rows.iter().zip(&sampled) {
                if a.host_staging {
                    let at = (u64::from(y) * hello.row_pitch) as usize;
                    host.copy_from_slice(&frame_host[at..at + row as usize]);
                } else {
                    stream.copy_to_host(src, &mut host)?;
                }
                let want = if (band_start..band_end).contains(&y) {
                    protocol::band_value(f)
                } else {
                    protocol::background(f)
                };
                ok &= host
                    .chunks_exact(4)
                    .all(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]) == want);
            }
            if !ok {
                bad += 1;
                if bad <= 5 {
                    eprintln!("[frame_client] frame {f} (slot {slot}) is wrong");
                }
            }
        }
        if !a.hold.is_zero() {
            std::thread::sleep(a.hold);
        }
        released[slot].signal(&stream, f)?;
        rx.release(frame, true)?;
    }
    stream.synchronize(a.timeout)?;
    let stats = rx.stats();
    if let Some(start) = start.filter(|_| a.frames > 1) {
        let secs = start.elapsed().as_secs_f64();
        handoff_us.sort_by(f64::total_cmp);
        latency_us.sort_by(f64::total_cmp);
        println!(
            "[frame_client] {} frames ({} checked, {bad} bad), {} dropped ({} after the first), \
             {:.1} frames/s, {:.3} ms/frame; hand-off (packet -> {}) median {:.1} us \
             p99 {:.1} us; present-to-usable latency median {:.1} us p99 {:.1} us",
            stats.received,
            if a.check { stats.received } else { 0 },
            stats.dropped,
            stats.dropped - dropped_at_start,
            (a.frames - 1) as f64 / secs,
            secs * 1e3 / (a.frames - 1) as f64,
            if a.host_staging {
                "staged into CUDA memory"
            } else {
                "CUDA waited"
            },
            percentile(&handoff_us, 0.5),
            percentile(&handoff_us, 0.99),
            percentile(&latency_us, 0.5),
            percentile(&latency_us, 0.99),
        );
    }
    Ok(bad)
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: frame_client [--name NAME | --socket PATH] [--frames 300] [--timeout 10]\n    [--lossless] [--no-check] [--hold-ms MS] [--host-staging]\n       frame_client --list";
