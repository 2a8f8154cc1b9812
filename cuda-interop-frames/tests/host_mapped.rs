//! Host-visible buffer rings written and read by the host through the
//! slots' mappings (lavapipe): `WriteSlot::present_bytes` publishes bytes
//! the CPU made, and `HostReceiver::read_into` (and `read`, built on it)
//! gets exactly them, frame after frame, into memory the caller reuses; a
//! receiver in another context of the same process reads them as a peer
//! process would. The checks, each with its twin beside it: bytes that do
//! not fit the slot are refused and leave the slot free with no frame
//! numbered, and memory of the wrong size is refused for a read while the
//! frame stays readable; the layer reports nothing.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{self, Address, Sender, SenderError, SenderOptions};
use cuda_interop_frames::transport::ConsumerError;
use cuda_interop_testkit::{assert_no_validation_errors, vulkan};
use vk_export::markers::HostVisible;

mod common;

const W: u32 = 48;
const H: u32 = 20;
const FRAMES: u64 = 8;
const BOUND: Duration = Duration::from_secs(60);

/// Frame `f`'s bytes: every byte differs from its neighbours and from
/// other frames' at the same place.
fn frame_bytes(f: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 7 + f * 31 + i as u64 / 251) as u8)
        .collect()
}

#[test]
fn bytes_presented_by_the_host_are_read_back_exact_through_the_mappings() {
    let dir = std::env::temp_dir().join(format!("cif-mapped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let opts = SenderOptions {
        // Host-visible ring of lavapipe: no semaphores, as the demo makes.
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "mapped".into(),
            },
            W,
            H,
            3,
        )
    };
    let mut sender = Sender::<HostVisible>::new(&ctx, opts).unwrap();
    let slot_size = sender.buffers()[0].size() as usize;
    let len = (W * H * 4) as usize;
    assert!(slot_size >= len);
    let (session, setup) =
        common::connect_serving(&directory, "mapped", Delivery::Lossless, BOUND, || {
            sender.serve(Duration::from_millis(5))
        });
    // A context of its own: imports the sender's fds as another process.
    let rx = HostReceiver::from_session(session, setup).unwrap();
    let frame_len = rx.frame_bytes() as usize;
    assert_eq!(frame_len, len);

    // Refused, each: nothing, and more than the slot holds. The slot stays
    // free and no frame is numbered; the twin below presents the same
    // slot's bytes.
    for bad in [Vec::new(), vec![0u8; slot_size + 1]] {
        let e = sender
            .acquire(BOUND)
            .unwrap()
            .present_bytes(sender::monotonic_ns(), &bad)
            .unwrap_err();
        assert!(
            matches!(
                &e,
                SenderError::Vulkan(vk_export::Error::InvalidArgument(_))
            ),
            "{} bytes: {e}",
            bad.len()
        );
    }
    assert_eq!(sender.stats().presented, 0, "no frame was numbered");

    let mut reused = vec![0u8; frame_len];
    let mut received = Vec::new();
    let start = Instant::now();
    for f in 1..=FRAMES {
        assert!(start.elapsed() < BOUND, "frames received: {received:?}");
        let want = frame_bytes(f, len);
        let slot = sender.acquire(BOUND).unwrap();
        assert_eq!(
            slot.present_bytes(sender::monotonic_ns(), &want).unwrap(),
            f
        );
        let frame = loop {
            sender.serve(Duration::ZERO);
            match rx.next(Duration::from_millis(50)) {
                Ok(frame) => break frame,
                Err(ConsumerError::Timeout(_)) => assert!(start.elapsed() < BOUND),
                Err(e) => panic!("frame {f}: {e}"),
            }
        };
        assert_eq!(frame.sequence(), f);
        if f == 1 {
            // The wrong size, either way: refused, the frame still held and
            // readable (the twin: the read after it).
            for wrong in [frame_len - 1, frame_len + 1] {
                let mut out = vec![0u8; wrong];
                let e = rx
                    .read_into(&frame, &mut out, Duration::from_secs(10))
                    .unwrap_err();
                assert!(
                    matches!(&e, ConsumerError::Protocol(why) if why.contains("frame_bytes")),
                    "{wrong} bytes: {e}"
                );
            }
            let bytes = rx.read(&frame, Duration::from_secs(10)).unwrap();
            assert!(
                bytes == want,
                "frame {f} through read: not the bytes presented"
            );
        }
        rx.read_into(&frame, &mut reused, Duration::from_secs(10))
            .unwrap();
        assert!(
            reused == want,
            "frame {f} through read_into: not the bytes presented"
        );
        received.push(f);
        rx.release(frame).unwrap();
        sender.serve(Duration::ZERO);
    }
    assert_eq!(received, (1..=FRAMES).collect::<Vec<_>>());
    drop(rx);
    drop(sender);
    assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
