//! `cudainteropsrc` on lavapipe: the demo producer (frame_server's loop:
//! every pixel's little-endian `u32` is the frame number, a band of rows
//! has the bits flipped) publishes a ring in a thread of the test, and
//! `cudainteropsrc ! appsink` must deliver every frame with every pixel of
//! every row exact, for buffer rings (RGBA8 with padded rows, NV12, P010:
//! both planes) and image rings (RGBA8, BGRA8); a ring GStreamer has no
//! format for is refused with the list of those that work.

use std::thread::JoinHandle;
use std::time::Duration;

use cuda_interop_frames::protocol::Planar;
use gst::prelude::*;

#[path = "../../cuda-interop-frames/examples/common/demo.rs"]
mod demo;

mod common;
use common::{init, pipeline, rows, run_to_end, run_to_end_with, unique_name, End, Run, BOUND};

/// Even (4:2:0), and not a multiple of 4: GStreamer's NV12 stride rounds
/// up to 4, the ring's RGBA rows are padded.
const W: u32 = 66;
const H: u32 = 40;
const FRAMES: u64 = 12;

/// The demo producer serving `FRAMES` frames as `name` once one receiver
/// subscribed, on host-visible slots without timelines (lavapipe's).
fn produce(
    name: &str,
    tweak: impl FnOnce(&mut demo::ProducerOptions),
) -> JoinHandle<Result<(), demo::ProducerError>> {
    let mut opts = demo::ProducerOptions {
        tag: "[gst-test producer]",
        name: Some(name.into()),
        width: W,
        height: H,
        row_pitch: u64::from(W) * 4,
        slots: 3,
        seconds: BOUND.as_secs_f64(),
        frames: Some(FRAMES),
        wait_for_receivers: 1,
        wait_timeout: BOUND,
        host_visible: true,
        no_semaphores: true,
        ..demo::ProducerOptions::default()
    };
    tweak(&mut opts);
    std::thread::spawn(move || demo::run(&opts))
}

/// Every row of every plane of every sample is frame OFFSET's pattern (a
/// chroma row is the background); the frame numbers.
fn check_pixels(run: &Run) -> Vec<u64> {
    let mut seen = Vec::new();
    for sample in &run.samples {
        let buffer = sample.buffer().unwrap();
        let f = buffer.offset();
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
    seen
}

/// PTS present and never going back.
fn check_pts(run: &Run) {
    let pts: Vec<_> = run
        .samples
        .iter()
        .map(|s| s.buffer().unwrap().pts().expect("every buffer has a PTS"))
        .collect();
    assert!(pts.windows(2).all(|w| w[0] <= w[1]), "PTS go back: {pts:?}");
}

/// The first sample's format, size and frame rate (its colorimetry is
/// GStreamer's default for the format: sRGB for RGB, see
/// `formats::ring_video`).
fn caps_of(run: &Run) -> (String, i32, i32, gst::Fraction, Option<String>) {
    let caps = run.samples[0].caps().unwrap();
    let s = caps.structure(0).unwrap();
    (
        s.get::<String>("format").unwrap(),
        s.get::<i32>("width").unwrap(),
        s.get::<i32>("height").unwrap(),
        s.get::<gst::Fraction>("framerate").unwrap(),
        s.get::<String>("colorimetry").ok(),
    )
}

/// A lossless run of `name` through `cudainteropsrc ! appsink`: every
/// frame from 1 to FRAMES, every pixel, PTS in order, then EOS.
fn lossless_run(name: &str, producer: JoinHandle<Result<(), demo::ProducerError>>) -> Run {
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} delivery=lossless timeout=30000 ! appsink name=sink \
         sync=false"
    ));
    let run = run_to_end(&p);
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert!(matches!(run.end, End::Eos), "{:?}", run.end);
    let seen = check_pixels(&run);
    assert_eq!(
        seen,
        (1..=FRAMES).collect::<Vec<_>>(),
        "lossless: every frame, in order"
    );
    check_pts(&run);
    run
}

