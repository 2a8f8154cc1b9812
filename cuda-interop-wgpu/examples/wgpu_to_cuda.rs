//! wgpu renders, CUDA receives: a wgpu compute shader writes a known pattern
//! into an exportable image wrapped as a `wgpu::Texture`, the wgpu
//! submission signals a vk-export timeline, and CUDA (the same memory and
//! timeline, imported) waits for it on the GPU, copies the frame out of its
//! array and hands its release back on the timeline, which the next wgpu
//! frame waits for. Every pixel of every frame is checked, and the run
//! fails on any validation error (where the layer is installed); the last
//! line is `PASS: N frames x WxH pixels: ...` with the median time per frame.
//!
//! ```sh
//! cargo run --release -p cuda-interop-wgpu --example wgpu_to_cuda -- [--frames 30]
//! ```
//!
//! Without CUDA (lavapipe, or no exportable timelines) it says so and checks
//! the frames through a wgpu readback instead, with the timeline waited by
//! the host.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop::{CudaDevice, Stream};
use cuda_interop_wgpu::pattern::{self, first_mismatch};
use cuda_interop_wgpu::{Error as AdapterError, InteropDevice, Options, TimelinePoint};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, HostVisible, Optimal};
use vk_export::{ExportableImage, ImageDesc, TimelineSemaphore, WaitStrategy};

const USAGE: &str = "usage: wgpu_to_cuda [--frames 30] [--width 1920] [--height 1080]\n\n\
    wgpu writes a pattern into an exportable image (a wgpu::Texture) and signals a timeline in\n\
    its submission; CUDA imports the image and the timeline, waits on the GPU, copies each frame\n\
    out and checks every pixel. Without CUDA: the same frames checked through a wgpu readback.";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    frames: u32,
    width: u32,
    height: u32,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        frames: 30,
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
            eprintln!("wgpu_to_cuda: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wgpu_to_cuda: FAIL: {e}");
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
    println!(
        "Vulkan: {} (deviceUUID {}); wgpu queue {:?}, vk-export queues {:?}",
        ctx.identity().name,
        ctx.identity().device_uuid_string(),
        device.wgpu_queue_choice(),
        ctx.queues()
    );
    let cuda = if ctx.supports_semaphore_fds() {
        CudaDevice::for_vulkan(ctx).map_err(|e| e.to_string())
    } else {
        Err("the device exports no semaphores (VK_KHR_external_semaphore_fd)".into())
    };
    let summary = match cuda {
        Ok(cuda) => with_cuda(&device, &cuda, args)?,
        Err(why) => {
            println!("CUDA not present ({why}): checking the frames through a wgpu readback");
            vulkan_only(&device, args)?
        }
    };
    match device.validation_errors() {
        0 => {
            println!("PASS: {summary}");
            Ok(())
        }
        n => Err(format!("{n} validation errors: {:?}", device.validation_error_ids()).into()),
    }
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn with_cuda(device: &InteropDevice, cuda: &CudaDevice, args: &Args) -> Res<String> {
    let ctx = device.context();
    println!("CUDA: [{}] {}", cuda.ordinal(), cuda.name());
    let (w, h) = (args.width, args.height);
    let image = ExportableImage::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>::new(
        ctx,
        ImageDesc::new_2d(w, h),
    )?;
    // SAFETY: only wgpu changes the image's layout while the texture lives;
    // CUDA reads its memory between the timeline's hand-offs.
    let texture = unsafe { device.texture_from_image(&image) }?;
    let timeline = TimelineSemaphore::new(ctx)?;
    let imported = cuda.import_image(&image)?;
    let array = imported.map_array()?;
    let level = array.level(0)?;
    let cuda_timeline = cuda.import_semaphore(&timeline)?;
    let stream = Stream::new(cuda)?;
    let mut host = vec![0u8; (w * h * 4) as usize];
    let mut times = Vec::new();
    let mut value = 0u64;
    for frame in 0..args.frames {
        let start = Instant::now();
        // wgpu waits for CUDA's release of the previous frame, writes this
        // one (ending in GENERAL: a storage write) and signals it.
        let waits = [TimelinePoint::new(&timeline, value)];
        device.queue().submit_with(
            [pattern::encode_pattern(device, &texture, frame)],
            if value > 0 { &waits[..] } else { &[] },
            &[TimelinePoint::new(&timeline, value + 1)],
        )?;
        cuda_timeline.wait(&stream, value + 1)?;
        level.copy_to_host(&stream, &mut host)?;
        cuda_timeline.signal(&stream, value + 2)?;
        value += 2;
        times.push(start.elapsed());
        if let Some((x, y, got, want)) = first_mismatch(&host, w, frame) {
            return Err(
                format!("frame {frame}: pixel ({x}, {y}) is {got:?}, expected {want:?}").into(),
            );
        }
        // wgpu's own bookkeeping (no wait).
        let _ = device.device().poll(wgpu::PollType::Poll);
    }
    stream.synchronize(stream.timeout())?;
    drop(texture);
    pattern::wait_idle(device, Duration::from_secs(10))?;
    Ok(format!(
        "{} frames x {w}x{h} pixels: wgpu compute -> timeline -> CUDA array -> host, every pixel exact; median {:.3} ms per frame",
        args.frames,
        median(&mut times).as_secs_f64() * 1e3
    ))
}

fn vulkan_only(device: &InteropDevice, args: &Args) -> Res<String> {
    let ctx = device.context();
    let (w, h) = (args.width, args.height);
    let image = ExportableImage::<Rgba8Unorm, Optimal, HostVisible, usage::Storage>::new(
        ctx,
        ImageDesc::new_2d(w, h),
    )?;
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }?;
    let timeline = TimelineSemaphore::new_local(ctx)?;
    let mut times = Vec::new();
    for frame in 0..args.frames {
        let start = Instant::now();
        let value = u64::from(frame) + 1;
        device.queue().submit_with(
            [pattern::encode_pattern(device, &texture, frame)],
            &[],
            &[TimelinePoint::new(&timeline, value)],
        )?;
        timeline.wait(value, Duration::from_secs(10), WaitStrategy::Block)?;
        let pixels = pattern::read_texture(device, device.queue(), &texture)?;
        times.push(start.elapsed());
        if let Some((x, y, got, want)) = first_mismatch(&pixels, w, frame) {
            return Err(
                format!("frame {frame}: pixel ({x}, {y}) is {got:?}, expected {want:?}").into(),
            );
        }
    }
    drop(texture);
    pattern::wait_idle(device, Duration::from_secs(10))?;
    Ok(format!(
        "(Vulkan only, CUDA not present) {} frames x {w}x{h} pixels: wgpu compute -> timeline (host wait) -> wgpu readback, every pixel exact; median {:.3} ms per frame",
        args.frames,
        median(&mut times).as_secs_f64() * 1e3
    ))
}
