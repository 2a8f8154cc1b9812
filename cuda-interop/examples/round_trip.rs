//! The main job: Vulkan fills an image, CUDA changes it in place through the
//! zero-copy mapping, Vulkan reads it back, with timeline semaphores ordering
//! the GPU work both ways. It verifies every pixel of every frame and prints
//! the time per frame.
//!
//! ```text
//! cargo run --release -p cuda-interop --example round_trip -- [FRAMES] [--bench] [--device UUID]
//! ```
//!
//! `--device UUID` picks the GPU by its UUID (`nvidia-smi -L` spelling, with
//! or without the `GPU-` prefix); CUDA follows it by UUID, whatever
//! `CUDA_VISIBLE_DEVICES` says.
//!
//! `--bench` also measures, in the same run, three ways for the host to see a
//! frame come back from CUDA: zero-copy with `vkWaitSemaphores`, zero-copy with
//! the adaptive counter poll, and copying through host memory (the baseline),
//! and prints their ratios.
//!
//! Without a Vulkan device or a CUDA driver it says what is missing and runs
//! what it can (the Vulkan-only export/import check). Its last line is the
//! verdict, `VERDICT: ...`: what ran and passed, what did not run and why,
//! or what failed.

use std::ffi::c_void;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_interop::{kernels, CudaDevice, DeviceBuffer, Module, Stream};
use vk_export::ash::vk;
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation, Optimal};
use vk_export::{
    Context, ExportableImage, HeadlessOptions, ImageDesc, SharedLayout, SubmitSync,
    TimelineSemaphore, WaitStrategy,
};

