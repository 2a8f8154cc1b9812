//! Multi-image rings on lavapipe (issue 31, item 4): a sender whose every
//! slot holds a colour (RGBA8), a depth (a `D32_SFLOAT` attachment copied
//! into an `R32_SFLOAT` part) and a segmentation (`R32_UINT`) image, and
//! Vulkan receivers in processes of their own that check every texel of
//! every part of every frame they take, each part encoding the frame's
//! sequence number (so a part of another frame is caught); the hello's
//! part records against peers that lie; the sender's refusals.
//!
//! Lavapipe exports no timelines: the rings have no semaphores, a frame is
//! announced after its submission completed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::{Directory, SlotKind};
use cuda_interop_frames::parts_reader::PartsReader;
use cuda_interop_frames::protocol::{
    Delivery, Message, PacketError, PartLayout, PartName, RingLayout, MAX_PARTS, SETUP_TAG,
};
use cuda_interop_frames::sender::{
    self, Address, ImagePart, ImageSender, ImageSet, MultiImageSender, PartSource, SenderError,
    SenderOptions, WriteSlot,
};
use cuda_interop_frames::session::Session;
use cuda_interop_frames::transport::{self, deadline_after, ConsumerError};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::app_image::AppImage;
use cuda_interop_testkit::{child, Mem};
use vk_export::ash::vk;
use vk_export::format::{Format, R32Sfloat, R32Uint, Rgba8Unorm};
use vk_export::markers::Optimal;
use vk_export::socket::{Exported, Listener};
use vk_export::{
    Context, DepthCopy, DepthFormat, DepthSource, ExportableImage, HeadlessOptions, ImageDesc,
    QueueRole, SourceImage, SourceSharing,
};

mod common;
use common::{env, num, results};

const W: u32 = 64;
const H: u32 = 48;
const SLOTS: u32 = 3;
/// Frames each receiver takes and checks.
const FRAMES: u64 = 12;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);

/// The three parts: colour, depth, segmentation.
fn parts() -> Vec<ImagePart> {
    vec![
        ImagePart::new::<Rgba8Unorm>("color").unwrap(),
        ImagePart::new::<R32Sfloat>("depth").unwrap(),
        ImagePart::new::<R32Uint>("segmentation").unwrap(),
    ]
}

fn options(address: Address) -> SenderOptions {
    SenderOptions {
        semaphores: false,
        ..SenderOptions::new(address, W, H, SLOTS)
    }
    .with_parts(parts())
}

/// Frame `f`'s colour texel at (x, y): x, y, and the frame number's two
/// low bytes.
fn color(f: u64, x: u32, y: u32) -> [u8; 4] {
    [x as u8, y as u8, f as u8, (f >> 8) as u8]
}

/// Frame `f`'s depth at (x, y): in [0, 1), exact in 32 bits (a numerator
/// below 2^20 over 2^20), the frame's number in its high bits.
fn depth(f: u64, x: u32, y: u32) -> f32 {
    let n = ((f % 4096) << 8) | u64::from((x + y) % 256);
    n as f32 / (1u32 << 20) as f32
}

/// Frame `f`'s segmentation label at (x, y): the frame number above the
/// texel's index.
fn label(f: u64, x: u32, y: u32) -> u32 {
    ((f as u32) << 12) | (y * W + x)
}

fn texels(f: u64) -> [Vec<u8>; 3] {
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for y in 0..H {
        for x in 0..W {
            out[0].extend_from_slice(&color(f, x, y));
            out[1].extend_from_slice(&depth(f, x, y).to_le_bytes());
            out[2].extend_from_slice(&label(f, x, y).to_le_bytes());
        }
    }
    out
}

/// The texels of every part of a frame read back that are not frame `f`'s,
/// as (part, index) pairs (at most a few of each).
fn wrong_texels(parts: &[Vec<u8>], f: u64) -> Vec<(usize, usize)> {
    let want = texels(f);
    let mut bad = Vec::new();
    for (p, (got, want)) in parts.iter().zip(&want).enumerate() {
        if got.len() != want.len() {
            bad.push((p, usize::MAX));
            continue;
        }
        let wrong = got
            .chunks(4)
            .zip(want.chunks(4))
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .map(|(i, _)| (p, i));
        bad.extend(wrong.take(4));
    }
    bad
}

/// The application's three images of frame `f` (made and filled by a
/// completed submission on the main queue, as a renderer's targets).
fn app_images(ctx: &Context, f: u64) -> [AppImage; 3] {
    let [c, d, s] = texels(f);
    let main = QueueRole::Main;
    [
        AppImage::of_format(
            ctx,
            (vk::Format::R8G8B8A8_UNORM, 4),
            [W, H],
            &c,
            vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
            main,
        ),
        AppImage::of_format(
            ctx,
            (vk::Format::D32_SFLOAT, 4),
            [W, H],
            &d,
            vk::ImageLayout::DEPTH_STENCIL_ATTACHMENT_OPTIMAL,
            main,
        ),
        AppImage::of_format(
            ctx,
            (vk::Format::R32_UINT, 4),
            [W, H],
            &s,
            vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
            main,
        ),
    ]
}

/// Presents `images` into a free slot by copies.
fn present(sender: &mut MultiImageSender<Mem>, images: &[AppImage; 3]) -> Result<u64, SenderError> {
    present_into(sender.acquire(BOUND).expect("a free slot"), images)
}

