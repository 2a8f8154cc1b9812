//! Publishing an image the application made without external memory (a
//! render target) by a GPU copy into an image ring's slot
//! (`WriteSlot::present_copy`), on lavapipe with the validation layer: a
//! Vulkan receiver on a device of its own reads every frame back and every
//! texel is the application's; a copy that cannot fit the ring is refused
//! before anything is recorded, with the slot left free and the frame
//! unnumbered. One process, two devices (lavapipe has one queue family:
//! the transfer queue is the main queue there; on the H200 a source owned
//! by the main family is copied on the main queue).

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{self, Address, ImageSender, SenderError, SenderOptions};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::app_image::AppImage;
use cuda_interop_testkit::{assert_no_validation_errors, pattern, vulkan, Mem};
use vk_export::ash::vk;
use vk_export::format::Rgba8Unorm;
use vk_export::{QueueRole, SourceImage, SourceSharing};

mod common;

const W: u32 = 48;
const H: u32 = 32;
const SLOTS: u32 = 3;
const FRAMES: u32 = 6;
/// Bound on every loop of this test.
const BOUND: Duration = Duration::from_secs(60);

/// The source as the application describes it.
///
/// # Safety
/// As `SourceImage::new`: `app` is a live RGBA8 image of the sender's
/// device in `app.layout`, owned by `app.family`, filled by a completed
/// submission, untouched by anything else while it lives.
unsafe fn source_of(app: &AppImage, extent: [u32; 2]) -> SourceImage<Rgba8Unorm> {
    // SAFETY: forwarded.
    unsafe {
        SourceImage::new(
            app.image,
            extent,
            app.layout,
            SourceSharing::Exclusive(app.family),
        )
    }
    .unwrap()
}

#[test]
fn an_application_image_is_published_by_a_copy_and_received_texel_for_texel() {
    let dir = std::env::temp_dir().join(format!("cif-copy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let rctx = vulkan(None);
    let opts = SenderOptions {
        semaphores: false,
        ..SenderOptions::new(
            Address::Named {
                directory: directory.clone(),
                name: "copied".into(),
            },
            W,
            H,
            SLOTS,
        )
    };
    let mut sender = ImageSender::<Rgba8Unorm, Mem>::new(&ctx, opts).unwrap();
    // Connected once the sender answered its subscribe (served here).
    let (session, setup) =
        common::connect_serving(&directory, "copied", Delivery::Lossless, BOUND, || {
            sender.serve(Duration::from_millis(5))
        });
    let vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();

    // Refused before anything is recorded: a source smaller than the ring,
    // a region at an offset past its edge. The slot stays free, no number.
    let small = AppImage::new(
        &ctx,
        [W - 1, H],
        &pattern(((W - 1) * H * 4) as usize, 1),
        vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
        QueueRole::Main,
    );
    let slot = sender.acquire(BOUND).unwrap();
    // SAFETY: see source_of; `small` lives until the end of the test.
    let e = slot
        .present_copy(
            sender::monotonic_ns(),
            &unsafe { source_of(&small, [W - 1, H]) },
            None,
        )
        .unwrap_err();
    assert!(
        matches!(&e, SenderError::Vulkan(vk_export::Error::InvalidArgument(m))
            if m.contains("region at [0, 0] of a 47x32 source does not fit")),
        "{e}"
    );
    let exact = AppImage::new(
        &ctx,
        [W, H],
        &pattern((W * H * 4) as usize, 2),
        vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
        QueueRole::Main,
    );
    let slot = sender.acquire(BOUND).unwrap();
    // SAFETY: as above.
    let shifted = unsafe { source_of(&exact, [W, H]) }.with_offset([0, 1]);
    assert!(slot
        .present_copy(sender::monotonic_ns(), &shifted, None)
        .is_err());
    // A wait on a timeline of another device.
    let elsewhere = vk_export::TimelineSemaphore::new_local(&rctx).unwrap();
    let slot = sender.acquire(BOUND).unwrap();
    // SAFETY: as above.
    let source = unsafe { source_of(&exact, [W, H]) };
    let e = slot
        .present_copy(sender::monotonic_ns(), &source, Some((&elsewhere, 1)))
        .unwrap_err();
    assert!(
        matches!(
            &e,
            SenderError::Vulkan(vk_export::Error::ForeignResource(_))
        ),
        "{e}"
    );
    assert_eq!(sender.stats().presented, 0, "no frame was numbered");
    // The application's "rendering done" timeline (signalled from the host
    // here: lavapipe's timelines are local), waited for by the copies.
    let rendered = vk_export::TimelineSemaphore::new_local(&ctx).unwrap();

    // Frames: each a fresh "render" of its own texels, in a layout a
    // renderer leaves a render target in, copied into the ring. The first
    // is presented until the receiver gets one (frames reach a receiver
    // only once the sender handled its subscribe, which it did before the
    // connect above returned); from then on it is served lossless: every
    // frame, in order.
    let mut expected = std::collections::HashMap::new();
    let mut received = Vec::new();
    let mut last = 0;
    for f in 1..=FRAMES {
        let texels = pattern((W * H * 4) as usize, 100 + f);
        let layout = if f % 2 == 0 {
            vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL
        } else {
            vk::ImageLayout::TRANSFER_SRC_OPTIMAL
        };
        let app = AppImage::new(&ctx, [W, H], &texels, layout, QueueRole::Main);
        if f % 2 == 0 {
            rendered.signal(u64::from(f)).unwrap();
        }
        // SAFETY: see source_of; `app` lives until its frames were read.
        let source = unsafe { source_of(&app, [W, H]) };
        // Twice on the last frame: the source was left in its layout, so a
        // second copy from the same facts is valid, and identical.
        for _ in 0..if f == FRAMES { 2 } else { 1 } {
            let start = Instant::now();
            let mut presented = false;
            'frame: loop {
                assert!(start.elapsed() < BOUND, "frame {f} never arrived");
                // A slot the receiver holds unread is not waited for here:
                // its frames are read below.
                if !presented || received.is_empty() {
                    if let Ok(slot) = sender.acquire(Duration::from_millis(100)) {
                        let wait = (f % 2 == 0).then_some((&rendered, u64::from(f)));
                        let seq = slot
                            .present_copy(sender::monotonic_ns(), &source, wait)
                            .unwrap_or_else(|e| {
                                panic!("frame {f} (presented so far: {last}): {e}")
                            });
                        assert_eq!(seq, last + 1, "one number per presented frame");
                        last = seq;
                        expected.insert(seq, texels.clone());
                        presented = true;
                    }
                }
                let wait = Duration::from_millis(if received.is_empty() { 100 } else { 10_000 });
                while let Ok(frame) = vrx.next(wait) {
                    let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
                    assert!(
                        pixels == expected[&frame.sequence()],
                        "frame {}: texels differ from the application's",
                        frame.sequence()
                    );
                    received.push(frame.sequence());
                    let done = presented && frame.sequence() == last;
                    vrx.release(frame).unwrap();
                    if done {
                        break 'frame;
                    }
                }
            }
        }
        drop(app);
    }
    // Lossless from its first frame on: every later frame, in order.
    let first = received[0];
    assert_eq!(received, (first..=last).collect::<Vec<_>>());
    assert!(received.len() > FRAMES as usize);
    assert_eq!(vrx.session().stats().dropped, 0);
    drop(vrx);
    drop(sender);
    drop((small, exact, rendered, elsewhere));
    assert_no_validation_errors(&ctx);
    assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
