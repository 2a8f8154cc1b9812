//! Host-visible slots lent to a host writer (`WriteSlot::lend`,
//! `Sender::present_lent`): what a GStreamer sink offers its upstream
//! element to write the frame into, with no copy at the sink. On lavapipe
//! with the validation layer; a host receiver in another context of this
//! process reads each frame as a peer process would. Each check beside its
//! twin:
//!
//! * bytes written through the lent pointer are the frame the receiver
//!   reads, frame after frame, numbered in order;
//! * a lent slot is out of the ring (a ring of two with two lent hands out
//!   nothing), and a `LentSlot` dropped unpresented gives its slot back with
//!   no frame numbered;
//! * a slot lent by another sender is refused, and that sender still
//!   presents it;
//! * a sender dropped while a slot is lent hands the slot's buffer to the
//!   `LentSlot`: the mapping is still written and read after the drop.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{
    monotonic_ns, AcquireError, Address, LentSlot, Sender, SenderError, SenderOptions,
};
use cuda_interop_frames::transport::ConsumerError;
use cuda_interop_testkit::{assert_no_validation_errors, vulkan};
use vk_export::markers::HostVisible;
use vk_export::Context;

mod common;

const W: u32 = 40;
const H: u32 = 18;
const BOUND: Duration = Duration::from_secs(60);

/// Frame `f`'s bytes: every byte differs from its neighbours and from
/// other frames' at the same place.
fn frame_bytes(f: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 7 + f * 31 + i as u64 / 251) as u8)
        .collect()
}

fn sender(ctx: &Context, directory: &Directory, name: &str, slots: u32) -> Sender<HostVisible> {
    let opts = SenderOptions {
        // A host-visible ring of lavapipe: no semaphores.
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: name.into(),
            },
            W,
            H,
            slots,
        )
    };
    Sender::<HostVisible>::new(ctx, opts).unwrap()
}

fn directory(tag: &str) -> Directory {
    let dir = std::env::temp_dir().join(format!("cif-lent-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Directory::new(&dir).unwrap()
}

/// Writes `bytes` at the start of `lent`'s slot.
fn write(lent: &LentSlot, bytes: &[u8]) {
    assert!(bytes.len() <= lent.size());
    // SAFETY: the slot is lent (out of the ring, no receiver reads it),
    // `bytes.len()` of its `size()` mapped bytes, one writer, and no
    // receiver of this ring in this process was dropped for a hold timeout.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), lent.as_mut_ptr(), bytes.len()) };
}

#[test]
fn frames_written_through_lent_slots_are_read_back_exact() {
    let directory = directory("frames");
    let ctx = vulkan(None);
    let mut tx = sender(&ctx, &directory, "lent", 3);
    let (session, setup) =
        common::connect_serving(&directory, "lent", Delivery::Lossless, BOUND, || {
            tx.serve(Duration::from_millis(5))
        });
    let rx = HostReceiver::from_session(session, setup).unwrap();
    let len = rx.frame_bytes() as usize;
    assert_eq!(len, (W * H * 4) as usize);

    let start = Instant::now();
    for f in 1..=6u64 {
        let want = frame_bytes(f, len);
        let lent = tx.acquire(BOUND).unwrap().lend().unwrap();
        write(&lent, &want);
        assert_eq!(tx.present_lent(lent, monotonic_ns()).unwrap(), f);
        let frame = loop {
            tx.serve(Duration::ZERO);
            match rx.next(Duration::from_millis(50)) {
                Ok(frame) => break frame,
                Err(ConsumerError::Timeout(_)) => assert!(start.elapsed() < BOUND),
                Err(e) => panic!("frame {f}: {e}"),
            }
        };
        assert_eq!(frame.sequence(), f);
        let got = rx.read(&frame, Duration::from_secs(10)).unwrap();
        assert!(got == want, "frame {f}: not the bytes written");
        rx.release(frame).unwrap();
    }
    drop(rx);
    drop(tx);
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_lent_slot_is_out_of_the_ring_until_presented_or_dropped() {
    let directory = directory("ring");
    let ctx = vulkan(None);
    let mut tx = sender(&ctx, &directory, "ring", 2);
    let first = tx.acquire(BOUND).unwrap().lend().unwrap();
    let second = tx.acquire(BOUND).unwrap().lend().unwrap();
    assert_ne!(first.index(), second.index());
    // No slot free now: `acquire_free` says so and counts nothing (the
    // caller has somewhere else for the frame); its twin `acquire` counts
    // a skipped frame.
    assert!(
        tx.acquire_free().is_none(),
        "a ring of two with two slots lent handed one out"
    );
    assert_eq!(tx.stats().skipped, 0);
    assert!(
        matches!(tx.acquire(Duration::ZERO), Err(AcquireError::AllSlotsHeld)),
        "a ring of two with two slots lent handed one out"
    );
    assert_eq!(tx.stats().skipped, 1);
    // Dropped unpresented: the slot is back, no frame numbered.
    let dropped = first.index();
    drop(first);
    let again = tx.acquire(Duration::ZERO).unwrap().lend().unwrap();
    assert_eq!(again.index(), dropped);
    assert_eq!(tx.stats().presented, 0);
    // Presented: back in the ring too.
    let presented = second.index();
    write(&second, &frame_bytes(1, 16));
    assert_eq!(tx.present_lent(second, monotonic_ns()).unwrap(), 1);
    assert_eq!(tx.acquire(Duration::ZERO).unwrap().index(), presented);
    drop(again);
    drop(tx);
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_slot_lent_by_another_sender_is_refused() {
    let directory = directory("other");
    let ctx = vulkan(None);
    let mut a = sender(&ctx, &directory, "a", 2);
    let mut b = sender(&ctx, &directory, "b", 2);
    let lent = a.acquire(BOUND).unwrap().lend().unwrap();
    let e = b.present_lent(lent, monotonic_ns()).unwrap_err();
    assert!(
        matches!(&e, SenderError::Vulkan(vk_export::Error::InvalidArgument(why)) if why.contains("another sender")),
        "{e}"
    );
    assert_eq!(b.stats().presented, 0);
    // Refused and dropped: `a` has its slot back, and presents a lent slot
    // of its own (the twin).
    let own = a.acquire(Duration::ZERO).unwrap().lend().unwrap();
    write(&own, &frame_bytes(2, 16));
    assert_eq!(a.present_lent(own, monotonic_ns()).unwrap(), 1);
    drop((a, b));
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_sender_dropped_while_a_slot_is_lent_leaves_the_slot_writable() {
    let directory = directory("drop");
    let ctx = vulkan(None);
    let mut tx = sender(&ctx, &directory, "drop", 2);
    let lent = tx.acquire(BOUND).unwrap().lend().unwrap();
    let size = lent.size();
    drop(tx);
    // The name is gone with the sender; the slot's buffer lives on in the
    // `LentSlot`, its mapping written and read whole.
    assert!(directory.list().unwrap().is_empty());
    let want = frame_bytes(3, size);
    write(&lent, &want);
    let mut got = vec![0u8; size];
    // SAFETY: as in `write`: the slot's `size` mapped bytes, lent, one
    // accessor.
    unsafe { std::ptr::copy_nonoverlapping(lent.as_mut_ptr(), got.as_mut_ptr(), size) };
    assert!(got == want);
    drop(lent);
    assert_no_validation_errors(&ctx);
}