/// Presents `images` into `slot` by copies.
fn present_into(
    slot: WriteSlot<'_, Mem, ImageSet<Mem>>,
    images: &[AppImage; 3],
) -> Result<u64, SenderError> {
    // SAFETY: each AppImage is a live image of the sender's device of the
    // named format and extent, with transfer-source usage, in its `layout`,
    // owned by its `family`, filled by a completed submission, untouched
    // until it is dropped (after the present returned).
    let (c, d, s) = unsafe {
        let own = |a: &AppImage| SourceSharing::Exclusive(a.family);
        (
            SourceImage::<Rgba8Unorm>::new(
                images[0].image,
                [W, H],
                images[0].layout,
                own(&images[0]),
            )
            .unwrap(),
            DepthSource::new(
                images[1].image,
                DepthFormat::D32Sfloat,
                [W, H],
                images[1].layout,
                own(&images[1]),
            )
            .unwrap(),
            SourceImage::<R32Uint>::new(images[2].image, [W, H], images[2].layout, own(&images[2]))
                .unwrap(),
        )
    };
    let sources: [&dyn PartSource; 3] = [&c, &d, &s];
    slot.present_copy(sender::monotonic_ns(), &sources, None)
}

/// A multi-image sender named `CIF_NAME` in `CIF_DIR`, presenting while a
/// receiver is connected, until `CIF_STOP` exists.
#[test]
#[ignore = "a child process of parts_receivers_check_every_texel_across_processes"]
fn child_multi_image_sender() {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let stop = PathBuf::from(env("CIF_STOP"));
    let ctx = cuda_interop_testkit::vulkan(None);
    let address = Address::Named {
        directory,
        name: env("CIF_NAME"),
    };
    let mut sender = MultiImageSender::<Mem>::new(&ctx, options(address)).expect("a sender");
    let start = Instant::now();
    while !stop.exists() {
        assert!(start.elapsed() < BOUND, "the sender ran past its bound");
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
            continue;
        }
        let f = sender.stats().presented + 1;
        let images = app_images(&ctx, f);
        // Latest receivers may hold every other slot: then no frame.
        let Ok(slot) = sender.acquire(sender::POLL) else {
            continue;
        };
        assert_eq!(slot.sequence(), f);
        assert_eq!(present_into(slot, &images).expect("present"), f);
        drop(images);
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = sender.stats();
    for line in sender.take_log() {
        println!("[sender] {line}");
    }
    println!("RESULT presented={}", stats.presented);
    println!("RESULT dropped={}", stats.dropped);
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    println!("RESULT validation_errors=0");
}

#[test]
#[ignore = "a child process of parts_receivers_check_every_texel_across_processes"]
fn child_parts_receiver_latest() {
    parts_receiver(Delivery::Latest);
}

#[test]
#[ignore = "a child process of parts_receivers_check_every_texel_across_processes"]
fn child_parts_receiver_lossless() {
    parts_receiver(Delivery::Lossless);
}

/// A Vulkan receiver on a device of its own: takes [`FRAMES`] frames of
/// `CIF_NAME` and checks every texel of every part of each.
fn parts_receiver(delivery: Delivery) {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let name = env("CIF_NAME");
    let start = Instant::now();
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "sender {name} never appeared");
        if let Ok(connected) =
            Session::connect_named_any(&directory, &name, delivery, Duration::from_secs(5))
        {
            break connected;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let info = directory.find(&name).unwrap();
    assert_eq!(
        (info.kind, info.format.as_str(), info.width, info.height),
        (
            SlotKind::Image,
            "color:r8g8b8a8_unorm+depth:r32_sfloat+segmentation:r32_uint",
            W,
            H
        )
    );
    let names: Vec<String> = session.parts().iter().map(|p| p.name.to_string()).collect();
    assert_eq!(names, ["color", "depth", "segmentation"]);
    assert_eq!(session.part_index("segmentation"), Some(2));
    let ctx = cuda_interop_testkit::vulkan(None);
    let rx = PartsReader::new(&ctx, session, setup).expect("the ring imported");
    let (mut checked, mut bad, mut last) = (0u64, 0u64, 0u64);
    let mut slots_seen = std::collections::BTreeSet::new();
    for _ in 0..FRAMES {
        let frame = rx.next(Duration::from_secs(10)).expect("a frame");
        assert!(frame.sequence() > last);
        last = frame.sequence();
        let parts = rx
            .read_parts(&frame, Duration::from_secs(10))
            .expect("read back");
        let wrong = wrong_texels(&parts, frame.sequence());
        if !wrong.is_empty() {
            bad += 1;
            eprintln!(
                "frame {} slot {}: wrong (part, texel) {wrong:?}",
                frame.sequence(),
                frame.slot()
            );
        }
        checked += 1;
        slots_seen.insert(frame.slot());
        rx.release(frame).expect("release");
    }
    println!("RESULT checked={checked}");
    println!("RESULT bad={bad}");
    println!("RESULT slots_seen={}", slots_seen.len());
    println!("RESULT dropped={}", rx.session().stats().dropped);
    drop(rx);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    println!("RESULT validation_errors=0");
}

