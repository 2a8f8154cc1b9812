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

mod common;

use std::process::ExitCode;

use cuda_interop_frames::producer::{self, ProducerOptions};

fn options() -> Result<ProducerOptions, String> {
    let cli = common::Cli::parse(
        USAGE,
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
    );
    let shared = common::producer_options(&cli, (1920, 1080), 300.0)?;
    let opts = ProducerOptions {
        socket: cli
            .value("--socket")
            .unwrap_or("/tmp/cuda-interop-frames.sock")
            .to_string(),
        row_pitch: cli.num("--row-pitch", shared.row_pitch)?,
        device: cli
            .value("--device")
            .map(|u| {
                u.parse::<vk_export::DeviceUuid>()
                    .map_err(|e| format!("--device: {e}"))
            })
            .transpose()?,
        host_visible: cli.flag("--host-visible"),
        no_semaphores: cli.flag("--no-semaphores"),
        image: cli
            .flag("--image")
            .then(|| common::image_format("--image-format", cli.value("--image-format")))
            .transpose()?,
        ..shared
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