#[test]
fn rgba_buffer_ring_with_padded_rows_arrives_whole_in_default_rows() {
    init();
    let name = unique_name("src-rgba");
    // 16 bytes of padding after each row: a source that ignored the pitch
    // would shift the band.
    let producer = produce(&name, |o| o.row_pitch = u64::from(W) * 4 + 16);
    let run = lossless_run(&name, producer);
    assert_eq!(
        caps_of(&run),
        (
            "RGBA".into(),
            W as i32,
            H as i32,
            gst::Fraction::new(0, 1),
            Some("sRGB".into())
        )
    );
    // appsink takes no GstVideoMeta: the rows were copied tight.
    let buffer = run.samples[0].buffer().unwrap();
    assert!(buffer.meta::<gst_video::VideoMeta>().is_none());
    assert_eq!(buffer.size(), (W * H * 4) as usize);
    // OFFSET_END is the next frame's number.
    assert_eq!(buffer.offset_end(), buffer.offset() + 1);
}

#[test]
fn rgba_buffer_ring_goes_out_with_a_video_meta_where_downstream_takes_one() {
    init();
    let name = unique_name("src-meta");
    let pitch = u64::from(W) * 4 + 16;
    let producer = produce(&name, |o| o.row_pitch = pitch);
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} delivery=lossless timeout=30000 ! appsink name=sink \
         sync=false"
    ));
    // Downstream says it takes GstVideoMeta (appsink itself does not).
    let sinkpad = p.by_name("sink").unwrap().static_pad("sink").unwrap();
    sinkpad.add_probe(gst::PadProbeType::QUERY_DOWNSTREAM, |_, info| {
        if let Some(gst::PadProbeData::Query(query)) = &mut info.data {
            if let gst::QueryViewMut::Allocation(allocation) = query.view_mut() {
                allocation.add_allocation_meta::<gst_video::VideoMeta>(None);
            }
        }
        gst::PadProbeReturn::Ok
    });
    let run = run_to_end(&p);
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert!(matches!(run.end, End::Eos), "{:?}", run.end);
    assert_eq!(check_pixels(&run), (1..=FRAMES).collect::<Vec<_>>());
    let buffer = run.samples[0].buffer().unwrap();
    let meta = buffer
        .meta::<gst_video::VideoMeta>()
        .expect("the ring's rows as they are, described by a meta");
    assert_eq!(meta.stride()[0] as u64, pitch);
}

#[test]
fn a_flushing_seek_is_refused_and_the_stream_goes_on() {
    init();
    let name = unique_name("src-seek");
    let producer = produce(&name, |_| {});
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} delivery=lossless timeout=30000 ! appsink name=sink \
         sync=false"
    ));
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = refused.clone();
    let run = run_to_end_with(&p, move |p| {
        let seek = p.seek_simple(
            gst::SeekFlags::FLUSH | gst::SeekFlags::KEY_UNIT,
            gst::ClockTime::ZERO,
        );
        flag.store(seek.is_err(), std::sync::atomic::Ordering::SeqCst);
    });
    producer
        .join()
        .expect("the producer thread")
        .expect("the producer ran");
    assert!(
        refused.load(std::sync::atomic::Ordering::SeqCst),
        "a live source is not seekable"
    );
    assert!(matches!(run.end, End::Eos), "{:?}", run.end);
    assert_eq!(check_pixels(&run), (1..=FRAMES).collect::<Vec<_>>());
}

fn planar_ring(planar: Planar, format: &str) {
    init();
    let name = unique_name(&format!("src-{}", planar.name()));
    // Rows padded to a multiple of 8 bytes (GStreamer's default: 4).
    let pitch = (u64::from(W) * planar.sample_bytes()).next_multiple_of(8);
    let producer = produce(&name, |o| {
        o.planar = Some(planar);
        o.row_pitch = pitch;
    });
    let run = lossless_run(&name, producer);
    assert_eq!(
        caps_of(&run),
        (
            format.into(),
            W as i32,
            H as i32,
            gst::Fraction::new(0, 1),
            Some("bt601".into())
        )
    );
}

#[test]
fn nv12_buffer_ring_arrives_with_both_planes() {
    planar_ring(Planar::Nv12, "NV12");
}

#[test]
fn p010_buffer_ring_arrives_with_both_planes() {
    planar_ring(Planar::P010, "P010_10LE");
}

fn image_ring(format: demo::ImageFormat, caps_format: &str) {
    init();
    let name = unique_name(&format!("src-image-{format:?}"));
    let producer = produce(&name, |o| o.image = Some(format));
    let run = lossless_run(&name, producer);
    assert_eq!(
        caps_of(&run),
        (
            caps_format.into(),
            W as i32,
            H as i32,
            gst::Fraction::new(0, 1),
            Some("sRGB".into())
        )
    );
}

