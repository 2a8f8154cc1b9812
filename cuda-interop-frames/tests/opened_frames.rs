//! Slots opened for the application's own submissions without a borrow of
//! the sender (`WriteSlot::open_detached`, `Sender::present_opened`,
//! `Sender::abandon_opened`): what the C ABI's `ci_sender_open` hands out.
//! The test plays the application: its own command pool, its own
//! submissions on the context's main queue (under `with_queue`), each
//! waiting for the frame's `ready` value and signalling its own timeline.
//! On lavapipe with the validation layer; a Vulkan receiver on a device of
//! its own checks every texel of every frame.
//!
//! * Two frames opened before either is written (two in flight), written
//!   in the reverse order, presented in order: every frame arrives texel
//!   for texel, numbered without a gap; a frame opened, written and
//!   abandoned numbers nothing and is never received.
//! * An opened slot is out of the ring (a ring of two with two opened
//!   hands out nothing) until it is presented or abandoned, and back after.
//! * A frame of another sender is refused (and a frame of its own, the
//!   twin, is taken); a written timeline of another context is refused
//!   before anything is released.
//! * A sender dropped with a frame opened leaks the slot: the
//!   application's write after the drop is valid (the layer says nothing).

use std::time::Duration;

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{
    self, AcquireError, Address, ImageSender, OpenedFrame, SenderError, SenderOptions,
};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::{assert_no_validation_errors, vulkan, Mem};
use vk_export::format::Rgba8Unorm;
use vk_export::{Context, QueueRole, TimelineSemaphore};

mod common;

const W: u32 = 40;
const H: u32 = 24;
const PAIRS: u64 = 4;
const BOUND: Duration = Duration::from_secs(60);

/// The texel frame `f` is cleared to.
fn colour(f: u64) -> [u8; 4] {
    [(f * 40 % 256) as u8, (f * 7 % 256) as u8, 200, 255]
}

/// A colour no presented frame has.
const JUNK: [u8; 4] = [1, 2, 3, 4];

/// A sender of `slots` images named `name` in `dir`.
fn image_sender(
    ctx: &Context,
    dir: &Directory,
    name: &str,
    slots: u32,
) -> ImageSender<Rgba8Unorm, Mem> {
    let opts = SenderOptions {
        semaphores: ctx.supports_semaphore_fds(),
        ..SenderOptions::new(
            Address::Named {
                directory: dir.clone(),
                name: name.into(),
            },
            W,
            H,
            slots,
        )
    };
    ImageSender::<Rgba8Unorm, Mem>::new(ctx, opts).unwrap()
}

/// Clears opened `frame`'s image to `texel` in the application's own
/// submission, signalling `written` = `value`.
fn write(
    sender: &ImageSender<Rgba8Unorm, Mem>,
    frame: &OpenedFrame,
    written: &TimelineSemaphore,
    value: u64,
    texel: [u8; 4],
) {
    let image = sender.images()[frame.index() as usize].raw();
    let ctx = written.context();
    common::clear_on_own_queue(
        ctx,
        frame.queue_family(),
        image,
        frame.ready(),
        written,
        value,
        texel,
    );
}

/// A slot of `sender` opened for the application's own submissions on the
/// main queue.
fn open(sender: &mut ImageSender<Rgba8Unorm, Mem>) -> OpenedFrame {
    sender
        .acquire(BOUND)
        .unwrap()
        .open_detached(QueueRole::Main)
        .unwrap()
}

