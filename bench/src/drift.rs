//! Drift (issue 18 item 5): whether a cycle of export, import and destroy
//! gets slower the more cycles ran before it.
//!
//! Each cycle is timed on its own; the 10th percentile of the first 10% of
//! the measured cycles is the baseline of the 10th percentile of the last
//! 10%, in the same run, with the goal "at most 1.2x". A per-cycle slowdown that grows
//! with the cycle count (a list searched linearly, a leak the driver walks)
//! shows as a ratio above 1: 40 ns more per import over 10,000 cycles adds
//! about 380 µs to the last tenth's cycles and 20 µs to the first's. The
//! least-squares slope over all cycles is reported beside it.
//!
//! # Contract
//!
//! * Times only; the soak tests (`tests/tests/soak.rs`) check that fds,
//!   memory and driver objects stay flat. The Vulkan part needs only a
//!   Vulkan device with exportable memory (it runs on lavapipe); the CUDA
//!   part needs the paired CUDA device.

use std::time::{Duration, Instant};

use cuda_interop::CudaDevice;
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{HostVisible, MemoryLocation, Optimal};
use vk_export::{
    Context, ExportableBuffer, ExportableImage, HeadlessOptions, ImageDesc, TimelineSemaphore,
};

use crate::common::Img;
use crate::report::{quantile, us, Report};
use crate::Res;

/// The ratio of the last tenth's cycle cost to the first tenth's that
/// still counts as flat.
const GOAL: f64 = 1.2;

/// One timed cycle and the reference work timed right before it.
#[derive(Clone, Copy)]
struct Sample {
    cycle: Duration,
    reference: Duration,
}

/// A fixed amount of CPU work (a few µs), timed before every cycle: on a
/// loaded machine it slows down with the cycle, a drift of the cycle does
/// not touch it.
fn reference_work() -> Duration {
    let start = Instant::now();
    let mut x = 0u64;
    for i in 0..4096u64 {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    std::hint::black_box(x);
    start.elapsed()
}

/// The 10th percentile (µs) of `f` over `window`: a loaded machine slows
/// some cycles of a window, a per-cycle slowdown every cycle after it.
fn p10(window: &[Sample], f: impl Fn(&Sample) -> Duration) -> f64 {
    let mut v: Vec<Duration> = window.iter().map(f).collect();
    us(quantile(&mut v, 0.1))
}

/// Reports the drift of `samples` (one per cycle, in order).
fn drift_rows(report: &mut Report, name: &str, samples: &[Sample]) {
    let tenth = (samples.len() / 10).max(1);
    let (early, late) = (&samples[..tenth], &samples[samples.len() - tenth..]);
    let first = p10(early, |s| s.cycle);
    let last = p10(late, |s| s.cycle);
    report.add(
        "Drift",
        format!(
            "{name}: per cycle, p10 of the first 10% of {} cycles",
            samples.len()
        ),
        first,
        "us",
    );
    report.add_vs(
        "Drift",
        format!("{name}: per cycle, p10 of the last 10%"),
        last,
        "us",
        ("first 10%", first),
    );
    // The same ratio in units of the reference work timed beside each
    // cycle, so that a machine loaded in one window and not the other does
    // not read as drift (on a shared 2-core machine the raw ratio moved
    // between 0.7x and 1.6x with no change).
    let (first_ref, last_ref) = (p10(early, |s| s.reference), p10(late, |s| s.reference));
    report.add_vs(
        "Drift",
        format!("{name}: last 10% against the first, in units of the reference CPU work timed before each cycle"),
        last / last_ref,
        "x reference",
        ("first 10%", first / first_ref),
    );
    report.goal(
        format!("<= {GOAL}x the first 10%"),
        last / last_ref <= GOAL * first / first_ref,
    );
    // The profile over the run: each tenth's p10, in µs and in units of
    // the reference work. A cost that grows per cycle rises tenth after
    // tenth; noise moves single tenths either way.
    let tenths: Vec<(f64, f64)> = samples
        .chunks(tenth)
        .take(10)
        .map(|w| {
            let cycle = p10(w, |s| s.cycle);
            (cycle, cycle / p10(w, |s| s.reference))
        })
        .collect();
    let rises = tenths.windows(2).filter(|w| w[1].1 > w[0].1).count();
    report.note(format!(
        "Drift: {name}: p10 per tenth of the run, µs (x reference): {}; {rises} of {} steps up",
        tenths
            .iter()
            .map(|(c, r)| format!("{c:.1} ({r:.2})"))
            .collect::<Vec<_>>()
            .join(", "),
        tenths.len().saturating_sub(1)
    ));
    // Least-squares slope of cycle time over cycle number, in ns per cycle.
    let n = samples.len() as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = samples.iter().map(|s| us(s.cycle)).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, s) in samples.iter().enumerate() {
        let dx = i as f64 - mean_x;
        sxy += dx * (us(s.cycle) - mean_y);
        sxx += dx * dx;
    }
    report.add(
        "Drift",
        format!("{name}: least-squares trend of the cycle time"),
        sxy / sxx * 1000.0,
        "ns per cycle",
    );
}

