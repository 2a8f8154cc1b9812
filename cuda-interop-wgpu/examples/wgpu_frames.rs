//! wgpu renders, other devices receive: a frame sender
//! (`cuda-interop-frames`) whose image slots wgpu writes as textures. Each
//! frame the sender opens a slot for wgpu's queue family
//! (`WriteSlot::open`: the receivers' releases waited for and the slot
//! acquired from the external family), a wgpu compute pass waits for that
//! on the GPU, writes the frame's pattern and signals a timeline, and
//! `OpenSlot::present` releases the slot to the external family after it
//! and announces the frame: the queue-family hand-offs the spec asks for
//! around wgpu's use, which wgpu itself does not record. A lossless Vulkan
//! receiver on a device of its own (the same GPU through its own
//! `VkDevice`, as another process would be) reads every frame back and
//! every pixel is checked. The last line is `PASS: ...` with the frames per
//! second.
//!
//! ```sh
//! cargo run --release -p cuda-interop-wgpu --example wgpu_frames -- [--frames 60]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{monotonic_ns, Address, ImageSender, SenderOptions};
use cuda_interop_frames::session::Session;
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_wgpu::pattern::{self, first_mismatch};
use cuda_interop_wgpu::{Error as AdapterError, InteropDevice, Options, TimelinePoint};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation};
use vk_export::{Context, HeadlessOptions, QueueRole, TimelineSemaphore};

