//! `cudainteropsink` on lavapipe: buffers pushed by `appsrc` (rows at a
//! padded stride described by a `GstVideoMeta`, so that a sink that
//! assumed GStreamer's default stride would garble them) are read back by
//! a lossless `HostReceiver` of the sink's name and compared byte for
//! byte, RGBA and NV12, with their timestamps; a name a live sender holds
//! is an error on the bus; stopping the pipeline removes the name; and
//! `cudainteropsrc ! cudainteropsink` carries every pixel and timestamp of
//! a sender to a receiver of the sink.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::{list_senders, Directory};
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::{Delivery, RingLayout};
use cuda_interop_frames::sender::{monotonic_ns, Address, Sender, SenderOptions};
use gst::prelude::*;
use vk_export::markers::HostVisible;
use vk_export::{Context, HeadlessOptions};

#[path = "../../cuda-interop-frames/examples/common/demo.rs"]
mod demo;

mod common;
use common::{bus_error, init, one_buffer_into_sink, pipeline, unique_name, BOUND};

const W: u32 = 66;
const H: u32 = 40;
const FRAMES: u64 = 8;
/// The receivers' bound on each call.
const WAIT: Duration = Duration::from_secs(30);

/// A frame as a GStreamer buffer: planes at `offsets`, rows `stride`
/// bytes apart, every `u32` of row `y` of plane 0 the demo pattern of
/// frame `f` (a chroma row: the background), padding bytes 0xee.
fn frame_buffer(
    format: gst_video::VideoFormat,
    f: u64,
    stride: usize,
    pts: gst::ClockTime,
) -> (gst::Buffer, Vec<Vec<u8>>) {
    let row_bytes = match format {
        gst_video::VideoFormat::Rgba => W as usize * 4,
        _ => W as usize,
    };
    let planes: Vec<u32> = match format {
        gst_video::VideoFormat::Nv12 => vec![H, H / 2],
        _ => vec![H],
    };
    let mut bytes = Vec::new();
    let mut offsets = Vec::new();
    let mut rows = Vec::new();
    for (plane, &n) in planes.iter().enumerate() {
        offsets.push(bytes.len());
        for y in 0..n {
            let (start, end) = demo::band_rows(f, H);
            let in_band = plane == 0 && (start..end).contains(&y);
            let word = if in_band {
                demo::band_value(f)
            } else {
                demo::background(f)
            };
            let mut row: Vec<u8> = word
                .to_le_bytes()
                .into_iter()
                .cycle()
                .take(row_bytes)
                .collect();
            rows.push(row.clone());
            row.resize(stride, 0xee);
            bytes.extend_from_slice(&row);
        }
    }
    let strides = vec![stride as i32; planes.len()];
    let mut buffer = gst::Buffer::from_mut_slice(bytes);
    {
        let b = buffer.get_mut().unwrap();
        b.set_pts(pts);
        gst_video::VideoMeta::add_full(
            b,
            gst_video::VideoFrameFlags::empty(),
            format,
            W,
            H,
            &offsets,
            &strides,
        )
        .unwrap();
    }
    (buffer, rows)
}

/// The rows of a received frame of `layout` (plane 0, then the chroma
/// plane), each `row_bytes` long.
fn ring_rows(layout: &RingLayout, bytes: &[u8]) -> Vec<Vec<u8>> {
    let pitch = layout.row_pitch as usize;
    let row_bytes = (u64::from(layout.width) * layout.texel_bytes()) as usize;
    let mut rows = Vec::new();
    for y in 0..layout.height as usize {
        rows.push(bytes[y * pitch..y * pitch + row_bytes].to_vec());
    }
    if let Some((_, chroma)) = layout.planar_format() {
        for y in 0..layout.height as usize / 2 {
            let at = chroma as usize + y * pitch;
            rows.push(bytes[at..at + row_bytes].to_vec());
        }
    }
    rows
}