const WIDTH: u32 = 1920;
const HEIGHT: u32 = 1080;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    check_args(&args, &["--bench"], &["--device"], |a| {
        a.parse::<u32>().is_ok()
    });
    let bench = args.iter().any(|a| a == "--bench");
    let frames: u32 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(120);
    let device = match args
        .iter()
        .position(|a| a == "--device")
        .map(|i| args.get(i + 1).map(|u| parse_uuid(u)))
    {
        None => None,
        Some(Some(Some(uuid))) => Some(uuid),
        Some(_) => {
            eprintln!("--device needs a UUID like GPU-c6de5a3f-2d8a-7089-8f09-81bcaf83a00b");
            return ExitCode::FAILURE;
        }
    };
    match run(frames, bench, device) {
        Ok(verdict) => {
            println!("VERDICT: {verdict}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("VERDICT: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_uuid(text: &str) -> Option<vk_export::DeviceUuid> {
    text.parse().ok()
}

fn color(frame: u32) -> [u8; 4] {
    [
        (frame * 7 % 256) as u8,
        (frame * 13 % 256) as u8,
        (frame * 29 % 256) as u8,
        255,
    ]
}

fn clear_value(c: [u8; 4]) -> vk::ClearColorValue {
    vk::ClearColorValue {
        float32: c.map(|v| f32::from(v) / 255.0),
    }
}

/// Runs what this machine allows; the verdict line's text.
fn run(frames: u32, bench: bool, device_uuid: Option<vk_export::DeviceUuid>) -> Res<String> {
    let options = HeadlessOptions {
        device_uuid,
        ..Default::default()
    };
    let ctx = match Context::headless(&options) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("no Vulkan device with VK_KHR_external_memory_fd: {e}");
            return Ok(
                "NOTHING RAN: no Vulkan device with external memory fds; install a \
                 Vulkan driver (e.g. mesa-vulkan-drivers) and libvulkan1"
                    .into(),
            );
        }
    };
    let id = ctx.identity();
    println!(
        "Vulkan: {} (deviceUUID {}, validation {})",
        id.name,
        id.device_uuid_string(),
        if ctx.validation_enabled() {
            "on"
        } else {
            "off"
        }
    );
    let cuda = match CudaDevice::for_vulkan(&ctx) {
        Ok(cuda) => cuda,
        Err(e) => {
            println!("CUDA part skipped: {e}");
            let semaphores = vulkan_only(&ctx)?;
            return Ok(format!(
                "PASSED the Vulkan-only part (an image exported as OPAQUE_FD into a second \
                 VkDevice, pixels exact); NOT RUN: the CUDA round trip and its semaphores (no \
                 usable CUDA driver, see `CUDA part skipped` above; {semaphores})"
            ));
        }
    };
    println!(
        "CUDA: [{}] {} ({}), primary context",
        cuda.ordinal(),
        cuda.name(),
        cuda_interop::driver_version().map_or("?".into(), |v| v.to_string())
    );

    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(WIDTH, HEIGHT))?;
    let info = image.info();
    println!(
        "image {WIDTH}x{HEIGHT} RGBA8 optimal, import size {} bytes (w*h*4 = {}), dedicated {}",
        info.allocation_size(),
        WIDTH * HEIGHT * 4,
        info.dedicated()
    );
    let timeline = TimelineSemaphore::new(&ctx)?;
    let imported = cuda.import_image(&image)?;
    let array = imported.map_array()?;
    let level = array.level(0)?;
    let surface = level.surface()?;
    let cuda_timeline = cuda.import_semaphore(&timeline)?;
    let module = Module::load_ptx(&cuda, kernels::PTX)?;
    let invert = module.function("invert_rgba8")?;
    let stream = Stream::new(&cuda)?;
    let mut value = 0u64;

    let cuda_invert = |wait: u64, signal: u64| -> Res<()> {
        cuda_timeline.wait(&stream, wait)?;
        let (mut s, mut w, mut h) = (surface.raw(), WIDTH, HEIGHT);
        let mut args: [*mut c_void; 3] = [
            (&mut s as *mut u64).cast(),
            (&mut w as *mut u32).cast(),
            (&mut h as *mut u32).cast(),
        ];
        // SAFETY: invert_rgba8(u64 surface, u32 width, u32 height); the surface
        // lives until the end of `run`, after the stream is synchronised.
        unsafe {
            stream.launch(
                &invert,
                [WIDTH.div_ceil(16), HEIGHT.div_ceil(16), 1],
                [16, 16, 1],
                0,
                &mut args,
            )
        }?;
        cuda_timeline.signal(&stream, signal)?;
        Ok(())
    };

    // The main job: GPU-side waits both ways, every pixel verified.
    let mut times = Vec::with_capacity(frames as usize);
    for frame in 0..frames {
        let start = Instant::now();
        let c = color(frame);
        ctx.clear_image(&image, clear_value(c), SubmitSync::new())?;
        ctx.release_image(
            &image,
            SubmitSync::new().signal_timeline(&timeline, value + 1),
        )?;
        cuda_invert(value + 1, value + 2)?;
        let pixels = ctx.read_image(
            &image,
            0,
            0,
            SubmitSync::new().wait_timeline(&timeline, value + 2),
        )?;
        value += 2;
        times.push(start.elapsed());
        let expected = [255 - c[0], 255 - c[1], 255 - c[2], 255];
        if let Some(i) = pixels.chunks_exact(4).position(|p| p != expected) {
            return Err(format!(
                "frame {frame}: pixel {i} is {:?}, expected {expected:?}",
                &pixels[i * 4..i * 4 + 4]
            )
            .into());
        }
    }
    stream.synchronize(stream.timeout())?;
    println!(
        "verified {frames} frames x {} pixels: Vulkan clear -> CUDA invert (surface, in place) -> Vulkan readback, exact",
        WIDTH * HEIGHT
    );
    println!(
        "time per frame (incl. 8.3 MB readback + check): {}",
        summary(&mut times)
    );

    if bench {
        let host_round_trip = |strategy: WaitStrategy, value: &mut u64| -> Res<Vec<Duration>> {
            let mut t = Vec::new();
            for frame in 0..frames + 20 {
                let start = Instant::now();
                ctx.clear_image(&image, clear_value(color(frame)), SubmitSync::new())?;
                ctx.release_image(
                    &image,
                    SubmitSync::new().signal_timeline(&timeline, *value + 1),
                )?;
                cuda_invert(*value + 1, *value + 2)?;
                timeline.wait(*value + 2, Duration::from_secs(10), strategy)?;
                *value += 2;
                if frame >= 20 {
                    t.push(start.elapsed());
                }
            }
            Ok(t)
        };
        let mut block = host_round_trip(WaitStrategy::Block, &mut value)?;
        let mut poll = host_round_trip(WaitStrategy::ADAPTIVE, &mut value)?;
        stream.synchronize(stream.timeout())?;
        let mut staging = staging_round_trip(&ctx, &image, &cuda, &module, &stream, frames)?;
        let (b, p, s) = (median(&mut block), median(&mut poll), median(&mut staging));
        println!("host-visible round trip per frame, {frames} frames after 20 warm-up, same run:");
        println!(
            "  zero-copy, host waits with vkWaitSemaphores : {}",
            summary(&mut block)
        );
        println!(
            "  zero-copy, host waits with adaptive poll     : {}",
            summary(&mut poll)
        );
        println!(
            "  copy through host memory (baseline)          : {}",
            summary(&mut staging)
        );
        println!(
            "  ratios (median): blocking / baseline = {:.2}, poll / baseline = {:.2}, blocking / poll = {:.2}",
            b.as_secs_f64() / s.as_secs_f64(),
            p.as_secs_f64() / s.as_secs_f64(),
            b.as_secs_f64() / p.as_secs_f64()
        );
    }
    println!(
        "validation errors: {}; failed CUDA destroys so far: {}",
        ctx.validation_errors(),
        cuda_interop::drop_errors()
    );
    if ctx.validation_errors() > 0 {
        return Err("the validation layer reported errors".into());
    }
    Ok(format!(
        "PASSED: {frames} frames of Vulkan clear -> CUDA invert -> Vulkan readback, \
         ordered by timeline semaphores both ways, every pixel exact, 0 validation errors{}",
        if bench {
            "; host waits measured against the copy baseline"
        } else {
            ""
        }
    ))
}

