//! The scenarios. Raw driver calls appear only where a scenario measures
//! them (baselines, the C loop's handles, a native CUDA array); each sits
//! in an `unsafe` block with its reason.

use std::ffi::{c_uint, c_void};
use std::time::{Duration, Instant};

use cuda_interop::{
    kernels, sys, CopyEngine, CudaDevice, DeviceBuffer, Event, ExternalSemaphore, Function,
    HostWait, Module, PitchedMut, SignalOp, Stream, WaitOp,
};
use vk_export::ash::vk;
use vk_export::format::{Format, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::DeviceLocal;
use vk_export::semaphore_kinds::Timeline;
use vk_export::{
    Context, ExportableBuffer, HeadlessOptions, ImageDesc, QueueRole, TimelineSemaphore,
    WaitStrategy,
};

use crate::common::{Drain, Img, SPIN, WAIT_LIMIT};
use crate::producer::{After, HostBuffer, Producer, Variant};
use crate::report::{quantile, us, Report};
use crate::Res;

/// A linear copy kernel for S4: `copy_b128(src, dst, n)` copies `n` 16-byte
/// words, one per thread.
const COPY_B128_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry copy_b128(.param .u64 src, .param .u64 dst, .param .u64 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra DONE;
    shl.b64 %rd6, %rd4, 4;
    add.u64 %rd7, %rd1, %rd6;
    ld.global.nc.v4.u32 {%r4, %r5, %r6, %r7}, [%rd7];
    add.u64 %rd8, %rd2, %rd6;
    st.global.v4.u32 [%rd8], {%r4, %r5, %r6, %r7};
DONE:
    ret;
}
"#;

pub fn run(quick: bool, vulkan_only: bool, json: Option<&str>) -> Res<()> {
    let mut report = Report::default();
    let mut header = vec![("commit", env!("BENCH_COMMIT").to_string())];
    // S8 first, in child processes of its own, while this process holds no
    // Vulkan or CUDA context yet.
    if vulkan_only {
        report.note("--vulkan-only: S1-S8 and the CUDA drift cycle not run");
    } else {
        crate::engine_switch::s8(&mut report, quick)?;
        // S9 in child processes too, before this process has a context.
        crate::s9::s9(&mut report, quick)?;
    }
    let ctx = match Context::headless(&HeadlessOptions::default()) {
        Ok(ctx) => ctx,
        Err(e) => {
            report.note(format!(
                "no Vulkan device with external memory ({e}); nothing else measured"
            ));
            return finish(&report, &header, json, None);
        }
    };
    header.push(("vulkan_device", ctx.identity().name.clone()));
    header.push(("validation", ctx.validation_enabled().to_string()));
    if ctx.validation_enabled() {
        println!("warning: the validation layer is on: figures include its cost");
    }
    // The Vulkan drift cycle needs no CUDA: it runs everywhere.
    crate::drift::vulkan(&ctx, &mut report, if quick { 2000 } else { 10_000 })?;
    if vulkan_only {
        crate::variants::vulkan_only(&ctx, &mut report)?;
        return finish(&report, &header, json, Some(&ctx));
    }
    let cuda = match CudaDevice::for_vulkan(&ctx) {
        Ok(cuda) => cuda,
        Err(e) => {
            report.note(format!(
                "S1-S7 and the CUDA drift cycle skipped: no CUDA device for this Vulkan device ({e})"
            ));
            crate::variants::vulkan_only(&ctx, &mut report)?;
            return finish(&report, &header, json, Some(&ctx));
        }
    };
    if let Err(e) = Img::<Rgba8Unorm>::preflight(&ctx, &ImageDesc::new_2d(64, 64)) {
        report.note(format!(
            "S1-S7 and the CUDA drift cycle skipped: no device-local exportable storage image here ({e})"
        ));
        crate::variants::vulkan_only(&ctx, &mut report)?;
        return finish(&report, &header, json, Some(&ctx));
    }
    header.push(("gpu", cuda.name().to_string()));
    header.push((
        "cuda_driver",
        cuda_interop::driver_version().map_or("?".into(), |v| v.to_string()),
    ));
    for (k, v) in &header {
        println!("{k}: {v}");
    }
    let copy_module = Module::load_ptx(&cuda, kernels::COPY_PTX)?;
    let tools = Module::load_ptx(&cuda, kernels::PTX)?;
    let linear = Module::load_ptx(&cuda, COPY_B128_PTX)?;

    s1_one_time_costs(&ctx, &cuda, &mut report, if quick { 4 } else { 11 })?;
    s2_hand_off_latency(
        &ctx,
        &cuda,
        &tools,
        &mut report,
        if quick { 200 } else { 2000 },
    )?;
    let sizes: &[(u32, u32, &str, u32)] = if quick {
        &[(1920, 1080, "1080p", 60), (3840, 2160, "4K", 40)]
    } else {
        &[
            (1920, 1080, "1080p", 400),
            (3840, 2160, "4K", 200),
            (7680, 4320, "8K", 60),
        ]
    };
    // The render producer's overhead is set against the two switches S8
    // measured on the main family (same run).
    let switches = crate::engine_switch::two_switches(&report, ctx.queue_family());
    match switches {
        Some(t) => report.note(format!(
            "S3: the render producer's overhead is compared with S8's two switches on family {} ({t:.1} µs: whole cycle minus a fill + fence alone minus the floor, p50, CUDA_DEVICE_MAX_CONNECTIONS unset)",
            ctx.queue_family()
        )),
        None => report.note(
            "S3: S8's rows are not in this report (skipped or failed): the render producer's overhead has no switch baseline or goal",
        ),
    }
    for variant in [Variant::Render, Variant::Copy] {
        report.note(format!(
            "S2/S3 {}: {}",
            variant.name(),
            variant.describe(&ctx)
        ));
    }
    for &(w, h, name, frames) in sizes {
        s3_frames::<Rgba8Unorm>(
            &ctx,
            &cuda,
            &copy_module,
            &mut report,
            S3Case {
                variant: Variant::Render,
                width: w,
                height: h,
                size: name,
                format: "RGBA8",
                frames,
                switches,
                batches: true,
            },
        )?;
    }
    // The copy producer at the sizes of issue 19's goals.
    for &(w, h, name, frames) in sizes.iter().filter(|s| s.2 != "8K") {
        s3_frames::<Rgba8Unorm>(
            &ctx,
            &cuda,
            &copy_module,
            &mut report,
            S3Case {
                variant: Variant::Copy,
                width: w,
                height: h,
                size: name,
                format: "RGBA8",
                frames,
                switches,
                batches: false,
            },
        )?;
    }
    for &(w, h, name, frames) in sizes {
        s3_frames::<Rgba16Sfloat>(
            &ctx,
            &cuda,
            &copy_module,
            &mut report,
            S3Case {
                variant: Variant::Render,
                width: w,
                height: h,
                size: name,
                format: "RGBA16F",
                frames,
                switches,
                batches: false,
            },
        )?;
    }
    s4_read_cost_by_layout(&ctx, &cuda, &copy_module, &linear, &mut report)?;
    crate::two_process::s7(&cuda, &mut report, if quick { 40 } else { 200 })?;
    s6_semaphore_batching(&ctx, &cuda, &mut report, if quick { 100 } else { 1000 })?;
    crate::drift::cuda(&ctx, &cuda, &mut report, if quick { 1000 } else { 10_000 })?;
    report.note(
        "S5 (array <-> linear copies): see bench/src/bin/array_copy.rs (the array_copy binary)",
    );
    finish(&report, &header, json, Some(&ctx))
}

/// Prints the table, writes the JSON, and fails if the layer reported
/// errors.
/// `bench --s9-only`: S9 alone (child processes), its table and JSON.
/// `bench --drift-only [--cycles N] [--json PATH]` (issue 30 item 6): the
/// Vulkan and CUDA drift cycles alone, `cycles` each (default 50,000: five
/// times the full suite's), with each tenth's profile, to tell a cost that
/// grows per cycle from noise.
pub fn run_drift_only(cycles: usize, json: Option<&str>) -> Res<()> {
    let mut report = Report::default();
    let mut header = vec![("commit", env!("BENCH_COMMIT").to_string())];
    let ctx = Context::headless(&HeadlessOptions::default())?;
    header.push(("vulkan_device", ctx.identity().name.clone()));
    header.push(("validation", ctx.validation_enabled().to_string()));
    for (k, v) in &header {
        println!("{k}: {v}");
    }
    crate::drift::vulkan(&ctx, &mut report, cycles)?;
    match CudaDevice::for_vulkan(&ctx) {
        Ok(cuda) => crate::drift::cuda(&ctx, &cuda, &mut report, cycles)?,
        Err(e) => report.note(format!(
            "the CUDA drift cycle not run: no CUDA device ({e})"
        )),
    }
    finish(&report, &header, json, Some(&ctx))
}

pub fn run_s9_only(quick: bool, json: Option<&str>) -> Res<()> {
    let mut report = Report::default();
    let header = vec![("commit", env!("BENCH_COMMIT").to_string())];
    for (k, v) in &header {
        println!("{k}: {v}");
    }
    crate::s9::s9(&mut report, quick)?;
    if !report.rows.iter().any(|r| r.scenario == "S9") {
        // Asked for S9 alone: nothing measured is a failure, not a skip.
        report.fail("--s9-only measured nothing (see the notes above)");
    }
    finish(&report, &header, json, None)
}

fn finish(
    report: &Report,
    header: &[(&str, String)],
    json: Option<&str>,
    ctx: Option<&Context>,
) -> Res<()> {
    report.print();
    if let Some(path) = json {
        std::fs::write(path, report.json(header))?;
        println!("wrote {path}");
    }
    if let Some(errors) = ctx.map(Context::validation_errors).filter(|&e| e > 0) {
        return Err(format!("{errors} validation errors").into());
    }
    if !report.failures.is_empty() {
        return Err(report.failures.join("; ").into());
    }
    Ok(())
}

/// Times `f`.
fn time<T>(f: impl FnOnce() -> Res<T>) -> Res<(T, Duration)> {
    let start = Instant::now();
    let value = f()?;
    Ok((value, start.elapsed()))
}

/// S1: the first call and the median of the later ones.
fn s1_one_time_costs(
    ctx: &Context,
    cuda: &CudaDevice,
    report: &mut Report,
    rounds: usize,
) -> Res<()> {
    let names = [
        "export 4K RGBA8 image",
        "import into CUDA",
        "map as array (1 level)",
        "get level 0",
        "export 4K image, full mip chain (12 levels)",
        "import it",
        "map it and get all 12 levels",
        "export timeline semaphore",
        "import it into CUDA",
        "destroy mapping (array + level)",
        "destroy CUDA import",
        "destroy Vulkan image",
        "destroy both semaphores",
        "destroy mip-chain image (maps, import, image)",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let desc = ImageDesc::new_2d(3840, 2160);
    for _ in 0..rounds {
        let mut t = Vec::new();
        let (image, d) = time(|| Ok(Img::<Rgba8Unorm>::new(ctx, desc)?))?;
        t.push(d);
        let (imported, d) = time(|| Ok(cuda.import_image(&image)?))?;
        t.push(d);
        let (array, d) = time(|| Ok(imported.map_array()?))?;
        t.push(d);
        let (level, d) = time(|| Ok(array.level(0)?))?;
        t.push(d);
        let (mip_image, d) = time(|| Ok(Img::<Rgba8Unorm>::new(ctx, desc.mip_levels(12))?))?;
        t.push(d);
        let (mip_import, d) = time(|| Ok(cuda.import_image(&mip_image)?))?;
        t.push(d);
        let (mip_array, d) = time(|| Ok(mip_import.map_array()?))?;
        let (mip_levels, d2) = time(|| {
            (0..12)
                .map(|l| Ok(mip_array.level(l)?))
                .collect::<Res<Vec<_>>>()
        })?;
        t.push(d + d2);
        let (semaphore, d) = time(|| Ok(TimelineSemaphore::new(ctx)?))?;
        t.push(d);
        let (cu_semaphore, d) = time(|| Ok(cuda.import_semaphore(&semaphore)?))?;
        t.push(d);
        let start = Instant::now();
        let _ = level;
        drop(array);
        t.push(start.elapsed());
        let start = Instant::now();
        drop(imported);
        t.push(start.elapsed());
        let start = Instant::now();
        drop(image);
        t.push(start.elapsed());
        let start = Instant::now();
        drop(cu_semaphore);
        drop(semaphore);
        t.push(start.elapsed());
        let start = Instant::now();
        drop(mip_levels);
        drop(mip_array);
        drop(mip_import);
        drop(mip_image);
        t.push(start.elapsed());
        for (s, d) in samples.iter_mut().zip(t) {
            s.push(d);
        }
    }
    for (name, mut s) in names.iter().zip(samples) {
        let first = s[0];
        let later = quantile(&mut s[1..], 0.5);
        report.add_vs(
            "S1",
            format!("{name}: first call"),
            us(first),
            "us",
            ("later calls, median", us(later)),
        );
    }
    Ok(())
}

/// Launches `store_u32(ptr, value)` on one thread.
fn launch_store(
    stream: &Stream,
    store: &Function<'_>,
    target: &DeviceBuffer,
    value: u32,
) -> Res<()> {
    let (mut ptr, mut value) = (target.device_ptr(), value);
    let mut args: [*mut c_void; 2] = [
        (&mut ptr as *mut u64).cast(),
        (&mut value as *mut u32).cast(),
    ];
    // SAFETY: store_u32(u64 ptr, u32 value) writes 4 bytes at `ptr`, the
    // start of `target` (4 bytes or more); the caller keeps `target` and the
    // module alive until the stream is synchronized.
    unsafe { stream.launch(store, [1, 1, 1], [1, 1, 1], 0, &mut args) }?;
    Ok(())
}

/// Submits nothing but a timeline signal of `semaphore` to `value`.
fn vk_signal(ctx: &Context, semaphore: vk::Semaphore, value: u64) -> Res<()> {
    vk_signal_on(ctx, QueueRole::Main, semaphore, value)
}

/// [`vk_signal`] on `role`'s queue.
fn vk_signal_on(ctx: &Context, role: QueueRole, semaphore: vk::Semaphore, value: u64) -> Res<()> {
    let values = [value];
    let semaphores = [semaphore];
    let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
    let info = vk::SubmitInfo::default()
        .signal_semaphores(&semaphores)
        .push_next(&mut timeline);
    // SAFETY: a live timeline semaphore of this device, a value above every
    // earlier one (the callers count up), arrays alive across the call; the
    // queue under the context's lock.
    ctx.with_queue_of(role, |queue| unsafe {
        ctx.device().queue_submit(queue, &[info], vk::Fence::null())
    })??;
    Ok(())
}

/// S2: Vulkan signals, CUDA waits, a trivial kernel, CUDA signals, the host
/// sees it; against kernel + event record + event query on one stream.
fn s2_hand_off_latency(
    ctx: &Context,
    cuda: &CudaDevice,
    tools: &Module,
    report: &mut Report,
    iterations: usize,
) -> Res<()> {
    let stream = Stream::new(cuda)?;
    let store = tools.function("store_u32")?;
    let target = DeviceBuffer::new(cuda, 4)?;
    let event = Event::new(cuda)?;
    let mut floor = Vec::new();
    for i in 0..iterations + 50 {
        let start = Instant::now();
        launch_store(&stream, &store, &target, i as u32)?;
        stream.record(&event)?;
        while !event.query()? {
            std::hint::spin_loop();
        }
        if i >= 50 {
            floor.push(start.elapsed());
        }
    }
    let floor_p50 = us(quantile(&mut floor, 0.5));
    let floor_p99 = us(quantile(&mut floor, 0.99));
    report.add(
        "S2",
        "CUDA-only floor: kernel, event record, event query until done: p50",
        floor_p50,
        "us",
    );
    report.add("S2", "CUDA-only floor: p99", floor_p99, "us");

    let produced = TimelineSemaphore::new(ctx)?;
    let consumed = TimelineSemaphore::new(ctx)?;
    let cu_produced = cuda.import_semaphore(&produced)?;
    let cu_consumed = cuda.import_semaphore(&consumed)?;
    let _drain = Drain(&stream);
    let mut value = 0u64;
    let strategies: [(&str, WaitStrategy, usize); 3] = [
        ("host spins on the Vulkan counter", SPIN, iterations),
        (
            "host waits with WaitStrategy::ADAPTIVE (default)",
            WaitStrategy::ADAPTIVE,
            iterations,
        ),
        (
            "host waits with vkWaitSemaphores (Block)",
            WaitStrategy::Block,
            iterations.min(100),
        ),
    ];
    for (name, strategy, n) in strategies {
        let mut t = Vec::new();
        for i in 0..n + 20 {
            value += 1;
            let start = Instant::now();
            vk_signal(ctx, produced.raw(), value)?;
            cu_produced.wait(&stream, value)?;
            launch_store(&stream, &store, &target, i as u32)?;
            cu_consumed.signal(&stream, value)?;
            consumed.wait(value, WAIT_LIMIT, strategy)?;
            if i >= 20 {
                t.push(start.elapsed());
            }
        }
        let p50 = us(quantile(&mut t, 0.5));
        let p99 = us(quantile(&mut t, 0.99));
        report.add_vs(
            "S2",
            format!("hand-off, {name}: p50"),
            p50,
            "us",
            ("floor p50", floor_p50),
        );
        report.goal("<= 2x the floor", p50 <= 2.0 * floor_p50);
        report.add_vs(
            "S2",
            format!("hand-off, {name}: p99"),
            p99,
            "us",
            ("floor p99", floor_p99),
        );
    }
    // The same hand-off, the host waiting on the CUDA stream instead of
    // the Vulkan counter (Stream::synchronize_with).
    let cuda_side: [(&str, HostWait); 3] = [
        (
            "host waits on the CUDA stream, HostWait::Spin",
            HostWait::Spin,
        ),
        (
            "host waits on the CUDA stream, HostWait::ADAPTIVE (default)",
            HostWait::ADAPTIVE,
        ),
        (
            "host waits on the CUDA stream, HostWait::Block",
            HostWait::Block,
        ),
    ];
    for (name, strategy) in cuda_side {
        let mut t = Vec::new();
        for i in 0..iterations + 20 {
            value += 1;
            let start = Instant::now();
            vk_signal(ctx, produced.raw(), value)?;
            cu_produced.wait(&stream, value)?;
            launch_store(&stream, &store, &target, i as u32)?;
            stream.synchronize_with(strategy, WAIT_LIMIT)?;
            if i >= 20 {
                t.push(start.elapsed());
            }
        }
        let p50 = us(quantile(&mut t, 0.5));
        report.add_vs(
            "S2",
            format!("hand-off, {name}: p50"),
            p50,
            "us",
            ("floor p50", floor_p50),
        );
        report.goal("<= 2x the floor", p50 <= 2.0 * floor_p50);
    }

    // The legs, to see what limits the hand-off.
    let legs: [(&str, usize); 5] = [
        ("leg: Vulkan queue signal -> host sees the counter", 0),
        (
            "leg: host vkSignalSemaphore -> CUDA wait + kernel -> host sees a CUDA event",
            1,
        ),
        (
            "leg: Vulkan queue signal -> CUDA wait + kernel -> host sees a CUDA event",
            2,
        ),
        (
            "leg: CUDA kernel + signal -> host sees the Vulkan counter",
            3,
        ),
        (
            "relay: host spins until the Vulkan signal landed, then CUDA wait (already met) + kernel -> host sees a CUDA event",
            4,
        ),
    ];
    for (name, leg) in legs {
        let mut t = Vec::new();
        for i in 0..iterations + 20 {
            value += 1;
            let start = Instant::now();
            match leg {
                0 => {
                    vk_signal(ctx, produced.raw(), value)?;
                    produced.wait(value, WAIT_LIMIT, SPIN)?;
                }
                1 | 2 | 4 => {
                    if leg == 1 {
                        produced.signal(value)?;
                    } else {
                        vk_signal(ctx, produced.raw(), value)?;
                    }
                    if leg == 4 {
                        produced.wait(value, WAIT_LIMIT, SPIN)?;
                    }
                    cu_produced.wait(&stream, value)?;
                    launch_store(&stream, &store, &target, i as u32)?;
                    stream.record(&event)?;
                    while !event.query()? {
                        std::hint::spin_loop();
                    }
                }
                _ => {
                    launch_store(&stream, &store, &target, i as u32)?;
                    cu_consumed.signal(&stream, value)?;
                    consumed.wait(value, WAIT_LIMIT, SPIN)?;
                }
            }
            if i >= 20 {
                t.push(start.elapsed());
            }
        }
        let p50 = us(quantile(&mut t, 0.5));
        report.add_vs(
            "S2",
            format!("{name}: p50"),
            p50,
            "us",
            ("floor p50", floor_p50),
        );
    }
    stream.synchronize(WAIT_LIMIT)?;
    s2_producer_variants(
        ctx,
        cuda,
        &stream,
        &store,
        &target,
        report,
        iterations,
        (floor_p50, floor_p99),
    )
}

/// S2 with the two producers of issue 19: a signal-only submission on the
/// transfer queue, then each producer's frame of a 256x256 RGBA8 image
/// (copy on the transfer queue / clear on the main queue, release) before
/// the same CUDA wait, trivial kernel and signal, the host spinning on the
/// Vulkan counter; and each producer alone (submit, host sees its signal).
#[allow(clippy::too_many_arguments)]
fn s2_producer_variants(
    ctx: &Context,
    cuda: &CudaDevice,
    stream: &Stream,
    store: &Function<'_>,
    target: &DeviceBuffer,
    report: &mut Report,
    iterations: usize,
    (floor_p50, floor_p99): (f64, f64),
) -> Res<()> {
    let produced = TimelineSemaphore::new(ctx)?;
    let consumed = TimelineSemaphore::new(ctx)?;
    let cu_produced = cuda.import_semaphore(&produced)?;
    let cu_consumed = cuda.import_semaphore(&consumed)?;
    let _drain = Drain(stream);
    let mut value = 0u64;
    let hand_off = |value: &mut u64, produce: &mut dyn FnMut(u64) -> Res<()>| -> Res<(f64, f64)> {
        let mut t = Vec::new();
        for i in 0..iterations + 20 {
            *value += 1;
            let start = Instant::now();
            produce(*value)?;
            cu_produced.wait(stream, *value)?;
            launch_store(stream, store, target, i as u32)?;
            cu_consumed.signal(stream, *value)?;
            consumed.wait(*value, WAIT_LIMIT, SPIN)?;
            if i >= 20 {
                t.push(start.elapsed());
            }
        }
        Ok((us(quantile(&mut t, 0.5)), us(quantile(&mut t, 0.99))))
    };
    let transfer = ctx.queue_family_of(QueueRole::Transfer);
    let (p50, p99) = hand_off(&mut value, &mut |v| {
        vk_signal_on(ctx, QueueRole::Transfer, produced.raw(), v)
    })?;
    let name = format!("hand-off, a signal-only submit on the transfer queue (family {transfer}), host spins on the Vulkan counter");
    report.add_vs(
        "S2",
        format!("{name}: p50"),
        p50,
        "us",
        ("floor p50", floor_p50),
    );
    report.goal("<= 2x the floor", p50 <= 2.0 * floor_p50);
    report.add_vs(
        "S2",
        format!("{name}: p99"),
        p99,
        "us",
        ("floor p99", floor_p99),
    );

    let (width, height) = (256, 256);
    let image = Img::<Rgba8Unorm>::new(ctx, ImageDesc::new_2d(width, height))?;
    let raw = [(image.raw(), vk::Extent2D { width, height })];
    for variant in [Variant::Copy, Variant::Render] {
        let describe = variant.describe(ctx);
        let mut producer = Producer::new(
            ctx,
            variant,
            Rgba8Unorm::TEXEL_BYTES,
            &raw,
            &[After::Release],
            Some(consumed.raw()),
            produced.raw(),
        )?;
        // One slot: the host saw frame v - 1 consumed before it submits v.
        let (p50, p99) = hand_off(&mut value, &mut |v| producer.submit(0, v - 1, v))?;
        let name = format!("hand-off, {}: a {width}x{height} RGBA8 frame ({describe}) + release, CUDA wait + kernel + signal, host spins on the Vulkan counter", variant.name());
        report.add_vs(
            "S2",
            format!("{name}: p50"),
            p50,
            "us",
            ("floor p50", floor_p50),
        );
        if variant == Variant::Copy {
            report.goal("<= 2x the floor", p50 <= 2.0 * floor_p50);
        }
        report.add_vs(
            "S2",
            format!("{name}: p99"),
            p99,
            "us",
            ("floor p99", floor_p99),
        );
        drop(producer);

        // The producer alone: its frame, host sees its signal.
        let alone = TimelineSemaphore::new(ctx)?;
        let mut producer = Producer::new(
            ctx,
            variant,
            Rgba8Unorm::TEXEL_BYTES,
            &raw,
            &[After::Release],
            None,
            alone.raw(),
        )?;
        let mut t = Vec::new();
        for v in 1..=(iterations + 20) as u64 {
            let start = Instant::now();
            producer.submit(0, 0, v)?;
            alone.wait(v, WAIT_LIMIT, SPIN)?;
            if v > 20 {
                t.push(start.elapsed());
            }
        }
        drop(producer);
        report.add_vs(
            "S2",
            format!(
                "{}, alone: its frame, host sees its signal: p50",
                variant.name()
            ),
            us(quantile(&mut t, 0.5)),
            "us",
            ("floor p50", floor_p50),
        );
    }
    stream.synchronize(WAIT_LIMIT)?;
    Ok(())
}

/// The copy kernel's parameters for one slot, and the argument array
/// pointing at them (boxed: the pointers must stay valid).
struct CopyArgs {
    surface: u64,
    dst: u64,
    pitch: u64,
    width: u32,
    height: u32,
}

fn copy_args(params: &mut CopyArgs) -> [*mut c_void; 5] {
    [
        (&mut params.surface as *mut u64).cast(),
        (&mut params.dst as *mut u64).cast(),
        (&mut params.pitch as *mut u64).cast(),
        (&mut params.width as *mut u32).cast(),
        (&mut params.height as *mut u32).cast(),
    ]
}

/// Mirrors `struct frame_loop` in `frame_loop.c`.
#[repr(C)]
struct FrameLoop {
    vk_device: vk::Device,
    vk_queue: vk::Queue,
    vk_queue_submit: vk::PFN_vkQueueSubmit,
    vk_get_counter: vk::PFN_vkGetSemaphoreCounterValue,
    vk_consumed: vk::Semaphore,
    slots: u32,
    in_flight: u32,
    submit_infos: *const *const c_void,
    submit_wait_values: *mut u64,
    submit_signal_values: *mut u64,
    cu_wait: *const c_void,
    cu_signal: *const c_void,
    cu_launch: *const c_void,
    cu_produced: sys::CUexternalSemaphore,
    cu_consumed: sys::CUexternalSemaphore,
    cu_wait_params: *mut sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    cu_signal_params: *mut sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    cu_stream: sys::CUstream,
    kernel: sys::CUfunction,
    kernel_args: *const *mut *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    spin_limit_ns: u64,
}

extern "C" {
    fn frame_loop_run(frame_loop: *const FrameLoop, first_frame: u64, frames: u32) -> i32;
}

/// One S3 run: which producer, which size, and what to compare with.
struct S3Case<'a> {
    variant: Variant,
    width: u32,
    height: u32,
    size: &'a str,
    format: &'a str,
    frames: u32,
    /// S8's two switches on the main family (µs), where S8 measured them.
    switches: Option<f64>,
    /// Also run the render producer's batched frame loop.
    batches: bool,
}

/// Slots of the batched frame loop: two batches of 3, or one of 6.
const BATCH_SLOTS: usize = 6;

/// S3 for one producer variant, size and format: producer alone, zero-copy
/// through the safe API with 1 and 3 frames in flight, the same loop in C,
/// host staging; for the render producer, its per-frame overhead against
/// S8's two switches and (`batches`) the batched frame loop.
fn s3_frames<F: Format>(
    ctx: &Context,
    cuda: &CudaDevice,
    copy_module: &Module,
    report: &mut Report,
    case: S3Case<'_>,
) -> Res<()> {
    const SLOTS: usize = 3;
    let S3Case {
        variant,
        width,
        height,
        size,
        format,
        frames,
        switches,
        batches,
    } = case;
    // Frame numbers of this size's own timelines (which start at 0).
    let mut frame_number = 0u64;
    let frame = &mut frame_number;
    let texel = u64::from(F::TEXEL_BYTES);
    let pitch = u64::from(width) * texel;
    let bytes = pitch * u64::from(height);
    let kernel_name = format!("array_to_linear_{texel}b_r4");
    let copy = copy_module.function(&kernel_name)?;
    let grid = [width.div_ceil(16), height.div_ceil(64), 1];
    let block = [16, 16, 1];
    let label = format!("{}, {size} {format}", variant.name());
    println!("S3 {label}: {frames} frames per run");
    // The frame loops use the first SLOTS images; the batched loop all.
    let image_count = if batches { BATCH_SLOTS } else { SLOTS };

    let images = (0..image_count)
        .map(|_| Img::<F>::new(ctx, ImageDesc::new_2d(width, height)))
        .collect::<Result<Vec<_>, _>>()?;
    let imports = images
        .iter()
        .map(|i| cuda.import_image(i))
        .collect::<Result<Vec<_>, _>>()?;
    let arrays = imports
        .iter()
        .map(|i| i.map_array())
        .collect::<Result<Vec<_>, _>>()?;
    let levels = arrays
        .iter()
        .map(|a| a.level(0))
        .collect::<Result<Vec<_>, _>>()?;
    let surfaces = levels
        .iter()
        .map(|l| l.surface())
        .collect::<Result<Vec<_>, _>>()?;
    let mut dsts = (0..image_count)
        .map(|_| DeviceBuffer::new(cuda, bytes as usize))
        .collect::<Result<Vec<_>, _>>()?;
    let mut params: Vec<Box<CopyArgs>> = (0..image_count)
        .map(|s| {
            Box::new(CopyArgs {
                surface: surfaces[s].raw(),
                dst: dsts[s].device_ptr(),
                pitch,
                width,
                height,
            })
        })
        .collect();
    let mut args: Vec<Box<[*mut c_void; 5]>> =
        params.iter_mut().map(|p| Box::new(copy_args(p))).collect();
    let extent = vk::Extent2D { width, height };
    let raw_images: Vec<_> = images.iter().map(|i| (i.raw(), extent)).collect();
    let release: Vec<_> = (0..image_count).map(|_| After::Release).collect();
    let stream = Stream::new(cuda)?;

    // The producer alone: the same command buffers, no consumer.
    let alone = TimelineSemaphore::new(ctx)?;
    let mut producer_alone = Producer::new(
        ctx,
        variant,
        F::TEXEL_BYTES,
        &raw_images,
        &release,
        None,
        alone.raw(),
    )?;
    let mut alone_value = 0u64;
    let mut producer_only = [0.0f64; 2];
    for (k, in_flight) in [1u64, 3].into_iter().enumerate() {
        let mut run = |n_frames: u32| -> Res<Duration> {
            let start = Instant::now();
            for _ in 0..n_frames {
                let n = alone_value;
                if n + 1 > in_flight {
                    alone.wait(n + 1 - in_flight, WAIT_LIMIT, SPIN)?;
                }
                producer_alone.submit((n % SLOTS as u64) as usize, 0, n + 1)?;
                alone_value += 1;
            }
            alone.wait(alone_value, WAIT_LIMIT, SPIN)?;
            Ok(start.elapsed())
        };
        run(10)?;
        let t = run(frames)?;
        producer_only[k] = t.as_secs_f64() * 1e3 / f64::from(frames);
        report.add(
            "S3",
            format!("{label}, {in_flight} in flight: Vulkan producer alone, per frame"),
            producer_only[k],
            "ms",
        );
    }

    // The consumer alone: the same copies on the same stream, no Vulkan
    // and no waits between frames (issue 30 item 4: what grows with the
    // frame on the consumer's side, beside the producer's own work).
    let mut run_consumer = |n_frames: u32, engine: CopyEngine| -> Res<Duration> {
        let start = Instant::now();
        for n in 0..n_frames as usize {
            let s = n % SLOTS;
            levels[s].enqueue_copy_to_with(&stream, PitchedMut::buffer(&mut dsts[s]), engine)?;
        }
        stream.synchronize(WAIT_LIMIT)?;
        Ok(start.elapsed())
    };
    run_consumer(10, CopyEngine::Kernel)?;
    let consumer_only =
        run_consumer(frames, CopyEngine::Kernel)?.as_secs_f64() * 1e3 / f64::from(frames);
    report.add(
        "S3",
        format!("{label}: CUDA consumer alone (its copy into pitched memory), per frame"),
        consumer_only,
        "ms",
    );
    // The same copy by the driver (`cuMemcpy3DAsync`, a copy engine rather
    // than a kernel on the graphics engine's SMs): issue 30 item 4, whether
    // a consumer that gives the graphics engine no work avoids the switches.
    run_consumer(10, CopyEngine::Driver)?;
    let consumer_only_dma =
        run_consumer(frames, CopyEngine::Driver)?.as_secs_f64() * 1e3 / f64::from(frames);
    report.add(
        "S3",
        format!(
            "{label}: CUDA consumer alone, its copy by the driver (CopyEngine::Driver), per frame"
        ),
        consumer_only_dma,
        "ms",
    );

    // Zero-copy through the safe API.
    let produced = TimelineSemaphore::new(ctx)?;
    let consumed = TimelineSemaphore::new(ctx)?;
    let cu_produced = cuda.import_semaphore(&produced)?;
    let cu_consumed = cuda.import_semaphore(&consumed)?;
    let _drain = Drain(&stream);
    let mut producer = Producer::new(
        ctx,
        variant,
        F::TEXEL_BYTES,
        &raw_images,
        &release,
        Some(consumed.raw()),
        produced.raw(),
    )?;
    let mut zero_copy = [0.0f64; 2];
    let mut zero_copy_dma = [0.0f64; 2];
    let mut c_loop = [0.0f64; 2];
    let mut relayed = 0.0f64;
    for (k, in_flight) in [1u64, 3].into_iter().enumerate() {
        // `relay`: the host waits until Vulkan's signal landed before it
        // enqueues the CUDA wait (see S2: a CUDA wait enqueued before a
        // Vulkan queue signal sees it ~300 µs late on the H200).
        let mut run_safe = |n_frames: u32, relay: bool, engine: CopyEngine| -> Res<Duration> {
            let start = Instant::now();
            for _ in 0..n_frames {
                let n = *frame;
                let s = (n % SLOTS as u64) as usize;
                if n + 1 > in_flight {
                    consumed.wait(n + 1 - in_flight, WAIT_LIMIT, SPIN)?;
                }
                producer.submit(s, (n + 1).saturating_sub(SLOTS as u64), n + 1)?;
                if relay {
                    produced.wait(n + 1, WAIT_LIMIT, SPIN)?;
                }
                cu_produced.wait(&stream, n + 1)?;
                levels[s].enqueue_copy_to_with(
                    &stream,
                    PitchedMut::buffer(&mut dsts[s]),
                    engine,
                )?;
                cu_consumed.signal(&stream, n + 1)?;
                *frame += 1;
            }
            consumed.wait(*frame, WAIT_LIMIT, SPIN)?;
            Ok(start.elapsed())
        };
        run_safe(10, false, CopyEngine::Kernel)?;
        let t = run_safe(frames, false, CopyEngine::Kernel)?;
        zero_copy[k] = t.as_secs_f64() * 1e3 / f64::from(frames);
        if in_flight == 1 {
            let t = run_safe(frames, true, CopyEngine::Kernel)?;
            relayed = t.as_secs_f64() * 1e3 / f64::from(frames);
        }
        if variant == Variant::Render {
            run_safe(10, false, CopyEngine::Driver)?;
            let t = run_safe(frames, false, CopyEngine::Driver)?;
            zero_copy_dma[k] = t.as_secs_f64() * 1e3 / f64::from(frames);
        }

        // The same loop in C: the submit infos and values are the producer's.
        let driver = sys::Driver::global().map_err(|e| e.to_string())?;
        let fns = driver.fns();
        let mut wait_params = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        let mut signal_params = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        let infos: Vec<*const c_void> = producer
            .submit_infos
            .iter()
            .map(|i| (i as *const vk::SubmitInfo).cast())
            .collect();
        let arg_ptrs: Vec<*mut *mut c_void> = args.iter_mut().map(|a| a.as_mut_ptr()).collect();
        let device = ctx.device();
        let mut c_frames = |first: u64,
                            n_frames: u32,
                            producer: &mut Producer<'_>|
         -> Res<Duration> {
            ctx.with_queue_of(producer.role(), |queue| -> Res<Duration> {
                let frame_loop = FrameLoop {
                    vk_device: device.handle(),
                    vk_queue: queue,
                    vk_queue_submit: device.fp_v1_0().queue_submit,
                    vk_get_counter: device.fp_v1_2().get_semaphore_counter_value,
                    vk_consumed: consumed.raw(),
                    slots: SLOTS as u32,
                    in_flight: in_flight as u32,
                    submit_infos: infos.as_ptr(),
                    submit_wait_values: producer.wait_values.as_ptr().cast::<u64>().cast_mut(),
                    submit_signal_values: producer.signal_values.as_ptr().cast::<u64>().cast_mut(),
                    cu_wait: fns
                        .cuWaitExternalSemaphoresAsync
                        .ok_or("no cuWaitExternalSemaphoresAsync")?
                        as *const c_void,
                    cu_signal: fns
                        .cuSignalExternalSemaphoresAsync
                        .ok_or("no cuSignalExternalSemaphoresAsync")?
                        as *const c_void,
                    cu_launch: fns.cuLaunchKernel.ok_or("no cuLaunchKernel")? as *const c_void,
                    cu_produced: cu_produced.raw(),
                    cu_consumed: cu_consumed.raw(),
                    cu_wait_params: &mut wait_params,
                    cu_signal_params: &mut signal_params,
                    cu_stream: stream.raw(),
                    kernel: copy.raw(),
                    kernel_args: arg_ptrs.as_ptr(),
                    grid,
                    block,
                    spin_limit_ns: WAIT_LIMIT.as_nanos() as u64,
                };
                let _context = cuda.enter()?;
                let start = Instant::now();
                // SAFETY: every handle in `frame_loop` is live for the call
                // (images, surfaces, buffers, semaphores, the stream and the
                // module outlive it), the submit infos point into the
                // producer's boxes, the queue is held under the context's
                // lock, the CUDA context is current; the C loop signals each
                // timeline with increasing values above every earlier one
                // and waits until its last frame is consumed before it
                // returns (or returns an error code).
                let code = unsafe { frame_loop_run(&frame_loop, first, n_frames) };
                if code != 0 {
                    return Err(format!("C frame loop failed with code {code}").into());
                }
                Ok(start.elapsed())
            })?
        };
        c_frames(*frame, 10, &mut producer)?;
        producer.signalled_up_to(*frame + 10);
        *frame += 10;
        let t = c_frames(*frame, frames, &mut producer)?;
        producer.signalled_up_to(*frame + u64::from(frames));
        *frame += u64::from(frames);
        c_loop[k] = t.as_secs_f64() * 1e3 / f64::from(frames);
        report.add_vs(
            "S3",
            format!("{label}, {in_flight} in flight: zero-copy through the safe API, per frame"),
            zero_copy[k],
            "ms",
            ("producer alone", producer_only[k]),
        );
        report.add_vs(
            "S3",
            format!("{label}, {in_flight} in flight: safe API vs the same loop in C"),
            zero_copy[k],
            "ms",
            ("C loop", c_loop[k]),
        );
        report.goal("<= 1.05x", zero_copy[k] <= 1.05 * c_loop[k]);
    }

    if variant == Variant::Render {
        // What the render producer pays per frame beyond its own work,
        // against the two switches S8 measured (issue 19's goals: at most
        // 1.1x the two; with frames in flight, at most one).
        let overhead = |t: f64, alone: f64, what: &str, report: &mut Report| {
            let overhead_ms = t - alone;
            let case = format!(
                "{label}, {what}: per-frame overhead (frame time minus the producer alone)"
            );
            match switches {
                Some(two) => {
                    report.add_vs(
                        "S3",
                        case,
                        overhead_ms,
                        "ms",
                        ("S8's two switches", two / 1e3),
                    );
                    report.add(
                        "S3",
                        format!("{label}, {what}: share of S8's two switches hidden (1 - overhead / two switches; below 0: overhead beyond them)"),
                        100.0 * (1.0 - overhead_ms * 1e3 / two),
                        "%",
                    );
                }
                None => report.add("S3", case, overhead_ms, "ms"),
            }
            overhead_ms
        };
        // The same overhead less the consumer's own copy: what the hand-off
        // costs beyond both sides' work (the contexts time-slice, so the
        // copy does not overlap the producer's frame even in flight).
        // `consumer`: the consumer alone, and how the row names it.
        let beyond_both = |t: f64,
                           alone: f64,
                           (consumer, named): (f64, &str),
                           what: &str,
                           report: &mut Report| {
            let beyond = t - alone - consumer;
            let case = format!(
                "{label}, {what}: per-frame overhead beyond both sides' own work ({named})"
            );
            match switches {
                Some(two) => {
                    report.add_vs("S3", case, beyond, "ms", ("S8's two switches", two / 1e3))
                }
                None => report.add("S3", case, beyond, "ms"),
            }
            beyond
        };
        let one = overhead(zero_copy[0], producer_only[0], "1 in flight", report);
        if let Some(two) = switches {
            report.goal("<= 1.1x the two switches", one * 1e3 <= 1.1 * two);
        }
        let by_kernel = (
            consumer_only,
            "frame time minus the producer alone minus the consumer alone",
        );
        let one_beyond = beyond_both(
            zero_copy[0],
            producer_only[0],
            by_kernel,
            "1 in flight",
            report,
        );
        if let Some(two) = switches {
            report.goal("<= 1.1x the two switches", one_beyond * 1e3 <= 1.1 * two);
        }
        let three = overhead(zero_copy[1], producer_only[1], "3 in flight", report);
        if let Some(two) = switches {
            report.goal("<= one switch (0.5x the two)", three * 1e3 <= 0.5 * two);
        }
        let three_beyond = beyond_both(
            zero_copy[1],
            producer_only[1],
            by_kernel,
            "3 in flight",
            report,
        );
        if let Some(two) = switches {
            report.goal(
                "<= one switch (0.5x the two)",
                three_beyond * 1e3 <= 0.5 * two,
            );
        }
        // The consumer's copy by the driver: the overheads again, against
        // the same switches (and less that consumer's own copy).
        for (k, what, share, goal) in [
            (
                0,
                "1 in flight, the consumer's copy by the driver",
                1.1,
                "<= 1.1x the two switches",
            ),
            (
                1,
                "3 in flight, the consumer's copy by the driver",
                0.5,
                "<= one switch (0.5x the two)",
            ),
        ] {
            let total = overhead(zero_copy_dma[k], producer_only[k], what, report);
            if let Some(two) = switches {
                report.goal(goal, total * 1e3 <= share * two);
            }
            let by_driver = (consumer_only_dma, "the consumer alone by the driver");
            let beyond = beyond_both(zero_copy_dma[k], producer_only[k], by_driver, what, report);
            if let Some(two) = switches {
                report.goal(goal, beyond * 1e3 <= share * two);
            }
        }
        if batches {
            // Batches of `n` frames in one vkQueueSubmit; CUDA waits once
            // per batch for its last frame, copies all of it, signals once.
            // Slot reuse: frame f waits (GPU) and the host waits before it
            // submits for consumed >= f - BATCH_SLOTS.
            for n in [3u64, BATCH_SLOTS as u64] {
                let mut run_batched = |n_batches: u32| -> Res<Duration> {
                    let start = Instant::now();
                    for _ in 0..n_batches {
                        let (first, last) = (*frame + 1, *frame + n);
                        let reuse = last.saturating_sub(BATCH_SLOTS as u64);
                        if reuse > 0 {
                            consumed.wait(reuse, WAIT_LIMIT, SPIN)?;
                        }
                        let slot = |f: u64| ((f - 1) % BATCH_SLOTS as u64) as usize;
                        let batch: Vec<(usize, u64, u64)> = (first..=last)
                            .map(|f| (slot(f), f.saturating_sub(BATCH_SLOTS as u64), f))
                            .collect();
                        producer.submit_batch(&batch)?;
                        cu_produced.wait(&stream, last)?;
                        for f in first..=last {
                            let s = slot(f);
                            levels[s].enqueue_copy_to_with(
                                &stream,
                                PitchedMut::buffer(&mut dsts[s]),
                                CopyEngine::Kernel,
                            )?;
                        }
                        cu_consumed.signal(&stream, last)?;
                        *frame = last;
                    }
                    consumed.wait(*frame, WAIT_LIMIT, SPIN)?;
                    Ok(start.elapsed())
                };
                run_batched(4)?;
                let n_batches = (frames / n as u32).max(1);
                let t = run_batched(n_batches)?;
                let per_frame = t.as_secs_f64() * 1e3 / f64::from(n_batches * n as u32);
                let what = format!(
                    "batches of {n} frames per submit, {} batch(es) queued",
                    BATCH_SLOTS as u64 / n
                );
                report.add_vs(
                    "S3",
                    format!("{label}, {what}: zero-copy through the safe API, per frame"),
                    per_frame,
                    "ms",
                    ("producer alone, 3 in flight", producer_only[1]),
                );
                overhead(per_frame, producer_only[1], &what, report);
            }
        }
    }

    // Host staging through pinned memory (1 in flight): clear, copy to a
    // host-visible buffer, wait, memcpy into pinned memory, copy to the
    // device, wait.
    let host = HostBuffer::new(ctx, bytes as usize)?;
    let staged = TimelineSemaphore::new(ctx)?;
    let mut staging_producer = Producer::new(
        ctx,
        variant,
        F::TEXEL_BYTES,
        &raw_images[..1],
        &[After::CopyTo(host.buffer)],
        None,
        staged.raw(),
    )?;
    let pinned = PinnedHost::new(cuda, bytes as usize)?;
    let _drain_staging = Drain(&stream);
    let driver = sys::Driver::global().map_err(|e| e.to_string())?;
    let htod = driver
        .fns()
        .cuMemcpyHtoDAsync
        .ok_or("no cuMemcpyHtoDAsync")?;
    let mut staged_value = 0u64;
    let mut run_staging = |n_frames: u32| -> Res<Duration> {
        let start = Instant::now();
        for _ in 0..n_frames {
            staged_value += 1;
            staging_producer.submit(0, 0, staged_value)?;
            staged.wait(staged_value, WAIT_LIMIT, SPIN)?;
            // SAFETY: the copy into `host` completed (its timeline value was
            // reached, and the command buffer made it host-visible); both
            // ranges hold `bytes` bytes and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(host.mapped, pinned.ptr, bytes as usize) };
            {
                let _context = cuda.enter()?;
                // SAFETY: `dsts[0]` holds `bytes` bytes, `pinned` is
                // page-locked host memory of `bytes` bytes, both alive until
                // the stream is drained below; the context is current.
                let r = unsafe {
                    htod(
                        dsts[0].device_ptr(),
                        pinned.ptr.cast(),
                        bytes as usize,
                        stream.raw(),
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuMemcpyHtoDAsync: {r:?}").into());
                }
            }
            while !stream.query()? {
                std::hint::spin_loop();
            }
        }
        Ok(start.elapsed())
    };
    run_staging(3)?;
    let staging_frames = frames.min(60);
    let t = run_staging(staging_frames)?;
    let staging = t.as_secs_f64() * 1e3 / f64::from(staging_frames);
    report.add_vs(
        "S3",
        format!("{label}, 1 in flight: host staging through pinned memory, per frame"),
        staging,
        "ms",
        ("producer alone", producer_only[0]),
    );
    let zero_copy_cost = (zero_copy[0] - producer_only[0]).max(1e-6);
    let staging_cost = staging - producer_only[0];
    report.add_vs(
        "S3",
        format!("{label}, 1 in flight: hand-off cost, staging (frame time minus producer alone)"),
        staging_cost,
        "ms",
        ("zero-copy hand-off cost", zero_copy_cost),
    );
    // Issue 19's goal for the transfer path; B.3's for the render path.
    let goal = match variant {
        Variant::Render => 20.0,
        Variant::Copy => 100.0,
    };
    if size == "4K" {
        report.goal(
            format!("staging cost >= {goal}x zero-copy's"),
            staging_cost >= goal * zero_copy_cost,
        );
    }
    let relayed_cost = (relayed - producer_only[0]).max(1e-6);
    report.add_vs(
        "S3",
        format!(
            "{label}, 1 in flight: hand-off cost, staging, against zero-copy with a host relay"
        ),
        staging_cost,
        "ms",
        ("zero-copy hand-off cost, host relay", relayed_cost),
    );
    if size == "4K" {
        report.goal(
            format!("staging cost >= {goal}x zero-copy's"),
            staging_cost >= goal * relayed_cost,
        );
    }
    stream.synchronize(WAIT_LIMIT)?;
    drop(staging_producer);
    drop(producer);
    drop(producer_alone);
    drop(surfaces);
    Ok(())
}

/// The crate's copy of one level into pitched linear memory, enqueued
/// without a synchronize.
fn copy_level(
    stream: &Stream,
    copy: &Function<'_>,
    grid: [u32; 3],
    block: [u32; 3],
    args: &mut [*mut c_void; 5],
) -> Res<()> {
    // SAFETY: array_to_linear_*b_r4(u64 surface, u64 dst, u64 pitch, u32 w,
    // u32 h) with a live surface of the level and a destination of pitch *
    // height bytes; both outlive the stream's work (the caller drains it
    // before dropping them).
    unsafe { stream.launch(copy, grid, block, 0, args) }?;
    Ok(())
}

/// Page-locked host memory (`cuMemAllocHost`).
struct PinnedHost {
    device: CudaDevice,
    ptr: *mut u8,
}

impl PinnedHost {
    fn new(device: &CudaDevice, len: usize) -> Res<Self> {
        let driver = sys::Driver::global().map_err(|e| e.to_string())?;
        let alloc = driver.fns().cuMemAllocHost.ok_or("no cuMemAllocHost")?;
        let _context = device.enter()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is current; writes one pointer.
        let r = unsafe { alloc(&mut ptr, len) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuMemAllocHost: {r:?}").into());
        }
        Ok(PinnedHost {
            device: device.clone(),
            ptr: ptr.cast(),
        })
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if let (Ok(driver), Ok(_context)) = (sys::Driver::global(), self.device.enter()) {
            if let Some(free) = driver.fns().cuMemFreeHost {
                // SAFETY: allocated by cuMemAllocHost in this context, freed
                // once; the copies reading it completed (streams drained).
                unsafe { free(self.ptr.cast()) };
            }
        }
    }
}

/// Times `launch` with events: the mean of `n` launches, in µs.
fn event_time(
    cuda: &CudaDevice,
    stream: &Stream,
    n: u32,
    mut launch: impl FnMut() -> Res<()>,
) -> Res<f64> {
    launch()?;
    let (start, end) = (Event::new(cuda)?, Event::new(cuda)?);
    stream.record(&start)?;
    for _ in 0..n {
        launch()?;
    }
    stream.record(&end)?;
    stream.synchronize(WAIT_LIMIT)?;
    Ok(f64::from(end.elapsed_ms_since(&start)?) * 1e3 / f64::from(n))
}

/// S4: a 4K RGBA8 frame read by a kernel (and written to linear memory),
/// by where it lives.
fn s4_read_cost_by_layout(
    ctx: &Context,
    cuda: &CudaDevice,
    copy_module: &Module,
    linear: &Module,
    report: &mut Report,
) -> Res<()> {
    let (width, height) = (3840u32, 2160u32);
    let bytes = u64::from(width) * u64::from(height) * 4;
    let stream = Stream::new(cuda)?;
    let dst = DeviceBuffer::new(cuda, bytes as usize)?;
    let copy_b128 = linear.function("copy_b128")?;
    let words = bytes / 16;
    let linear_copy = |src: u64| -> Res<()> {
        let (mut s, mut d, mut n) = (src, dst.device_ptr(), words);
        let mut args: [*mut c_void; 3] = [
            (&mut s as *mut u64).cast(),
            (&mut d as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: copy_b128(u64 src, u64 dst, u64 n) copies n 16-byte words;
        // both ranges hold `bytes` bytes and outlive the stream's work.
        unsafe {
            stream.launch(
                &copy_b128,
                [(words as u32).div_ceil(256), 1, 1],
                [256, 1, 1],
                0,
                &mut args,
            )
        }?;
        Ok(())
    };
    let gb = |t_us: f64| bytes as f64 / t_us / 1e3;

    let malloc = DeviceBuffer::new(cuda, bytes as usize)?;
    let t_malloc = event_time(cuda, &stream, 100, || linear_copy(malloc.device_ptr()))?;
    report.add(
        "S4",
        "4K RGBA8 read by a kernel from cuMemAlloc memory (linear)",
        gb(t_malloc),
        "GB/s",
    );

    let buffer = ExportableBuffer::<DeviceLocal>::new(ctx, bytes)?;
    let mut imported = cuda.import_buffer(&buffer)?;
    let mapped = imported.map()?;
    let t_buffer = event_time(cuda, &stream, 100, || linear_copy(mapped.device_ptr()))?;
    report.add_vs(
        "S4",
        "from a mapped Vulkan buffer",
        gb(t_buffer),
        "GB/s",
        ("cuMemAlloc", gb(t_malloc)),
    );

    let copy = copy_module.function("array_to_linear_4b_r4")?;
    let grid = [width.div_ceil(16), height.div_ceil(64), 1];
    let image = Img::<Rgba8Unorm>::new(ctx, ImageDesc::new_2d(width, height))?;
    let image_import = cuda.import_image(&image)?;
    let array = image_import.map_array()?;
    let level = array.level(0)?;
    let surface = level.surface()?;
    let mut params = CopyArgs {
        surface: surface.raw(),
        dst: dst.device_ptr(),
        pitch: u64::from(width) * 4,
        width,
        height,
    };
    let mut args = copy_args(&mut params);
    let t_array = event_time(cuda, &stream, 100, || {
        copy_level(&stream, &copy, grid, [16, 16, 1], &mut args)
    })?;
    report.add_vs(
        "S4",
        "from a mapped Vulkan image (CUDA array), surface reads",
        gb(t_array),
        "GB/s",
        ("cuMemAlloc", gb(t_malloc)),
    );

    let native = NativeArray::new(cuda, width, height)?;
    let _drain = Drain(&stream);
    let mut native_params = CopyArgs {
        surface: native.surface,
        dst: dst.device_ptr(),
        pitch: u64::from(width) * 4,
        width,
        height,
    };
    let mut native_args = copy_args(&mut native_params);
    let t_native = event_time(cuda, &stream, 100, || {
        copy_level(&stream, &copy, grid, [16, 16, 1], &mut native_args)
    })?;
    report.add_vs(
        "S4",
        "from a native CUDA array (cuArray3DCreate), surface reads",
        gb(t_native),
        "GB/s",
        ("cuMemAlloc", gb(t_malloc)),
    );
    report.add_vs(
        "S4",
        "mapped Vulkan image vs native CUDA array",
        gb(t_array),
        "GB/s",
        ("native array", gb(t_native)),
    );
    report.note(
        "S4: texture reads are not measured (the crate's kernels read arrays through surfaces)",
    );
    stream.synchronize(WAIT_LIMIT)?;
    drop(native);
    Ok(())
}

/// A 2D RGBA8 CUDA array with a surface, made by CUDA itself.
struct NativeArray {
    device: CudaDevice,
    array: sys::CUarray,
    surface: sys::CUsurfObject,
}

impl NativeArray {
    fn new(device: &CudaDevice, width: u32, height: u32) -> Res<Self> {
        let driver = sys::Driver::global().map_err(|e| e.to_string())?;
        let fns = driver.fns();
        let create = fns.cuArray3DCreate.ok_or("no cuArray3DCreate")?;
        let surface_create = fns.cuSurfObjectCreate.ok_or("no cuSurfObjectCreate")?;
        let _context = device.enter()?;
        let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: width as usize,
            Height: height as usize,
            Depth: 0,
            Format: sys::CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
            NumChannels: 4,
            Flags: sys::CUDA_ARRAY3D_SURFACE_LDST,
        };
        let mut array: sys::CUarray = std::ptr::null_mut();
        // SAFETY: the context is current; a valid 2D descriptor; writes one handle.
        let r = unsafe { create(&mut array, &desc) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuArray3DCreate: {r:?}").into());
        }
        let mut res = sys::CUDA_RESOURCE_DESC {
            resType: sys::CUresourcetype::CU_RESOURCE_TYPE_ARRAY,
            ..Default::default()
        };
        res.res.array.hArray = array;
        let mut surface: sys::CUsurfObject = 0;
        // SAFETY: a resource descriptor naming the live array just made
        // (with SURFACE_LDST); writes one handle.
        let r = unsafe { surface_create(&mut surface, &res) };
        let native = NativeArray {
            device: device.clone(),
            array,
            surface,
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuSurfObjectCreate: {r:?}").into());
        }
        Ok(native)
    }
}

impl Drop for NativeArray {
    fn drop(&mut self) {
        if let (Ok(driver), Ok(_context)) = (sys::Driver::global(), self.device.enter()) {
            let fns = driver.fns();
            // SAFETY: made in this context, destroyed once, after the streams
            // that used them were drained.
            unsafe {
                if self.surface != 0 {
                    if let Some(destroy) = fns.cuSurfObjectDestroy {
                        destroy(self.surface);
                    }
                }
                if let Some(destroy) = fns.cuArrayDestroy {
                    destroy(self.array);
                }
            }
        }
    }
}

/// `count` timeline semaphores of a context and their CUDA imports, which
/// drop first (fields drop in order).
struct TimelineSet {
    imports: Vec<ExternalSemaphore<Timeline>>,
    _vulkan: Vec<TimelineSemaphore>,
}

impl TimelineSet {
    fn new(ctx: &Context, cuda: &CudaDevice, count: usize) -> Res<TimelineSet> {
        let vulkan = (0..count)
            .map(|_| TimelineSemaphore::new(ctx))
            .collect::<Result<Vec<_>, _>>()?;
        let imports = vulkan
            .iter()
            .map(|s| cuda.import_semaphore(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TimelineSet {
            imports,
            _vulkan: vulkan,
        })
    }
}

/// S6's batch loop: per frame, one `signal_semaphores` and one
/// `wait_semaphores` of every semaphore in `imports` (values 1, 2, ...),
/// then a drain: the time per frame, in µs.
fn batched_frames(
    stream: &Stream,
    imports: &[ExternalSemaphore<Timeline>],
    frames: u32,
) -> Res<f64> {
    // The signal list is reused, as the raw loop reuses its parameters.
    let mut signals: Vec<SignalOp<'_>> = Vec::with_capacity(imports.len());
    let start = Instant::now();
    for f in 1..=u64::from(frames) {
        signals.clear();
        signals.extend(imports.iter().map(|s| SignalOp::Timeline(s, f)));
        stream.signal_semaphores(&signals)?;
        stream.wait_semaphores(imports.iter().map(|s| WaitOp::Timeline(s, f)))?;
    }
    stream.synchronize(WAIT_LIMIT)?;
    Ok(us(start.elapsed()) / f64::from(frames))
}

/// S6: `count` timeline signals and waits per frame: one safe call per
/// semaphore, and the safe batch API, against one batched raw call for all
/// of them.
fn s6_semaphore_batching(
    ctx: &Context,
    cuda: &CudaDevice,
    report: &mut Report,
    frames: u32,
) -> Res<()> {
    let stream = Stream::new(cuda)?;
    let driver = sys::Driver::global().map_err(|e| e.to_string())?;
    let fns = driver.fns();
    let signal = fns
        .cuSignalExternalSemaphoresAsync
        .ok_or("no cuSignalExternalSemaphoresAsync")?;
    let wait = fns
        .cuWaitExternalSemaphoresAsync
        .ok_or("no cuWaitExternalSemaphoresAsync")?;
    for count in [1usize, 4, 16] {
        let safe_set = TimelineSet::new(ctx, cuda, count)?;
        let safe_imports = &safe_set.imports[..];
        let raw_set = TimelineSet::new(ctx, cuda, count)?;
        let raw_imports = &raw_set.imports;
        let _drain = Drain(&stream);
        let start = Instant::now();
        for f in 1..=u64::from(frames) {
            for s in safe_imports {
                s.signal(&stream, f)?;
            }
            for s in safe_imports {
                s.wait(&stream, f)?;
            }
        }
        stream.synchronize(WAIT_LIMIT)?;
        let safe = us(start.elapsed()) / f64::from(frames);

        let handles: Vec<sys::CUexternalSemaphore> = raw_imports.iter().map(|s| s.raw()).collect();
        let mut signal_params = vec![sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); count];
        let mut wait_params = vec![sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default(); count];
        let start = Instant::now();
        {
            let _context = cuda.enter()?;
            for f in 1..=u64::from(frames) {
                for p in &mut signal_params {
                    p.params.fence.value = f;
                }
                for p in &mut wait_params {
                    p.params.fence.value = f;
                }
                // SAFETY: `count` live imported timeline semaphores of the
                // current context, as many zeroed parameter blocks with
                // increasing values, a live stream; the imports outlive the
                // work (the stream is drained below, before they drop).
                let r = unsafe {
                    signal(
                        handles.as_ptr(),
                        signal_params.as_ptr(),
                        count as c_uint,
                        stream.raw(),
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuSignalExternalSemaphoresAsync: {r:?}").into());
                }
                // SAFETY: as above.
                let r = unsafe {
                    wait(
                        handles.as_ptr(),
                        wait_params.as_ptr(),
                        count as c_uint,
                        stream.raw(),
                    )
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuWaitExternalSemaphoresAsync: {r:?}").into());
                }
            }
        }
        stream.synchronize(WAIT_LIMIT)?;
        let raw = us(start.elapsed()) / f64::from(frames);
        report.add_vs(
            "S6",
            format!("{count} timeline signal(s) + wait(s) per frame: safe API, one call each"),
            safe,
            "us",
            ("one batched raw call each", raw),
        );

        // The safe batch API: one signal_semaphores and one wait_semaphores
        // per frame, on a third set (the values of each set only go up).
        let batch_set = TimelineSet::new(ctx, cuda, count)?;
        let batched = batched_frames(&stream, &batch_set.imports, frames)?;
        report.add_vs(
            "S6",
            format!("{count} timeline signal(s) + wait(s) per frame: safe batch API (Stream::signal_semaphores / wait_semaphores)"),
            batched,
            "us",
            ("one batched raw call each", raw),
        );
        report.goal("<= 1.5x the raw batched call", batched <= 1.5 * raw);

        // The same, with the context current on this thread for the whole
        // loop, as the raw loop has it (and as a CUDA runtime's, PyTorch's
        // or CuPy's thread has it): the safe calls then push and pop
        // nothing.
        let current_set = TimelineSet::new(ctx, cuda, count)?;
        let batched_current = {
            let _context = cuda.enter()?;
            batched_frames(&stream, &current_set.imports, frames)?
        };
        report.add_vs(
            "S6",
            format!("{count} timeline signal(s) + wait(s) per frame: safe batch API, the context current (as the raw loop has it)"),
            batched_current,
            "us",
            ("one batched raw call each", raw),
        );
        report.goal(
            "<= 1.5x the raw batched call, both with the context current",
            batched_current <= 1.5 * raw,
        );
    }
    Ok(())
}