const USAGE: &str = "usage: wgpu_frames [--frames 60] [--width 1920] [--height 1080]\n\n\
    A frame sender whose image slots wgpu writes (a compute pass per frame, between the\n\
    sender's open and present), received by a lossless Vulkan receiver on a device of its own\n\
    that checks every pixel of every frame.";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    frames: u32,
    width: u32,
    height: u32,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        frames: 60,
        width: 1920,
        height: 1080,
    };
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let slot = match arg.as_str() {
            "--frames" => &mut out.frames,
            "--width" => &mut out.width,
            "--height" => &mut out.height,
            other => return Err(format!("unknown argument {other:?}")),
        };
        *slot = rest
            .next()
            .and_then(|v| v.parse().ok())
            .filter(|&v: &u32| v > 0)
            .ok_or_else(|| format!("{arg} needs a positive number"))?;
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let args = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wgpu_frames: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wgpu_frames: FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Res<()> {
    let device = match InteropDevice::new(&Options::default()) {
        Ok(d) => d,
        // SAFETY: this program polls the device from this thread only, and
        // never while the device drops.
        Err(AdapterError::OneQueue(name)) => unsafe {
            println!("{name} has one queue: wgpu and vk-export share it under one lock");
            InteropDevice::new_shared_queue(&Options::default())?
        },
        Err(AdapterError::NoDevice(e)) => {
            println!("no Vulkan device for the adapter: {e}\nnothing to run");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let ctx = device.context();
    let wgpu_family = device.wgpu_queue_choice().family;
    println!(
        "Vulkan: {}; wgpu queue {:?}, vk-export queues {:?}",
        ctx.identity().name,
        device.wgpu_queue_choice(),
        ctx.queues()
    );
    if ctx.queue_family_of(QueueRole::Main) != wgpu_family {
        return Err(format!(
            "wgpu's queue family {wgpu_family} is not the context's main family {}: the slots \
             are opened for the main family",
            ctx.queue_family_of(QueueRole::Main)
        )
        .into());
    }
    // The receiver's own device: the same GPU, picked by deviceUUID.
    let rctx = Context::headless(&HeadlessOptions {
        device_uuid: Some(ctx.identity().device_uuid),
        ..HeadlessOptions::default()
    })?;
    // Device-local slots where the driver offers them (NVIDIA), host-visible
    // otherwise (lavapipe).
    let summary = match frames::<DeviceLocal>(&device, &rctx, args) {
        Err(e) if e.to_string().contains("no memory type of the class") => {
            println!("device-local exportable images not offered: host-visible slots");
            frames::<HostVisible>(&device, &rctx, args)?
        }
        other => other?,
    };
    let errors = device.validation_errors() + rctx.validation_errors();
    if errors != 0 {
        return Err(format!(
            "{errors} validation errors: {:?} {:?}",
            device.validation_error_ids(),
            rctx.validation_error_ids()
        )
        .into());
    }
    println!("PASS: {summary}");
    Ok(())
}

fn frames<M: MemoryLocation>(device: &InteropDevice, rctx: &Context, args: &Args) -> Res<String> {
    let ctx = device.context();
    let (w, h) = (args.width, args.height);
    let dir = std::env::temp_dir().join(format!("wgpu-frames-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir)?;
    let opts = SenderOptions {
        semaphores: ctx.supports_semaphore_fds() && rctx.supports_semaphore_fds(),
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "wgpu".into(),
            },
            w,
            h,
            3,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, M, usage::Storage>::new(ctx, opts)?;
    // One texture per slot, wrapped once.
    let textures = sender
        .images()
        .iter()
        // SAFETY: wgpu is the only user of each slot image between the
        // sender's open (acquire for wgpu's family, GENERAL) and present
        // (release after wgpu's timeline value, GENERAL); receivers use it
        // only between those, and each image is wrapped once.
        .map(|image| unsafe { device.texture_from_image(image) })
        .collect::<Result<Vec<_>, _>>()?;
    let (session, setup) = {
        let dir = directory.clone();
        let t = std::thread::spawn(move || {
            Session::connect_named(&dir, "wgpu", Delivery::Lossless, Duration::from_secs(10))
        });
        while !t.is_finished() {
            sender.serve(Duration::from_millis(5));
        }
        t.join().map_err(|_| "the connecting thread panicked")??
    };
    let vrx = VulkanReceiver::<Rgba8Unorm, M>::new(rctx, session, setup)?;
    let written = TimelineSemaphore::new_local(ctx)?;
    let mut value = 0u64;
    let mut checked = Vec::new();
    let start = Instant::now();
    let bound = Duration::from_secs(60);
    while checked.len() < args.frames as usize {
        if start.elapsed() > bound {
            return Err(format!("{} frames checked in {bound:?}", checked.len()).into());
        }
        if let Ok(slot) = sender.acquire(Duration::from_millis(100)) {
            let slot = slot.open(QueueRole::Main)?;
            // The pattern of frame `sequence - 1`: what the receiver expects.
            let frame = (slot.sequence() - 1) as u32;
            let (opened, ready) = slot.ready();
            value += 1;
            device.queue().submit_with(
                [pattern::encode_pattern(
                    device,
                    &textures[slot.index() as usize],
                    frame,
                )],
                &[TimelinePoint::new(opened, ready)],
                &[TimelinePoint::new(&written, value)],
            )?;
            slot.present(monotonic_ns(), (&written, value))?;
            let _ = device.device().poll(wgpu::PollType::Poll);
        }
        // Read what arrived (lossless: every frame from the first on).
        let wait = Duration::from_millis(if checked.is_empty() { 50 } else { 5_000 });
        if let Ok(frame) = vrx.next(wait) {
            let pixels = vrx.read_pixels(&frame, Duration::from_secs(10))?;
            let index = (frame.sequence() - 1) as u32;
            if let Some((x, y, got, want)) = first_mismatch(&pixels, w, index) {
                return Err(format!(
                    "frame {}: pixel ({x}, {y}) is {got:?}, expected {want:?}",
                    frame.sequence()
                )
                .into());
            }
            checked.push(frame.sequence());
            vrx.release(frame)?;
        }
    }
    let took = start.elapsed();
    let first = checked[0];
    if checked != (first..first + checked.len() as u64).collect::<Vec<_>>() {
        return Err(format!("frames out of order or missing: {checked:?}").into());
    }
    drop(vrx);
    drop(sender);
    drop(textures);
    pattern::wait_idle(device, Duration::from_secs(10))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "{} frames x {w}x{h} pixels: wgpu compute into the sender's slots -> Vulkan receiver on its own device, every pixel exact; {:.0} frames/s with the readback",
        checked.len(),
        checked.len() as f64 / took.as_secs_f64()
    ))
}
