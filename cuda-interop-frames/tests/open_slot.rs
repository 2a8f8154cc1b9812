//! A slot written by the application's own submission (`WriteSlot::open`,
//! `OpenSlot::present`), as wgpu or an engine with its own queue writes:
//! the test records and submits on the context's main queue itself (its own
//! command pool, under `with_queue`), waiting for the slot's `ready` value
//! and signalling its own timeline; a Vulkan receiver on a device of its
//! own reads every frame and every texel is the one the application
//! cleared. A present after a timeline of another device is refused with
//! the frame unnumbered, and a slot dropped unpresented is released and
//! free again; the layer reports nothing on either device.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{
    self, AcquireError, Address, ImageSender, SenderError, SenderOptions,
};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::{assert_no_validation_errors, vulkan, Mem};
use vk_export::format::Rgba8Unorm;
use vk_export::{QueueRole, TimelineSemaphore};

mod common;

const W: u32 = 40;
const H: u32 = 24;
const FRAMES: u64 = 6;
const BOUND: Duration = Duration::from_secs(60);

/// The texel frame `f` is cleared to.
fn colour(f: u64) -> [u8; 4] {
    [(f * 40 % 256) as u8, (f * 7 % 256) as u8, 200, 255]
}

#[test]
fn a_slot_written_by_the_applications_own_submission_is_received_texel_for_texel() {
    let dir = std::env::temp_dir().join(format!("cif-open-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let rctx = vulkan(None);
    let opts = SenderOptions {
        semaphores: ctx.supports_semaphore_fds() && rctx.supports_semaphore_fds(),
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "opened".into(),
            },
            W,
            H,
            3,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, Mem>::new(&ctx, opts).unwrap();
    // Connected once the sender answered its subscribe (served here).
    let (session, setup) =
        common::connect_serving(&directory, "opened", Delivery::Lossless, BOUND, || {
            sender.serve(Duration::from_millis(5))
        });
    let vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();
    let written = TimelineSemaphore::new_local(&ctx).unwrap();

    // A present after a timeline of another device: refused, unnumbered;
    // the slot is not released under writes this sender cannot wait for:
    // it stays out of the ring (the twin below: a slot opened and dropped
    // is released and free again).
    let elsewhere = TimelineSemaphore::new_local(&rctx).unwrap();
    let slot = sender
        .acquire(BOUND)
        .unwrap()
        .open(QueueRole::Main)
        .unwrap();
    let e = slot
        .present(sender::monotonic_ns(), (&elsewhere, 1))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SenderError::Vulkan(vk_export::Error::ForeignResource(_))
        ),
        "{e}"
    );
    let kept_out = e.to_string();
    assert!(kept_out.contains("stays out of the ring"), "{kept_out}");
    // Opened and dropped: released, no frame, and free again.
    let (opened, reopened) = {
        let slot = sender
            .acquire(BOUND)
            .unwrap()
            .open(QueueRole::Main)
            .unwrap();
        let index = slot.index();
        drop(slot);
        (index, sender.acquire(BOUND).unwrap().index())
    };
    assert_eq!(opened, reopened, "a slot opened and dropped is free again");
    assert_eq!(sender.stats().presented, 0, "no frame was numbered");
    // The refused slot is out of the ring: two more taken out leave none
    // of the three.
    let two = [(); 2].map(|()| {
        sender
            .acquire(BOUND)
            .unwrap()
            .open_detached(QueueRole::Main)
            .unwrap()
    });
    assert!(
        matches!(
            sender.acquire(Duration::ZERO),
            Err(AcquireError::AllSlotsHeld)
        ),
        "the slot of the refused present was handed out again"
    );
    for frame in two {
        // SAFETY: nothing was submitted that writes the slot.
        unsafe { sender.abandon_opened(frame) }.unwrap();
    }

    // Frames, lossless from the receiver's subscription on: every one read.
    let mut received = Vec::new();
    let mut f = 0;
    let start = Instant::now();
    while received.len() < FRAMES as usize {
        assert!(start.elapsed() < BOUND, "frames received: {received:?}");
        if let Ok(slot) = sender.acquire(Duration::from_millis(100)) {
            let slot = slot.open(QueueRole::Main).unwrap();
            f += 1;
            assert_eq!(slot.sequence(), f);
            let image = slot.resource().raw();
            common::clear_on_own_queue(
                &ctx,
                slot.queue_family(),
                image,
                slot.ready(),
                &written,
                f,
                colour(f),
            );
            assert_eq!(
                slot.present(sender::monotonic_ns(), (&written, f)).unwrap(),
                f
            );
        }
        let wait = Duration::from_millis(if received.is_empty() { 100 } else { 10_000 });
        if let Ok(frame) = vrx.next(wait) {
            let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
            let want = colour(frame.sequence());
            assert!(
                pixels.chunks(4).all(|t| t == want),
                "frame {}: texels differ from {want:?}",
                frame.sequence()
            );
            received.push(frame.sequence());
            vrx.release(frame).unwrap();
        }
    }
    let first = received[0];
    assert_eq!(received, (first..first + FRAMES).collect::<Vec<_>>());
    drop(vrx);
    drop(sender);
    drop((written, elsewhere));
    assert_no_validation_errors(&ctx);
    assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A present whose wait never arrives in time: `OpenSlot::present` returns
/// the timeout, the frame keeps its number (a later frame is the next
/// number: no second signal of one "produced" value) and the slot is
/// released once (the drop does not release it again); once the value
/// arrives, the next frame goes out. The layer reports nothing.
#[test]
fn a_present_that_times_out_keeps_its_number_and_the_next_frame_goes_out() {
    let ctx = vulkan(None);
    let dir = std::env::temp_dir().join(format!("cif-open-late-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = SenderOptions {
        semaphores: ctx.supports_semaphore_fds(),
        hold_timeout: Duration::from_millis(100),
        ..SenderOptions::new(
            Address::Named {
                directory: Directory::new(&dir).unwrap(),
                name: "late".into(),
            },
            W,
            H,
            2,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, Mem>::new(&ctx, opts).unwrap();
    let written = TimelineSemaphore::new_local(&ctx).unwrap();
    let slot = sender
        .acquire(BOUND)
        .unwrap()
        .open(QueueRole::Main)
        .unwrap();
    assert_eq!(slot.sequence(), 1);
    // Nobody signals 10 before the present's bound.
    let e = slot
        .present(sender::monotonic_ns(), (&written, 10))
        .unwrap_err();
    assert!(
        matches!(&e, SenderError::Vulkan(vk_export::Error::Timeout(_))),
        "{e}"
    );
    assert_eq!(
        sender.stats().presented,
        1,
        "the late frame keeps its number"
    );
    // It arrives: the release behind it runs; the next frame is number 2.
    written.signal(10).unwrap();
    let slot = sender
        .acquire(BOUND)
        .unwrap()
        .open(QueueRole::Main)
        .unwrap();
    assert_eq!(slot.sequence(), 2);
    let image = slot.resource().raw();
    common::clear_on_own_queue(
        &ctx,
        slot.queue_family(),
        image,
        slot.ready(),
        &written,
        11,
        colour(11),
    );
    assert_eq!(
        slot.present(sender::monotonic_ns(), (&written, 11))
            .unwrap(),
        2
    );
    drop(sender);
    assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