#[test]
fn rgba8_image_ring_arrives_whole() {
    image_ring(demo::ImageFormat::Rgba8, "RGBA");
}

#[test]
fn bgra8_image_ring_arrives_whole_as_bgra() {
    image_ring(demo::ImageFormat::Bgra8, "BGRA");
}

#[test]
fn a_ring_without_a_gstreamer_format_is_refused_naming_those_that_work() {
    init();
    let name = unique_name("src-rgba16f");
    let producer = produce(&name, |o| {
        o.image = Some(demo::ImageFormat::Rgba16f);
        // The refusal disconnects: the producer ends when its one receiver
        // left (or, had it left before subscribing, after its wait).
        o.wait_timeout = Duration::from_secs(5);
        o.frames = Some(1);
    });
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} timeout=30000 ! appsink name=sink sync=false"
    ));
    let run = run_to_end(&p);
    let End::Error(e) = run.end else {
        panic!("an RGBA16F ring must be refused, got {:?}", run.end)
    };
    assert!(e.contains("R16G16B16A16_SFLOAT"), "{e}");
    assert!(e.contains("no GStreamer video format"), "{e}");
    assert!(
        e.contains("NV12") && e.contains("RGB10A2_LE") && e.contains("BGRA"),
        "{e}"
    );
    // Whether it saw the receiver subscribe before it left is a race.
    let _ = producer.join().expect("the producer thread");
}

#[test]
fn a_sender_that_never_comes_is_an_error_within_the_timeout() {
    init();
    let name = unique_name("src-nobody");
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} timeout=300 ! appsink name=sink sync=false"
    ));
    let run = run_to_end(&p);
    let End::Error(e) = run.end else {
        panic!("no sender: an error, got {:?}", run.end)
    };
    assert!(e.contains(&name) && e.contains("cannot connect"), "{e}");
}

/// Presents frame `slot.sequence()` of the demo pattern in `slot` (a
/// buffer of `size` bytes holding unpadded rows of `W` x `H` RGBA8) at
/// `timestamp`; the frame's number.
fn present_demo(
    slot: cuda_interop_frames::sender::WriteSlot<'_, vk_export::markers::HostVisible>,
    size: u64,
    timestamp: u64,
) -> u64 {
    let f = slot.sequence();
    slot.present_with(timestamp, |device, cmd, buffer| {
        // SAFETY: the sender's recording command buffer and the slot's
        // buffer of `size` bytes (transfer usage), alive past the
        // submission's wait; unpadded rows inside it.
        unsafe {
            demo::record_demo_pattern(
                device,
                cmd,
                buffer,
                size,
                (u64::from(W) * 4, H, u64::from(W) * 4),
                f,
            )
        }
    })
    .expect("present");
    f
}