fn temp_dir(what: &str) -> (std::path::PathBuf, Directory) {
    let dir = std::env::temp_dir().join(format!("cif-opened-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    (dir, directory)
}

#[test]
fn frames_written_by_the_applications_own_submissions_arrive_texel_for_texel() {
    let (dir, directory) = temp_dir("texels");
    let ctx = vulkan(None);
    let rctx = vulkan(None);
    let mut sender = image_sender(&ctx, &directory, "opened", 4);
    let (session, setup) =
        common::connect_serving(&directory, "opened", Delivery::Lossless, BOUND, || {
            sender.serve(Duration::from_millis(5))
        });
    let vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();
    let written = TimelineSemaphore::new_local(&ctx).unwrap();
    let mut value = 0;
    let mut presented = Vec::new();
    let mut received = Vec::new();
    for pair in 0..PAIRS {
        // Two frames open at once, the sender free between (it serves).
        let a = open(&mut sender);
        sender.serve(Duration::ZERO);
        let b = open(&mut sender);
        assert_ne!(a.index(), b.index());
        let next = sender.stats().presented + 1;
        // Written in the reverse order, presented in order: a is `next`.
        write(&sender, &b, &written, value + 1, colour(next + 1));
        write(&sender, &a, &written, value + 2, colour(next));
        value += 2;
        if pair == 1 {
            // Opened, written, abandoned: no number, never received.
            let c = open(&mut sender);
            value += 1;
            write(&sender, &c, &written, value, JUNK);
            // SAFETY: the application's write of the slot completed
            // (`write` waited for its timeline value).
            unsafe { sender.abandon_opened(c) }.unwrap();
        }
        let fa = sender
            .present_opened(a, sender::monotonic_ns(), (&written, value))
            .unwrap();
        let fb = sender
            .present_opened(b, sender::monotonic_ns(), (&written, value - 1))
            .unwrap();
        presented.extend([fa, fb]);
        for _ in 0..2 {
            let frame = vrx.next(Duration::from_secs(10)).unwrap();
            let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
            let want = colour(frame.sequence());
            assert_eq!(pixels.len(), (W * H * 4) as usize);
            assert!(
                pixels.chunks(4).all(|t| t == want),
                "frame {}: texels differ from {want:?}",
                frame.sequence()
            );
            received.push(frame.sequence());
            vrx.release(frame).unwrap();
        }
    }
    let all: Vec<u64> = (1..=2 * PAIRS).collect();
    assert_eq!(presented, all, "numbered in present order, no gap");
    assert_eq!(received, all, "every frame, in order");
    drop(vrx);
    drop(sender);
    drop(written);
    assert_no_validation_errors(&ctx);
    assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_opened_slot_is_out_of_the_ring_until_presented_or_abandoned() {
    let (dir, directory) = temp_dir("ring");
    let ctx = vulkan(None);
    let mut sender = image_sender(&ctx, &directory, "ring", 2);
    let written = TimelineSemaphore::new_local(&ctx).unwrap();
    let a = open(&mut sender);
    // Twin: with one slot opened, the other is still handed out.
    let b = open(&mut sender);
    assert_ne!(a.index(), b.index());
    // Both opened: nothing is handed out (at once: no receiver holds them).
    assert!(matches!(
        sender.acquire(Duration::from_millis(10)),
        Err(AcquireError::AllSlotsHeld)
    ));
    // Abandoned (nothing was submitted): back, no frame numbered.
    let b_index = b.index();
    // SAFETY: no submission of the application writes the slot.
    unsafe { sender.abandon_opened(b) }.unwrap();
    assert_eq!(sender.stats().presented, 0);
    let again = sender.acquire(BOUND).unwrap().index();
    assert_eq!(again, b_index);
    // Presented: back too.
    write(&sender, &a, &written, 1, colour(1));
    assert_eq!(
        sender
            .present_opened(a, sender::monotonic_ns(), (&written, 1))
            .unwrap(),
        1
    );
    let c = open(&mut sender);
    let d = open(&mut sender);
    assert_ne!(c.index(), d.index());
    // SAFETY: no submission of the application writes either slot.
    unsafe {
        sender.abandon_opened(c).unwrap();
        sender.abandon_opened(d).unwrap();
    }
    drop(sender);
    drop(written);
    assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_frame_of_another_sender_or_a_foreign_timeline_is_refused() {
    let (dir, directory) = temp_dir("refused");
    let ctx = vulkan(None);
    let other_ctx = vulkan(None);
    let mut one = image_sender(&ctx, &directory, "one", 2);
    let mut two = image_sender(&ctx, &directory, "two", 2);
    let written = TimelineSemaphore::new_local(&ctx).unwrap();
    let elsewhere = TimelineSemaphore::new_local(&other_ctx).unwrap();

    // Another sender's frame: refused, `two` unchanged.
    let theirs = open(&mut one);
    write(&one, &theirs, &written, 1, colour(1));
    let e = two
        .present_opened(theirs, sender::monotonic_ns(), (&written, 1))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SenderError::Vulkan(vk_export::Error::InvalidArgument(_))
        ),
        "{e}"
    );
    assert_eq!(two.stats().presented, 0);
    // Spent: `one` keeps that slot out of its ring (one slot left).
    let left = open(&mut one);
    assert!(matches!(
        one.acquire(Duration::from_millis(10)),
        Err(AcquireError::AllSlotsHeld)
    ));
    // Twin: its own sender takes it.
    write(&one, &left, &written, 2, colour(1));
    assert_eq!(
        one.present_opened(left, sender::monotonic_ns(), (&written, 2))
            .unwrap(),
        1
    );

    // A written timeline of another context: refused before any release;
    // the slot stays out of the ring (the writes may be pending).
    let mine = open(&mut two);
    let e = two
        .present_opened(mine, sender::monotonic_ns(), (&elsewhere, 1))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SenderError::Vulkan(vk_export::Error::ForeignResource(_))
        ),
        "{e}"
    );
    assert_eq!(two.stats().presented, 0);
    // Twin: the same with the context's own timeline is presented.
    let ok = open(&mut two);
    write(&two, &ok, &written, 3, colour(1));
    assert_eq!(
        two.present_opened(ok, sender::monotonic_ns(), (&written, 3))
            .unwrap(),
        1
    );
    // ...and the refused slot is still out: only the presented one comes.
    let back_index = two.acquire(BOUND).unwrap().index();
    let out = open(&mut two);
    assert_eq!(out.index(), back_index);
    assert!(matches!(
        two.acquire(Duration::from_millis(10)),
        Err(AcquireError::AllSlotsHeld)
    ));
    // SAFETY: nothing of the application writes the slot.
    unsafe { two.abandon_opened(out) }.unwrap();

    // A sender dropped with a frame opened leaks the slot (and the ready
    // timeline): the application's write after the drop is valid.
    let late = open(&mut one);
    let image = one.images()[late.index() as usize].raw();
    drop(one);
    common::clear_on_own_queue(
        &ctx,
        late.queue_family(),
        image,
        late.ready(),
        &written,
        4,
        JUNK,
    );
    drop(late);
    drop(two);
    drop(written);
    assert_no_validation_errors(&ctx);
    assert_no_validation_errors(&other_ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A present refused before anything was submitted (called from inside
/// `with_queue`, which would wait for its own lock) waited for nothing:
/// the slot is kept out of the ring, never released and handed out under
/// the application's writes. The twin: the same slot presented normally
/// comes back.
#[test]
fn a_present_refused_before_submitting_keeps_the_slot_out_of_the_ring() {
    let (dir, directory) = temp_dir("refused-in-queue");
    let ctx = vulkan(None);
    let mut sender = image_sender(&ctx, &directory, "refused", 2);
    let written = TimelineSemaphore::new_local(&ctx).unwrap();
    // Twin: opened, written, presented: the slot comes back.
    let a = open(&mut sender);
    let a_index = a.index();
    write(&sender, &a, &written, 1, colour(1));
    sender
        .present_opened(a, sender::monotonic_ns(), (&written, 1))
        .unwrap();
    // Refused: presented from inside with_queue.
    let b = open(&mut sender);
    let b_index = b.index();
    let ctx2 = ctx.clone();
    let refused = ctx2
        .with_queue(|_| sender.present_opened(b, sender::monotonic_ns(), (&written, 2)))
        .unwrap();
    assert!(
        refused.is_err(),
        "a present from inside with_queue was taken"
    );
    assert_eq!(sender.stats().presented, 1, "nothing numbered");
    // Only the presented slot is handed out from now on.
    for _ in 0..3 {
        let next = sender.acquire(BOUND).unwrap().index();
        assert_ne!(next, b_index, "the refused slot was handed out again");
        assert_eq!(next, a_index);
    }
    drop(sender);
    assert_no_validation_errors(&ctx);
    let _ = std::fs::remove_dir_all(dir);
}
