//! Image rings on lavapipe: a sender of OPTIMAL RGBA8 images and Vulkan
//! receivers on devices of their own, each in a process of its own, every
//! pixel of every frame they take checked, the validation layer silent in
//! each process. Lavapipe exports no timelines, so the rings have no
//! semaphores: a frame is announced after the sender's submission
//! completed, and a receiver's release follows its own completed reads
//! (the host path of `vulkan_receiver`).
//!
//! The CUDA receiver of image slots needs a GPU
//! (`cuda_receiver_of_an_image_ring`, ignored here).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::{Directory, SlotKind};
use cuda_interop_frames::producer::{check_demo_row, record_demo_pattern_image};
use cuda_interop_frames::receiver::{Delivery, FrameReceiver};
use cuda_interop_frames::sender::{self, Address, ImageSender, Sender, SenderOptions};
use cuda_interop_frames::vulkan_receiver::{VulkanReceiver, VulkanReceiverError};
use cuda_interop_testkit::{child, Mem};
use vk_export::format::{Format, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal};
use vk_export::semaphore_kinds::Timeline;
use vk_export::ExportableBuffer;

const W: u32 = 64;
const H: u32 = 48;
const SLOTS: u32 = 3;
/// Frames each receiver takes and checks.
const FRAMES: u64 = 20;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name}: started by the parent test"))
}

fn results(stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.find("RESULT ").map(|i| &l[i + "RESULT ".len()..]))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(r: &HashMap<String, String>, key: &str) -> u64 {
    r.get(key)
        .unwrap_or_else(|| panic!("no RESULT {key} in {r:?}"))
        .parse()
        .unwrap()
}

fn image_sender(ctx: &vk_export::Context, address: Address) -> ImageSender<Rgba8Unorm, Mem> {
    let opts = SenderOptions {
        semaphores: false,
        // The pattern is transfer commands (lavapipe has no transfer-only
        // family: the main queue takes them).
        queue: vk_export::QueueRole::Transfer,
        ..SenderOptions::new(address, W, H, SLOTS)
    };
    ImageSender::<Rgba8Unorm, Mem>::new(ctx, opts).expect("an image sender")
}

/// Presents one frame of the demo pattern if a slot is free.
fn present_one<F: Format, M: MemoryLocation>(
    sender: &mut ImageSender<F, M>,
    scratch: &ExportableBuffer<M>,
    timeout: Duration,
) -> bool {
    let Ok(slot) = sender.acquire(timeout) else {
        return false;
    };
    let f = slot.sequence();
    slot.present_with(sender::monotonic_ns(), |device, cmd, target| {
        // SAFETY: the sender's recording command buffer and its W x H slot
        // of F; the scratch buffer holds W * H texels of F (transfer usage)
        // and each present waits for its commands, so no earlier copy still
        // reads it; it outlives the sender's submissions (dropped after).
        unsafe { record_demo_pattern_image::<F>(device, cmd, scratch.raw(), target, (W, H), f) }
    })
    .expect("present");
    true
}

/// Every row of frame `f`'s read-back (texels of 4 bytes) that is not the
/// demo pattern's.
fn bad_rows(pixels: &[u8], f: u64) -> Vec<u32> {
    bad_rows_of(pixels, f, 4)
}

/// [`bad_rows`] for texels of `texel` bytes.
fn bad_rows_of(pixels: &[u8], f: u64, texel: u32) -> Vec<u32> {
    let row = (W * texel) as usize;
    assert_eq!(pixels.len(), row * H as usize);
    (0..H)
        .filter(|&y| !check_demo_row(&pixels[y as usize * row..][..row], f, y, H))
        .collect()
}

/// An image sender named `CIF_NAME` in `CIF_DIR`, presenting (at most 200
/// frames/s while a receiver is connected) until `CIF_STOP` exists.
#[test]
#[ignore = "a child process of vulkan_receivers_check_every_pixel_across_processes"]
fn child_image_sender() {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let stop = PathBuf::from(env("CIF_STOP"));
    let ctx = cuda_interop_testkit::vulkan(None);
    let address = Address::Named {
        directory,
        name: env("CIF_NAME"),
    };
    let mut sender = image_sender(&ctx, address);
    let scratch = ExportableBuffer::<Mem>::new(&ctx, u64::from(W * H * 4)).unwrap();
    let start = Instant::now();
    while !stop.exists() {
        assert!(start.elapsed() < BOUND, "the sender ran past its bound");
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
            continue;
        }
        present_one(&mut sender, &scratch, sender::POLL);
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = sender.stats();
    for line in sender.take_log() {
        println!("[sender] {line}");
    }
    println!("RESULT presented={}", stats.presented);
    println!("RESULT dropped={}", stats.dropped);
    drop(sender);
    drop(scratch);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    println!("RESULT validation_errors=0");
}

