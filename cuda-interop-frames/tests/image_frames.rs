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

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_interop_frames::cuda_receiver::{cuda_device_for, CudaReceiver};
use cuda_interop_frames::discovery::{Directory, SlotKind};
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::{
    Delivery, DropReason, Message, PacketError, RingLayout, SETUP_TAG,
};
use cuda_interop_frames::sender::{self, Address, ImageSender, Sender, SenderOptions};
use cuda_interop_frames::session::{check_setup_shape, Session};
use cuda_interop_frames::transport::{self, deadline_after, ConsumerError};
use cuda_interop_frames::vulkan_receiver::{VulkanReceiver, VulkanReceiverError};
use cuda_interop_testkit::{child, Mem};
use vk_export::format::{
    A2b10g10r10UnormPack32, Bgra8Srgb, Bgra8Unorm, Format, Rg16Unorm, Rgba16Sfloat, Rgba8Srgb,
    Rgba8Unorm,
};
use vk_export::markers::{DeviceLocal, MemoryLocation, Optimal};
use vk_export::wire::Received;
use vk_export::ExportableBuffer;

mod common;
use common::{env, num, results};

#[path = "../examples/common/demo.rs"]
mod demo;
use demo::{check_demo_row, record_demo_pattern_image};
// The CUDA example's checker: it reads an image slot through the receiver's
// surface object (frame_client's check).
#[path = "../examples/common/cuda_host.rs"]
#[allow(dead_code)]
mod cuda_host;

