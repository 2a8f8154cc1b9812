//! A Vulkan receiver of an image ring on a device of its own (the
//! Vulkan-to-Vulkan case, `vulkan_receiver::VulkanReceiver`): connects by
//! name in latest (default) or lossless delivery, imports the ring's
//! images on its own headless `VkDevice` (device-local or host-visible, as
//! the sender's records say), and for each frame reads the image back and
//! checks every pixel against the demo pattern (`common::demo`) of
//! `frame_server --image` and `renderer`. A multi-image ring
//! (`frame_server --with-depth`) is read with `parts_reader::PartsReader`:
//! every part of every frame read back and every texel checked against
//! its part's pattern (`demo::check_part_row`). Runs on lavapipe: see
//! `frame_server`'s docs for the pair of commands.
//!
//! Prints frames received, bad ones (the exit status is non-zero if any),
//! dropped ones, frames/s and the per-frame read-back and check, median
//! and p99. `--help` lists every option with its default.

mod common;

use std::process::ExitCode;
use std::time::Instant;

use common::demo::{self, ImageFormat};
use common::{Cli, Opt};
use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::parts_reader::PartsReader;
use cuda_interop_frames::session::Session;
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use vk_export::ash::vk;
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation};
use vk_export::wire::{Received, Resource};
use vk_export::{Context, HeadlessOptions, Validation};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let mut opts = Opt::table(&[
        "--name NAME -- the sender's name (needed; frame_client --list lists them)",
        "--frames N -- frames to receive and check (default 100)",
        "--host-visible -- require host-visible slots (default: take what the sender has)",
    ]);
    opts.extend(common::receiver_opts(10.0));
    let about = "A Vulkan receiver of an image ring on its own device: every pixel of every frame \
                 checked.";
    let cli = Cli::parse("vulkan_client", about, &opts);
    common::finish("vulkan_client", run(&cli))
}

fn run(cli: &Cli) -> Res<u64> {
    let name = cli
        .value("--name")
        .ok_or("pass --name NAME: the sender's --name (frame_client --list lists them)")?;
    let (delivery, timeout) = (cli.delivery(), cli.seconds("--timeout", 10.0)?);
    let (session, setup) =
        Session::connect_named_any(&Directory::from_env()?, name, delivery, timeout)?;
    if session.layout().is_multi_image() {
        return receive_parts(cli, session, setup);
    }
    let Some(format) = session.layout().vk_format() else {
        return Err(format!(
            "{name:?} shares pitched buffers, which this client does not read: run the sender \
             with --image rgba8 (frame_server), or read the buffers with frame_client (CUDA) or \
             the Python module"
        )
        .into());
    };
    let host_visible = match setup.message().resources.first() {
        Some(Resource::Image(info)) => HostVisible::admits(info.memory_flags()),
        _ => false,
    };
    if cli.flag("--host-visible") && !host_visible {
        return Err(format!("{name:?}'s slots are device-local: leave --host-visible out").into());
    }
    let a = (cli, session, setup);
    let raw = vk::Format::from_raw(format as i32);
    let Some(&(image_format, _)) = ImageFormat::ALL.iter().find(|(f, _)| f.vk().0 == raw) else {
        return Err(format!(
            "{name:?} shares images of {raw:?}; this client reads the demo's: run the sender \
             with --image {}",
            ImageFormat::NAMES
        )
        .into());
    };
    if host_visible {
        demo::with_image_format!(image_format, receive::<_, HostVisible>(a))
    } else {
        demo::with_image_format!(image_format, receive::<_, DeviceLocal>(a))
    }
}

/// The device the setup message's records name: the receiver's own,
/// without the validation layer (which would be measured too).
fn own_device(setup: &Received) -> Res<Context> {
    Ok(Context::headless(&HeadlessOptions {
        device_uuid: match setup.message().resources.first() {
            Some(Resource::Image(info)) => Some(info.device_uuid()),
            _ => None,
        },
        validation: Validation::Off,
        ..HeadlessOptions::default()
    })?)
}