fn appsrc_to_receiver(format: gst_video::VideoFormat, caps_format: &str, padded: bool) {
    init();
    let name = unique_name(&format!("sink-{caps_format}-{padded}"));
    let p = pipeline(&format!(
        "appsrc name=src format=time caps=video/x-raw,format={caps_format},width={W},height={H},\
         framerate=30/1 ! cudainteropsink sender-name={name} sync=false timeout=30000"
    ));
    let appsrc = p
        .by_name("src")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    let bus = p.bus().unwrap();
    p.set_state(gst::State::Playing)
        .expect("the pipeline starts");
    let row_bytes = if caps_format == "RGBA" { W * 4 } else { W } as usize;
    // Padded rows (12 bytes past GStreamer's default stride): packed into
    // the ring's layout; else the ring's own layout (its pitch is the
    // row's bytes): the buffer goes in as it is.
    let stride = if padded {
        row_bytes.next_multiple_of(4) + 12
    } else {
        row_bytes
    };
    let pts = |f: u64| gst::ClockTime::from_mseconds(33 * f);
    // The first buffer makes the sender (at its caps); receivers connect
    // to it from then on.
    let mut pushed = Vec::new();
    let (buffer, rows) = frame_buffer(format, 1, stride, pts(1));
    pushed.push(rows);
    appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
    let rx = HostReceiver::connect_named(&name, Delivery::Lossless, WAIT)
        .unwrap_or_else(|e| panic!("connect to {name}: {e}"));
    let layout = *rx.session().layout();
    let base = p.base_time().expect("a playing pipeline has a base time");
    for f in 2..=FRAMES {
        let (buffer, rows) = frame_buffer(format, f, stride, pts(f));
        pushed.push(rows);
        appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
    }
    appsrc.end_of_stream().expect("appsrc takes EOS");
    // Frame 1 may have gone before this receiver subscribed; every frame
    // after it comes.
    let mut seen = Vec::new();
    let start = Instant::now();
    while seen.last() != Some(&FRAMES) {
        assert!(start.elapsed() < BOUND, "frames stopped: {seen:?}");
        if let Some(e) = bus_error(&bus, Duration::ZERO) {
            panic!("the pipeline failed: {e}");
        }
        let frame = rx.next(WAIT).expect("a frame");
        let f = frame.sequence();
        let bytes = rx.read(&frame, WAIT).expect("the frame's bytes");
        assert_eq!(
            ring_rows(&layout, &bytes),
            pushed[f as usize - 1],
            "frame {f}: every row as pushed"
        );
        assert_eq!(
            frame.timestamp_ns(),
            (base + pts(f)).nseconds(),
            "frame {f}: stamped with its running time on CLOCK_MONOTONIC"
        );
        rx.release(frame).expect("release");
        seen.push(f);
    }
    assert!(
        seen.ends_with(&(2..=FRAMES).collect::<Vec<_>>()),
        "{seen:?}"
    );
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

#[test]
fn rgba_buffers_arrive_byte_for_byte_at_their_running_time() {
    appsrc_to_receiver(gst_video::VideoFormat::Rgba, "RGBA", true);
}

#[test]
fn rgba_buffers_in_the_rings_layout_arrive_byte_for_byte() {
    appsrc_to_receiver(gst_video::VideoFormat::Rgba, "RGBA", false);
}

#[test]
fn nv12_buffers_arrive_byte_for_byte_in_both_planes() {
    appsrc_to_receiver(gst_video::VideoFormat::Nv12, "NV12", true);
}

#[test]
fn nv12_buffers_in_the_rings_layout_arrive_byte_for_byte() {
    appsrc_to_receiver(gst_video::VideoFormat::Nv12, "NV12", false);
}

#[test]
fn a_name_a_live_sender_holds_is_an_error_on_the_bus() {
    init();
    let name = unique_name("sink-taken");
    let ctx = Context::headless(&HeadlessOptions::default()).expect("lavapipe");
    let mut opts = SenderOptions::new(Address::named(&name).unwrap(), 16, 16, 2);
    opts.semaphores = false;
    let holder = Sender::<HostVisible>::new(&ctx, opts).expect("the first sender of the name");
    let p = pipeline(&format!(
        "videotestsrc num-buffers=3 ! video/x-raw,format=RGBA,width=32,height=16 ! \
         cudainteropsink sender-name={name}"
    ));
    let bus = p.bus().unwrap();
    let _ = p.set_state(gst::State::Playing);
    let e = bus_error(&bus, BOUND).expect("an error on the bus");
    p.set_state(gst::State::Null).expect("the pipeline stops");
    assert!(e.contains(&name) && e.contains("sender-name="), "{e}");
    // The holder keeps its name.
    assert!(list_senders().unwrap().iter().any(|s| s.name == name));
    drop(holder);
}

#[test]
fn stopping_the_pipeline_removes_the_name() {
    init();
    let name = unique_name("sink-stop");
    let p = pipeline(&format!(
        "videotestsrc num-buffers=3 ! video/x-raw,format=RGBA,width=32,height=16 ! \
         cudainteropsink sender-name={name} sync=false"
    ));
    let bus = p.bus().unwrap();
    p.set_state(gst::State::Playing)
        .expect("the pipeline starts");
    Directory::from_env()
        .unwrap()
        .wait_for(&name, BOUND)
        .unwrap_or_else(|e| panic!("the sink's name never appeared: {e}"));
    let eos = bus.timed_pop_filtered(
        gst::ClockTime::from_seconds(BOUND.as_secs()),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    assert!(
        matches!(
            eos.as_ref().map(|m| m.view()),
            Some(gst::MessageView::Eos(_))
        ),
        "{eos:?}"
    );
    // After EOS the sender is still there (until the pipeline stops).
    assert!(list_senders().unwrap().iter().any(|s| s.name == name));
    p.set_state(gst::State::Null).expect("the pipeline stops");
    assert!(
        !list_senders().unwrap().iter().any(|s| s.name == name),
        "the name outlived the pipeline"
    );
}

/// `cudainteropsrc name=a ! cudainteropsink name=b`: a sender `a` of
/// the test presents the demo pattern; a receiver of `b` gets every frame
/// with every pixel, and its timestamps are `a`'s.
#[test]
fn src_to_sink_round_trip_keeps_pixels_and_timestamps() {
    init();
    let (a, b) = (unique_name("trip-a"), unique_name("trip-b"));
    let ctx = Context::headless(&HeadlessOptions::default()).expect("lavapipe");
    let pitch = u64::from(W) * 4 + 8;
    let mut opts = SenderOptions::new(Address::named(&a).unwrap(), W, H, 3);
    opts.row_pitch = pitch;
    opts.semaphores = false;
    let mut sender = Sender::<HostVisible>::new(&ctx, opts).expect("sender a");
    let size = sender.buffers()[0].size();
    // The element names are the sender names (no sender-name property).
    let p = pipeline(&format!(
        "cudainteropsrc name={a} delivery=lossless timeout=30000 ! cudainteropsink name={b} \
         sync=false timeout=30000"
    ));
    let bus = p.bus().unwrap();
    // The source connects in its start, which needs `a` served: from here.
    let starting = {
        let p = p.clone();
        std::thread::spawn(move || p.set_state(gst::State::Playing).map(drop))
    };
    assert!(
        sender.wait_for_receivers(1, BOUND),
        "the source never subscribed"
    );
    starting
        .join()
        .expect("the thread that starts the pipeline")
        .expect("the pipeline starts");
    let present = |sender: &mut Sender<HostVisible>| -> (u64, u64) {
        let start = Instant::now();
        loop {
            assert!(start.elapsed() < BOUND, "no slot of a freed");
            if let Ok(slot) = sender.acquire(Duration::from_millis(100)) {
                let f = slot.sequence();
                let ts = monotonic_ns();
                slot.present_with(ts, |device, cmd, buffer| {
                    // SAFETY: the sender's recording command buffer and the
                    // slot's buffer of `size` bytes (transfer usage), alive
                    // past the submission's wait; a checked layout, so the
                    // band lies inside it.
                    unsafe {
                        demo::record_demo_pattern(
                            device,
                            cmd,
                            buffer,
                            size,
                            (u64::from(W) * 4, H, pitch),
                            f,
                        )
                    }
                })
                .expect("present");
                return (f, ts);
            }
        }
    };
    // Frame 1 makes b (at its caps). b may present it before or after this
    // receiver subscribes: it is taken, and checked, if it comes.
    let mut sent = std::collections::HashMap::new();
    let (f1, ts1) = present(&mut sender);
    sent.insert(f1, ts1);
    let rx = HostReceiver::connect_named(&b, Delivery::Lossless, WAIT)
        .unwrap_or_else(|e| panic!("connect to {b}: {e}"));
    let layout = *rx.session().layout();
    assert_eq!((layout.width, layout.height), (W, H));
    for _ in 2..=FRAMES {
        let (f, ts) = present(&mut sender);
        sent.insert(f, ts);
        let start = Instant::now();
        let mut frame = loop {
            assert!(start.elapsed() < BOUND, "frame {f} never came through b");
            if let Some(e) = bus_error(&bus, Duration::ZERO) {
                panic!("the pipeline failed: {e}");
            }
            // Serve a's source (its releases) while b's frame comes.
            sender.serve(Duration::from_millis(1));
            match rx.next(Duration::from_millis(50)) {
                Ok(frame) => break frame,
                Err(e) if !e.is_disconnected() => continue,
                Err(e) => panic!("b dropped the receiver: {e}"),
            }
        };
        // b's frame 1 was a's frame 1, and so on: an earlier one (frame 1,
        // presented after this receiver subscribed) comes first, whole.
        loop {
            let g = frame.sequence();
            assert!(g <= f, "b's frame {g} before a presented it");
            assert_eq!(
                Some(&frame.timestamp_ns()),
                sent.get(&g),
                "frame {g}: a's timestamp"
            );
            let bytes = rx.read(&frame, WAIT).expect("the frame's bytes");
            for (y, row) in ring_rows(&layout, &bytes).iter().enumerate() {
                assert!(
                    demo::check_demo_row(row, g, y as u32, H),
                    "frame {g}: row {y} is not the frame's"
                );
            }
            rx.release(frame).expect("release");
            if g == f {
                break;
            }
            let start = Instant::now();
            frame = loop {
                assert!(start.elapsed() < BOUND, "frame {f} never came through b");
                sender.serve(Duration::from_millis(1));
                match rx.next(Duration::from_millis(50)) {
                    Ok(frame) => break frame,
                    Err(e) if !e.is_disconnected() => continue,
                    Err(e) => panic!("b dropped the receiver: {e}"),
                }
            };
        }
    }
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

/// A buffer whose `GstVideoMeta` puts its rows past the buffer (a stride of
/// 16 MiB on a buffer of 40 rows of 276 bytes, and a negative stride):
/// GStreamer maps it as video anyway (it checks only the planes' offsets),
/// so the sink checks every plane's extent first and posts an error naming
/// the plane, never reading past the buffer. The twin, rows inside the
/// buffer at a padded stride, is `rgba_buffers_arrive_byte_for_byte_at_their_running_time`.
#[test]
fn a_video_meta_whose_rows_lie_past_the_buffer_is_an_error_not_a_read() {
    init();
    for stride in [1i32 << 24, -276] {
        let name = unique_name("sink-meta");
        let p = pipeline(&format!(
            "appsrc name=src format=time caps=video/x-raw,format=RGBA,width={W},height={H},\
             framerate=30/1 ! cudainteropsink sender-name={name} sync=false"
        ));
        let appsrc = p
            .by_name("src")
            .unwrap()
            .downcast::<gst_app::AppSrc>()
            .unwrap();
        let bus = p.bus().unwrap();
        p.set_state(gst::State::Playing)
            .expect("the pipeline starts");
        let row_bytes = W as usize * 4 + 12;
        let mut buffer = gst::Buffer::from_mut_slice(vec![0u8; row_bytes * H as usize]);
        {
            let b = buffer.get_mut().unwrap();
            b.set_pts(gst::ClockTime::ZERO);
            gst_video::VideoMeta::add_full(
                b,
                gst_video::VideoFrameFlags::empty(),
                gst_video::VideoFormat::Rgba,
                W,
                H,
                &[0],
                &[stride],
            )
            .unwrap();
        }
        let _ = appsrc.push_buffer(buffer);
        let e = bus_error(&bus, BOUND).expect("an error on the bus");
        p.set_state(gst::State::Null).expect("the pipeline stops");
        assert!(
            e.contains("plane 0") && e.contains("past the buffer's"),
            "stride {stride}: {e}"
        );
    }
}

/// `timeout` is bounded at a minute (a lossless receiver holding a slot
/// longer is dropped by the sender's hold timeout first).
#[test]
fn the_slot_timeout_is_bounded_at_a_minute() {
    init();
    let sink = gst::ElementFactory::make("cudainteropsink")
        .build()
        .unwrap();
    let spec = sink
        .find_property("timeout")
        .unwrap()
        .downcast::<gst::glib::ParamSpecUInt>()
        .unwrap();
    assert_eq!(spec.maximum(), 60_000);
    sink.set_property("timeout", 60_000u32);
    assert_eq!(sink.property::<u32>("timeout"), 60_000);
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sink.set_property("timeout", 60_001u32)
    }));
    assert!(refused.is_err(), "60001 ms taken");
    assert_eq!(sink.property::<u32>("timeout"), 60_000);
}

