//! `cudainteropsrc` in `memory:CUDAMemory`: offered for device-local rings
//! (read by CUDA) where GStreamer's CUDA library is installed, every frame
//! copied device to device into a `GstCudaMemory` (no host copy:
//! `device-copies` stays 0), every pixel exact as GStreamer itself maps
//! the memory back; a host-visible ring (lavapipe's) is never offered in
//! it, and the same device-local ring without a CUDA caps filter goes
//! through system memory (counted as device copies).
//!
//! The device-local tests need an NVIDIA GPU and GStreamer's CUDA library
//! (`libgstreamer-plugins-bad1.0-0`): `--ignored`, run on the GPU machine.

use std::thread::JoinHandle;

use cuda_interop_frames::protocol::Planar;
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
