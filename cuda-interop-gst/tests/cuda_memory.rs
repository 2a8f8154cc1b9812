//! `cudainteropsrc` in `memory:CUDAMemory`: offered for device-local rings
//! (read by CUDA) where GStreamer's CUDA library is installed, every frame
//! copied device to device into a `GstCudaMemory` (no host copy:
//! `device-copies` stays 0), every pixel exact as GStreamer itself maps
//! the memory back; a host-visible ring (lavapipe's) is never offered in
//! it, and the same device-local ring without a CUDA caps filter goes
//! through system memory (counted as device copies).
//!
//! `cudainteropsink` takes `memory:CUDAMemory` where it can (an NVIDIA
//! device, the library): a device-local ring that CUDA copies each buffer
//! into; `cudainteropsrc ! CUDA memory ! cudainteropsink` republishes a
//! ring without a host copy at either end, checked by a CUDA receiver of
//! the second name. Where it cannot (lavapipe), CUDA caps do not
//! negotiate.
//!
//! The device-local tests need an NVIDIA GPU and GStreamer's CUDA library
//! (`libgstreamer-plugins-bad1.0-0`): `--ignored`, run on the GPU machine.

use std::thread::JoinHandle;
use std::time::Duration;

use cuda_interop::Stream;
use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::protocol::{Delivery, Planar};
use gst::prelude::*;

#[path = "../../cuda-interop-frames/examples/common/demo.rs"]
mod demo;

mod common;
use common::{init, pipeline, rows, run_to_end, unique_name, End, Run, BOUND};

const W: u32 = 1920;
const H: u32 = 1080;
const FRAMES: u64 = 60;

fn produce(
    name: &str,
    device_local: bool,
    planar: Option<Planar>,
) -> JoinHandle<Result<(), demo::ProducerError>> {
    let row_pitch = match planar {
        Some(p) => u64::from(W) * p.sample_bytes(),
        None => u64::from(W) * 4,
    };
    let opts = demo::ProducerOptions {
        tag: "[gst-cuda-memory producer]",
        name: Some(name.into()),
        width: W,
        height: H,
        row_pitch,
        slots: 4,
        seconds: BOUND.as_secs_f64(),
        frames: Some(FRAMES),
        wait_for_receivers: 1,
        wait_timeout: BOUND,
        // A zero-copy test holds slots for the whole run.
        hold_timeout: BOUND,
        host_visible: !device_local,
        device_local,
        no_semaphores: !device_local,
        planar,
        ..demo::ProducerOptions::default()
    };
    std::thread::spawn(move || demo::run(&opts))
}

/// Every frame 1..=FRAMES, every row of every plane the demo pattern.
fn check_frames(run: &Run) {
    let mut seen = Vec::new();
    for sample in &run.samples {
        let f = sample.buffer().unwrap().offset();
        for (plane, y, row) in rows(sample) {
            let pattern_row = if plane == 0 { y } else { H };
            assert!(
                demo::check_demo_row(&row, f, pattern_row, H),
                "frame {f}: plane {plane} row {y} is not the frame's: {:?}",
                &row[..8.min(row.len())]
            );
        }
        seen.push(f);
    }
    assert_eq!(
        seen,
        (1..=FRAMES).collect::<Vec<_>>(),
        "every frame, in order"
    );
}

fn counter(p: &gst::Pipeline, name: &str) -> u64 {
    p.by_name("src").unwrap().property::<u64>(name)
}

/// Runs `name` through `cudainteropsrc ! CAPS ! appsink` (lossless).
fn run(name: &str, caps: &str) -> (gst::Pipeline, Run) {
    let p = pipeline(&format!(
        "cudainteropsrc name=src sender-name={name} delivery=lossless timeout=30000 ! {caps} ! \
         appsink name=sink sync=false"
    ));
    let run = run_to_end(&p);
    (p, run)
}

fn in_cuda_memory(sample: &gst::Sample) -> bool {
    let buffer = sample.buffer().unwrap();
    buffer.n_memory() == 1
        && buffer
            .peek_memory(0)
            .allocator()
            .is_some_and(|a| a.memory_type() == "gst.cuda.memory")
}

#[test]
fn the_template_offers_cuda_memory_in_the_formats_its_allocator_lays_out() {
    init();
    let factory = gst::ElementFactory::find("cudainteropsrc").unwrap();
    let template = factory
        .static_pad_templates()
        .into_iter()
        .find(|t| t.name_template() == "src")
        .unwrap()
        .caps();
    let cuda = template
        .iter_with_features()
        .find(|(_, f)| f.contains("memory:CUDAMemory"))
        .map(|(s, _)| s.to_owned())
        .expect("a memory:CUDAMemory structure");
    let formats: Vec<String> = cuda
        .get::<gst::List>("format")
        .unwrap()
        .iter()
        .map(|v| v.get::<String>().unwrap())
        .collect();
    assert_eq!(formats, ["RGBA", "BGRA", "RGB10A2_LE", "NV12", "P010_10LE"]);
}