/// The baseline: Vulkan -> host -> CUDA -> host -> Vulkan, no interop.
fn staging_round_trip(
    ctx: &Context,
    image: &ExportableImage<Rgba8Unorm>,
    cuda: &CudaDevice,
    module: &Module,
    stream: &Stream,
    frames: u32,
) -> Res<Vec<Duration>> {
    let len = (WIDTH * HEIGHT * 4) as usize;
    let mut device = DeviceBuffer::new(cuda, len)?;
    let xor = module.function("xor_bytes")?;
    let mut back = vec![0u8; len];
    let mut times = Vec::new();
    for frame in 0..frames + 20 {
        let start = Instant::now();
        ctx.clear_image(image, clear_value(color(frame)), SubmitSync::new())?;
        let pixels = ctx.read_image(image, 0, 0, SubmitSync::new())?;
        stream.copy_from_host(&pixels, &mut device)?;
        let (mut ptr, mut n, mut key) = (device.device_ptr(), len as u64, 0xffu32);
        let mut args: [*mut c_void; 3] = [
            (&mut ptr as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut key as *mut u32).cast(),
        ];
        // SAFETY: xor_bytes(u64, u64, u32) over `len` bytes of `device`.
        unsafe {
            stream.launch(
                &xor,
                [(len as u32).div_ceil(256), 1, 1],
                [256, 1, 1],
                0,
                &mut args,
            )
        }?;
        stream.copy_to_host(&device, &mut back)?;
        ctx.write_image(image, 0, 0, &back, SubmitSync::new())?;
        if frame >= 20 {
            times.push(start.elapsed());
        }
    }
    Ok(times)
}

fn median(t: &mut [Duration]) -> Duration {
    t.sort();
    t[t.len() / 2]
}

fn summary(t: &mut [Duration]) -> String {
    t.sort();
    let q = |f: f64| t[((t.len() as f64 - 1.0) * f) as usize];
    format!(
        "p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
        q(0.5).as_secs_f64() * 1e3,
        q(0.9).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3
    )
}

/// What runs without CUDA: export an image, import it into a second Vulkan
/// device, and check the pixels. Device-local memory where the driver has a
/// memory type of that class, host-visible memory elsewhere (lavapipe).
/// Returns whether this driver exports semaphores as fds, for the verdict.
fn vulkan_only(ctx: &Context) -> Res<&'static str> {
    let second = Context::headless(&HeadlessOptions {
        device_uuid: Some(ctx.identity().device_uuid),
        ..Default::default()
    })?;
    let class = match share_with_second_device::<DeviceLocal>(ctx, &second) {
        Err(e) if matches!(e.downcast_ref(), Some(vk_export::Error::Unsupported { .. })) => {
            share_with_second_device::<HostVisible>(ctx, &second)?;
            "host-visible (this driver has no device-local-only memory type)"
        }
        other => other.map(|()| "device-local")?,
    };
    println!("Vulkan-only: 256x256 RGBA8 in {class} memory exported as OPAQUE_FD and imported into a second VkDevice: pixels exact");
    let semaphores = if ctx.supports_semaphore_fds() {
        "this driver exports semaphore fds"
    } else {
        "this driver exports no semaphore fds either"
    };
    println!(
        "semaphore fds: {}",
        if ctx.supports_semaphore_fds() {
            "supported"
        } else {
            "not supported by this driver"
        }
    );
    Ok(semaphores)
}

fn share_with_second_device<M: MemoryLocation>(ctx: &Context, second: &Context) -> Res<()> {
    let image = ExportableImage::<Rgba8Unorm, Optimal, M>::new(ctx, ImageDesc::new_2d(256, 256))?;
    let c = [10, 20, 30, 255];
    ctx.clear_image(&image, clear_value(c), SubmitSync::new())?;
    ctx.release_image(&image, SubmitSync::new())?;
    let imported = ExportableImage::import_from(second, &image)?;
    // SAFETY: `ctx` released the image in GENERAL and that submission
    // completed (the helper waited for it).
    unsafe { second.assume_image_released(&imported, SharedLayout::General) }?;
    let pixels = second.read_image(&imported, 0, 0, SubmitSync::new())?;
    if pixels.chunks_exact(4).any(|p| p != c) {
        return Err("the second Vulkan device read different pixels".into());
    }
    Ok(())
}

/// What `--help` prints (and a refused argument is followed by).
const USAGE: &str = "usage: round_trip [FRAMES] [--bench] [--device UUID]\n\n  FRAMES         frames to run (default 120)\n  --bench        also measure three host-wait strategies against a copy baseline\n  --device UUID  the GPU with this UUID (nvidia-smi -L spelling)";

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