const W: u32 = 64;
const H: u32 = 48;
const SLOTS: u32 = 3;
/// Frames each receiver takes and checks.
const FRAMES: u64 = 20;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);

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
fn present_one<F: Format, M: MemoryLocation, U: vk_export::markers::Usage>(
    sender: &mut ImageSender<F, M, U>,
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
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "sender {name} never appeared");
        if let Ok(connected) =
            Session::connect_named(&directory, &name, delivery, Duration::from_secs(5))
        {
            break connected;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let info = directory.find(&name).unwrap();
    assert_eq!(
        (info.kind, info.format.as_str(), info.width, info.height),
        (SlotKind::Image, "r8g8b8a8_unorm", W, H)
    );
    let ctx = cuda_interop_testkit::vulkan(None);
    let vrx =
        VulkanReceiver::<Rgba8Unorm, Mem>::new(&ctx, session, setup).expect("the ring imported");
    let (mut checked, mut bad, mut last) = (0u64, 0u64, 0u64);
    let mut slots_seen = std::collections::BTreeSet::new();
    for _ in 0..FRAMES {
        let frame = vrx.next(Duration::from_secs(10)).expect("a frame");
        assert!(frame.sequence() > last);
        last = frame.sequence();
        let pixels = vrx
            .read_pixels(&frame, Duration::from_secs(10))
            .expect("read back");
        let rows = bad_rows(&pixels, frame.sequence());
        if !rows.is_empty() {
            bad += 1;
            eprintln!(
                "frame {} slot {}: bad rows {rows:?}",
                frame.sequence(),
                frame.slot()
            );
        }
        checked += 1;
        slots_seen.insert(frame.slot());
        vrx.release(frame).expect("release");
    }
    println!("RESULT checked={checked}");
    println!("RESULT bad={bad}");
    println!("RESULT slots_seen={}", slots_seen.len());
    println!("RESULT dropped={}", vrx.session().stats().dropped);
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

/// One process: a receiver reads only frames of its own session, and a
/// Vulkan receiver refuses a buffer ring and a ring of another format
/// with what it is; the CUDA and host receivers refuse an image ring
/// without semaphores saying which receiver reads it.
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
    // A session of `name` and its setup message, the sender served
    // meanwhile (it answers the subscribe).
    let connect = |name: &str, delivery: Delivery, sender: &mut dyn FnMut()| {
        let start = Instant::now();
        let dir = directory.clone();
        let name = name.to_string();
        let t = std::thread::spawn(move || {
            Session::connect_named(&dir, &name, delivery, Duration::from_secs(10))
        });
        while !t.is_finished() {
            assert!(start.elapsed() < BOUND);
            sender();
        }
        let connected: (Session, Received) = t.join().unwrap().expect("connected");
        connected
    };
    let lossless = Delivery::Lossless;
    // A buffer ring.
    let mut buffers = buffers;
    let (session, setup) = connect("buf", lossless, &mut || {
        buffers.serve(Duration::from_millis(5))
    });
    let err = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap_err();
    assert!(matches!(err, VulkanReceiverError::Ring(_)), "{err}");
    assert!(
        err.to_string()
            .contains("shares pitched buffers, not images"),
        "{err}"
    );
    assert!(err.to_string().contains("HostReceiver"), "{err}");
    // The CUDA receiver (the Python module's) needs the timelines, which
    // lavapipe's sender cannot share: it says so, and what reads the
    // images instead, before asking for a CUDA device.
    let (session, setup) = connect("img", lossless, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let err = CudaReceiver::from_session(session, setup, |_| panic!("no CUDA device is asked for"))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("shares 3 images and no semaphores"),
        "{err}"
    );
    assert!(
        err.to_string().contains("vulkan_receiver::VulkanReceiver"),
        "{err}"
    );
    // The host reader (the Python module's path without CUDA) reads buffer
    // rings only, and says which receivers read images.
    let (session, setup) = connect("img", lossless, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let err = HostReceiver::from_session(session, setup).unwrap_err();
    assert!(
        err.to_string()
            .contains("OPTIMAL images, which only a GPU API reads"),
        "{err}"
    );
    assert!(
        err.to_string().contains("vulkan_receiver::VulkanReceiver"),
        "{err}"
    );
    // A layout that is no layout (built by hand: its fields are public) is
    // a typed error of the setup check, never a panic. The receivers take
    // their layout only from a session, which decoded and checked the
    // sender's hello (a hello like this one is refused at connect:
    // `a_hello_that_announces_no_ring_is_refused_at_connect`).
    let (session, setup) = connect("img", lossless, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let mut bad = *session.layout();
    bad.height = 0;
    let err = check_setup_shape(&bad, &setup).unwrap_err();
    assert!(
        matches!(err, ConsumerError::Packet(PacketError::Layout(_))),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("bad ring layout: {W}x0 pixels")),
        "{err}"
    );
    assert!(check_setup_shape(session.layout(), &setup).is_ok());
    drop((session, setup));
    // Another format.
    let (session, setup) = connect("img", lossless, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let err = VulkanReceiver::<Rgba16Sfloat, Mem>::new(&rctx, session, setup).unwrap_err();
    assert!(
        err.to_string()
            .contains("its images are R8G8B8A8_UNORM, this receiver's type is R16G16B16A16_SFLOAT"),
        "{err}"
    );
    // A frame of another session. Reading a frame after giving it back no
    // longer compiles (the release takes the frame by value), nor does
    // forging one (its fields are private: the crate's compile-fail test);
    // what is left to refuse at run time is a frame another receiver
    // handed out.
    let (session, setup) = connect("img", lossless, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();
    // Latest, and never asking: it holds no slot and the sender never
    // waits for it.
    let (session, setup) = connect("img", Delivery::Latest, &mut || {
        sender.serve(Duration::from_millis(5))
    });
    let other = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();
    let start = Instant::now();
    let frame = loop {
        assert!(start.elapsed() < BOUND);
        present_one(&mut sender, &scratch, Duration::from_millis(100));
        if let Ok(frame) = vrx.next(Duration::from_millis(100)) {
            break frame;
        }
    };
    let sequence = frame.sequence();
    let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
    assert!(bad_rows(&pixels, sequence).is_empty());
    let err = other
        .read_pixels(&frame, Duration::from_secs(10))
        .unwrap_err();
    assert!(
        matches!(
            err,
            VulkanReceiverError::Consumer(ConsumerError::NotThisReceiver { sequence: s })
                if s == sequence
        ),
        "{err}"
    );
    assert!(err.to_string().contains("release it there"), "{err}");
    // Still its own session's, untouched: read again, the same pixels.
    assert_eq!(
        vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap(),
        pixels
    );
    // Given back to the other receiver: refused, and the frame released
    // to its own session on its own (its drop).
    assert_eq!(vrx.session().held(), 1);
    let err = other.release(frame).unwrap_err();
    assert!(
        matches!(
            err,
            VulkanReceiverError::Consumer(ConsumerError::NotThisReceiver { sequence: s })
                if s == sequence
        ),
        "{err}"
    );
    assert_eq!(vrx.session().held(), 0);
    assert_eq!(other.session().held(), 0);
    drop((vrx, other));
    drop(sender);
    drop(buffers);
    drop(scratch);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
    cuda_interop_testkit::assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The Rust CUDA receiver of image slots: a sender of DeviceLocal RGBA8
/// images with timelines, and a lossless `CudaReceiver` (on a thread, over
/// the socket) that imports each slot's image as a CUDA array. Even frames
/// are copied into the slot's packed rows after a GPU wait for "produced"
/// (`enqueue_readable`), read back at `pitched`'s address and checked
/// row by row; odd frames are read by the copy kernel through the
/// receiver's `surface` (zero copy) and checked likewise. Each is released
/// with a GPU signal of "released" (`release_after`).
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

/// The same with issue 31's 4-byte formats (BGRA8, the packed A2B10G10R10,
/// R16G16 UNORM): the pattern's words bit for bit. Needs the CUDA
/// receiver's `image_formats!` to list them.
#[test]
#[ignore = "GPU: needs a CUDA driver and a Vulkan device that exports timelines and \
            device-local OPTIMAL images (the H200); lavapipe has neither"]
fn cuda_receiver_of_bgra8_rgb10a2_and_rg16_image_rings() {
    cuda_receiver_of::<Bgra8Unorm>();
    cuda_receiver_of::<A2b10g10r10UnormPack32>();
    cuda_receiver_of::<Rg16Unorm>();
}

/// Copies `dst.len()` bytes at device address `src` to `dst` and waits for
/// the copy. `src` is a slot's memory of a live [`CudaReceiver`] on `cuda`
/// (what [`CudaReceiver::slot`] gives), with every write to it completed.
fn copy_slot_to_host(cuda: &cuda_interop::CudaDevice, src: u64, dst: &mut [u8]) {
    let copy = cuda_interop::sys::Driver::global()
        .expect("the CUDA driver")
        .fns()
        .cuMemcpyDtoH
        .expect("cuMemcpyDtoH");
    let _current = cuda.enter().expect("the device's context current");
    // SAFETY: `src` addresses at least `dst.len()` bytes of device memory
    // of `cuda`'s primary context (a slot the caller's receiver keeps alive
    // for the call, checked by the caller against the slot's length), made
    // current on this thread by the guard; the writes to it completed (the
    // caller synchronized the stream they were on); `dst` is writable host
    // memory of that length, and cuMemcpyDtoH returns once the copy is done.
    let status = unsafe { copy(dst.as_mut_ptr().cast(), src, dst.len()) };
    assert_eq!(
        status,
        cuda_interop::sys::CUresult::CUDA_SUCCESS,
        "cuMemcpyDtoH"
    );
}

/// An sRGB ring: its images have no storage usage (no GPU offers sRGB
/// storage), so the sender shares them sampled; the CUDA receiver maps them
/// by the usage their records name. The encoded bytes arrive as written;
/// `CudaReceiver::surface` refuses (no storage), so the surface check reads
/// the packed copy instead.
#[test]
#[ignore = "GPU: needs a CUDA driver and a Vulkan device that exports timelines and \
            device-local OPTIMAL images (the H200); lavapipe has neither"]
fn cuda_receiver_of_an_srgb_sampled_image_ring() {
    cuda_receiver_of_usage::<Rgba8Srgb, vk_export::markers::usage::Sampled>();
    cuda_receiver_of_usage::<Bgra8Srgb, vk_export::markers::usage::ColorAttachment>();
}

fn cuda_receiver_of<F: Format>() {
    cuda_receiver_of_usage::<F, vk_export::markers::usage::Storage>();
}

fn cuda_receiver_of_usage<F: Format, U: vk_export::markers::Usage>() {
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
    let mut sender = ImageSender::<F, DeviceLocal, U>::new(&ctx, opts).unwrap();
    let scratch =
        ExportableBuffer::<DeviceLocal>::new(&ctx, u64::from(W * H * F::TEXEL_BYTES)).unwrap();
    let receiver = std::thread::spawn(move || -> (u64, u64) {
        let timeout = Duration::from_secs(10);
        let (session, setup) =
            Session::connect_named(&directory, "cuda-img", Delivery::Lossless, timeout).unwrap();
        let layout = *session.layout();
        assert!(layout.is_image_ring());
        assert_eq!(layout.vk_format(), Some(F::VK.as_raw() as u32));
        let rx = CudaReceiver::from_session(session, setup, cuda_device_for).unwrap();
        let mut host = vec![0u8; (W * H * F::TEXEL_BYTES) as usize];
        let mut checker = cuda_host::Checker::new(&rx).unwrap();
        let mut own = cuda_interop::Stream::new(rx.cuda()).unwrap();
        own.set_timeout(timeout);
        let (mut checked, mut bad, mut through_surface) = (0, 0, 0);
        for i in 0..FRAMES_GPU {
            let frame = rx.next(timeout).unwrap();
            let f = frame.sequence();
            if i % 2 == 1 {
                // Zero copy: the image itself, read by a kernel through
                // the receiver's surface object after a wait for
                // "produced" on the test's own stream.
                rx.wait_produced(&frame, &own).unwrap();
                if !checker.check(&rx, &frame, &own, None, timeout).unwrap() {
                    bad += 1;
                }
                through_surface += 1;
                checked += 1;
                rx.release_after(frame, &own).unwrap();
                continue;
            }
            // The wait for "produced" and the copy of the image into the
            // slot's rows, on the receiver's wait stream.
            let stream = rx.enqueue_readable(&frame).unwrap();
            stream.synchronize(timeout).unwrap();
            let slot = rx.slot(&frame).unwrap();
            assert_eq!(slot.len, host.len() as u64);
            let rows = rx.pitched(&frame).unwrap();
            assert_eq!(
                (rows.ptr, rows.pitch, rows.row_bytes, rows.rows),
                (
                    slot.data,
                    u64::from(W * F::TEXEL_BYTES),
                    u64::from(W * F::TEXEL_BYTES),
                    H
                ),
                "the packed copy as pitched memory"
            );
            copy_slot_to_host(rx.cuda(), rows.ptr, &mut host);
            if !bad_rows_of(&host, f, F::TEXEL_BYTES).is_empty() {
                bad += 1;
            }
            checked += 1;
            rx.release_after(frame, &stream).unwrap();
        }
        assert_eq!(through_surface, FRAMES_GPU / 2);
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
/// another size. The sender follows the protocol's order: it reads the
/// receiver's subscribe, then sends the hello and the setup message.
#[test]
fn vulkan_receiver_refuses_images_of_another_size_than_the_hello() {
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
        let (session, setup) =
            Session::connect(&socket, Delivery::Lossless, Duration::from_secs(10))
                .expect("connected");
        let rctx = cuda_interop_testkit::vulkan(None);
        let err = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap_err();
        cuda_interop_testkit::assert_no_validation_errors(&rctx);
        err.to_string()
    });
    let conn = listener.accept(Duration::from_secs(10)).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(
        transport::recv_message(&conn, deadline_after(t), t).unwrap(),
        Message::Subscribe(Delivery::Lossless)
    );
    let layout = RingLayout::images(
        2,
        W,
        H,
        Rgba8Unorm::VK.as_raw() as u32,
        Rgba8Unorm::TEXEL_BYTES,
    );
    transport::send_message(&conn, &Message::Hello(layout)).unwrap();
    let resources: Vec<&dyn Exported> = images.iter().map(|i| i as &dyn Exported).collect();
    conn.send_exported(SETUP_TAG, &resources).unwrap();
    let err = receiver.join().unwrap();
    assert!(
        err.contains(&format!(
            "slot 0's image is {W}x{}, not the layout's size",
            H / 2
        )),
        "{err}"
    );
    drop(conn);
    let _ = std::fs::remove_file(&path);
}

/// A hand-made sender whose hello announces RGBA8 images with rows of 16
/// bytes a texel (a layout the protocol's own check takes): the Vulkan
/// receiver refuses the ring, so no reader lays its pixels out at the
/// peer's pitch (a GStreamer source panicked on it, a GRAY16 one handed out
/// rows of the wrong bytes). Its twin, the right pitch, is every other
/// test here.
#[test]
fn vulkan_receiver_refuses_a_hello_whose_rows_are_not_its_formats() {
    use vk_export::socket::{Exported, Listener};
    use vk_export::ImageDesc;
    let path = std::env::temp_dir().join(format!("cif-img-pitch-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = Listener::bind(&path).unwrap();
    let ctx = cuda_interop_testkit::vulkan(None);
    let images: Vec<vk_export::ExportableImage<Rgba8Unorm, Optimal, Mem>> = (0..2)
        .map(|_| vk_export::ExportableImage::new(&ctx, ImageDesc::new_2d(W, H)).unwrap())
        .collect();
    let socket = path.display().to_string();
    let receiver = std::thread::spawn(move || {
        let (session, setup) =
            Session::connect(&socket, Delivery::Lossless, Duration::from_secs(10))
                .expect("connected");
        let rctx = cuda_interop_testkit::vulkan(None);
        let err = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap_err();
        cuda_interop_testkit::assert_no_validation_errors(&rctx);
        err.to_string()
    });
    let conn = listener.accept(Duration::from_secs(10)).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(
        transport::recv_message(&conn, deadline_after(t), t).unwrap(),
        Message::Subscribe(Delivery::Lossless)
    );
    let layout = RingLayout::images(2, W, H, Rgba8Unorm::VK.as_raw() as u32, 16);
    layout.check().expect("the protocol's check takes it");
    transport::send_message(&conn, &Message::Hello(layout)).unwrap();
    let resources: Vec<&dyn Exported> = images.iter().map(|i| i as &dyn Exported).collect();
    conn.send_exported(SETUP_TAG, &resources).unwrap();
    let err = receiver.join().unwrap();
    assert!(
        err.contains(&format!(
            "its rows of {W} texels are announced as {} bytes, R8G8B8A8_UNORM makes {}",
            W * 16,
            W * 4
        )),
        "{err}"
    );
    drop(conn);
    let _ = std::fs::remove_file(&path);
}

/// A hand-made sender whose hello announces no ring (0 rows; its fields
/// are public, and encoding does not check them): the session refuses it
/// at connect with a typed error, before any setup message, never a panic.
#[test]
fn a_hello_that_announces_no_ring_is_refused_at_connect() {
    use vk_export::socket::Listener;
    let path = std::env::temp_dir().join(format!("cif-img-bad-hello-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = Listener::bind(&path).unwrap();
    let socket = path.display().to_string();
    let receiver = std::thread::spawn(move || {
        match Session::connect(&socket, Delivery::Latest, Duration::from_secs(10)) {
            Ok(_) => panic!("a hello of no ring was taken"),
            Err(e) => e,
        }
    });
    let conn = listener.accept(Duration::from_secs(10)).unwrap();
    let t = Duration::from_secs(10);
    assert_eq!(
        transport::recv_message(&conn, deadline_after(t), t).unwrap(),
        Message::Subscribe(Delivery::Latest)
    );
    let mut layout = RingLayout::images(
        2,
        W,
        H,
        Rgba8Unorm::VK.as_raw() as u32,
        Rgba8Unorm::TEXEL_BYTES,
    );
    layout.height = 0;
    transport::send_message(&conn, &Message::Hello(layout)).unwrap();
    let err = receiver.join().unwrap();
    assert!(
        matches!(err, ConsumerError::Packet(PacketError::Layout(_))),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains(&format!("bad ring layout: {W}x0 pixels")),
        "{err}"
    );
    drop(conn);
    let _ = std::fs::remove_file(&path);
}

/// `frame_server --image`'s loop (`demo::run` with `image`): a lossless
/// Vulkan receiver checks every pixel of the frames it gets until the
/// producer stops after its 15 frames. The producer renders once a
/// connection is accepted, but sends frames to it only once its subscribe
/// was handled (at its next pump, a frame period at most), and presents at
/// most 20 frames/s: at most 6 frames go by first. From then on the
/// receiver gets every frame, in order. At the end the producer says
/// goodbye (it stops) and no frame from before that is handed out after
/// it: frames still queued, or held while the goodbye came, are refused.
/// Back-pressure bounds them: frame 15 was presented only once the
/// receiver had released frame `15 - SLOTS`, read and checked.
fn frame_server_image_ring<F: Format>(format: demo::ImageFormat) {
    use demo::ProducerOptions;
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
    let server = std::thread::spawn(move || demo::run(&opts));
    let start = Instant::now();
    let path = socket.display().to_string();
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "the producer never listened");
        if let Ok(connected) = Session::connect(&path, Delivery::Lossless, Duration::from_secs(10))
        {
            break connected;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ctx = cuda_interop_testkit::vulkan(None);
    let vrx = VulkanReceiver::<F, Mem>::new(&ctx, session, setup).unwrap();
    let mut seen = Vec::new();
    // Until the producer, done, drops this receiver.
    let end = loop {
        let frame = match vrx.next(Duration::from_secs(10)) {
            Ok(frame) => frame,
            Err(e) => break e,
        };
        let pixels = match vrx.read_pixels(&frame, Duration::from_secs(10)) {
            Ok(pixels) => pixels,
            // The goodbye came during the read.
            Err(e) => break e,
        };
        assert_eq!(
            bad_rows_of(&pixels, frame.sequence(), F::TEXEL_BYTES),
            Vec::<u32>::new(),
            "frame {}",
            frame.sequence()
        );
        seen.push(frame.sequence());
        // The producer may be gone by now: its last releases find no one.
        let _ = vrx.release(frame);
    };
    server.join().unwrap().expect("the producer ran");
    assert!(
        matches!(
            end,
            VulkanReceiverError::Consumer(ConsumerError::Dropped(DropReason::SenderStopping))
        ),
        "{end}"
    );
    println!("RESULT frame_server_image_ring {format:?} frames={seen:?}");
    let (first, last) = (seen[0], *seen.last().unwrap());
    assert_eq!(
        seen,
        (first..=last).collect::<Vec<_>>(),
        "in order, none missed"
    );
    assert!(first <= 7, "frames {seen:?}");
    assert!(last >= 15 - u64::from(SLOTS), "frames {seen:?}");
    assert!(last <= 15, "frames {seen:?}");
    drop(vrx);
    cuda_interop_testkit::assert_no_validation_errors(&ctx);
}

#[test]
fn frame_server_rgba8_image_ring_is_the_demo_pattern() {
    frame_server_image_ring::<Rgba8Unorm>(demo::ImageFormat::Rgba8);
}

/// The same with 8-byte texels: the pattern's words land bit for bit.
#[test]
fn frame_server_rgba16f_image_ring_is_the_demo_pattern() {
    frame_server_image_ring::<Rgba16Sfloat>(demo::ImageFormat::Rgba16f);
}

/// Issue 31's formats of the demo (BGRA8, the packed A2B10G10R10, R16G16
/// UNORM): each texel one word of the pattern, bit for bit.
#[test]
fn frame_server_bgra8_rgb10a2_and_rg16_image_rings_are_the_demo_pattern() {
    frame_server_image_ring::<Bgra8Unorm>(demo::ImageFormat::Bgra8);
    frame_server_image_ring::<A2b10g10r10UnormPack32>(demo::ImageFormat::Rgb10a2);
    frame_server_image_ring::<Rg16Unorm>(demo::ImageFormat::Rg16);
}

/// The demo's format names parse to formats whose `VkFormat` and texel
/// size are the vk-export type's.
#[test]
fn the_demo_image_formats_are_vk_export_formats() {
    for (format, name) in demo::ImageFormat::ALL {
        assert_eq!(demo::ImageFormat::parse(name), Some(format));
        assert!(demo::ImageFormat::NAMES.split('|').any(|n| n == name));
        let (vk, texel) = format.vk();
        let described = vk_export::format::describe(vk).expect("a vk-export format");
        assert_eq!(described.1 * described.2.bytes(), texel, "{name}");
    }
    assert_eq!(demo::ImageFormat::parse("bgra"), None);
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
        let (session, setup) =
            Session::connect_named(&directory, "vk-img", Delivery::Latest, timeout).unwrap();
        let rctx = cuda_interop_testkit::vulkan(None);
        let vrx = VulkanReceiver::<Rgba8Unorm, DeviceLocal>::new(&rctx, session, setup).unwrap();
        let (mut checked, mut bad) = (0, 0);
        for _ in 0..FRAMES_GPU {
            let frame = vrx.next(timeout).unwrap();
            let pixels = vrx.read_pixels(&frame, timeout).unwrap();
            if !bad_rows(&pixels, frame.sequence()).is_empty() {
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