/// The twin of the GPU tests below, on any machine: a host-visible ring is
/// never offered in CUDA memory, so a CUDA caps filter fails negotiation.
#[test]
fn a_host_visible_ring_is_not_offered_in_cuda_memory() {
    init();
    let name = unique_name("cuda-host-visible");
    let producer = produce(&name, false, None);
    let (p, run) = run(&name, "video/x-raw(memory:CUDAMemory)");
    let End::Error(why) = &run.end else {
        panic!(
            "negotiated CUDA memory for a host-visible ring: {:?}",
            run.end
        );
    };
    assert!(
        why.contains("not-negotiated") || why.contains("negotiat"),
        "{why}"
    );
    assert_eq!(counter(&p, "cuda-memory-buffers"), 0);
    drop(p);
    // The producer waited for a subscriber; it stops by its bound or when
    // the receiver left, either way without an error of its own.
    let _ = producer.join().expect("the producer thread");
}

fn device_local(planar: Option<Planar>, caps_format: &str) {
    init();
    let name = unique_name(&format!("cuda-{caps_format}"));
    let producer = produce(&name, true, planar);
    let (p, run) = run(
        &name,
        &format!("video/x-raw(memory:CUDAMemory),format={caps_format}"),
    );
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert!(matches!(run.end, End::Eos), "{:?}", run.end);
    assert!(
        run.samples.iter().all(in_cuda_memory),
        "every buffer is a GstCudaMemory"
    );
    check_frames(&run);
    assert_eq!(counter(&p, "cuda-memory-buffers"), FRAMES);
    assert_eq!(counter(&p, "device-copies"), 0, "no copy through the host");
    println!("{caps_format}: {FRAMES} frames in CUDA memory, every pixel exact");
}

#[test]
#[ignore = "needs an NVIDIA GPU and libgstreamer-plugins-bad1.0-0: run on the GPU machine"]
fn a_device_local_rgba_ring_arrives_in_cuda_memory_exact() {
    device_local(None, "RGBA");
}

#[test]
#[ignore = "needs an NVIDIA GPU and libgstreamer-plugins-bad1.0-0: run on the GPU machine"]
fn a_device_local_nv12_ring_arrives_in_cuda_memory_with_both_planes() {
    device_local(Some(Planar::Nv12), "NV12");
}

/// The twin: the same ring, system memory asked for, goes through the
/// host (each frame a CUDA device-to-host copy).
#[test]
#[ignore = "needs an NVIDIA GPU: run on the GPU machine"]
fn a_device_local_ring_in_system_memory_is_copied_through_the_host() {
    init();
    let name = unique_name("cuda-system");
    let producer = produce(&name, true, None);
    let (p, run) = run(&name, "video/x-raw,format=RGBA");
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert!(matches!(run.end, End::Eos), "{:?}", run.end);
    assert!(!run.samples.iter().any(in_cuda_memory));
    check_frames(&run);
    assert_eq!(counter(&p, "cuda-memory-buffers"), 0);
    assert_eq!(counter(&p, "device-copies"), FRAMES);
}

/// Whether the sink takes CUDA memory here, found out without it: an
/// NVIDIA device under the default Vulkan device, and GStreamer's CUDA
/// library installed.
fn cuda_memory_takeable() -> bool {
    let ctx = vk_export::Context::headless(&vk_export::HeadlessOptions::default());
    // SAFETY: loads GStreamer's own library, whose initialisers only
    // register types.
    let library = unsafe { libloading::Library::new("libgstcuda-1.0.so.0") };
    ctx.is_ok_and(|ctx| cuda_interop::CudaDevice::for_vulkan(&ctx).is_ok()) && library.is_ok()
}

