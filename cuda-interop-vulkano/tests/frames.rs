//! A vulkano application publishes frames and a vulkano receiver in
//! another process checks every pixel of every one: the sender's device is
//! made by vulkano and wrapped ([`Interop`]), its image ring's slots are
//! vulkano images that vulkano command buffers clear and copy into between
//! the sender's open and present (a vk-export timeline waited and signalled
//! in the vulkano submission); the receiver (a child process of this test
//! binary) wraps its own vulkano device, imports the ring
//! (`VulkanReceiver`), and copies each frame's slot to a host buffer with a
//! vulkano command buffer (the acquire from and release to the external
//! queue family recorded by vulkano). Lavapipe exports no semaphores: the
//! ring has none (a frame is announced after its writes completed). The
//! validation layer is required in both processes and must stay silent.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{self, Address, ImageSender, SenderOptions};
use cuda_interop_frames::session::Session;
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::child;
use cuda_interop_vulkano::{CurrentLayout, InteropImage, TimelinePoint};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::HostVisible;
use vk_export::{QueueRole, TimelineSemaphore};
use vulkano::buffer::BufferUsage;
use vulkano::command_buffer::{CommandBufferBeginInfo, RecordingCommandBuffer};
use vulkano::command_buffer::{CommandBufferLevel, CommandBufferUsage, CopyImageToBufferInfo};
use vulkano::image::ImageLayout;
use vulkano::sync::{
    AccessFlags, BufferMemoryBarrier, DependencyInfo, ImageMemoryBarrier, PipelineStages,
    QueueFamilyOwnershipTransfer,
};

mod common;
use common::{first_mismatch, Allocators, Vk, VERSION};

const W: u32 = 64;
const H: u32 = 48;
const SLOTS: u32 = 3;
/// Frames the receiver takes and checks.
const FRAMES: u64 = 24;
/// Bound on every loop of these tests.
const BOUND: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(10);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name}: started by the parent test"))
}

/// `RESULT key=value` lines of a child's stdout.
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

