//! The demo sender (`common::demo::run`): a headless Vulkan device writes
//! the demo pattern into a small ring of exportable buffers (or OPTIMAL
//! images, `--image`) and serves it by name (`--name`) or socket path
//! (`--socket`) to receivers in other processes: `frame_client` (CUDA),
//! `vulkan_client` (Vulkan, image rings), the Python module.
//!
//! Memory and semaphores are what the device offers unless told, and the
//! first lines say what was chosen and which receivers take the ring: on a
//! GPU whose driver exports semaphores (NVIDIA), device-local slots with
//! timelines (every receiver); on lavapipe, host-visible slots without
//! timelines (Vulkan receivers of an image ring, host receivers of a
//! buffer ring). `--wait-for-receivers N` presents nothing until N
//! receivers have subscribed; `--seconds` and `--frames` bound the run.
//! `--with-depth` serves a multi-image ring instead: every slot a colour
//! (RGBA8), a depth (R32_SFLOAT, copied from a `D32_SFLOAT` attachment)
//! and a segmentation (R32_UINT) image of one frame (3 slots unless
//! `--slots` says fewer). `--help` lists every option with its default.
//!
//! The Vulkan-to-Vulkan pair that runs on lavapipe (no GPU), in two shells
//! (the sender waits for the receiver, the receiver takes every frame it
//! is sent, each pixel checked):
//!
//! ```text
//! cargo run -p cuda-interop-frames --example frame_server -- --name cam --image rgba8 --frames 120 --wait-for-receivers 1
//! cargo run -p cuda-interop-frames --example vulkan_client -- --name cam --frames 60 --lossless
//! ```

mod common;

use std::process::ExitCode;

use common::demo::{self, ImageFormat, ProducerOptions};
use common::{Cli, Opt};
use cuda_interop_frames::protocol::Planar;