/// The CI case: a colour + depth + segmentation sender and two
/// Vulkan receivers (latest and lossless), three processes; every texel of
/// every part of every frame a receiver took is that frame's, no
/// validation error in any process.
#[test]
fn parts_receivers_check_every_texel_across_processes() {
    let dir = std::env::temp_dir().join(format!("cif-parts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Directory::new(&dir).unwrap();
    let stop = dir.join("stop");
    let base = || {
        vec![
            ("CIF_DIR".to_string(), dir.display().to_string()),
            ("CIF_STOP".to_string(), stop.display().to_string()),
            ("CIF_NAME".to_string(), "sim".to_string()),
        ]
    };
    let spawn = |test: &'static str, envs: Vec<(String, String)>| {
        std::thread::spawn(move || {
            let envs: Vec<(&str, &str)> =
                envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            results(&child::run_with(test, &envs))
        })
    };
    let sender = spawn("child_multi_image_sender", base());
    let latest = spawn("child_parts_receiver_latest", base());
    let lossless = spawn("child_parts_receiver_lossless", base());
    let latest = latest.join().expect("latest receiver");
    let lossless = lossless.join().expect("lossless receiver");
    std::fs::write(&stop, b"").unwrap();
    let sender = sender.join().expect("sender");
    std::fs::remove_dir_all(&dir).unwrap();
    for (what, r) in [("latest", &latest), ("lossless", &lossless)] {
        assert_eq!(num(r, "checked"), FRAMES, "{what}");
        assert_eq!(num(r, "bad"), 0, "{what}: frames with wrong texels");
        assert_eq!(num(r, "validation_errors"), 0, "{what}");
    }
    assert_eq!(num(&lossless, "dropped"), 0);
    assert_eq!(num(&lossless, "slots_seen"), u64::from(SLOTS));
    assert_eq!(num(&sender, "dropped"), 0);
    assert_eq!(num(&sender, "validation_errors"), 0);
    assert!(num(&sender, "presented") >= FRAMES);
}

/// A session of `name` in `directory` on another thread while `serve`
/// runs here, with `connect` (the plain or the `_any` one).
fn connect_with<T: Send + 'static>(
    directory: &Directory,
    name: &str,
    connect: fn(&Directory, &str) -> T,
    mut serve: impl FnMut(),
) -> T {
    let (dir, name) = (directory.clone(), name.to_string());
    let t = std::thread::spawn(move || connect(&dir, &name));
    let start = Instant::now();
    while !t.is_finished() {
        assert!(start.elapsed() < BOUND, "no connection within {BOUND:?}");
        serve();
    }
    t.join().unwrap()
}

/// A test's sender and parts reader in this one process, each on a
/// device of its own, named in a directory of the test's own.
struct OneProcess {
    dir: PathBuf,
    directory: Directory,
    ctx: Context,
    rctx: Context,
}

impl OneProcess {
    fn new(tag: &str) -> OneProcess {
        Self::with_depth_copy(tag, DepthCopy::IfAvailable)
    }