/// The vulkano sender: a ring named `CVK_NAME` in `CVK_DIR`, written by
/// vulkano command buffers, presenting while a receiver is connected
/// until `CVK_STOP` exists.
#[test]
#[ignore = "a child process of a_vulkano_receiver_in_another_process_checks_every_pixel"]
fn child_vulkano_sender() {
    let directory = Directory::new(env("CVK_DIR")).unwrap();
    let stop = PathBuf::from(env("CVK_STOP"));
    let vk = Vk::new(VERSION);
    let interop = vk.interop();
    let ctx = interop.context();
    let alloc = Allocators::new(&interop);
    let opts = SenderOptions {
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory,
                name: env("CVK_NAME"),
            },
            W,
            H,
            SLOTS,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, HostVisible>::new(ctx, opts).expect("a sender");
    // Each slot wrapped once: vulkano takes it in GENERAL (where the
    // sender's open leaves it) and leaves it there.
    let slots: Vec<InteropImage> = sender
        .images()
        .iter()
        // SAFETY: vulkano uses a slot only between the sender's open (the
        // slot acquired for the main family in GENERAL) and present (its
        // release after vulkano's timeline value); nothing else changes its
        // layout, and each is wrapped once.
        .map(|image| unsafe { interop.image(image, CurrentLayout::General) }.unwrap())
        .collect();
    let written = TimelineSemaphore::new_local(ctx).unwrap();
    let mut value = 0u64;
    let start = Instant::now();
    while !stop.exists() {
        assert!(start.elapsed() < BOUND, "the sender ran past its bound");
        if sender.stats().receivers == 0 {
            sender.serve(Duration::from_millis(10));
            continue;
        }
        let Ok(slot) = sender.acquire(sender::POLL) else {
            continue;
        };
        let slot = slot.open(QueueRole::Main).expect("open");
        assert_eq!(slot.queue_family(), interop.queue().queue_family_index());
        let f = slot.sequence();
        let staging = alloc.host_buffer(u64::from(W * H * 4), BufferUsage::TRANSFER_SRC);
        let commands =
            alloc.frame_commands(&interop, &slots[slot.index() as usize], &staging, f, (W, H));
        value += 1;
        let (opened, ready) = slot.ready();
        // SAFETY: the slot is acquired for this family in GENERAL once
        // `ready` is reached (waited here on the GPU); vulkano leaves it in
        // GENERAL; present releases it after `written` reaches `value`.
        let mut submission = unsafe {
            interop.submit(
                &[commands],
                &[TimelinePoint::new(opened, ready)],
                &[TimelinePoint::new(&written, value)],
            )
        }
        .expect("the vulkano submission");
        let sequence = slot
            .present(sender::monotonic_ns(), (&written, value))
            .expect("present");
        assert_eq!(sequence, f);
        submission.wait(WAIT).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let stats = sender.stats();
    println!("RESULT presented={}", stats.presented);
    println!("RESULT dropped={}", stats.dropped);
    drop(slots);
    drop(sender);
    drop(interop);
    vk.assert_clean();
    println!("RESULT validation_errors=0");
}

/// The vulkano receiver: takes [`FRAMES`] frames of `CVK_NAME` losslessly,
/// copies each slot to a host buffer with a vulkano command buffer and
/// checks every pixel.
#[test]
#[ignore = "a child process of a_vulkano_receiver_in_another_process_checks_every_pixel"]
fn child_vulkano_receiver() {
    let directory = Directory::new(env("CVK_DIR")).unwrap();
    let name = env("CVK_NAME");
    let start = Instant::now();
    let (session, setup) = loop {
        assert!(start.elapsed() < BOUND, "sender {name} never appeared");
        if let Ok(c) = Session::connect_named(&directory, &name, Delivery::Lossless, WAIT) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let vk = Vk::new(VERSION);
    let interop = vk.interop();
    let alloc = Allocators::new(&interop);
    let rx = VulkanReceiver::<Rgba8Unorm, HostVisible>::new(interop.context(), session, setup)
        .expect("the ring imported");
    let images: Vec<InteropImage> = rx
        .images()
        .iter()
        // SAFETY: the receiver's images are used only by the vulkano
        // command buffers below, each between this receiver's take of a
        // frame (the sender released the slot to the external family in
        // GENERAL) and its release of it, which the command buffer itself
        // records in GENERAL; vk-export's read helpers are not used.
        .map(|image| unsafe { interop.image(image, CurrentLayout::General) }.unwrap())
        .collect();
    let out = alloc.host_buffer(u64::from(W * H * 4), BufferUsage::TRANSFER_DST);
    let family = interop.queue().queue_family_index();
    let (mut checked, mut bad, mut last, mut gaps) = (0u64, 0u64, 0u64, 0u64);
    let mut slots_seen = BTreeSet::new();
    for _ in 0..FRAMES {
        let frame = rx.next(WAIT).expect("a frame");
        assert!(frame.sequence() > last, "frames in order");
        if last != 0 && frame.sequence() != last + 1 {
            gaps += 1;
        }
        last = frame.sequence();
        rx.wait_produced(&frame, WAIT).unwrap();
        let image = images[frame.slot() as usize].image().clone();
        let mut cb = RecordingCommandBuffer::new(
            alloc.commands.clone(),
            family,
            CommandBufferLevel::Primary,
            CommandBufferBeginInfo {
                usage: CommandBufferUsage::OneTimeSubmit,
                ..Default::default()
            },
        )
        .unwrap();
        let barrier = |acquire: bool| ImageMemoryBarrier {
            src_stages: if acquire {
                PipelineStages::ALL_COMMANDS
            } else {
                PipelineStages::ALL_TRANSFER
            },
            src_access: AccessFlags::empty(),
            dst_stages: if acquire {
                PipelineStages::ALL_TRANSFER
            } else {
                PipelineStages::ALL_COMMANDS
            },
            dst_access: if acquire {
                AccessFlags::TRANSFER_READ
            } else {
                AccessFlags::empty()
            },
            old_layout: ImageLayout::General,
            new_layout: ImageLayout::General,
            queue_family_ownership_transfer: Some(if acquire {
                QueueFamilyOwnershipTransfer::ExclusiveFromExternal { dst_index: family }
            } else {
                QueueFamilyOwnershipTransfer::ExclusiveToExternal { src_index: family }
            }),
            subresource_range: image.subresource_range(),
            ..ImageMemoryBarrier::image(image.clone())
        };
        let to_host = BufferMemoryBarrier {
            src_stages: PipelineStages::ALL_TRANSFER,
            src_access: AccessFlags::TRANSFER_WRITE,
            dst_stages: PipelineStages::HOST,
            dst_access: AccessFlags::HOST_READ,
            range: 0..out.size(),
            ..BufferMemoryBarrier::buffer(out.buffer().clone())
        };
        // SAFETY: the frame is held: the sender released the slot to the
        // external family in GENERAL before announcing it (no semaphores:
        // after its writes completed); the command buffer acquires it,
        // copies it in GENERAL into `out` (this receiver's own buffer,
        // idle: the previous submission was waited for) and releases it
        // back to the external family in GENERAL before the frame's release.
        unsafe {
            cb.pipeline_barrier(&DependencyInfo {
                image_memory_barriers: vec![barrier(true)].into(),
                ..Default::default()
            })
            .unwrap();
            cb.copy_image_to_buffer(&CopyImageToBufferInfo {
                src_image_layout: ImageLayout::General,
                ..CopyImageToBufferInfo::image_buffer(image.clone(), out.clone())
            })
            .unwrap();
            cb.pipeline_barrier(&DependencyInfo {
                image_memory_barriers: vec![barrier(false)].into(),
                buffer_memory_barriers: vec![to_host].into(),
                ..Default::default()
            })
            .unwrap();
        }
        // SAFETY: recording ended once, here.
        let cb = Arc::new(unsafe { cb.end() }.unwrap());
        // SAFETY: as the recording's; submitted once.
        let mut submission = unsafe { interop.submit(&[cb], &[], &[]) }.unwrap();
        submission.wait(WAIT).unwrap();
        drop(submission);
        let pixels = out.read().unwrap().to_vec();
        if let Some((x, y, got, want)) = first_mismatch(&pixels, frame.sequence(), (W, H)) {
            bad += 1;
            eprintln!(
                "frame {} slot {}: pixel ({x}, {y}) is {got:?}, expected {want:?}",
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
    println!("RESULT gaps={gaps}");
    println!("RESULT slots_seen={}", slots_seen.len());
    println!("RESULT dropped={}", rx.session().stats().dropped);
    drop(images);
    drop(rx);
    drop(interop);
    vk.assert_clean();
    println!("RESULT validation_errors=0");
}

/// Two processes: the vulkano sender and the vulkano receiver, every pixel
/// of every frame the receiver took checked, lossless (every frame in
/// order, every slot seen), no validation error in either.
#[test]
fn a_vulkano_receiver_in_another_process_checks_every_pixel() {
    let dir = std::env::temp_dir().join(format!("cvk-frames-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Directory::new(&dir).unwrap();
    let stop = dir.join("stop");
    let envs = vec![
        ("CVK_DIR".to_string(), dir.display().to_string()),
        ("CVK_STOP".to_string(), stop.display().to_string()),
        ("CVK_NAME".to_string(), "vulkano".to_string()),
    ];
    let spawn = |test: &'static str| {
        let envs = envs.clone();
        std::thread::spawn(move || {
            let envs: Vec<(&str, &str)> =
                envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            results(&child::run_with(test, &envs))
        })
    };
    let sender = spawn("child_vulkano_sender");
    let receiver = spawn("child_vulkano_receiver").join();
    // Stop the sender whatever the receiver did, then report.
    std::fs::write(&stop, b"").unwrap();
    let sender = sender.join().expect("the sender");
    let receiver = receiver.expect("the receiver");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(num(&receiver, "checked"), FRAMES);
    assert_eq!(num(&receiver, "bad"), 0, "frames with wrong pixels");
    assert_eq!(
        num(&receiver, "gaps"),
        0,
        "lossless: every frame after the first, in order"
    );
    assert_eq!(num(&receiver, "slots_seen"), u64::from(SLOTS));
    assert_eq!(num(&receiver, "dropped"), 0);
    assert_eq!(num(&receiver, "validation_errors"), 0);
    assert_eq!(num(&sender, "dropped"), 0);
    assert_eq!(num(&sender, "validation_errors"), 0);
    assert!(num(&sender, "presented") >= FRAMES);
}
