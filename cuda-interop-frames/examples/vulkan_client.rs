//! A Vulkan receiver of an image ring on a device of its own (the
//! Vulkan-to-Vulkan case): connects by name in latest (default) or lossless
//! mode, imports the ring's images on its own headless `VkDevice`
//! (`vulkan_receiver::VulkanReceiver`), and for each frame copies the image
//! back after the sender's "produced" value (on the GPU) and checks every
//! pixel against the demo pattern of `frame_server --image` and the
//! `renderer` example.
//!
//! ```text
//! cargo run --release -p cuda-interop-frames --example vulkan_client -- --name NAME \
//!     [--lossless] [--frames 100] [--timeout 10] [--host-visible]
//! ```
//!
//! `--host-visible` for a sender whose slots are host-visible (lavapipe).
//! Prints frames received, bad ones (the exit status is non-zero if any),
//! dropped frames, frames/s and the per-frame read-back (the image copied
//! to this process and checked) median and p99.

mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::producer::check_demo_row;
use cuda_interop_frames::receiver::{Delivery, FrameReceiver};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use vk_export::format::{Format, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation};
use vk_export::{Context, HeadlessOptions, Validation};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const USAGE: &str =
    "usage: vulkan_client --name NAME [--lossless] [--frames 100] [--timeout 10] [--host-visible]";

struct Args {
    name: String,
    delivery: Delivery,
    frames: u64,
    timeout: Duration,
    host_visible: bool,
}

fn args() -> Result<Args, String> {
    let cli = common::Cli::parse(
        USAGE,
        &["--lossless", "--host-visible"],
        &["--name", "--frames", "--timeout"],
    );
    Ok(Args {
        name: cli
            .value("--name")
            .ok_or(format!("--name is needed\n{USAGE}"))?
            .to_string(),
        delivery: cli.delivery(),
        frames: cli.num("--frames", 100u64)?,
        timeout: cli.seconds("--timeout", 10.0)?,
        host_visible: cli.flag("--host-visible"),
    })
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vulkan_client: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(bad) => {
            eprintln!("vulkan_client: {bad} bad frames");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("vulkan_client FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Res<u64> {
    let rx = FrameReceiver::connect_named(&Directory::from_env()?, &a.name, a.delivery, a.timeout)?;
    let hello = *rx.layout();
    let format = vk_export::ash::vk::Format::from_raw(hello.format as i32);
    match (format, a.host_visible) {
        (Rgba8Unorm::VK, false) => receive::<Rgba8Unorm, DeviceLocal>(a, rx),
        (Rgba8Unorm::VK, true) => receive::<Rgba8Unorm, HostVisible>(a, rx),
        (Rgba16Sfloat::VK, false) => receive::<Rgba16Sfloat, DeviceLocal>(a, rx),
        (Rgba16Sfloat::VK, true) => receive::<Rgba16Sfloat, HostVisible>(a, rx),
        _ => Err(format!(
            "the sender's ring is not of RGBA8 or RGBA16F images (VkFormat {}, image ring: {})",
            hello.format,
            hello.is_image_ring()
        )
        .into()),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn receive<F: Format, M: MemoryLocation>(a: &Args, rx: FrameReceiver) -> Res<u64> {
    let hello = *rx.layout();
    // The receiver's own device (a second VkDevice on the sender's GPU);
    // without the validation layer, which would be measured too (the
    // library's tests run with it).
    let ctx = Context::headless(&HeadlessOptions {
        validation: Validation::Off,
        ..HeadlessOptions::default()
    })?;
    let mut vrx = VulkanReceiver::<F, M>::new(&ctx, rx)?;
    println!(
        "[vulkan_client] own device {}: {} slots of {}x{} {}, {:?} delivery",
        ctx.identity().name,
        hello.slot,
        hello.width,
        hello.height,
        F::NAME,
        a.delivery
    );
    let row = (hello.width * F::TEXEL_BYTES) as usize;
    let (mut bad, mut start, mut dropped_at_start) = (0u64, None, 0u64);
    let mut readback_ms = Vec::new();
    for i in 0..a.frames {
        let frame = vrx.next_frame(a.timeout)?;
        if i == 1 {
            start = Some(Instant::now());
            dropped_at_start = vrx.receiver().stats().dropped;
        }
        let t = Instant::now();
        let pixels = vrx.read_pixels(&frame, a.timeout)?;
        let f = frame.sequence;
        let ok = pixels
            .chunks_exact(row)
            .zip(0..)
            .all(|(line, y)| check_demo_row(line, f, y, hello.height));
        if i >= 1 {
            readback_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if !ok {
            bad += 1;
            if bad <= 5 {
                eprintln!("[vulkan_client] frame {f} (slot {}) is wrong", frame.slot);
            }
        }
        vrx.release(frame)?;
    }
    let stats = vrx.receiver().stats();
    if let Some(start) = start.filter(|_| a.frames > 1) {
        let secs = start.elapsed().as_secs_f64();
        readback_ms.sort_by(f64::total_cmp);
        println!(
            "[vulkan_client] {} frames ({} checked, every pixel, {bad} bad), {} dropped ({} after \
             the first), {:.1} frames/s, {:.3} ms/frame; read-back and check median {:.3} ms p99 \
             {:.3} ms",
            stats.received,
            stats.received,
            stats.dropped,
            stats.dropped - dropped_at_start,
            (a.frames - 1) as f64 / secs,
            secs * 1e3 / (a.frames - 1) as f64,
            percentile(&readback_ms, 0.5),
            percentile(&readback_ms, 0.99),
        );
    }
    Ok(bad)
}
