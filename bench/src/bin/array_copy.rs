//! Array <-> linear copy speed on imported Vulkan images (device-local,
//! OPTIMAL, storage usage), at 4K and 8K, for 4-, 8- and 16-byte texels:
//! the crate's copy kernel (both directions), the driver's copies of the
//! same level (`cuMemcpy3DAsync` through the crate, `cuMemcpy2DAsync` called
//! directly), and a plain device-to-device `cuMemcpyDtoDAsync` of the same
//! byte count, all in the same run.
//!
//! ```text
//! cargo run --release -p cuda-interop-bench --bin array_copy -- [--iters N] [--json PATH]
//! ```
//!
//! Each method is timed with CUDA events around `N` back-to-back copies
//! (default 100, at most 250) enqueued behind a CUDA wait on a Vulkan
//! timeline value, which Vulkan signals once all of them are enqueued: the
//! events time the GPU only, never the host enqueueing. It prints a table
//! (µs per copy, GB/s counting the bytes once, % of the D2D copy, speed-up
//! over `cuMemcpy2D`), writes the same as JSON to `--json PATH` (or
//! `$ARRAY_COPY_JSON`), and says whether the goals hold: the kernel at least
//! 80% of D2D and at least 2.5x `cuMemcpy2D`, in both directions, at 4K and
//! 8K. It exits non-zero on an error, not on a missed goal.

use std::fmt::Write as _;
use std::process::ExitCode;