/// Times `cycles` runs of `cycle` after `cycles / 10` (at least 10)
/// unrecorded ones (first calls load code and fill caches, that is S1's; on
/// lavapipe the first thousand cycles were still 5-40% slower).
fn timed(cycles: usize, mut cycle: impl FnMut() -> Res<()>) -> Res<Vec<Sample>> {
    for _ in 0..(cycles / 10).max(10) {
        cycle()?;
    }
    let mut samples = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let reference = reference_work();
        let start = Instant::now();
        cycle()?;
        samples.push(Sample {
            cycle: start.elapsed(),
            reference,
        });
    }
    Ok(samples)
}

/// The Vulkan export/import cycle of the soak test, on a second context of
/// the same device: a 64x64 RGBA8 image with 3 levels and a 64 KiB buffer
/// exported (a new fd each), imported and both imports destroyed; and a
/// timeline semaphore created, exported, imported and destroyed.
pub(crate) fn vulkan(ctx: &Context, report: &mut Report, cycles: usize) -> Res<()> {
    let other = Context::headless(&HeadlessOptions {
        device_uuid: Some(ctx.identity().device_uuid),
        ..HeadlessOptions::default()
    })?;
    // lavapipe has no device-local memory: the cycle runs in the class the
    // device offers.
    let device_local_only = crate::common::has_device_local_only(ctx);
    if device_local_only {
        vulkan_in::<vk_export::markers::DeviceLocal>(ctx, &other, report, cycles, "device-local")
    } else {
        vulkan_in::<HostVisible>(ctx, &other, report, cycles, "host-visible")
    }
}

fn vulkan_in<M: MemoryLocation>(
    ctx: &Context,
    other: &Context,
    report: &mut Report,
    cycles: usize,
    class: &str,
) -> Res<()> {
    type Image<M> = ExportableImage<Rgba8Unorm, Optimal, M>;
    let image = Image::<M>::new(ctx, ImageDesc::new_2d(64, 64).mip_levels(3))?;
    let buffer = ExportableBuffer::<M>::new(ctx, 1 << 16)?;
    let samples = timed(cycles, || {
        let i = Image::<M>::import_from(other, &image)?;
        let j = ExportableBuffer::import_from(other, &buffer)?;
        drop((i, j));
        Ok(())
    })?;
    drift_rows(
        report,
        &format!("Vulkan image + buffer export, import into a second context, destroy ({class})"),
        &samples,
    );
    if TimelineSemaphore::preflight(ctx).is_ok() {
        let samples = timed(cycles, || {
            let timeline = TimelineSemaphore::new(ctx)?;
            let imported = TimelineSemaphore::import_from(other, &timeline)?;
            drop((imported, timeline));
            Ok(())
        })?;
        drift_rows(
            report,
            "Vulkan timeline semaphore create, export, import into a second context, destroy",
            &samples,
        );
    } else {
        report.note("Drift: no exportable timeline semaphore here; its cycle not measured");
    }
    if ctx.validation_enabled() {
        report.note(
            "Drift: the validation layer is on; its bookkeeping is part of each Vulkan cycle",
        );
    }
    Ok(())
}

/// The CUDA cycle of the GPU soak test: image import, array mapping,
/// level and surface, buffer import and mapping, semaphore import, and
/// destroy.
pub(crate) fn cuda(
    ctx: &Context,
    cuda: &CudaDevice,
    report: &mut Report,
    cycles: usize,
) -> Res<()> {
    let image = Img::<Rgba8Unorm>::new(ctx, ImageDesc::new_2d(512, 512).mip_levels(4))?;
    let buffer = ExportableBuffer::<vk_export::markers::DeviceLocal>::new(ctx, 1 << 20)?;
    let timeline = TimelineSemaphore::new(ctx)?;
    let samples = timed(cycles, || {
        let imported = cuda.import_image(&image)?;
        let array = imported.map_array()?;
        let level = array.level(1)?;
        drop(level.surface()?);
        drop(array);
        drop(imported);
        let mut b = cuda.import_buffer(&buffer)?;
        drop(b.map()?);
        drop(b);
        drop(cuda.import_semaphore(&timeline)?);
        Ok(())
    })?;
    drift_rows(
        report,
        "CUDA import cycle (image import + map + level + surface, buffer import + map, semaphore import, destroy)",
        &samples,
    );
    Ok(())
}