fn options() -> Result<ProducerOptions, String> {
    let mut opts = vec![
        Opt::valued(
            "--name",
            "NAME",
            "announce the ring by this name (default: serve --socket)",
        ),
        Opt::valued(
            "--socket",
            "PATH",
            "serve on this socket when no --name is given (default /tmp/cuda-interop-frames.sock)",
        ),
        Opt::optional(
            "--image",
            ImageFormat::NAMES,
            "serve OPTIMAL images of this format (default rgba8) instead of pitched RGBA8 buffers",
        ),
        Opt::valued(
            "--image-format",
            ImageFormat::NAMES,
            "the same as --image FORMAT",
        ),
        Opt::valued(
            "--format",
            "rgba8|nv12|p010|IMAGE",
            "pitched buffers of RGBA8 (the default) or planar YUV 4:2:0 (NV12, P010: \
             the luma plane, then the chroma plane at row pitch x height), or an image \
             format as --image takes",
        ),
        Opt::valued(
            "--row-pitch",
            "BYTES",
            "bytes between buffer rows (default: width * 4)",
        ),
        Opt::flag(
            "--with-depth",
            "serve colour + depth + segmentation images a slot (a multi-image ring, 3 slots)",
        ),
        Opt::flag(
            "--concurrent-targets",
            "with --with-depth: the application's images are CONCURRENT between the main and \
             the transfer family, so the present's copies of colour parts may run on the \
             transfer queue (a depth part keeps them on the main one)",
        ),
        Opt::flag(
            "--depth-through-buffer",
            "with --with-depth, a measurement knob: copy depth through a buffer even where \
             the device copies it directly (VK_KHR_maintenance8)",
        ),
        Opt::flag(
            "--render-clears",
            "with --with-depth, a measurement knob: render each image by a clear (the \
             graphics engine, as draws) and a copy of the band rows, not a fill and a copy of \
             every byte on the copy engine (the same pattern)",
        ),
        Opt::flag(
            "--color-part-only",
            "with --with-depth: the same renderer and copies for the colour part alone \
             (a one-part ring: the baseline the three parts are measured against)",
        ),
        Opt::valued(
            "--parts",
            "N",
            "with --with-depth: the first N of colour, depth, segmentation (1 to 3; default 3)",
        ),
        Opt::flag(
            "--render-once",
            "with --with-depth, a measurement knob: the images are rendered for the first frame \
             only and copied again for every later one (receivers must not check the pattern: \
             frame_client --no-check)",
        ),
        Opt::valued(
            "--device",
            "UUID",
            "the Vulkan device's deviceUUID (default: the first device)",
        ),
    ];
    opts.extend(common::sender_opts((1920, 1080), 300.0));
    let about =
        "The demo sender: the demo pattern in a ring of buffers or images, by name or path.";
    let cli = Cli::parse("frame_server", about, &opts);
    let shared = common::producer_options(&cli, "[frame_server]", (1920, 1080), 300.0)?;
    let planar = match cli.value("--format") {
        Some("nv12") => Some(Planar::Nv12),
        Some("p010") => Some(Planar::P010),
        _ => None,
    };
    let buffer = matches!(cli.value("--format"), None | Some("rgba8")) || planar.is_some();
    let image = cli.flag("--image") || cli.flag("--image-format") || !buffer;
    let format = cli
        .value("--image")
        .or(cli.value("--image-format"))
        .or(cli.value("--format").filter(|_| !buffer));
    // A planar row is `width` samples: its default pitch is that, rounded
    // to 4 bytes.
    let default_pitch = match planar {
        Some(p) => (u64::from(shared.width) * p.sample_bytes()).next_multiple_of(4),
        None => shared.row_pitch,
    };
    let opts = ProducerOptions {
        socket: cli
            .value("--socket")
            .unwrap_or("/tmp/cuda-interop-frames.sock")
            .to_string(),
        row_pitch: cli.num("--row-pitch", default_pitch)?,
        planar,
        device: cli
            .value("--device")
            .map(|u| {
                u.parse::<vk_export::DeviceUuid>()
                    .map_err(|e| format!("--device: {e} (`cargo xtask doctor` lists the devices)"))
            })
            .transpose()?,
        image: image
            .then(|| common::image_format("--image", format))
            .transpose()?,
        with_depth: cli.flag("--with-depth"),
        parts: match cli.flag("--color-part-only") {
            true => 1,
            false => cli.num("--parts", 3usize)?,
        },
        render_once: cli.flag("--render-once"),
        concurrent_targets: cli.flag("--concurrent-targets"),
        depth_through_buffer: cli.flag("--depth-through-buffer"),
        render_clears: cli.flag("--render-clears"),
        // Three images a slot: at most 3 slots fit one setup message.
        slots: match (cli.flag("--with-depth"), cli.value("--slots")) {
            (true, None) => 3,
            _ => shared.slots,
        },
        ..shared
    };
    if (opts.concurrent_targets || opts.depth_through_buffer || opts.render_clears)
        && !opts.with_depth
    {
        return Err(
            "--concurrent-targets, --depth-through-buffer and --render-clears are --with-depth \
             options"
                .into(),
        );
    }
    let parts_given = cli.flag("--color-part-only") || cli.value("--parts").is_some();
    if (parts_given || opts.render_once) && !opts.with_depth {
        return Err("--color-part-only, --parts and --render-once are --with-depth options".into());
    }
    if !(1..=3).contains(&opts.parts) {
        return Err(format!("--parts {}: give 1, 2 or 3", opts.parts));
    }
    if opts.with_depth && (cli.value("--format").is_some() || image) {
        return Err(
            "--with-depth serves its own three formats: leave out --format and --image".into(),
        );
    }
    opts.validate().map_err(|e| e.to_string())?;
    Ok(opts)
}

fn main() -> ExitCode {
    let opts = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("frame_server: {e}");
            return ExitCode::from(2);
        }
    };
    match demo::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("frame_server FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