/// A buffer waiting for a slot (a lossless receiver that reads nothing
/// holds the ring full, `timeout` 30 s) is given up when the pipeline
/// stops (`unlock`): dropped and counted, not presented once the sender's
/// hold timeout frees a slot.
#[test]
fn stopping_interrupts_a_buffer_waiting_for_a_slot() {
    init();
    let name = unique_name("sink-unlock");
    let p = pipeline(&format!(
        "appsrc name=feed format=time caps=video/x-raw,format=RGBA,width=16,height=16,\
         framerate=0/1 ! cudainteropsink name=sink sender-name={name} sync=false timeout=30000"
    ));
    let feed = p
        .by_name("feed")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    let sink = p.by_name("sink").unwrap();
    p.set_state(gst::State::Playing).unwrap();
    let push = |f: u64| {
        let mut buffer = gst::Buffer::with_size(16 * 16 * 4).unwrap();
        buffer
            .get_mut()
            .unwrap()
            .set_pts(gst::ClockTime::from_mseconds(f));
        feed.push_buffer(buffer).expect("appsrc takes a buffer");
    };
    push(0);
    // A lossless receiver that never takes a frame: the ring fills.
    let rx = HostReceiver::connect_named(&name, Delivery::Lossless, WAIT).unwrap();
    for f in 1..12 {
        push(f);
    }
    let start = Instant::now();
    while sink.property::<u64>("frames-presented") < 4 {
        assert!(start.elapsed() < BOUND, "the ring never filled");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let skipped_before = sink.property::<u64>("frames-skipped");
    p.set_state(gst::State::Null).unwrap();
    let skipped = sink.property::<u64>("frames-skipped");
    drop(rx);
    assert!(
        skipped > skipped_before,
        "the waiting buffer was presented, not given up ({skipped_before} -> {skipped} skipped)"
    );
}

/// A ring's frame has no fields: interlaced video is an error that says to
/// deinterlace, progressive (also caps without `interlace-mode`) is taken.
#[test]
fn interlaced_video_is_refused_at_negotiation() {
    init();
    for (mode, refused) in [("interleaved", true), ("progressive", false)] {
        let name = unique_name(&format!("sink-{mode}"));
        let error = one_buffer_into_sink(
            &format!(
                "video/x-raw,format=RGBA,width=16,height=16,framerate=0/1,interlace-mode={mode}"
            ),
            &name,
            16 * 16 * 4,
        );
        match (refused, error) {
            (true, Some(why)) => assert!(why.contains("deinterlace"), "{mode}: {why}"),
            (false, None) => {}
            (r, e) => panic!("{mode}: refused {r} expected, got {e:?}"),
        }
    }
}

/// The buffer pool the sink offers upstream (its allocation answer in
/// system memory): a buffer of it is a ring slot, the element before the
/// sink writes the frame into it, and the sink presents it without a copy
/// (`frames-in-place` counts those), every row as written. Its twin: a
/// pool buffer that something else still holds is copied into a free slot
/// instead (still exact, not counted). Pool buffers dropped unpushed give
/// their slots back: more of them than the ring has slots, and frames
/// after are still written in place.
#[test]
fn buffers_from_the_sinks_pool_are_presented_in_place() {
    init();
    let name = unique_name("sink-pool");
    let caps = format!("video/x-raw,format=RGBA,width={W},height={H},framerate=30/1");
    let p = pipeline(&format!(
        "appsrc name=src format=time caps={caps} ! cudainteropsink name=sink \
         sender-name={name} sync=false timeout=30000"
    ));
    let appsrc = p
        .by_name("src")
        .unwrap()
        .downcast::<gst_app::AppSrc>()
        .unwrap();
    let sink = p.by_name("sink").unwrap();
    let bus = p.bus().unwrap();
    p.set_state(gst::State::Playing)
        .expect("the pipeline starts");
    let pts = |f: u64| gst::ClockTime::from_mseconds(33 * f);
    let row_bytes = W as usize * 4;
    // Frame 1, a buffer of appsrc's own: makes the ring at its caps.
    let (first, _) = frame_buffer(gst_video::VideoFormat::Rgba, 1, row_bytes, pts(1));
    appsrc.push_buffer(first).expect("appsrc takes a buffer");
    let rx = HostReceiver::connect_named(&name, Delivery::Lossless, WAIT)
        .unwrap_or_else(|e| panic!("connect to {name}: {e}"));
    let layout = *rx.session().layout();

    // The pool, as an element before the sink asks for it.
    let caps = caps.parse::<gst::Caps>().unwrap();
    let mut query = gst::query::Allocation::new(Some(&caps), true);
    assert!(appsrc.static_pad("src").unwrap().peer_query(&mut query));
    let (pool, size, _, _) = query
        .allocation_pools()
        .next()
        .expect("the sink offers a pool for its ring's caps");
    let pool = pool.expect("a pool, not only a size");
    let mut config = pool.config();
    config.set_params(Some(&caps), size, 0, 0);
    pool.set_config(config).unwrap();
    pool.set_active(true).unwrap();
    // A frame written into a buffer of the pool, as a depayloader writes.
    let pool_frame = |f: u64| {
        let (plain, rows) = frame_buffer(gst_video::VideoFormat::Rgba, f, row_bytes, pts(f));
        let mut buffer = pool.acquire_buffer(None).expect("a buffer of the pool");
        {
            let b = buffer.get_mut().unwrap();
            b.copy_from_slice(0, &plain.map_readable().unwrap())
                .unwrap();
            b.set_pts(pts(f));
        }
        (buffer, rows)
    };

    let expect_frame = |f: u64, rows: &[Vec<u8>]| {
        let start = Instant::now();
        loop {
            assert!(start.elapsed() < BOUND, "frame {f} never came");
            if let Some(e) = bus_error(&bus, Duration::ZERO) {
                panic!("the pipeline failed: {e}");
            }
            let frame = rx.next(WAIT).expect("a frame");
            let got = frame.sequence();
            let bytes = rx.read(&frame, WAIT).expect("the frame's bytes");
            rx.release(frame).expect("release");
            // Frame 1 may have gone before the receiver subscribed.
            if got == 1 && f > 1 {
                continue;
            }
            assert_eq!(got, f);
            assert_eq!(ring_rows(&layout, &bytes), rows, "frame {f}: every row");
            return;
        }
    };
    let in_place = || sink.property::<u64>("frames-in-place");

    // Frames 2..=5: written in place, one at a time (each read and
    // released before the next is written: the ring always has a slot to
    // lend).
    for f in 2..=5 {
        let (buffer, rows) = pool_frame(f);
        appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
        expect_frame(f, &rows);
    }
    assert_eq!(in_place(), 4, "frames 2..=5 were presented in place");

    // The twin: a pool buffer still held elsewhere (a tee's other branch,
    // a last sample) is copied, the same bytes arriving.
    let (buffer, rows) = pool_frame(6);
    let held = buffer.clone();
    appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
    expect_frame(6, &rows);
    assert_eq!(
        in_place(),
        4,
        "a shared pool buffer was not presented in place"
    );
    drop(held);
    // Nor one whose memory someone kept a reference to (it could map the
    // memory again after the present).
    let (buffer, rows) = pool_frame(7);
    let kept = buffer.memory(0).unwrap();
    appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
    expect_frame(7, &rows);
    assert_eq!(
        in_place(),
        4,
        "a pool buffer whose memory is referenced elsewhere was not presented in place"
    );
    drop(kept);

    // Pool buffers dropped unpushed, more than the ring's slots: each gives
    // its slot back, so frames after them are still lent slots.
    for _ in 0..10 {
        drop(pool.acquire_buffer(None).unwrap());
    }
    for f in 8..=9 {
        let (buffer, rows) = pool_frame(f);
        appsrc.push_buffer(buffer).expect("appsrc takes a buffer");
        expect_frame(f, &rows);
    }
    assert_eq!(in_place(), 6, "slots of dropped pool buffers came back");
    assert_eq!(sink.property::<u64>("frames-presented"), 9);
    appsrc.end_of_stream().unwrap();
    pool.set_active(false).unwrap();
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

/// A queue before the sink holds pool buffers: the pool lends only while
/// two slots stay unlent, so the plain buffers it hands out after that are
/// copied into those, and no frame is skipped (with no receiver, no slot
/// is ever held; the twin is the same pipeline with the pool refused).
#[test]
fn a_queue_before_the_sink_skips_no_frame() {
    init();
    for refuse_pool in [false, true] {
        let name = unique_name(&format!("sink-queue-{refuse_pool}"));
        let refuse = if refuse_pool {
            "identity drop-allocation=true ! "
        } else {
            ""
        };
        let p = pipeline(&format!(
            "videotestsrc num-buffers=60 ! video/x-raw,format=RGBA,width=64,height=48,\
             framerate=60/1 ! queue ! {refuse}cudainteropsink name=sink sender-name={name} \
             sync=false"
        ));
        let sink = p.by_name("sink").unwrap();
        let bus = p.bus().unwrap();
        p.set_state(gst::State::Playing).unwrap();
        let msg = bus
            .timed_pop_filtered(
                gst::ClockTime::from_seconds(BOUND.as_secs()),
                &[gst::MessageType::Eos, gst::MessageType::Error],
            )
            .expect("the pipeline ends within the bound");
        assert!(
            matches!(msg.view(), gst::MessageView::Eos(_)),
            "the pipeline failed: {msg:?}"
        );
        let (presented, skipped, in_place) = (
            sink.property::<u64>("frames-presented"),
            sink.property::<u64>("frames-skipped"),
            sink.property::<u64>("frames-in-place"),
        );
        p.set_state(gst::State::Null).unwrap();
        assert_eq!(
            (presented, skipped),
            (60, 0),
            "pool refused: {refuse_pool}; {in_place} in place"
        );
        if refuse_pool {
            assert_eq!(in_place, 0);
        } else {
            assert!(in_place > 0, "the queue's buffers came from the pool");
        }
    }
}