/// A multi-image ring's frames: every part read back, every texel checked.
fn receive_parts(cli: &Cli, session: Session, setup: Received) -> Res<u64> {
    let (delivery, timeout) = (cli.delivery(), cli.seconds("--timeout", 10.0)?);
    let frames = cli.num("--frames", 100u64)?;
    let layout = *session.layout();
    let names: Vec<String> = session.parts().iter().map(|p| p.name.to_string()).collect();
    // frame_server --with-depth's parts, or the first of them
    // (--color-part-only): part p's words are demo::part_words(p, ..).
    let known = names.len() <= demo::DEPTH_PARTS.len()
        && names.iter().zip(demo::DEPTH_PARTS).all(|(n, d)| n == d);
    if names.is_empty() || !known {
        return Err(format!(
            "the sender's parts are {names:?}; this client checks frame_server --with-depth's \
             {:?} (or its first ones)",
            demo::DEPTH_PARTS
        )
        .into());
    }
    let ctx = own_device(&setup)?;
    let rx = PartsReader::new(&ctx, session, setup)?;
    println!(
        "[vulkan_client] own device {}: {} slots of {}x{} parts {}, {delivery:?} delivery",
        ctx.identity().name,
        layout.slots,
        layout.width,
        layout.height,
        names.join(" + "),
    );
    let (mut bad, mut start, mut dropped_at_start) = (0u64, Instant::now(), 0u64);
    let mut readback_ms = Vec::new();
    for i in 0..frames {
        let frame = rx.next(timeout)?;
        if i == 1 {
            (start, dropped_at_start) = (Instant::now(), rx.session().stats().dropped);
        }
        let t = Instant::now();
        let parts = rx.read_parts(&frame, timeout)?;
        let f = frame.sequence();
        let ok = parts
            .iter()
            .zip(rx.parts())
            .enumerate()
            .all(|(p, (bytes, part))| {
                let row = part.row_bytes(layout.width) as usize;
                bytes.len() == row * layout.height as usize
                    && bytes
                        .chunks_exact(row)
                        .zip(0..)
                        .all(|(line, y)| demo::check_part_row(line, p, f, y, layout.height))
            });
        if i >= 1 {
            readback_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if !ok {
            bad += 1;
            if bad <= 5 {
                eprintln!("[vulkan_client] frame {f} (slot {}) is wrong", frame.slot());
            }
        }
        rx.release(frame)?;
    }
    let stats = rx.session().stats();
    if frames > 1 {
        let secs = start.elapsed().as_secs_f64();
        let (m50, m99) = common::median_p99(&mut readback_ms);
        println!(
            "[vulkan_client] {} frames ({} checked, every texel of every part, {bad} bad), {} \
             dropped ({} after the first), {:.1} frames/s, {:.3} ms/frame; read-back and check \
             median {m50:.3} ms p99 {m99:.3} ms",
            stats.received,
            stats.received,
            stats.dropped,
            stats.dropped - dropped_at_start,
            (frames - 1) as f64 / secs,
            secs * 1e3 / (frames - 1) as f64,
        );
    }
    Ok(bad)
}

fn receive<F: demo::DemoFormat, M: MemoryLocation>(
    (cli, session, setup): (&Cli, Session, Received),
) -> Res<u64> {
    let (delivery, timeout) = (cli.delivery(), cli.seconds("--timeout", 10.0)?);
    let frames = cli.num("--frames", 100u64)?;
    let layout = *session.layout();
    // The receiver's own device, on the sender's GPU; without the
    // validation layer, which would be measured too.
    let ctx = Context::headless(&HeadlessOptions {
        device_uuid: match setup.message().resources.first() {
            Some(Resource::Image(info)) => Some(info.device_uuid()),
            _ => None,
        },
        validation: Validation::Off,
        ..HeadlessOptions::default()
    })?;
    let rx = VulkanReceiver::<F, M, F::Usage>::new(&ctx, session, setup)?;
    println!(
        "[vulkan_client] own device {}: {} slots of {}x{} {} in {}, {delivery:?} delivery",
        ctx.identity().name,
        layout.slots,
        layout.width,
        layout.height,
        F::NAME,
        M::describe(),
    );
    let row = (layout.width * F::TEXEL_BYTES) as usize;
    let (mut bad, mut start, mut dropped_at_start) = (0u64, Instant::now(), 0u64);
    let mut readback_ms = Vec::new();
    for i in 0..frames {
        let frame = rx.next(timeout)?;
        if i == 1 {
            (start, dropped_at_start) = (Instant::now(), rx.session().stats().dropped);
        }
        let t = Instant::now();
        let pixels = rx.read_pixels(&frame, timeout)?;
        let f = frame.sequence();
        let ok = pixels.len() == row * layout.height as usize
            && pixels
                .chunks_exact(row)
                .zip(0..)
                .all(|(line, y)| demo::check_demo_row(line, f, y, layout.height));
        if i >= 1 {
            readback_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if !ok {
            bad += 1;
            if bad <= 5 {
                eprintln!("[vulkan_client] frame {f} (slot {}) is wrong", frame.slot());
            }
        }
        rx.release(frame)?;
    }
    let stats = rx.session().stats();
    if frames > 1 {
        let secs = start.elapsed().as_secs_f64();
        let (m50, m99) = common::median_p99(&mut readback_ms);
        println!(
            "[vulkan_client] {} frames ({} checked, every pixel, {bad} bad), {} dropped ({} after \
             the first), {:.1} frames/s, {:.3} ms/frame; read-back and check median {m50:.3} ms \
             p99 {m99:.3} ms",
            stats.received,
            stats.received,
            stats.dropped,
            stats.dropped - dropped_at_start,
            (frames - 1) as f64 / secs,
            secs * 1e3 / (frames - 1) as f64,
        );
    }
    Ok(bad)
}
