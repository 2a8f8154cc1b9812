//! What the GStreamer tests share: the plugin registered in the test
//! process, pipelines run to their end with every wait bounded, and the
//! demo pattern checked in every row of a GStreamer video frame.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::time::{Duration, Instant};

use gst::prelude::*;
use gst_video::prelude::*;

/// The bound on every pipeline run of these tests.
pub const BOUND: Duration = Duration::from_secs(90);

/// GStreamer initialised, the plugin's elements registered.
pub fn init() {
    gstcudainterop::plugin_register_static().expect("the plugin registers");
}

/// A sender name no other test (or test process) uses.
pub fn unique_name(what: &str) -> String {
    format!("gst-{what}-{}", std::process::id())
}

/// How a pipeline run ended.
#[derive(Debug)]
pub enum End {
    /// End of stream.
    Eos,
    /// An error on the bus: its text and debug string.
    Error(String),
}

/// What [`run_to_end`] collected.
#[derive(Debug)]
pub struct Run {
    /// The appsink's samples, in order.
    pub samples: Vec<gst::Sample>,
    /// How it ended.
    pub end: End,
    /// The QoS messages' (processed, dropped) buffer counts, in order.
    pub qos: Vec<(u64, u64)>,
}

/// The first error message on `bus` within `timeout`, if any.
pub fn bus_error(bus: &gst::Bus, timeout: Duration) -> Option<String> {
    let message = bus.timed_pop_filtered(
        gst::ClockTime::from_nseconds(timeout.as_nanos() as u64),
        &[gst::MessageType::Error],
    )?;
    match message.view() {
        gst::MessageView::Error(e) => Some(format!(
            "{} ({})",
            e.error(),
            e.debug().map(|d| d.to_string()).unwrap_or_default()
        )),
        _ => None,
    }
}

/// Runs `pipeline` (its appsink named `sink`) until EOS or an error,
/// pulling every sample. Bounded by [`BOUND`]: a run past it panics.
pub fn run_to_end(pipeline: &gst::Pipeline) -> Run {
    run_to_end_with(pipeline, |_| {})
}

/// [`run_to_end`], calling `on_first` once, after the first sample.
pub fn run_to_end_with(pipeline: &gst::Pipeline, on_first: impl FnOnce(&gst::Pipeline)) -> Run {
    let mut on_first = Some(on_first);
    let appsink = pipeline
        .by_name("sink")
        .expect("an element named sink")
        .downcast::<gst_app::AppSink>()
        .expect("sink is an appsink");
    let bus = pipeline.bus().expect("a pipeline has a bus");
    if pipeline.set_state(gst::State::Playing).is_err() {
        // A start that failed at once: its error is on the bus.
        let error =
            bus_error(&bus, Duration::from_secs(5)).expect("a failed state change posts an error");
        let _ = pipeline.set_state(gst::State::Null);
        return Run {
            samples: Vec::new(),
            end: End::Error(error),
            qos: Vec::new(),
        };
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut qos = Vec::new();
    let end = loop {
        assert!(
            start.elapsed() < BOUND,
            "the pipeline ran past {BOUND:?}: {} samples",
            samples.len()
        );
        if let Some(sample) = appsink.try_pull_sample(gst::ClockTime::from_mseconds(20)) {
            samples.push(sample);
            if let Some(f) = on_first.take() {
                f(pipeline);
            }
            continue;
        }
        let mut ended = None;
        while let Some(message) = bus.pop() {
            match message.view() {
                gst::MessageView::Error(e) => {
                    ended = Some(End::Error(format!(
                        "{} ({})",
                        e.error(),
                        e.debug().map(|d| d.to_string()).unwrap_or_default()
                    )));
                    break;
                }
                gst::MessageView::Qos(q) => {
                    let (processed, dropped) = q.stats();
                    qos.push((processed.value() as u64, dropped.value() as u64));
                }
                _ => {}
            }
        }
        if let Some(end) = ended {
            break end;
        }
        if appsink.is_eos() {
            // Samples queued before the EOS.
            while let Some(sample) = appsink.try_pull_sample(gst::ClockTime::ZERO) {
                samples.push(sample);
            }
            break End::Eos;
        }
    };
    pipeline
        .set_state(gst::State::Null)
        .expect("the pipeline stops");
    Run { samples, end, qos }
}

/// A pipeline from a `gst-launch-1.0` description.
pub fn pipeline(description: &str) -> gst::Pipeline {
    gst::parse::launch(description)
        .unwrap_or_else(|e| panic!("{description}: {e}"))
        .downcast::<gst::Pipeline>()
        .expect("a pipeline")
}

/// The rows of every plane of `sample`'s buffer as GStreamer maps them
/// (its `GstVideoMeta`'s strides, or the caps' default ones): `(plane,
/// row index, bytes of the row's pixels)`.
pub fn rows(sample: &gst::Sample) -> Vec<(usize, u32, Vec<u8>)> {
    let caps = sample.caps().expect("a sample has caps");
    let info = gst_video::VideoInfo::from_caps(caps).expect("video caps");
    let buffer = sample.buffer().expect("a sample has a buffer");
    let frame = gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info)
        .expect("the buffer maps as its caps' video");
    let mut out = Vec::new();
    for plane in 0..frame.n_planes() {
        let data = frame.plane_data(plane).expect("a plane");
        let stride = frame.plane_stride()[plane as usize] as usize;
        let (row_bytes, rows) = match (info.format(), plane) {
            (gst_video::VideoFormat::Nv12, _) => (info.width() as usize, info.height() >> plane),
            (gst_video::VideoFormat::P01010le, _) => {
                (2 * info.width() as usize, info.height() >> plane)
            }
            _ => (
                info.width() as usize * info.format_info().pixel_stride()[0] as usize,
                info.height(),
            ),
        };
        for y in 0..rows {
            let at = y as usize * stride;
            out.push((plane as usize, y, data[at..at + row_bytes].to_vec()));
        }
    }
    out
}

/// Runs `appsrc caps=CAPS ! cudainteropsink sender-name=NAME`, pushes one
/// zeroed buffer of `bytes` and EOS: the first error's text and debug
/// string, or `None` for EOS (bounded by [`BOUND`]).
pub fn one_buffer_into_sink(caps: &str, name: &str, bytes: usize) -> Option<String> {
    let p = pipeline(&format!(
        "appsrc name=feed format=time caps=\"{caps}\" ! cudainteropsink sender-name={name}"
    ));
    let feed = p
        .by_name("feed")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let mut buffer = gst::Buffer::with_size(bytes).unwrap();
    buffer.get_mut().unwrap().set_pts(gst::ClockTime::ZERO);
    let pushed = feed.push_buffer(buffer);
    let _ = feed.end_of_stream();
    let ended = p.bus().unwrap().timed_pop_filtered(
        gst::ClockTime::from_seconds(BOUND.as_secs()),
        &[gst::MessageType::Error, gst::MessageType::Eos],
    );
    p.set_state(gst::State::Null).unwrap();
    match ended.as_ref().map(|m| m.view()) {
        Some(gst::MessageView::Error(e)) => Some(format!("{} ({:?})", e.error(), e.debug())),
        Some(gst::MessageView::Eos(_)) => None,
        other => panic!("{caps}: neither EOS nor an error ({pushed:?}, {other:?})"),
    }
}
