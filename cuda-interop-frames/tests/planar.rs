//! Planar YUV 4:2:0 buffer rings (NV12, P010; issue 31) on lavapipe: the
//! demo producer (`frame_server --format nv12|p010`'s loop) serves a ring
//! whose slots hold the luma plane and, `row_pitch * height` bytes in, the
//! chroma plane; a lossless host receiver reads every frame whole and
//! checks both planes, row by row, against the pattern of the frame's own
//! number. Odd sizes and short pitches are refused at the sender with what
//! is wrong.

use std::time::{Duration, Instant};

use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::{
    Delivery, DropReason, PacketError, Planar, RingLayout, SlotFormat,
};
use cuda_interop_frames::sender::{Address, Sender, SenderError, SenderOptions};
use cuda_interop_frames::session::Session;
use cuda_interop_frames::transport::ConsumerError;
use cuda_interop_testkit::Mem;

#[path = "../examples/common/demo.rs"]
mod demo;

/// Even, and a pitch with padding (rows of 66 or 132 bytes at 72 or 136).
const W: u32 = 66;
const H: u32 = 40;
const SLOTS: u32 = 3;
const FRAMES: u64 = 12;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);

/// Whether `bytes` (one frame of `layout`) is frame `f` of the demo
/// pattern in both planes: the luma rows (the band among them), then every
/// chroma row the background. The first bad row, if any.
fn bad_row(layout: &RingLayout, bytes: &[u8], f: u64) -> Option<String> {
    let (planar, chroma) = layout.planar_format().expect("a planar ring");
    let row = (u64::from(layout.width) * planar.sample_bytes()) as usize;
    let pitch = layout.row_pitch as usize;
    for y in 0..layout.height {
        let at = y as usize * pitch;
        if !demo::check_demo_row(&bytes[at..at + row], f, y, layout.height) {
            return Some(format!("luma row {y}"));
        }
    }
    for y in 0..layout.height / 2 {
        let at = chroma as usize + y as usize * pitch;
        // Outside the band: the background's words.
        if !demo::check_demo_row(&bytes[at..at + row], f, layout.height, layout.height) {
            return Some(format!("chroma row {y}"));
        }
    }
    None
}

fn serve_and_check(planar: Planar) {
    let socket = std::env::temp_dir().join(format!(
        "cif-planar-{}-{}.sock",
        std::process::id(),
        planar.name()
    ));
    let _ = std::fs::remove_file(&socket);
    let pitch = (u64::from(W) * planar.sample_bytes()).next_multiple_of(8);
    let opts = demo::ProducerOptions {
        socket: socket.display().to_string(),
        width: W,
        height: H,
        row_pitch: pitch,
        planar: Some(planar),
        slots: SLOTS,
        seconds: BOUND.as_secs_f64(),
        // Up to 6 go by before the subscribe is handled.
        frames: Some(FRAMES + 6),
        fps: 20.0,
        host_visible: true,
        no_semaphores: true,
        ..demo::ProducerOptions::default()
    };
    let server = std::thread::spawn(move || demo::run(&opts));
    let start = Instant::now();
    let path = socket.display().to_string();
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "the producer never listened");
        if let Ok(c) = Session::connect(&path, Delivery::Lossless, Duration::from_secs(10)) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let layout = *session.layout();
    assert_eq!(
        layout.format,
        SlotFormat::PlanarBuffer {
            planar,
            chroma_offset: pitch * u64::from(H)
        },
        "the hello's layout"
    );
    let rx = HostReceiver::from_session(session, setup).unwrap();
    assert_eq!(Some(rx.frame_bytes()), layout.frame_bytes());
    // Every frame until the producer, done, drops this receiver.
    let mut seen = Vec::new();
    let end = loop {
        assert!(start.elapsed() < BOUND, "frames stopped coming");
        let frame = match rx.next(Duration::from_secs(10)) {
            Ok(frame) => frame,
            Err(e) => break e,
        };
        let f = frame.sequence();
        let bytes = match rx.read(&frame, Duration::from_secs(10)) {
            Ok(bytes) => bytes,
            // The goodbye came during the read.
            Err(e) => break e,
        };
        if let Some(bad) = bad_row(&layout, &bytes, f) {
            panic!("{} frame {f}: {bad} is not the frame's", planar.name());
        }
        seen.push(f);
        // The producer may be gone by now.
        let _ = rx.release(frame);
    };
    server.join().unwrap().expect("the producer ran");
    assert!(
        matches!(end, ConsumerError::Dropped(DropReason::SenderStopping)),
        "{end}"
    );
    println!("RESULT planar {} frames={seen:?}", planar.name());
    let (first, last) = (seen[0], *seen.last().unwrap());
    assert_eq!(
        seen,
        (first..=last).collect::<Vec<_>>(),
        "in order, none missed"
    );
    assert!(seen.len() as u64 >= FRAMES, "frames {seen:?}");
}