    /// With the sender's context made with `depth_copy`.
    fn with_depth_copy(tag: &str, depth_copy: DepthCopy) -> OneProcess {
        let dir = std::env::temp_dir().join(format!("cif-parts-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let directory = Directory::new(&dir).unwrap();
        OneProcess {
            dir,
            directory,
            ctx: cuda_interop_testkit::vulkan_with(HeadlessOptions {
                depth_copy,
                ..HeadlessOptions::default()
            }),
            rctx: cuda_interop_testkit::vulkan(None),
        }
    }

    fn address(&self, name: &str) -> Address {
        Address::Named {
            directory: self.directory.clone(),
            name: name.into(),
        }
    }

    /// A parts reader of `sender`'s ring `name` (lossless), on `rctx`.
    fn reader(&self, sender: &mut MultiImageSender<Mem>, name: &str) -> PartsReader {
        let (session, setup) = connect_with(
            &self.directory,
            name,
            |d, n| Session::connect_named_any(d, n, Delivery::Lossless, Duration::from_secs(10)),
            || sender.serve(Duration::from_millis(5)),
        )
        .expect("connected");
        PartsReader::new(&self.rctx, session, setup).expect("imported")
    }

    /// After the test dropped its sender and reader: no validation error
    /// on either device, and the directory gone.
    fn finish(self) {
        cuda_interop_testkit::assert_no_validation_errors(&self.ctx);
        cuda_interop_testkit::assert_no_validation_errors(&self.rctx);
        std::fs::remove_dir_all(&self.dir).unwrap();
    }
}

/// One process: the sender refuses parts it cannot make and copies it
/// cannot do before anything is recorded (slot free, no frame numbered);
/// receivers of one image a slot refuse the ring with what takes it; a
/// Vulkan parts reader in the same process gets every part of a frame.
#[test]
fn refusals_and_one_frame_in_one_process() {
    let dir = std::env::temp_dir().join(format!("cif-parts-one-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let rctx = cuda_interop_testkit::vulkan(None);
    let named = |name: &str| Address::Named {
        directory: directory.clone(),
        name: name.into(),
    };
    // Options refused: duplicate names, too many parts, too many resources
    // for one setup message, none, parts on a one-image sender.
    let refused = |opts: SenderOptions| match MultiImageSender::<Mem>::new(&ctx, opts) {
        Ok(_) => panic!("a sender of bad parts was made"),
        Err(e) => e.to_string(),
    };
    let mut twice = parts();
    twice[2] = ImagePart::new::<R32Uint>("color").unwrap();
    let e = refused(options(named("a")).with_parts(twice));
    assert!(e.contains("two parts named color"), "{e}");
    let five: Vec<ImagePart> = (0..=MAX_PARTS)
        .map(|i| ImagePart::new::<R32Uint>(&format!("p{i}")).unwrap())
        .collect();
    let e = refused(options(named("b")).with_parts(five));
    assert!(e.contains("1 to 4 parts"), "{e}");
    let e = refused(SenderOptions {
        slots: 4,
        ..options(named("c"))
    });
    assert!(e.contains("resources"), "{e}");
    let e = refused(options(named("d")).with_parts([]));
    assert!(e.contains("1 to 4 parts"), "{e}");
    let e = match ImageSender::<Rgba8Unorm, Mem>::new(&ctx, options(named("e"))) {
        Ok(_) => panic!("a one-image sender took parts"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("MultiImageSender"), "{e}");
    assert!(ImagePart::new::<R32Uint>("no spaces").is_err());

    let mut sender = MultiImageSender::<Mem>::new(&ctx, options(named("sim"))).unwrap();
    assert_eq!(sender.parts().len(), 3);
    // Receivers of one image a slot refuse the ring, naming its parts.
    let plain = connect_with(
        &directory,
        "sim",
        |d, n| Session::connect_named(d, n, Delivery::Lossless, Duration::from_secs(10)),
        || sender.serve(Duration::from_millis(5)),
    );
    let e = plain.unwrap_err().to_string();
    assert!(
        e.contains("multi-image ring (parts color, depth, segmentation)"),
        "{e}"
    );
    let (session, setup) = connect_with(
        &directory,
        "sim",
        |d, n| Session::connect_named_any(d, n, Delivery::Lossless, Duration::from_secs(10)),
        || sender.serve(Duration::from_millis(5)),
    )
    .expect("connected");
    let e = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap_err();
    assert!(
        matches!(&e, cuda_interop_frames::vulkan_receiver::VulkanReceiverError::Consumer(
            ConsumerError::MultiImage { parts }) if parts.len() == 3),
        "{e}"
    );
    let (session, setup) = connect_with(
        &directory,
        "sim",
        |d, n| Session::connect_named_any(d, n, Delivery::Lossless, Duration::from_secs(10)),
        || sender.serve(Duration::from_millis(5)),
    )
    .expect("connected");
    let rx = PartsReader::new(&rctx, session, setup).expect("imported");

    // Copies refused before anything is recorded.
    let images = app_images(&ctx, 1);
    // SAFETY: as in `present`.
    let (c, d, s) = unsafe {
        let own = |a: &AppImage| SourceSharing::Exclusive(a.family);
        (
            SourceImage::<Rgba8Unorm>::new(
                images[0].image,
                [W, H],
                images[0].layout,
                own(&images[0]),
            )
            .unwrap(),
            DepthSource::new(
                images[1].image,
                DepthFormat::D32Sfloat,
                [W, H],
                images[1].layout,
                own(&images[1]),
            )
            .unwrap(),
            SourceImage::<R32Uint>::new(images[2].image, [W, H], images[2].layout, own(&images[2]))
                .unwrap(),
        )
    };
    let invalid = |r: Result<u64, SenderError>, what: &str| match r {
        Err(SenderError::Vulkan(vk_export::Error::InvalidArgument(m))) => {
            assert!(m.contains(what), "{m}")
        }
        other => panic!("{other:?}"),
    };
    let slot = sender.acquire(BOUND).unwrap();
    invalid(
        slot.present_copy(sender::monotonic_ns(), &[&c, &d], None),
        "2 copy sources for a ring of 3 parts",
    );
    let slot = sender.acquire(BOUND).unwrap();
    invalid(
        slot.present_copy(sender::monotonic_ns(), &[&c, &s, &d], None),
        "the copy source of part depth fills R32_UINT",
    );
    // A source offset past its edge.
    // SAFETY: as in `present`.
    let shifted = unsafe {
        DepthSource::new(
            images[1].image,
            DepthFormat::D32Sfloat,
            [W, H],
            images[1].layout,
            SourceSharing::Exclusive(images[1].family),
        )
    }
    .unwrap()
    .with_offset([1, 0]);
    let slot = sender.acquire(BOUND).unwrap();
    invalid(
        slot.present_copy(sender::monotonic_ns(), &[&c, &shifted, &s], None),
        "does not fit",
    );
    assert_eq!(sender.stats().presented, 0);

    // One frame: every part the frame's.
    assert_eq!(present(&mut sender, &images).unwrap(), 1);
    drop(images);
    let frame = rx.next(Duration::from_secs(10)).unwrap();
    assert_eq!(frame.sequence(), 1);
    let got = rx.read_parts(&frame, Duration::from_secs(10)).unwrap();
    assert_eq!(wrong_texels(&got, 1), Vec::<(usize, usize)>::new());
    assert_eq!(got[1][..4], depth(1, 0, 0).to_le_bytes());
    rx.release(frame).unwrap();
    drop(rx);
    drop(sender);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    cuda_interop_testkit::assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The open path is the same one state machine: the application's own
/// submissions (one per part, each waiting for the opened slot's `ready`)
/// write every part of an opened slot, and its present releases all of
/// them as one frame, which a parts reader gets whole.
#[test]
fn an_opened_slot_is_written_part_by_part_by_the_applications_own_submissions() {
    let t = OneProcess::new("open");
    let ctx = &t.ctx;
    let address = t.address("opened");
    let mut sender = MultiImageSender::<Mem>::new(ctx, options(address)).unwrap();
    let rx = t.reader(&mut sender, "opened");
    let written = vk_export::TimelineSemaphore::new_local(ctx).unwrap();
    let texel = [10u8, 20, 30, 40];
    let open = sender
        .acquire(BOUND)
        .unwrap()
        .open(QueueRole::Main)
        .unwrap();
    let family = open.queue_family();
    let images = open.resource().images();
    assert_eq!(open.resource().image("depth"), Some(images[1]));
    for (i, &image) in images.iter().enumerate() {
        common::clear_on_own_queue(
            ctx,
            family,
            image,
            open.ready(),
            &written,
            i as u64 + 1,
            texel,
        );
    }
    let f = open
        .present(sender::monotonic_ns(), (&written, images.len() as u64))
        .unwrap();
    let frame = rx.next(Duration::from_secs(10)).unwrap();
    assert_eq!(frame.sequence(), f);
    let parts = rx.read_parts(&frame, Duration::from_secs(10)).unwrap();
    // The clear's first channel, 10 / 255: RGBA8 back to the bytes, the
    // float as is, the labels its bits (a UINT clear reads the union so).
    let red = 10.0f32 / 255.0;
    assert!(parts[0].chunks(4).all(|t| t == texel));
    assert!(parts[1].chunks(4).all(|t| t == red.to_le_bytes()));
    assert!(parts[2].chunks(4).all(|t| t == red.to_bits().to_le_bytes()));
    rx.release(frame).unwrap();
    drop(rx);
    drop(sender);
    t.finish();
}

/// `present_with` of a multi-image ring: the closure gets every part's
/// image by name (`PartTargets`), in `GENERAL`, owned by the command
/// buffer's family, and the frame is every part it wrote.
#[test]
fn present_with_gets_every_part_by_name() {
    let t = OneProcess::new("with");
    let ctx = &t.ctx;
    let address = t.address("with");
    let mut sender = MultiImageSender::<Mem>::new(ctx, options(address)).unwrap();
    let rx = t.reader(&mut sender, "with");
    let slot = sender.acquire(BOUND).unwrap();
    let f = slot
        .present_with(sender::monotonic_ns(), |device, cmd, targets| {
            assert_eq!(targets.images().len(), 3);
            assert_eq!(targets.image("nope"), None);
            let range = vk::ImageSubresourceRange {
                aspect_mask: vk::ImageAspectFlags::COLOR,
                base_mip_level: 0,
                level_count: 1,
                base_array_layer: 0,
                layer_count: 1,
            };
            let values = [
                (
                    "color",
                    vk::ClearColorValue {
                        float32: [1.0, 0.0, 1.0, 0.0],
                    },
                ),
                (
                    "depth",
                    vk::ClearColorValue {
                        float32: [0.25, 0.0, 0.0, 0.0],
                    },
                ),
                (
                    "segmentation",
                    vk::ClearColorValue {
                        uint32: [42, 0, 0, 0],
                    },
                ),
            ];
            for (name, value) in &values {
                let image = targets.image(name).expect("a part of that name");
                // SAFETY: the sender's recording command buffer; the part's
                // image in GENERAL, owned by its family, with transfer
                // destination usage (every preset), left in GENERAL.
                unsafe {
                    device.cmd_clear_color_image(
                        cmd,
                        image,
                        vk::ImageLayout::GENERAL,
                        value,
                        &[range],
                    )
                };
            }
        })
        .unwrap();
    let frame = rx.next(Duration::from_secs(10)).unwrap();
    assert_eq!(frame.sequence(), f);
    let parts = rx.read_parts(&frame, Duration::from_secs(10)).unwrap();
    assert!(parts[0].chunks(4).all(|t| t == [255, 0, 255, 0]));
    assert!(parts[1].chunks(4).all(|t| t == 0.25f32.to_le_bytes()));
    assert!(parts[2].chunks(4).all(|t| t == 42u32.to_le_bytes()));
    rx.release(frame).unwrap();
    drop((rx, sender));
    t.finish();
}

/// A `D16_UNORM` attachment goes into an `R16_UNORM` part bit for bit,
/// beside a colour part (the other depth format `DepthSource` copies).
#[test]
fn a_d16_depth_attachment_is_copied_into_an_r16_part() {
    let t = OneProcess::new("d16");
    let ctx = &t.ctx;
    let address = t.address("d16");
    let opts = options(address).with_parts([
        ImagePart::new::<Rgba8Unorm>("color").unwrap(),
        ImagePart::new::<vk_export::format::R16Unorm>("depth16").unwrap(),
    ]);
    let mut sender = MultiImageSender::<Mem>::new(ctx, opts).unwrap();
    let rx = t.reader(&mut sender, "d16");
    let [color_texels, ..] = texels(7);
    let depth_texels: Vec<u8> = (0..W * H)
        .flat_map(|i| ((i * 37 + 7) as u16).to_le_bytes())
        .collect();
    let main = QueueRole::Main;
    let color = AppImage::of_format(
        ctx,
        (vk::Format::R8G8B8A8_UNORM, 4),
        [W, H],
        &color_texels,
        vk::ImageLayout::GENERAL,
        main,
    );
    let depth = AppImage::of_format(
        ctx,
        (vk::Format::D16_UNORM, 2),
        [W, H],
        &depth_texels,
        vk::ImageLayout::DEPTH_STENCIL_READ_ONLY_OPTIMAL,
        main,
    );
    // SAFETY: as in `present`.
    let (c, d) = unsafe {
        (
            SourceImage::<Rgba8Unorm>::new(
                color.image,
                [W, H],
                color.layout,
                SourceSharing::Exclusive(color.family),
            )
            .unwrap(),
            DepthSource::new(
                depth.image,
                DepthFormat::D16Unorm,
                [W, H],
                depth.layout,
                SourceSharing::Exclusive(depth.family),
            )
            .unwrap(),
        )
    };
    let slot = sender.acquire(BOUND).unwrap();
    let f = slot
        .present_copy(sender::monotonic_ns(), &[&c, &d], None)
        .unwrap();
    let frame = rx.next(Duration::from_secs(10)).unwrap();
    assert_eq!(frame.sequence(), f);
    let parts = rx.read_parts(&frame, Duration::from_secs(10)).unwrap();
    assert!(parts[0] == color_texels, "the colour part");
    assert!(parts[1] == depth_texels, "the depth part, bit for bit");
    rx.release(frame).unwrap();
    drop((rx, sender, color, depth));
    t.finish();
}

/// Whether a context with [`DepthCopy::IfAvailable`] should copy depth
/// directly: the device offers `VK_KHR_maintenance8` with its feature and
/// the context's main family has `GRAPHICS` (asked of the driver here, not
/// of the context), and no validation layer older than the extension
/// (header 1.4.305) watches (Debian's 1.3.239 would report the copies).
fn offers_depth_to_color_copies(ctx: &Context) -> bool {
    let old_layer = ctx.validation_enabled() && {
        // SAFETY: loads the system's Vulkan loader, already loaded by the
        // context.
        let entry = unsafe { vk_export::ash::Entry::load() }.unwrap();
        // SAFETY: plain enumeration.
        let layers = unsafe { entry.enumerate_instance_layer_properties() }.unwrap();
        layers
            .iter()
            .find(|l| l.layer_name_as_c_str() == Ok(c"VK_LAYER_KHRONOS_validation"))
            .is_some_and(|l| l.spec_version < vk::make_api_version(0, 1, 4, 305))
    };
    let (instance, physical) = (ctx.instance(), ctx.physical_device());
    // SAFETY: plain queries on the context's live instance and device.
    let (extensions, families) = unsafe {
        (
            instance
                .enumerate_device_extension_properties(physical)
                .unwrap(),
            instance.get_physical_device_queue_family_properties(physical),
        )
    };
    let offered = extensions
        .iter()
        .any(|e| e.extension_name_as_c_str() == Ok(c"VK_KHR_maintenance8"));
    let graphics = families[ctx.queue_family() as usize]
        .queue_flags
        .contains(vk::QueueFlags::GRAPHICS);
    offered && graphics && !old_layer && maintenance8_feature(ctx)
}

/// `VkPhysicalDeviceMaintenance8FeaturesKHR` (ash 0.38 has none), as the
/// test asks the driver for it.
#[repr(C)]
struct Maintenance8 {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    maintenance8: vk::Bool32,
}
// SAFETY: the C layout of the struct the spec lets extend
// VkPhysicalDeviceFeatures2.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Maintenance8 {}

/// Whether the device reports the `maintenance8` feature (asked only where
/// the extension is offered).
fn maintenance8_feature(ctx: &Context) -> bool {
    let mut m8 = Maintenance8 {
        s_type: vk::StructureType::from_raw(1_000_574_000),
        p_next: std::ptr::null_mut(),
        maintenance8: vk::FALSE,
    };
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut m8);
    // SAFETY: a plain query on the context's live instance (Vulkan 1.2) and
    // device, which offers the extension (the caller checked); the chain
    // lives across the call.
    unsafe {
        ctx.instance()
            .get_physical_device_features2(ctx.physical_device(), &mut features)
    };
    m8.maintenance8 == vk::TRUE
}

/// A depth attachment is copied directly exactly where the device allows
/// it and the context was not told otherwise: lavapipe (Mesa 22) offers no
/// `VK_KHR_maintenance8`, the H100's driver 580 does (without a validation
/// layer older than the extension).
#[test]
fn depth_copies_are_direct_only_where_the_device_offers_them() {
    let direct = cuda_interop_testkit::vulkan_with(HeadlessOptions::default());
    assert_eq!(
        direct.copies_depth_to_color(),
        offers_depth_to_color_copies(&direct),
        "{direct:?}"
    );
    let through = cuda_interop_testkit::vulkan_with(HeadlessOptions {
        depth_copy: DepthCopy::ThroughBuffer,
        ..HeadlessOptions::default()
    });
    assert!(!through.copies_depth_to_color(), "{through:?}");
}

/// Both depth formats arrive bit for bit whichever way they are copied:
/// one `vkCmdCopyImage` a part where the context copies depth to colour
/// (the GPU machine), through the slot's buffer where it does not
/// (lavapipe, or [`DepthCopy::ThroughBuffer`]); the colour part beside
/// them too (recorded after them).
#[test]
fn depth_parts_are_the_attachments_bits_by_either_copy() {
    for depth_copy in [DepthCopy::IfAvailable, DepthCopy::ThroughBuffer] {
        let tag = format!("either-{depth_copy:?}").to_lowercase();
        let t = OneProcess::with_depth_copy(&tag, depth_copy);
        let ctx = &t.ctx;
        let opts = options(t.address(&tag)).with_parts([
            ImagePart::new::<Rgba8Unorm>("color").unwrap(),
            ImagePart::new::<R32Sfloat>("depth").unwrap(),
            ImagePart::new::<vk_export::format::R16Unorm>("depth16").unwrap(),
        ]);
        let mut sender = MultiImageSender::<Mem>::new(ctx, opts).unwrap();
        let rx = t.reader(&mut sender, &tag);
        let [color_texels, depth_texels, _] = texels(9);
        let depth16_texels: Vec<u8> = (0..W * H)
            .flat_map(|i| ((i * 53 + 11) as u16).to_le_bytes())
            .collect();
        let main = QueueRole::Main;
        // Frame 9's colour and D32 depth images (its segmentation unused).
        let [color, depth, labels] = app_images(ctx, 9);
        let depth16 = AppImage::of_format(
            ctx,
            (vk::Format::D16_UNORM, 2),
            [W, H],
            &depth16_texels,
            vk::ImageLayout::GENERAL,
            main,
        );
        let own = |a: &AppImage| SourceSharing::Exclusive(a.family);
        // SAFETY: as in `present`.
        let (c, d, d16) = unsafe {
            (
                SourceImage::<Rgba8Unorm>::new(color.image, [W, H], color.layout, own(&color))
                    .unwrap(),
                DepthSource::new(
                    depth.image,
                    DepthFormat::D32Sfloat,
                    [W, H],
                    depth.layout,
                    own(&depth),
                )
                .unwrap(),
                DepthSource::new(
                    depth16.image,
                    DepthFormat::D16Unorm,
                    [W, H],
                    depth16.layout,
                    own(&depth16),
                )
                .unwrap(),
            )
        };
        for _ in 0..2 {
            let slot = sender.acquire(BOUND).unwrap();
            let f = slot
                .present_copy(sender::monotonic_ns(), &[&c, &d, &d16], None)
                .unwrap();
            let frame = rx.next(Duration::from_secs(10)).unwrap();
            assert_eq!(frame.sequence(), f);
            let parts = rx.read_parts(&frame, Duration::from_secs(10)).unwrap();
            let how = ctx.copies_depth_to_color();
            assert!(
                parts[0] == color_texels,
                "the colour part ({depth_copy:?}, direct {how})"
            );
            assert!(
                parts[1] == depth_texels,
                "D32 into R32, bit for bit ({depth_copy:?}, direct {how})"
            );
            assert!(
                parts[2] == depth16_texels,
                "D16 into R16, bit for bit ({depth_copy:?}, direct {how})"
            );
            rx.release(frame).unwrap();
        }
        drop((rx, sender, color, depth, labels, depth16));
        t.finish();
    }
}

/// A depth attachment is copied only on a queue family with `GRAPHICS`
/// (`VUID-vkCmdCopyImageToBuffer-commandBuffer-10216`): one released to the
/// transfer family is refused before anything is recorded, naming the rule;
/// the same image owned by the main family is taken, on the main queue.
#[test]
fn a_depth_source_released_to_the_transfer_family_is_refused() {
    let ctx = cuda_interop_testkit::vulkan(None);
    let depth = AppImage::of_format(
        &ctx,
        (vk::Format::D32_SFLOAT, 4),
        [W, H],
        &texels(3)[1],
        vk::ImageLayout::DEPTH_STENCIL_ATTACHMENT_OPTIMAL,
        QueueRole::Main,
    );
    let source = |sharing| {
        // SAFETY: as in `present`; nothing is recorded (check_copy only).
        unsafe {
            DepthSource::new(
                depth.image,
                DepthFormat::D32Sfloat,
                [W, H],
                depth.layout,
                sharing,
            )
        }
        .unwrap()
    };
    let released = source(SourceSharing::ReleasedToTransfer { from: depth.family });
    let refused = released.check_copy(&ctx, [W, H]).unwrap_err().to_string();
    assert!(refused.contains("GRAPHICS"), "{refused}");
    assert!(refused.contains("10216"), "{refused}");
    let owned = source(SourceSharing::Exclusive(depth.family));
    assert_eq!(owned.check_copy(&ctx, [W, H]).unwrap(), QueueRole::Main);
    let shared = source(SourceSharing::Concurrent);
    assert_eq!(shared.check_copy(&ctx, [W, H]).unwrap(), QueueRole::Main);
    drop(depth);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
}

/// What a hand-made sender sends after the receiver's subscribe.
struct Lie {
    hello: RingLayout,
    messages: Vec<Message>,
    /// Each slot's images' formats and sizes, slot by slot, part by part.
    images: Vec<(vk::Format, [u32; 2])>,
}

fn part(name: &str, format: vk::Format) -> PartLayout {
    PartLayout {
        name: PartName::new(name).unwrap(),
        vk_format: format.as_raw() as u32,
        texel_bytes: 4,
    }
}

fn good_parts() -> Vec<PartLayout> {
    vec![
        part("color", vk::Format::R8G8B8A8_UNORM),
        part("depth", vk::Format::R32_SFLOAT),
    ]
}

fn good_lie() -> Lie {
    let parts = good_parts();
    Lie {
        hello: RingLayout::multi_image(2, W, H, &parts),
        messages: (0..)
            .zip(&parts)
            .map(|(index, p)| Message::Part { index, part: *p })
            .collect(),
        images: (0..2)
            .flat_map(|_| {
                parts
                    .iter()
                    .map(|p| (vk::Format::from_raw(p.vk_format as i32), [W, H]))
            })
            .collect(),
    }
}

fn exported(ctx: &Context, format: vk::Format, extent: [u32; 2]) -> Box<dyn Exported> {
    let desc = ImageDesc::new_2d(extent[0], extent[1]);
    match format {
        vk::Format::R8G8B8A8_UNORM => {
            Box::new(ExportableImage::<Rgba8Unorm, Optimal, Mem>::new(ctx, desc).unwrap())
        }
        vk::Format::R32_SFLOAT => {
            Box::new(ExportableImage::<R32Sfloat, Optimal, Mem>::new(ctx, desc).unwrap())
        }
        vk::Format::R32_UINT => {
            Box::new(ExportableImage::<R32Uint, Optimal, Mem>::new(ctx, desc).unwrap())
        }
        other => panic!("no test image of {other:?}"),
    }
}

/// Plays `lie` to a receiver connecting with `Session::connect_any`:
/// what the receiver made of it (a session's parts, or its error).
fn play(lie: Lie) -> Result<Vec<String>, ConsumerError> {
    let path = std::env::temp_dir().join(format!(
        "cif-parts-lie-{}-{:?}.sock",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = Listener::bind(&path).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let images: Vec<Box<dyn Exported>> = lie
        .images
        .iter()
        .map(|&(f, e)| exported(&ctx, f, e))
        .collect();
    let socket = path.display().to_string();
    let receiver = std::thread::spawn(move || {
        Session::connect_any(&socket, Delivery::Lossless, Duration::from_secs(10))
            .map(|(s, _)| s.parts().iter().map(|p| p.name.to_string()).collect())
    });
    let conn = listener.accept(Duration::from_secs(10)).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(
        transport::recv_message(&conn, deadline_after(t), t).unwrap(),
        Message::Subscribe(Delivery::Lossless)
    );
    // The hello's own encoding (a layout the protocol refuses still goes).
    let _ = transport::send_message(&conn, &Message::Hello(lie.hello));
    for m in &lie.messages {
        let _ = transport::send_message(&conn, m);
    }
    let resources: Vec<&dyn Exported> = images.iter().map(|i| &**i).collect();
    let _ = conn.send_exported(SETUP_TAG, &resources);
    let got = receiver.join().unwrap();
    drop(conn);
    let _ = std::fs::remove_file(&path);
    got
}

fn refused_with(lie: Lie, what: &str) -> ConsumerError {
    let e = play(lie).expect_err("a lying sender was taken");
    assert!(e.to_string().contains(what), "{what:?} not in: {e}");
    e
}

/// The honest twin of every lie below is taken.
#[test]
fn an_honest_hand_made_sender_is_taken() {
    assert_eq!(play(good_lie()).unwrap(), ["color", "depth"]);
}

#[test]
fn a_hello_of_too_many_parts_is_refused() {
    let mut lie = good_lie();
    lie.hello.parts = MAX_PARTS + 1;
    let e = refused_with(lie, "images a slot (1 to 4)");
    assert!(matches!(e, ConsumerError::Packet(PacketError::Layout(_))));
}

#[test]
fn a_ring_beyond_one_setup_message_is_refused() {
    let mut lie = good_lie();
    lie.hello.slots = 6;
    refused_with(lie, "one setup message carries at most 16");
}

#[test]
fn duplicate_part_names_are_refused() {
    let mut lie = good_lie();
    lie.messages[1] = Message::Part {
        index: 1,
        part: part("color", vk::Format::R32_SFLOAT),
    };
    refused_with(lie, "two parts named color");
}

#[test]
fn parts_out_of_order_are_refused() {
    let mut lie = good_lie();
    lie.messages.swap(0, 1);
    refused_with(lie, "must send part 0, not a part");
}

#[test]
fn a_missing_part_message_is_refused() {
    let mut lie = good_lie();
    lie.messages.pop();
    // The setup message comes where part 1 should: not a frame packet.
    let e = play(lie).expect_err("taken");
    assert!(
        matches!(e, ConsumerError::Packet(_) | ConsumerError::Protocol(_)),
        "{e}"
    );
}

#[test]
fn a_frame_instead_of_a_part_is_refused() {
    let mut lie = good_lie();
    lie.messages[1] = Message::Frame {
        slot: 0,
        sequence: 1,
        timestamp_ns: 1,
    };
    refused_with(lie, "must send part 1, not a frame");
}

#[test]
fn a_first_part_other_than_the_hello_is_refused() {
    let mut lie = good_lie();
    // The hello says R32_UINT, part 0 says RGBA8.
    lie.hello.format = cuda_interop_frames::protocol::SlotFormat::Image {
        vk_format: vk::Format::R32_UINT.as_raw() as u32,
    };
    refused_with(lie, "part 0 (color)");
}

#[test]
fn a_part_whose_texel_size_is_not_its_formats_is_refused() {
    let mut lie = good_lie();
    let Message::Part { part, .. } = &mut lie.messages[1] else {
        unreachable!()
    };
    part.texel_bytes = 16;
    refused_with(
        lie,
        "part depth is VkFormat 100 (4-byte texels) announced with 16-byte texels",
    );
}

#[test]
fn an_image_of_another_format_than_its_part_is_refused() {
    let mut lie = good_lie();
    // Slot 1's depth image is R32_UINT (also 4 bytes a texel).
    lie.images[3].0 = vk::Format::R32_UINT;
    refused_with(
        lie,
        "slot 1's image of part depth (resource 3) is VkFormat 98",
    );
}

#[test]
fn an_image_of_another_size_than_the_hello_is_refused() {
    let mut lie = good_lie();
    lie.images[2].1 = [W, H / 2];
    refused_with(
        lie,
        &format!(
            "slot 1's image of part color (resource 2) is {W}x{}x1",
            H / 2
        ),
    );
}

#[test]
fn a_setup_message_of_too_few_images_is_refused() {
    let mut lie = good_lie();
    lie.images.pop();
    refused_with(lie, "with 4 resources, or 7 with the semaphores; got tag");
}

#[test]
fn a_part_message_after_a_one_image_hello_is_refused() {
    let mut lie = good_lie();
    lie.hello = RingLayout::images(2, W, H, Rgba8Unorm::VK.as_raw() as u32, 4);
    lie.images.truncate(2);
    // The part packet comes where the setup message must.
    play(lie).expect_err("a part after a one-image hello was taken");
}