/// A latest receiver that misses a frame (the sender presents two while
/// the source is held inside a push, a probe holding it: no timing) marks
/// the next buffer DISCONT, counts the frame in `frames-dropped` and posts
/// a QoS message with the counts.
#[test]
fn a_gap_in_latest_delivery_is_discont_frames_dropped_and_qos() {
    use std::sync::{mpsc, Mutex};

    use cuda_interop_frames::sender::{monotonic_ns, Address, Sender, SenderOptions};
    use vk_export::markers::HostVisible;
    use vk_export::{Context, HeadlessOptions};

    init();
    let name = unique_name("src-gap");
    let ctx = Context::headless(&HeadlessOptions::default()).expect("lavapipe");
    let mut opts = SenderOptions::new(Address::named(&name).unwrap(), W, H, 3);
    opts.semaphores = false;
    let mut sender = Sender::<HostVisible>::new(&ctx, opts).expect("the sender");
    let size = sender.buffers()[0].size();
    let p = pipeline(&format!(
        "cudainteropsrc name=src sender-name={name} delivery=latest timeout=30000 ! appsink \
         name=sink sync=false"
    ));
    let appsink = p
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    let src = p.by_name("src").unwrap();
    // Frame 2's push waits here until the test says go.
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (held_tx, go_rx) = (Mutex::new(held_tx), Mutex::new(go_rx));
    src.static_pad("src")
        .unwrap()
        .add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            if let Some(gst::PadProbeData::Buffer(buffer)) = &info.data {
                if buffer.offset() == 2 {
                    let _ = held_tx.lock().unwrap().send(());
                    let _ = go_rx.lock().unwrap().recv_timeout(BOUND);
                }
            }
            gst::PadProbeReturn::Ok
        });
    let starting = {
        let p = p.clone();
        std::thread::spawn(move || p.set_state(gst::State::Playing).map(drop))
    };
    assert!(
        sender.wait_for_receivers(1, BOUND),
        "the source never subscribed"
    );
    starting.join().unwrap().expect("the pipeline starts");
    let present = |sender: &mut Sender<HostVisible>| {
        let slot = sender
            .acquire(Duration::from_secs(5))
            .expect("a free slot (the source holds none)");
        present_demo(slot, size, monotonic_ns());
    };
    let start = std::time::Instant::now();
    let mut samples = Vec::new();
    // Pulls samples, serving the sender, until one of frame `f` came.
    let pull_until = |sender: &mut Sender<HostVisible>, f: u64, samples: &mut Vec<gst::Sample>| {
        while samples
            .last()
            .is_none_or(|s: &gst::Sample| s.buffer().unwrap().offset() < f)
        {
            assert!(start.elapsed() < BOUND, "frame {f} never came");
            sender.serve(Duration::from_millis(1));
            if let Some(sample) = appsink.try_pull_sample(gst::ClockTime::from_mseconds(5)) {
                samples.push(sample);
            }
        }
    };
    present(&mut sender);
    pull_until(&mut sender, 1, &mut samples);
    present(&mut sender);
    // The source is inside frame 2's push: it asks for nothing.
    while held_rx.try_recv().is_err() {
        assert!(start.elapsed() < BOUND, "frame 2 never reached the probe");
        sender.serve(Duration::from_millis(1));
    }
    present(&mut sender); // 3: never asked for
    present(&mut sender); // 4: the newest when the source asks again
    go_tx.send(()).unwrap();
    pull_until(&mut sender, 4, &mut samples);
    let offsets: Vec<u64> = samples
        .iter()
        .map(|s| s.buffer().unwrap().offset())
        .collect();
    assert_eq!(offsets, [1, 2, 4]);
    let discont: Vec<bool> = samples
        .iter()
        .map(|s| {
            s.buffer()
                .unwrap()
                .flags()
                .contains(gst::BufferFlags::DISCONT)
        })
        .collect();
    // The first buffer of a stream is DISCONT anyway (GstBaseSrc).
    assert_eq!(discont[1..], [false, true], "DISCONT after the gap only");
    assert_eq!(src.property::<u64>("frames-dropped"), 1);
    assert_eq!(src.property::<u64>("frames-received"), 3);
    let qos = p
        .bus()
        .unwrap()
        .iter_filtered(&[gst::MessageType::Qos])
        .filter_map(|m| match m.view() {
            gst::MessageView::Qos(q) => {
                let (processed, dropped) = q.stats();
                Some((processed.value(), dropped.value()))
            }
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(
        qos,
        [(3, 1)],
        "one QoS message: 3 buffers received, 1 dropped"
    );
    for sample in &samples {
        let f = sample.buffer().unwrap().offset();
        for (_, y, row) in rows(sample) {
            assert!(demo::check_demo_row(&row, f, y, H), "frame {f} row {y}");
        }
    }
    drop(sender);
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

/// A sender's timestamps are claims: frames stamped an hour ahead and with
/// `u64::MAX` (GStreamer's NONE) get a PTS no later than the pipeline's
/// running time when they arrive, so they hold nothing back and panic
/// nothing; an honest frame after them keeps its own, later or equal, PTS.
/// The twin, honest timestamps passing through exactly, is the sink's
/// `src_to_sink_round_trip_keeps_pixels_and_timestamps`.
#[test]
fn timestamps_from_the_future_or_none_are_clamped_to_now() {
    use cuda_interop_frames::sender::{monotonic_ns, Address, Sender, SenderOptions};
    use vk_export::markers::HostVisible;
    use vk_export::{Context, HeadlessOptions};

    init();
    let name = unique_name("src-future");
    let ctx = Context::headless(&HeadlessOptions::default()).expect("lavapipe");
    let mut opts = SenderOptions::new(Address::named(&name).unwrap(), W, H, 3);
    opts.semaphores = false;
    let mut sender = Sender::<HostVisible>::new(&ctx, opts).expect("the sender");
    let size = sender.buffers()[0].size();
    let p = pipeline(&format!(
        "cudainteropsrc sender-name={name} delivery=lossless timeout=30000 ! appsink \
         name=sink sync=false"
    ));
    let appsink = p
        .by_name("sink")
        .unwrap()
        .downcast::<gst_app::AppSink>()
        .unwrap();
    let starting = {
        let p = p.clone();
        std::thread::spawn(move || p.set_state(gst::State::Playing).map(drop))
    };
    assert!(
        sender.wait_for_receivers(1, BOUND),
        "the source never subscribed"
    );
    starting.join().unwrap().expect("the pipeline starts");
    let hour = 3_600_000_000_000u64;
    let start = std::time::Instant::now();
    let mut pts = Vec::new();
    for stamp in [monotonic_ns() + hour, u64::MAX, monotonic_ns()] {
        let slot = sender.acquire(BOUND).expect("a free slot");
        let f = present_demo(slot, size, stamp);
        let sample = loop {
            assert!(start.elapsed() < BOUND, "frame {f} never came");
            sender.serve(Duration::from_millis(1));
            if let Some(sample) = appsink.try_pull_sample(gst::ClockTime::from_mseconds(5)) {
                break sample;
            }
        };
        let running = p.current_running_time().expect("a running time");
        let at = sample.buffer().unwrap().pts().expect("a PTS");
        assert!(
            at <= running,
            "frame {f}: PTS {at} after the running time {running}"
        );
        pts.push(at);
    }
    assert!(pts.windows(2).all(|w| w[0] <= w[1]), "{pts:?}");
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

/// `zero-copy` with a host-visible ring in system memory: each buffer is
/// the slot itself in the receiver's mapping (counted in
/// `zero-copy-buffers`), the frame held until the buffer is freed (the
/// appsink here keeps one at a time), every pixel of every frame as sent;
/// the twin, without `zero-copy`, copies each frame (none counted). An
/// NV12 ring whose last chroma row ends before GStreamer's stride does (a
/// width of 2 mod 4: the caps' size is 2 bytes past the frame's) is copied
/// with `zero-copy` too, so that every buffer maps as video.
#[test]
fn zero_copy_hands_out_a_host_visible_slot_itself() {
    init();
    let nv12_pitch = u64::from(W).next_multiple_of(4);
    for (planar, zero_copy, wrapped) in [
        (None, true, true),
        (None, false, false),
        (Some(Planar::Nv12), true, false),
    ] {
        let tag = format!("{}-{zero_copy}", planar.map_or("rgba", |p| p.name()));
        let name = unique_name(&format!("src-zero-copy-{tag}"));
        // Rows at GStreamer's default stride: RGBA goes out as the slot.
        let producer = produce(&name, |o| {
            if let Some(p) = planar {
                o.planar = Some(p);
                o.row_pitch = nv12_pitch;
            }
        });
        let p = pipeline(&format!(
            "cudainteropsrc name=src sender-name={name} delivery=lossless zero-copy={zero_copy} \
             timeout=30000 ! appsink name=sink sync=false max-buffers=1"
        ));
        let src = p.by_name("src").unwrap();
        let sink = p
            .by_name("sink")
            .unwrap()
            .downcast::<gst_app::AppSink>()
            .unwrap();
        p.set_state(gst::State::Playing).unwrap();
        let mut seen = Vec::new();
        while let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_seconds(30)) {
            let f = sample.buffer().unwrap().offset();
            // `rows` maps the buffer as its caps' video: a short buffer
            // fails here.
            for (plane, y, row) in rows(&sample) {
                let pattern_row = if plane == 0 { y } else { H };
                assert!(
                    demo::check_demo_row(&row, f, pattern_row, H),
                    "{tag}: frame {f} plane {plane} row {y} is not the frame's"
                );
            }
            seen.push(f);
            // Dropped: the frame goes back to the sender.
        }
        assert!(sink.is_eos(), "{tag}: no EOS within the bound");
        let in_slot = src.property::<u64>("zero-copy-buffers");
        p.set_state(gst::State::Null).unwrap();
        producer
            .join()
            .expect("the producer thread")
            .expect("the producer ran");
        assert_eq!(seen, (1..=FRAMES).collect::<Vec<_>>(), "{tag}");
        assert_eq!(
            in_slot,
            if wrapped { FRAMES } else { 0 },
            "{tag}: buffers that were the slot itself"
        );
    }
}