// Two names: the child runner keeps a child's output in a file named after
// the parent and the child, so one name runs once at a time.
#[test]
#[ignore = "a child process of vulkan_receivers_check_every_pixel_across_processes"]
fn child_vulkan_receiver_latest() {
    vulkan_receiver(Delivery::Latest);
}

#[test]
#[ignore = "a child process of vulkan_receivers_check_every_pixel_across_processes"]
fn child_vulkan_receiver_lossless() {
    vulkan_receiver(Delivery::Lossless);
}

/// A Vulkan receiver on a device of its own: takes [`FRAMES`] frames of
/// `CIF_NAME`, reads each back and checks every row.
fn vulkan_receiver(delivery: Delivery) {
    let directory = Directory::new(env("CIF_DIR")).unwrap();
    let name = env("CIF_NAME");
    let start = Instant::now();
    let rx = loop {
        assert!(start.elapsed() < BOUND, "sender {name} never appeared");
        if let Ok(rx) =
            FrameReceiver::connect_named(&directory, &name, delivery, Duration::from_secs(5))
        {
            break rx;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let info = directory.find(&name).unwrap();
    assert_eq!(
        (info.kind, info.format.as_str(), info.width, info.height),
        (SlotKind::Image, "r8g8b8a8_unorm", W, H)
    );
    let ctx = cuda_interop_testkit::vulkan(None);
    let mut vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&ctx, rx).expect("the ring imported");
    let (mut checked, mut bad, mut last) = (0u64, 0u64, 0u64);
    let mut slots_seen = std::collections::BTreeSet::new();
    for _ in 0..FRAMES {
        let frame = vrx.next_frame(Duration::from_secs(10)).expect("a frame");
        assert!(frame.sequence > last);
        last = frame.sequence;
        let pixels = vrx
            .read_pixels(&frame, Duration::from_secs(10))
            .expect("read back");
        let rows = bad_rows(&pixels, frame.sequence);
        if !rows.is_empty() {
            bad += 1;
            eprintln!(
                "frame {} slot {}: bad rows {rows:?}",
                frame.sequence, frame.slot
            );
        }
        checked += 1;
        slots_seen.insert(frame.slot);
        vrx.release(frame).expect("release");
    }
    println!("RESULT checked={checked}");
    println!("RESULT bad={bad}");
    println!("RESULT slots_seen={}", slots_seen.len());
    println!("RESULT dropped={}", vrx.receiver().stats().dropped);
    drop(vrx);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    println!("RESULT validation_errors=0");
}

/// The CI case: a sender of an image ring and two Vulkan receivers
/// (latest and lossless), three processes, every pixel of every frame a
/// receiver took checked, no validation error in any process.
#[test]
fn vulkan_receivers_check_every_pixel_across_processes() {
    let dir = std::env::temp_dir().join(format!("cif-img-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Directory::new(&dir).unwrap();
    let stop = dir.join("stop");
    let base = || {
        vec![
            ("CIF_DIR".to_string(), dir.display().to_string()),
            ("CIF_STOP".to_string(), stop.display().to_string()),
            ("CIF_NAME".to_string(), "images".to_string()),
        ]
    };
    let spawn = |test: &'static str, envs: Vec<(String, String)>| {
        std::thread::spawn(move || {
            let envs: Vec<(&str, &str)> =
                envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            results(&child::run_with(test, &envs))
        })
    };
    let sender = spawn("child_image_sender", base());
    let latest = spawn("child_vulkan_receiver_latest", base());
    let lossless = spawn("child_vulkan_receiver_lossless", base());
    let latest = latest.join().expect("latest receiver");
    let lossless = lossless.join().expect("lossless receiver");
    std::fs::write(&stop, b"").unwrap();
    let sender = sender.join().expect("sender");
    std::fs::remove_dir_all(&dir).unwrap();
    for (what, r) in [("latest", &latest), ("lossless", &lossless)] {
        assert_eq!(num(r, "checked"), FRAMES, "{what}");
        assert_eq!(num(r, "bad"), 0, "{what}: frames with wrong pixels");
        assert_eq!(num(r, "validation_errors"), 0, "{what}");
    }
    // Lossless: every frame in order, so every slot of the ring was read.
    assert_eq!(num(&lossless, "dropped"), 0);
    assert_eq!(num(&lossless, "slots_seen"), u64::from(SLOTS));
    assert_eq!(num(&sender, "dropped"), 0);
    assert_eq!(num(&sender, "validation_errors"), 0);
    assert!(num(&sender, "presented") >= FRAMES);
}

/// One process: a receiver may read only frames it holds, and a Vulkan
/// receiver refuses a buffer ring and a ring of another format with what
/// it is.
#[test]
fn vulkan_receiver_refuses_what_it_cannot_read() {
    let dir = std::env::temp_dir().join(format!("cif-img-refuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    // The receivers' own device.
    let rctx = cuda_interop_testkit::vulkan(None);
    let named = |name: &str| Address::Named {
        directory: directory.clone(),
        name: name.into(),
    };
    let mut sender = image_sender(&ctx, named("img"));
    let scratch = ExportableBuffer::<Mem>::new(&ctx, u64::from(W * H * 4)).unwrap();
    let buffers = Sender::<Mem>::new(
        &ctx,
        SenderOptions {
            semaphores: false,
            ..SenderOptions::new(named("buf"), W, H, SLOTS)
        },
    )
    .unwrap();
    let connect = |name: &str, sender: &mut dyn FnMut()| {
        let start = Instant::now();
        let dir = directory.clone();
        let name = name.to_string();
        let t = std::thread::spawn(move || {
            FrameReceiver::connect_named(&dir, &name, Delivery::Lossless, Duration::from_secs(10))
        });
        while !t.is_finished() {
            assert!(start.elapsed() < BOUND);
            sender();
        }
        t.join().unwrap().expect("connected")
    };
    // A buffer ring.
    let mut buffers = buffers;
    let rx = connect("buf", &mut || buffers.serve(Duration::from_millis(5)));
    let err = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, rx).unwrap_err();
    assert!(
        err.to_string()
            .contains("shares pitched buffers, not images"),
        "{err}"
    );
    // The CUDA ring import (the Python module's) needs the timelines,
    // which lavapipe's sender cannot share: it says so before asking for a
    // CUDA device.
    let mut rx = connect("img", &mut || sender.serve(Duration::from_millis(5)));
    let (hello, setup) = (*rx.layout(), rx.take_setup().unwrap());
    let err =
        cuda_interop_frames::consumer::Ring::import(rx.connection().clone(), hello, setup, |_| {
            panic!("no CUDA device is asked for")
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("shares 3 images and no semaphores"),
        "{err}"
    );
    drop(rx);
    // The host reader (the Python module's path without CUDA) reads buffer
    // rings only, and says which receivers read images.
    let mut rx = connect("img", &mut || sender.serve(Duration::from_millis(5)));
    let (hello, setup) = (*rx.layout(), rx.take_setup().unwrap());
    let err = cuda_interop_frames::host_receiver::HostBuffers::import(&hello, setup).unwrap_err();
    assert!(
        err.to_string()
            .contains("OPTIMAL images, which only a GPU API reads"),
        "{err}"
    );
    drop(rx);
    // A hello whose layout is no layout (built by hand: its fields are
    // public) is a typed error of both importers, never a panic.
    let mut rx = connect("img", &mut || sender.serve(Duration::from_millis(5)));
    let (mut bad, setup) = (*rx.layout(), rx.take_setup().unwrap());
    bad.height = 0;
    let err = cuda_interop_frames::consumer::check_setup(&bad, &setup).unwrap_err();
    assert!(err.to_string().contains("the sender's hello"), "{err}");
    let err = cuda_interop_frames::host_receiver::HostBuffers::import(&bad, setup).unwrap_err();
    assert!(err.to_string().contains("the sender's hello"), "{err}");
    drop(rx);
    // Another format.
    let rx = connect("img", &mut || sender.serve(Duration::from_millis(5)));
    let err = VulkanReceiver::<Rgba16Sfloat, Mem>::new(&rctx, rx).unwrap_err();
    assert!(
        err.to_string()
            .contains("its images are R8G8B8A8_UNORM, this receiver's type is R16G16B16A16_SFLOAT"),
        "{err}"
    );
    // Reading a frame after giving it back.
    let rx = connect("img", &mut || sender.serve(Duration::from_millis(5)));
    let mut vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, rx).unwrap();
    let start = Instant::now();
    let frame = loop {
        assert!(start.elapsed() < BOUND);
        present_one(&mut sender, &scratch, Duration::from_millis(100));
        if let Ok(frame) = vrx.next_frame(Duration::from_millis(100)) {
            break frame;
        }
    };
    let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
    assert!(bad_rows(&pixels, frame.sequence).is_empty());
    let forged = cuda_interop_frames::receiver::FrameInfo {
        slot: frame.slot,
        sequence: frame.sequence,
        timestamp_ns: frame.timestamp_ns,
        dropped_before: 0,
    };
    vrx.release(frame).unwrap();
    assert!(matches!(
        vrx.read_pixels(&forged, Duration::from_secs(10)),
        Err(VulkanReceiverError::NotHeld { .. })
    ));
    drop(vrx);
    drop(sender);
    drop(buffers);
    drop(scratch);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    cuda_interop_testkit::assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The Rust CUDA receiver of image slots: a sender of DeviceLocal RGBA8
/// images with timelines, and a lossless receiver (on a thread, over the
/// socket) that imports each slot with `import_received_image`, maps it as
/// a CUDA array, waits on the GPU for "produced", copies the whole level
/// back and checks every row, and releases with a GPU signal of
/// "released".
#[test]
#[ignore = "GPU: needs a CUDA driver and a Vulkan device that exports timelines and \
            device-local OPTIMAL images (the H200); lavapipe has neither"]
fn cuda_receiver_of_an_image_ring() {
    cuda_receiver_of::<Rgba8Unorm>();
}

/// The same with RGBA16F images (8-byte texels, the pattern's words bit
/// for bit).
#[test]
#[ignore = "GPU: needs a CUDA driver and a Vulkan device that exports timelines and \
            device-local OPTIMAL images (the H200); lavapipe has neither"]
fn cuda_receiver_of_an_rgba16f_image_ring() {
    cuda_receiver_of::<Rgba16Sfloat>();
}

fn cuda_receiver_of<F: Format>() {
    const FRAMES_GPU: u64 = 30;
    let dir = std::env::temp_dir().join(format!("cif-img-cuda-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let opts = SenderOptions {
        queue: vk_export::QueueRole::Transfer,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "cuda-img".into(),
            },
            W,
            H,
            SLOTS,
        )
    };
    let mut sender = ImageSender::<F, DeviceLocal>::new(&ctx, opts).unwrap();
    let scratch =
        ExportableBuffer::<DeviceLocal>::new(&ctx, u64::from(W * H * F::TEXEL_BYTES)).unwrap();
    let receiver = std::thread::spawn(move || -> (u64, u64) {
        let timeout = Duration::from_secs(10);
        let mut rx =
            FrameReceiver::connect_named(&directory, "cuda-img", Delivery::Lossless, timeout)
                .unwrap();
        let hello = *rx.layout();
        assert!(hello.is_image_ring());
        let n = hello.slot as usize;
        let mut setup = rx.take_setup().unwrap();
        let take = |setup: &mut vk_export::wire::Received, i| {
            setup
                .take_image::<F, Optimal, DeviceLocal, usage::Storage>(i)
                .unwrap()
        };
        let first = take(&mut setup, 0);
        let cuda =
            cuda_interop_frames::consumer::cuda_device_for(first.record().info().device_uuid())
                .unwrap();
        let mut images = vec![cuda
            .import_received_image(first)
            .map_err(|e| e.into_error())
            .unwrap()];
        for i in 1..n {
            let image = take(&mut setup, i);
            images.push(
                cuda.import_received_image(image)
                    .map_err(|e| e.into_error())
                    .unwrap(),
            );
        }
        let mut semaphore = |i| {
            let received = setup.take_semaphore::<Timeline>(i).unwrap();
            cuda.import_received_semaphore(received)
                .map_err(|e| e.into_error())
                .unwrap()
        };
        let produced = semaphore(n);
        let released: Vec<_> = (0..n).map(|i| semaphore(n + 1 + i)).collect();
        let arrays: Vec<_> = images.iter().map(|i| i.map_array().unwrap()).collect();
        let levels: Vec<_> = arrays.iter().map(|a| a.level(0).unwrap()).collect();
        let mut stream = cuda_interop::Stream::new(&cuda).unwrap();
        stream.set_timeout(timeout);
        let mut host = vec![0u8; (W * H * F::TEXEL_BYTES) as usize];
        let (mut checked, mut bad) = (0, 0);
        for _ in 0..FRAMES_GPU {
            let frame = rx.next_frame(timeout).unwrap();
            let (slot, f) = (frame.slot as usize, frame.sequence);
            produced.wait(&stream, f).unwrap();
            levels[slot].copy_to_host(&stream, &mut host).unwrap();
            if !bad_rows_of(&host, f, F::TEXEL_BYTES).is_empty() {
                bad += 1;
            }
            checked += 1;
            released[slot].signal(&stream, f).unwrap();
            rx.release(frame, true).unwrap();
        }
        stream.synchronize(timeout).unwrap();
        (checked, bad)
    });
    let start = Instant::now();
    while !receiver.is_finished() {
        assert!(
            start.elapsed() < BOUND,
            "the CUDA receiver ran past its bound"
        );
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
        } else {
            present_one(&mut sender, &scratch, sender::POLL);
        }
    }
    let (checked, bad) = receiver.join().expect("the CUDA receiver");
    println!(
        "RESULT cuda_image_frames {} checked={checked} bad={bad}",
        F::NAME
    );
    assert_eq!((checked, bad), (FRAMES_GPU, 0));
    drop(sender);
    drop(scratch);
    cuda_interop_testkit::assert_no_validation_errors_except(
        &ctx,
        &[cuda_interop_testkit::IMPORTED_TIMELINE_HOST_SIGNAL_FALSE_POSITIVE],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hand-made sender whose images are not the size its hello says: the
/// Vulkan receiver refuses the ring rather than hand out read-backs of
/// another size.
#[test]
fn vulkan_receiver_refuses_images_of_another_size_than_the_hello() {
    use cuda_interop_frames::protocol::{Packet, SETUP_TAG};
    use vk_export::socket::{Exported, Listener};
    use vk_export::ImageDesc;
    let path = std::env::temp_dir().join(format!("cif-img-size-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = Listener::bind(&path).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let images: Vec<vk_export::ExportableImage<Rgba8Unorm, Optimal, Mem>> = (0..2)
        .map(|_| vk_export::ExportableImage::new(&ctx, ImageDesc::new_2d(W, H / 2)).unwrap())
        .collect();
    let socket = path.display().to_string();
    let receiver = std::thread::spawn(move || {
        let rx = FrameReceiver::connect(&socket, Delivery::Lossless, Duration::from_secs(10))
            .expect("connected");
        let rctx = cuda_interop_testkit::vulkan(None);
        let err = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, rx).unwrap_err();
        cuda_interop_testkit::assert_no_validation_errors(&rctx);
        err.to_string()
    });
    let conn = listener.accept(Duration::from_secs(10)).unwrap();
    let hello = Packet::image_hello(2, W, H, Rgba8Unorm::VK.as_raw() as u32, 4);
    cuda_interop_frames::consumer::send_packet(&conn, &hello).unwrap();
    let resources: Vec<&dyn Exported> = images.iter().map(|i| i as &dyn Exported).collect();
    conn.send_exported(SETUP_TAG, &resources).unwrap();
    let err = receiver.join().unwrap();
    assert!(
        err.contains(&format!(
            "slot 0's image is {W}x{}, not the hello's size",
            H / 2
        )),
        "{err}"
    );
    drop(conn);
    let _ = std::fs::remove_file(&path);
}

/// `frame_server --image`'s loop (`producer::run` with `image`): a lossless
/// Vulkan receiver checks every pixel of the frames it gets until the
/// producer stops after its 15 frames. The producer renders once a receiver
/// is connected, but pushes frames to it only once its subscribe was read
/// (at most `SUBSCRIBE_GRACE`, 250 ms, later), and presents at most 20
/// frames/s: at most 6 frames go by first. From then on the receiver gets
/// every frame, in order, to the last.
fn frame_server_image_ring<F: Format>(format: cuda_interop_frames::producer::ImageFormat) {
    use cuda_interop_frames::producer::{self, ProducerOptions};
    let socket = std::env::temp_dir().join(format!(
        "cif-img-server-{}-{format:?}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&socket);
    let host_visible =
        std::any::TypeId::of::<Mem>() == std::any::TypeId::of::<vk_export::markers::HostVisible>();
    let opts = ProducerOptions {
        socket: socket.display().to_string(),
        width: W,
        height: H,
        row_pitch: u64::from(W) * 4,
        slots: SLOTS,
        seconds: BOUND.as_secs_f64(),
        frames: Some(15),
        fps: 20.0,
        host_visible,
        no_semaphores: true,
        image: Some(format),
        ..ProducerOptions::default()
    };
    let server = std::thread::spawn(move || producer::run(&opts));
    let start = Instant::now();
    let path = socket.display().to_string();
    let rx = loop {
        assert!(start.elapsed() < BOUND, "the producer never listened");
        if let Ok(rx) = FrameReceiver::connect(&path, Delivery::Lossless, Duration::from_secs(10)) {
            break rx;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ctx = cuda_interop_testkit::vulkan(None);
    let mut vrx = VulkanReceiver::<F, Mem>::new(&ctx, rx).unwrap();
    let mut seen = Vec::new();
    // Until the producer, done, closes the connection.
    while let Ok(frame) = vrx.next_frame(Duration::from_secs(10)) {
        let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
        assert_eq!(
            bad_rows_of(&pixels, frame.sequence, F::TEXEL_BYTES),
            Vec::<u32>::new(),
            "frame {}",
            frame.sequence
        );
        seen.push(frame.sequence);
        // The producer may be gone by now: its last releases find no one.
        let _ = vrx.release(frame);
    }
    server.join().unwrap().expect("the producer ran");
    assert!(seen.len() >= 9, "frames {seen:?}");
    assert_eq!(seen, (16 - seen.len() as u64..=15).collect::<Vec<_>>());
    drop(vrx);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
}

#[test]
fn frame_server_rgba8_image_ring_is_the_demo_pattern() {
    frame_server_image_ring::<Rgba8Unorm>(cuda_interop_frames::producer::ImageFormat::Rgba8);
}

/// The same with 8-byte texels: the pattern's words land bit for bit.
#[test]
fn frame_server_rgba16f_image_ring_is_the_demo_pattern() {
    frame_server_image_ring::<Rgba16Sfloat>(cuda_interop_frames::producer::ImageFormat::Rgba16f);
}

/// A Vulkan receiver of a ring with timelines (its reads wait on the GPU
/// for "produced"), on a second device context of its own, in one
/// process: every pixel of 30 frames checked, no validation error.
#[test]
#[ignore = "GPU: needs a Vulkan device that exports timelines and device-local OPTIMAL \
            images (the H200); lavapipe exports no timelines"]
fn vulkan_receiver_of_a_ring_with_timelines() {
    const FRAMES_GPU: u64 = 30;
    let dir = std::env::temp_dir().join(format!("cif-img-vk-gpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let opts = SenderOptions {
        queue: vk_export::QueueRole::Transfer,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "vk-img".into(),
            },
            W,
            H,
            SLOTS,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, DeviceLocal>::new(&ctx, opts).unwrap();
    let scratch = ExportableBuffer::<DeviceLocal>::new(&ctx, u64::from(W * H * 4)).unwrap();
    let receiver = std::thread::spawn(move || -> (u64, u64) {
        let timeout = Duration::from_secs(10);
        let rx =
            FrameReceiver::connect_named(&directory, "vk-img", Delivery::Latest, timeout).unwrap();
        let rctx = cuda_interop_testkit::vulkan(None);
        let mut vrx = VulkanReceiver::<Rgba8Unorm, DeviceLocal>::new(&rctx, rx).unwrap();
        let (mut checked, mut bad) = (0, 0);
        for _ in 0..FRAMES_GPU {
            let frame = vrx.next_frame(timeout).unwrap();
            let pixels = vrx.read_pixels(&frame, timeout).unwrap();
            if !bad_rows(&pixels, frame.sequence).is_empty() {
                bad += 1;
            }
            checked += 1;
            vrx.release(frame).unwrap();
        }
        drop(vrx);
        cuda_interop_testkit::assert_no_validation_errors(&rctx);
        (checked, bad)
    });
    let start = Instant::now();
    while !receiver.is_finished() {
        assert!(
            start.elapsed() < BOUND,
            "the Vulkan receiver ran past its bound"
        );
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
        } else {
            present_one(&mut sender, &scratch, sender::POLL);
        }
    }
    let (checked, bad) = receiver.join().expect("the Vulkan receiver");
    println!("RESULT vulkan_image_frames_with_timelines checked={checked} bad={bad}");
    assert_eq!((checked, bad), (FRAMES_GPU, 0));
    drop(sender);
    drop(scratch);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