use cuda_interop::sys::{self, CUdeviceptr, CUmemorytype, CUresult};
use cuda_interop::{
    CopyEngine, CudaDevice, DeviceBuffer, Event, LevelArray, Pitched, PitchedMut, Stream,
};
use vk_export::format::{Format, Rgba16Sfloat, Rgba32Sfloat, Rgba8Unorm};
use vk_export::markers::usage;
use vk_export::{
    Context, ExportableImage, HeadlessOptions, ImageDesc, SubmitSync, TimelineSemaphore, Validation,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The sizes measured.
const SIZES: [(&str, u32, u32); 2] = [("4K", 3840, 2160), ("8K", 7680, 4320)];
/// The goals: the kernel's share of D2D speed, and its speed-up over cuMemcpy2D.
const GOAL_OF_D2D: f64 = 0.80;
const GOAL_OVER_2D: f64 = 2.5;

/// One measured method on one image.
struct Row {
    size: &'static str,
    format: &'static str,
    method: &'static str,
    bytes: u64,
    micros: f64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let iters = value_of("--iters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100u32)
        .clamp(1, 250);
    let json = value_of("--json").or_else(|| std::env::var("ARRAY_COPY_JSON").ok());
    match run(iters, json.as_deref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("array_copy FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What every measurement shares: the devices, the stream, the gate.
struct Bench {
    ctx: Context,
    cuda: CudaDevice,
    stream: Stream,
    timeline: TimelineSemaphore,
    cuda_timeline: cuda_interop::ExternalSemaphore<vk_export::semaphore_kinds::Timeline>,
    gate: u64,
    iters: u32,
}

impl Bench {
    /// GPU time per call of `enqueue`, in µs: `iters` calls behind a gate
    /// the GPU opens once all are enqueued, between two events.
    fn time(&mut self, mut enqueue: impl FnMut(&Stream) -> Res<()>) -> Res<f64> {
        for _ in 0..3 {
            enqueue(&self.stream)?;
        }
        self.stream.synchronize(self.stream.timeout())?;
        let (start, end) = (Event::new(&self.cuda)?, Event::new(&self.cuda)?);
        self.gate += 1;
        self.cuda_timeline.wait(&self.stream, self.gate)?;
        self.stream.record(&start)?;
        for _ in 0..self.iters {
            enqueue(&self.stream)?;
        }
        self.stream.record(&end)?;
        // A GPU-side signal (an empty submission) opens the gate.
        self.ctx.submit_and_wait(
            SubmitSync::new().signal_timeline(&self.timeline, self.gate),
            |_, _| {},
        )?;
        end.synchronize(self.stream.timeout())?;
        Ok(f64::from(end.elapsed_ms_since(&start)?) * 1e3 / f64::from(self.iters))
    }
}

fn run(iters: u32, json: Option<&str>) -> Res<()> {
    let ctx = Context::headless(&HeadlessOptions {
        validation: Validation::Off,
        ..Default::default()
    })?;
    let cuda = CudaDevice::for_vulkan(&ctx)?;
    println!(
        "Vulkan: {}; CUDA: [{}] {} (driver {}); {iters} copies per measurement",
        ctx.identity().name,
        cuda.ordinal(),
        cuda.name(),
        cuda_interop::driver_version().map_or("?".into(), |v| v.to_string())
    );
    let timeline = TimelineSemaphore::new(&ctx)?;
    let cuda_timeline = cuda.import_semaphore(&timeline)?;
    let stream = Stream::new(&cuda)?;
    let mut bench = Bench {
        ctx,
        cuda,
        stream,
        timeline,
        cuda_timeline,
        gate: 0,
        iters,
    };
    let mut rows = Vec::new();
    for (size, w, h) in SIZES {
        rows.extend(measure::<Rgba8Unorm>(&mut bench, size, w, h)?);
        rows.extend(measure::<Rgba16Sfloat>(&mut bench, size, w, h)?);
        rows.extend(measure::<Rgba32Sfloat>(&mut bench, size, w, h)?);
    }
    let goals = report(&rows, json)?;
    println!(
        "goals (kernel >= {:.0}% of D2D and >= {GOAL_OVER_2D}x cuMemcpy2D, both directions, 4K and 8K): {}",
        GOAL_OF_D2D * 100.0,
        if goals { "HOLD" } else { "NOT MET" }
    );
    println!("failed CUDA destroys: {}", cuda_interop::drop_errors());
    Ok(())
}

/// Every method on a `w x h` storage image of `F`.
fn measure<F: Format>(bench: &mut Bench, size: &'static str, w: u32, h: u32) -> Res<Vec<Row>> {
    let image = ExportableImage::<F>::new(&bench.ctx, ImageDesc::new_2d(w, h))?;
    bench.ctx.release_image(&image, SubmitSync::new())?;
    let imported = bench.cuda.import_image(&image)?;
    let array = imported.map_array()?;
    let level = array.level(0)?;
    let bytes = level.byte_len()?;
    let mut linear = DeviceBuffer::new(&bench.cuda, bytes)?;
    let other = DeviceBuffer::new(&bench.cuda, bytes)?;
    let cuda = bench.cuda.clone();
    let methods: [(&'static str, f64); 7] = [
        (
            "kernel array->linear",
            bench.time(copy_with(&level, &mut linear, CopyEngine::Kernel, true))?,
        ),
        (
            "kernel linear->array",
            bench.time(copy_with(&level, &mut linear, CopyEngine::Kernel, false))?,
        ),
        (
            "cuMemcpy3D array->linear",
            bench.time(copy_with(&level, &mut linear, CopyEngine::Driver, true))?,
        ),
        (
            "cuMemcpy3D linear->array",
            bench.time(copy_with(&level, &mut linear, CopyEngine::Driver, false))?,
        ),
        (
            "cuMemcpy2D array->linear",
            bench.time(|s| memcpy_2d(&cuda, s, &level, linear.device_ptr(), true))?,
        ),
        (
            "cuMemcpy2D linear->array",
            bench.time(|s| memcpy_2d(&cuda, s, &level, linear.device_ptr(), false))?,
        ),
        (
            "D2D cuMemcpyDtoD",
            bench.time(|s| memcpy_d2d(&cuda, s, &linear, &other))?,
        ),
    ];
    bench.stream.synchronize(bench.stream.timeout())?;
    Ok(methods
        .into_iter()
        .map(|(method, micros)| Row {
            size,
            format: F::NAME,
            method,
            bytes: bytes as u64,
            micros,
        })
        .collect())
}

/// One crate copy between the level and `linear` with `engine`, `to` the
/// linear side or from it, as a closure to time.
fn copy_with<'a, F: Format>(
    level: &'a LevelArray<'_, F, usage::Storage>,
    linear: &'a mut DeviceBuffer,
    engine: CopyEngine,
    to: bool,
) -> impl FnMut(&Stream) -> Res<()> + 'a {
    move |stream: &Stream| -> Res<()> {
        let used = if to {
            level.enqueue_copy_to_with(stream, PitchedMut::buffer(&mut *linear), engine)?
        } else {
            level.enqueue_copy_from_with(stream, Pitched::buffer(linear), engine)?
        };
        if used != engine {
            return Err(format!("asked for {engine:?}, got {used:?}").into());
        }
        Ok(())
    }
}

/// `cuMemcpy2DAsync` of the whole level to or from `linear` (tightly
/// packed), called directly: the baseline the kernel is measured against.
fn memcpy_2d<F: Format>(
    cuda: &CudaDevice,
    stream: &Stream,
    level: &LevelArray<'_, F, usage::Storage>,
    linear: CUdeviceptr,
    to_linear: bool,
) -> Res<()> {
    let [w, h, _] = level.extent();
    let row = w as usize * F::TEXEL_BYTES as usize;
    let mut p = sys::CUDA_MEMCPY2D {
        WidthInBytes: row,
        Height: h as usize,
        ..Default::default()
    };
    if to_linear {
        p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
        p.srcArray = level.raw();
        p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
        p.dstDevice = linear;
        p.dstPitch = row;
    } else {
        p.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
        p.dstArray = level.raw();
        p.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_DEVICE;
        p.srcDevice = linear;
        p.srcPitch = row;
    }
    let copy = sys::Driver::global()?
        .fns()
        .cuMemcpy2DAsync
        .ok_or("the driver has no cuMemcpy2DAsync")?;
    let _guard = cuda.enter()?;
    // SAFETY: a whole-level copy between a live level of the current context
    // and `linear`, a device buffer of at least row * h bytes that `measure`
    // keeps alive until the stream is synchronized; the stream is live.
    let status = unsafe { copy(&p, stream.raw()) };
    check("cuMemcpy2DAsync", status)
}

/// `cuMemcpyDtoDAsync` of `src`'s bytes into `dst` (as large).
fn memcpy_d2d(
    cuda: &CudaDevice,
    stream: &Stream,
    src: &DeviceBuffer,
    dst: &DeviceBuffer,
) -> Res<()> {
    let copy = sys::Driver::global()?
        .fns()
        .cuMemcpyDtoDAsync
        .ok_or("the driver has no cuMemcpyDtoDAsync")?;
    let _guard = cuda.enter()?;
    // SAFETY: two live device buffers of the current context, each of
    // src.len() bytes, kept alive by `measure` until the stream is
    // synchronized; the stream is live.
    let status = unsafe { copy(dst.device_ptr(), src.device_ptr(), src.len(), stream.raw()) };
    check("cuMemcpyDtoDAsync", status)
}

fn check(call: &str, status: CUresult) -> Res<()> {
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: CUDA error {}", status.0).into())
    }
}

/// Prints the table, writes the JSON, and says whether the goals hold.
fn report(rows: &[Row], json: Option<&str>) -> Res<bool> {
    let find = |size: &str, format: &str, method: &str| {
        rows.iter()
            .find(|r| r.size == size && r.format == format && r.method == method)
            .map(|r| r.micros)
    };
    let mut goals = true;
    let mut out = String::from("{\"rows\":[");
    println!(
        "{:<4} {:<22} {:<26} {:>10} {:>9} {:>9} {:>12}",
        "size", "format", "method", "µs", "GB/s", "% of D2D", "x cuMemcpy2D"
    );
    for (i, r) in rows.iter().enumerate() {
        let d2d = find(r.size, r.format, "D2D cuMemcpyDtoD").unwrap_or(f64::NAN);
        let direction = if r.method.ends_with("array->linear") {
            "array->linear"
        } else {
            "linear->array"
        };
        let two_d = find(r.size, r.format, &format!("cuMemcpy2D {direction}")).unwrap_or(f64::NAN);
        let gbps = r.bytes as f64 / (r.micros * 1e3);
        let of_d2d = d2d / r.micros;
        let over_2d = two_d / r.micros;
        println!(
            "{:<4} {:<22} {:<26} {:>10.1} {:>9.1} {:>8.0}% {:>11.2}x",
            r.size,
            r.format,
            r.method,
            r.micros,
            gbps,
            of_d2d * 100.0,
            over_2d
        );
        if r.method.starts_with("kernel") {
            goals &= of_d2d >= GOAL_OF_D2D && over_2d >= GOAL_OVER_2D;
        }
        let _ = write!(
            out,
            "{}{{\"size\":\"{}\",\"format\":\"{}\",\"method\":\"{}\",\"bytes\":{},\"us\":{:.3},\"gb_per_s\":{:.2},\"of_d2d\":{:.4},\"over_memcpy2d\":{:.3}}}",
            if i == 0 { "" } else { "," },
            r.size,
            r.format,
            r.method,
            r.bytes,
            r.micros,
            gbps,
            of_d2d,
            over_2d
        );
    }
    let _ = write!(
        out,
        "],\"goal_of_d2d\":{GOAL_OF_D2D},\"goal_over_memcpy2d\":{GOAL_OVER_2D},\"goals_hold\":{goals}}}"
    );
    if let Some(path) = json {
        std::fs::write(path, out + "\n")?;
        println!("JSON written to {path}");
    }
    Ok(goals)
}