#[test]
fn nv12_ring_frames_carry_both_planes_of_their_own_number() {
    serve_and_check(Planar::Nv12);
}

#[test]
fn p010_ring_frames_carry_both_planes_of_their_own_number() {
    serve_and_check(Planar::P010);
}

/// A checker that cannot fail is no check: a frame of another number, and
/// one whose chroma plane is off by one byte, are told apart.
#[test]
fn the_planar_check_tells_a_wrong_frame() {
    let layout = RingLayout::planar(2, W, H, 72, Planar::Nv12);
    let len = layout.frame_bytes().unwrap() as usize;
    let mut bytes = vec![0u8; len];
    let fill = |bytes: &mut [u8], f: u64| {
        let (start, end) = demo::band_rows(f, H);
        for (i, word) in bytes.chunks_mut(4).enumerate() {
            let y = (i * 4 / 72) as u32;
            let v = if (start..end).contains(&y) && i * 4 < 72 * H as usize {
                demo::band_value(f)
            } else {
                demo::background(f)
            };
            let b = v.to_le_bytes();
            word.copy_from_slice(&b[..word.len()]);
        }
    };
    fill(&mut bytes, 7);
    assert_eq!(bad_row(&layout, &bytes, 7), None);
    assert!(bad_row(&layout, &bytes, 8).is_some());
    let chroma = layout.planar_format().unwrap().1 as usize;
    bytes[chroma + 72 * 3 + 5] ^= 1;
    assert_eq!(bad_row(&layout, &bytes, 7), Some("chroma row 3".into()));
}

#[test]
fn odd_sizes_and_short_pitches_are_refused_with_what_is_wrong() {
    let ctx = cuda_interop_testkit::vulkan(None);
    let dir = std::env::temp_dir().join(format!("cif-planar-bad-{}", std::process::id()));
    let make = |w: u32, h: u32, planar: Planar, pitch: Option<u64>| {
        let opts =
            SenderOptions::new(Address::Path(dir.join("s.sock")), w, h, 2).with_planar(planar);
        let opts = SenderOptions {
            row_pitch: pitch.unwrap_or(opts.row_pitch),
            semaphores: false,
            ..opts
        };
        Sender::<Mem>::new(&ctx, opts).map(drop)
    };
    std::fs::create_dir_all(&dir).unwrap();
    let layout_error = |r: Result<(), SenderError>| match r {
        Err(SenderError::Layout(PacketError::Layout(why))) => why,
        other => panic!("not a layout error: {other:?}"),
    };
    assert!(layout_error(make(65, 40, Planar::Nv12, None)).contains("even width and height"));
    assert!(layout_error(make(64, 39, Planar::P010, None)).contains("even width and height"));
    // A P010 row of 64 samples is 128 bytes.
    assert!(layout_error(make(64, 40, Planar::P010, Some(64))).contains("row pitch 64"));
    // The twin: a valid one is made.
    make(64, 40, Planar::P010, None).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