/// CUDA caps negotiate with the sink only where it takes CUDA memory
/// (`cuda_memory_takeable`): elsewhere (lavapipe: no NVIDIA device, CI)
/// negotiation fails and no sender is made, while the template still lists
/// them; where it does (the GPU machine), they negotiate, and a buffer in
/// system memory under them is refused with what to do.
#[test]
fn the_sink_takes_cuda_memory_only_where_it_can() {
    init();
    let factory = gst::ElementFactory::find("cudainteropsink").unwrap();
    let template = factory
        .static_pad_templates()
        .into_iter()
        .find(|t| t.name_template() == "sink")
        .unwrap()
        .caps();
    assert!(template
        .iter_with_features()
        .any(|(_, f)| f.contains("memory:CUDAMemory")));
    let name = unique_name("sink-cuda-caps");
    let why = common::one_buffer_into_sink(
        "video/x-raw(memory:CUDAMemory),format=RGBA,width=64,height=48,framerate=0/1",
        &name,
        64 * 48 * 4,
    )
    .expect("a buffer in system memory under CUDA caps was taken");
    if cuda_memory_takeable() {
        assert!(why.contains("not one CUDA memory"), "{why}");
        println!("CUDA memory is taken here; a system-memory buffer under its caps: {why}");
    } else {
        assert!(why.contains("negotiat"), "{why}");
        assert!(list_senders_named(&name).is_empty(), "no sender was made");
        println!("CUDA memory is not taken here: {why}");
    }
}

fn list_senders_named(name: &str) -> Vec<String> {
    cuda_interop_frames::discovery::list_senders()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.name == name)
        .map(|s| s.name)
        .collect()
}

/// The first word of `row` names the frame (the background is the frame
/// number, the band its complement); the frame whose pattern row 0 is.
fn frame_of(row: &[u8], h: u32) -> Option<u64> {
    let word = u32::from_le_bytes([row[0], row[1], row[2], row[3]]);
    [u64::from(word), u64::from(!word)]
        .into_iter()
        .find(|&f| demo::check_demo_row(row, f, 0, h))
}

fn republished(planar: Option<Planar>, caps_format: &str) {
    init();
    let (a, b) = (
        unique_name(&format!("cuda-a-{caps_format}")),
        unique_name(&format!("cuda-b-{caps_format}")),
    );
    let producer = produce(&a, true, planar);
    let p = pipeline(&format!(
        "cudainteropsrc name=src sender-name={a} delivery=lossless timeout=30000 ! \
         video/x-raw(memory:CUDAMemory),format={caps_format} ! cudainteropsink name=sink \
         sender-name={b} timeout=1000"
    ));
    p.set_state(gst::State::Playing).unwrap();
    let rx = CudaReceiver::connect_named(&b, Delivery::Lossless, Duration::from_secs(60))
        .expect("the sink's sender appears");
    let layout = *rx.layout();
    let stream = Stream::new(rx.cuda()).unwrap();
    let mut bytes = vec![0u8; layout.frame_bytes().unwrap() as usize];
    let pitch = layout.row_pitch as usize;
    let mut seen = Vec::new();
    loop {
        let frame = match rx.next(Duration::from_secs(20)) {
            Ok(frame) => frame,
            Err(e) => {
                // The sink says goodbye when the pipeline stops (EOS from
                // the producer's end).
                println!("{caps_format}: receiving ended: {e}");
                break;
            }
        };
        rx.wait_on(&frame, &stream).unwrap();
        rx.copy_to_host(&frame, &stream, 0, &mut bytes, Duration::from_secs(10))
            .unwrap();
        rx.release_after(frame, &stream).unwrap();
        let luma_row = |y: u32| &bytes[y as usize * pitch..][..(W as usize * 4).min(pitch)];
        let f = frame_of(luma_row(0), H).expect("row 0 names a demo frame");
        let row_bytes = match planar {
            Some(p) => W as usize * p.sample_bytes() as usize,
            None => W as usize * 4,
        };
        for y in 0..H {
            let row = &bytes[y as usize * pitch..][..row_bytes];
            assert!(
                demo::check_demo_row(row, f, y, H),
                "frame {f}: luma row {y}"
            );
        }
        if let Some((_, chroma)) = layout.planar_format() {
            for y in 0..H / 2 {
                let row = &bytes[chroma as usize + y as usize * pitch..][..row_bytes];
                assert!(
                    demo::check_demo_row(row, f, H, H),
                    "frame {f}: chroma row {y}"
                );
            }
        }
        seen.push(f);
        if f == FRAMES {
            break;
        }
    }
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    let src = p.by_name("src").unwrap();
    let sink = p.by_name("sink").unwrap();
    let (in_cuda, copies, presented) = (
        src.property::<u64>("cuda-memory-buffers"),
        src.property::<u64>("device-copies"),
        sink.property::<u64>("frames-presented"),
    );
    p.set_state(gst::State::Null).unwrap();
    println!(
        "{caps_format}: src pushed {in_cuda} buffers in CUDA memory ({copies} host copies); the \
         sink presented {presented}; the CUDA receiver of the republished ring checked {} \
         frames, every pixel exact",
        seen.len()
    );
    assert_eq!(copies, 0, "no copy through the host");
    assert_eq!(in_cuda, FRAMES);
    assert!(seen.len() >= 10, "only {} frames checked", seen.len());
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");
    assert_eq!(seen.last(), Some(&FRAMES));
}

