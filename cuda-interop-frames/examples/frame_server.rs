//! A frame producer for Python and Rust consumers: the command line of
//! `cuda_interop_frames::producer` (Vulkan writes frames into a small ring of
//! exportable device-local buffers and serves them over a Unix socket with
//! the frame-ring protocol, `cuda_interop_frames::protocol`).
//!
//! ```text
//! cargo run --release -p cuda-interop-frames --example frame_server -- [--name NAME | --socket PATH]
//!     [--width 1920] [--height 1080] [--row-pitch BYTES] [--slots 4]
//!     [--seconds 300] [--frames N] [--fps F] [--hold-timeout 5] [--device UUID]
//!     [--host-visible] [--no-semaphores] [--image [--image-format rgba8|rgba16f]]
//! ```
//!
//! * Each frame `f` (from 1) is written with transfer commands only: the whole
//!   buffer filled with the `u32` `f` (little-endian RGBA bytes), then a band
//!   of `height / 16` rows at a row moving 8 rows a frame filled with `!f`
//!   (`protocol::band_rows`). Rows are `--row-pitch` bytes apart (default
//!   `width * 4`).
//! * `--name` announces it in `$XDG_RUNTIME_DIR/cuda-interop-frames`
//!   (receivers connect by name; `frame_client --list` lists senders).
//! * Each receiver chooses latest (the newest frame when it asks; the sender
//!   never waits for it) or lossless (every frame; bounded back-pressure);
//!   see `cuda_interop_frames::sender`.
//! * A receiver that disconnects or dies gives its slots back; one that holds
//!   a slot longer than `--hold-timeout` seconds, or whose GPU release does
//!   not arrive within it, is disconnected. The others keep being served.
//! * Bounded: accepts, reads and writes have timeouts, and the whole run
//!   ends after `--seconds` (or `--frames`). Every change in the number of
//!   consumers prints the process's fd count and, when a CUDA driver is
//!   there, `cuMemGetInfo`'s free memory, next to the values before the first
//!   consumer.
//! * `--host-visible` puts the ring in host-visible memory instead, for
//!   Vulkan drivers without device-local-only memory (lavapipe: the CPU
//!   tests); CUDA consumers need the default, device-local.
//!   `--no-semaphores` (also for lavapipe, which exports none) shares only
//!   the buffers: frames are announced after their writes completed, and a
//!   release with a GPU signal is a protocol error. CUDA consumers refuse
//!   such a ring.
//! * `--image` serves OPTIMAL images (`--image-format`, default RGBA8)
//!   instead of pitched buffers (the same pattern of `u32` words, copied bit
//!   for bit into each slot's image; `--row-pitch` unused),
//!   released to the external queue family in `GENERAL` after each frame.

use std::process::ExitCode;
use std::time::Duration;

use cuda_interop_frames::producer::{self, ProducerOptions};

fn options() -> Result<ProducerOptions, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(
        &args,
        &["--host-visible", "--no-semaphores", "--image"],
        &[
            "--socket",
            "--name",
            "--image-format",
            "--width",
            "--height",
            "--row-pitch",
            "--slots",
            "--seconds",
            "--frames",
            "--fps",
            "--hold-timeout",
            "--device",
        ],
        |_| false,
    );
    let value = |name: &str| -> Option<&String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    fn num<T: std::str::FromStr>(name: &str, v: Option<&String>, default: T) -> Result<T, String> {
        v.map_or(Ok(default), |s| {
            s.parse()
                .map_err(|_| format!("{name} needs a number, not {s:?}"))
        })
    }
    let width = num("--width", value("--width"), 1920u32)?;
    let height = num("--height", value("--height"), 1080u32)?;
    let opts = ProducerOptions {
        name: value("--name").cloned(),
        socket: value("--socket")
            .cloned()
            .unwrap_or_else(|| "/tmp/cuda-interop-frames.sock".into()),
        width,
        height,
        row_pitch: num("--row-pitch", value("--row-pitch"), u64::from(width) * 4)?,
        slots: num("--slots", value("--slots"), 4u32)?,
        seconds: num("--seconds", value("--seconds"), 300.0f64)?,
        frames: value("--frames")
            .map(|s| {
                s.parse()
                    .map_err(|_| format!("--frames needs a number, not {s:?}"))
            })
            .transpose()?,
        fps: num("--fps", value("--fps"), 0.0f64)?,
        hold_timeout: Duration::from_secs_f64(num("--hold-timeout", value("--hold-timeout"), 5.0)?),
        device: value("--device")
            .map(|u| {
                u.parse::<vk_export::DeviceUuid>()
                    .map_err(|e| format!("--device: {e}"))
            })
            .transpose()?,
        host_visible: args.iter().any(|a| a == "--host-visible"),
        no_semaphores: args.iter().any(|a| a == "--no-semaphores"),
        image: if args.iter().any(|a| a == "--image") {
            let name = value("--image-format").map_or("rgba8", |s| s.as_str());
            Some(
                producer::ImageFormat::parse(name)
                    .ok_or_else(|| format!("--image-format: rgba8 or rgba16f, not {name:?}"))?,
            )
        } else {
            None
        },
    };
    opts.validate().map_err(|e| e.to_string())?;
    Ok(opts)
}

fn main() -> ExitCode {
    let opts = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("frame_server: {e}");
            return ExitCode::FAILURE;
        }
    };
    match producer::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("frame_server FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: frame_server [--name NAME] [--socket PATH] [--width 1920] [--height 1080] [--row-pitch BYTES]\n    [--slots 4] [--seconds 300] [--frames N] [--fps F] [--hold-timeout 5] [--device UUID]\n    [--host-visible] [--no-semaphores] [--image [--image-format rgba8|rgba16f]]";

/// Answers `-h`/`--help` with [`USAGE`] (exit 0) and refuses, with it
/// (exit 2), an argument that is none of `flags`, not the value after one of
/// `valued`, and not a positional argument `positional` accepts: a misspelt
/// flag is an error, never silently ignored.
fn check_args(args: &[String], flags: &[&str], valued: &[&str], positional: fn(&str) -> bool) {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.as_str();
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if valued.contains(&arg) {
            rest.next();
        } else if !flags.contains(&arg) && (arg.starts_with('-') || !positional(arg)) {
            eprintln!("unknown argument {arg:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