#[test]
#[ignore = "needs an NVIDIA GPU and libgstreamer-plugins-bad1.0-0: run on the GPU machine"]
fn a_ring_republished_through_cuda_memory_keeps_every_pixel_rgba() {
    republished(None, "RGBA");
}

#[test]
#[ignore = "needs an NVIDIA GPU and libgstreamer-plugins-bad1.0-0: run on the GPU machine"]
fn a_ring_republished_through_cuda_memory_keeps_every_pixel_nv12() {
    republished(Some(Planar::Nv12), "NV12");
}

/// `zero-copy` is off until asked for: a copy that is released at once is
/// the default (the slot itself stays held while downstream keeps it).
#[test]
fn zero_copy_is_off_unless_asked_for() {
    init();
    let src = gst::ElementFactory::make("cudainteropsrc").build().unwrap();
    assert!(!src.property::<bool>("zero-copy"));
    src.set_property("zero-copy", true);
    assert!(src.property::<bool>("zero-copy"));
}

/// `zero-copy` on a lossless reader: on GStreamer 1.24 and later every
/// buffer is the ring's slot itself (`zero-copy-buffers`), earlier a copy
/// (0 of them). Either way a buffer's pixels stay the frame's for as long
/// as it is held: the test keeps the first `HELD` buffers while every
/// later frame goes through the slots left (of the ring's four, appsink
/// keeps one: the last sample it handed out), then checks the kept ones
/// again. A slot released on the push instead of when GStreamer frees the
/// buffer would have been written by later frames (58 of them through
/// four slots).
#[test]
#[ignore = "needs an NVIDIA GPU and libgstreamer-plugins-bad1.0-0: run on the GPU machine"]
fn zero_copy_buffers_keep_their_frame_until_dropped() {
    const HELD: usize = 2;
    init();
    let name = unique_name("cuda-zero-copy");
    let producer = produce(&name, true, None);
    // No last-sample: the sink would keep one more buffer, and with it a
    // slot.
    let p = pipeline(&format!(
        "cudainteropsrc name=src sender-name={name} delivery=lossless timeout=30000 \
         zero-copy=true ! video/x-raw(memory:CUDAMemory),format=RGBA ! \
         appsink name=sink sync=false enable-last-sample=false"
    ));
    let appsink = p
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let check = |sample: &gst::Sample| -> u64 {
        assert!(in_cuda_memory(sample), "every buffer is a GstCudaMemory");
        let f = sample.buffer().unwrap().offset();
        for (_, y, row) in rows(sample) {
            assert!(
                demo::check_demo_row(&row, f, y, H),
                "frame {f}: row {y} is not the frame's: {:?}",
                &row[..8]
            );
        }
        f
    };
    let (mut held, mut seen) = (Vec::new(), Vec::new());
    while seen.last() != Some(&FRAMES) {
        let sample = appsink
            .try_pull_sample(gst::ClockTime::from_seconds(BOUND.as_secs()))
            .unwrap_or_else(|| panic!("no sample within {BOUND:?} after {seen:?}"));
        seen.push(check(&sample));
        if held.len() < HELD {
            held.push(sample);
        }
    }
    let again: Vec<u64> = held.iter().map(check).collect();
    assert_eq!(again, (1..=HELD as u64).collect::<Vec<_>>());
    let src = p.by_name("src").unwrap();
    let (in_cuda, slots, copies) = (
        src.property::<u64>("cuda-memory-buffers"),
        src.property::<u64>("zero-copy-buffers"),
        src.property::<u64>("device-copies"),
    );
    drop(held);
    p.set_state(gst::State::Null).unwrap();
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert_eq!(
        seen,
        (1..=FRAMES).collect::<Vec<_>>(),
        "every frame, in order"
    );
    assert_eq!((in_cuda, copies), (FRAMES, 0));
    let wraps = gst::version() >= (1, 24, 0, 0);
    assert_eq!(slots, if wraps { FRAMES } else { 0 });
    println!(
        "zero-copy on GStreamer {}: {slots} of {in_cuda} buffers were the ring's slot itself; the \
         {HELD} held while {} more frames went by kept every pixel",
        gst::version_string(),
        FRAMES - HELD as u64
    );
}
