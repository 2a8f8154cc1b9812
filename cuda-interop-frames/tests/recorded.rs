//! Frames recorded into the application's own command buffer
//! (`WriteSlot::record_copy_into`, `Sender::present_recorded`): an engine
//! that records the copy of its render target into the frame's command
//! buffer, submits it itself, and presents once its fence says it ran. On
//! lavapipe with the validation layer; a Vulkan receiver on a device of its
//! own checks every texel of every frame.
//!
//! * Two frames recorded before either is submitted (two frames in
//!   flight), presented after: both arrive, in order, texel for texel.
//! * A recorded slot is out of the ring until presented (a ring of two
//!   with two recorded hands out nothing), and back after.
//! * A frame of another sender is refused; an abandoned frame numbers
//!   nothing and gives its slot back.

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{
    self, AcquireError, Address, ImageSender, RecordedFrame, SenderError, SenderOptions,
};
use cuda_interop_frames::vulkan_receiver::VulkanReceiver;
use cuda_interop_testkit::app_image::AppImage;
use cuda_interop_testkit::{assert_no_validation_errors, pattern, vulkan, Mem};
use vk_export::ash::vk;
use vk_export::format::Rgba8Unorm;
use vk_export::{Context, QueueRole, SourceImage, SourceSharing};

mod common;

const W: u32 = 40;
const H: u32 = 24;
const BOUND: Duration = Duration::from_secs(60);

/// The engine's side: a command pool of the main family, one command
/// buffer and fence per frame in flight.
struct Engine {
    ctx: Context,
    pool: vk::CommandPool,
}

impl Engine {
    fn new(ctx: &Context) -> Engine {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(ctx.queue_family())
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: a valid create info for the context's device.
        let pool = unsafe { ctx.device().create_command_pool(&info, None) }.unwrap();
        Engine {
            ctx: ctx.clone(),
            pool,
        }
    }

    /// A command buffer in the recording state.
    fn begin(&self) -> vk::CommandBuffer {
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let d = self.ctx.device();
        // SAFETY: the pool is ours, of this device.
        let cmd = unsafe { d.allocate_command_buffers(&info) }.unwrap()[0];
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: a fresh command buffer.
        unsafe { d.begin_command_buffer(cmd, &begin) }.unwrap();
        cmd
    }

    /// Ends and submits `cmd` on the main queue; its fence.
    fn submit(&self, cmd: vk::CommandBuffer) -> vk::Fence {
        let d = self.ctx.device();
        // SAFETY: a command buffer in the recording state, ours.
        unsafe { d.end_command_buffer(cmd) }.unwrap();
        // SAFETY: a valid create info.
        let fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }.unwrap();
        let cmds = [cmd];
        let submit = vk::SubmitInfo::default().command_buffers(&cmds);
        self.ctx
            .with_queue_of(QueueRole::Main, |queue| {
                // SAFETY: the queue is locked for this call; the command
                // buffer is executable, the fence unsignalled.
                unsafe { d.queue_submit(queue, &[submit], fence) }
            })
            .unwrap()
            .unwrap();
        fence
    }

    fn wait(&self, fence: vk::Fence) {
        let d = self.ctx.device();
        // SAFETY: our fence; bounded.
        unsafe { d.wait_for_fences(&[fence], true, 30_000_000_000) }.unwrap();
        // SAFETY: signalled: nothing uses it.
        unsafe { d.destroy_fence(fence, None) };
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: every fence was waited for: no command buffer of the
        // pool is pending.
        unsafe { self.ctx.device().destroy_command_pool(self.pool, None) };
    }
}

/// The render target as the engine describes it.
///
/// # Safety
/// As `SourceImage::new`, for `app`.
unsafe fn source_of(app: &AppImage) -> SourceImage<Rgba8Unorm> {
    // SAFETY: forwarded.
    unsafe {
        SourceImage::new(
            app.image,
            [W, H],
            app.layout,
            SourceSharing::Exclusive(app.family),
        )
    }
    .unwrap()
}

fn options(directory: &Directory, name: &str, slots: u32) -> SenderOptions {
    SenderOptions {
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
    }
}

#[test]
fn frames_recorded_in_the_engines_command_buffer_arrive_texel_for_texel() {
    let dir = std::env::temp_dir().join(format!("cif-recorded-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let rctx = vulkan(None);
    let mut sender =
        ImageSender::<Rgba8Unorm, Mem>::new(&ctx, options(&directory, "rec", 3)).unwrap();
    let (session, setup) =
        common::connect_serving(&directory, "rec", Delivery::Lossless, BOUND, || {
            sender.serve(Duration::from_millis(5))
        });
    let vrx = VulkanReceiver::<Rgba8Unorm, Mem>::new(&rctx, session, setup).unwrap();
    let engine = Engine::new(&ctx);

    let mut expected = Vec::new();
    let mut last = 0u64;
    for round in 0..3u32 {
        // Two frames in flight: both recorded and submitted before either
        // is presented; their render targets differ.
        let mut in_flight: Vec<(RecordedFrame, vk::Fence, AppImage)> = Vec::new();
        for k in 0..2u32 {
            let texels = pattern((W * H * 4) as usize, 10 * round + k + 1);
            let app = AppImage::new(
                &ctx,
                [W, H],
                &texels,
                vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
                QueueRole::Main,
            );
            let cmd = engine.begin();
            let slot = sender.acquire(BOUND).expect("a free slot");
            // SAFETY: `cmd` is recording, of the main family, outside a
            // render pass; it is submitted once below and presented after
            // its fence; `app` was filled by a completed submission and
            // lives until then.
            let frame = unsafe { slot.record_copy_into(cmd, &source_of(&app)) }.unwrap();
            let fence = engine.submit(cmd);
            expected.push(texels);
            in_flight.push((frame, fence, app));
        }
        for (frame, fence, app) in in_flight {
            engine.wait(fence);
            // SAFETY: its command buffer completed (the fence).
            let seq = unsafe { sender.present_recorded(frame, sender::monotonic_ns()) }.unwrap();
            assert_eq!(seq, last + 1, "one number per presented frame, in order");
            last = seq;
            drop(app);
        }
        // The receiver reads every frame so far, texel for texel.
        let start = Instant::now();
        while vrx.session().stats().received < expected.len() as u64 {
            assert!(start.elapsed() < BOUND, "frames never arrived");
            sender.serve(Duration::from_millis(1));
            let Ok(frame) = vrx.next(Duration::from_millis(50)) else {
                continue;
            };
            let pixels = vrx.read_pixels(&frame, Duration::from_secs(10)).unwrap();
            let want = &expected[(frame.sequence() - 1) as usize];
            assert!(
                &pixels == want,
                "frame {}: texels differ from the engine's render target",
                frame.sequence()
            );
            vrx.release(frame).unwrap();
        }
    }
    assert_eq!(sender.stats().presented, 6);
    assert_eq!(vrx.session().stats().dropped, 0);
    drop(vrx);
    drop(sender);
    drop(engine);
    assert_no_validation_errors(&ctx);
    assert_no_validation_errors(&rctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_recorded_slot_is_out_of_the_ring_until_presented_or_abandoned() {
    let dir = std::env::temp_dir().join(format!("cif-recorded-ring-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let directory = Directory::new(&dir).unwrap();
    let ctx = vulkan(None);
    let mut sender =
        ImageSender::<Rgba8Unorm, Mem>::new(&ctx, options(&directory, "two", 2)).unwrap();
    let mut other =
        ImageSender::<Rgba8Unorm, Mem>::new(&ctx, options(&directory, "other", 2)).unwrap();
    let engine = Engine::new(&ctx);
    let app = AppImage::new(
        &ctx,
        [W, H],
        &pattern((W * H * 4) as usize, 7),
        vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
        QueueRole::Main,
    );
    let record = |sender: &mut ImageSender<Rgba8Unorm, Mem>, cmd| {
        let slot = sender.acquire(Duration::from_millis(100)).unwrap();
        // SAFETY: `cmd` is recording, of the main family; each is
        // submitted once and waited for before its frame is presented, or
        // never submitted and abandoned; `app` outlives them.
        unsafe { slot.record_copy_into(cmd, &source_of(&app)) }.unwrap()
    };
    let (c1, c2) = (engine.begin(), engine.begin());
    let first = record(&mut sender, c1);
    let second = record(&mut sender, c2);
    assert_ne!(first.slot(), second.slot());
    // Both slots recorded: none to hand out (and no waiting for them: only
    // the application can give them back).
    assert!(matches!(
        sender.acquire(Duration::from_millis(100)),
        Err(AcquireError::AllSlotsHeld)
    ));
    // Another sender's frame is refused, and changes nothing here (the
    // frame is spent: `other` keeps that slot out of its ring).
    let c3 = engine.begin();
    let foreign = record(&mut other, c3);
    // SAFETY: refused before anything happens (c3 is never submitted).
    let e = unsafe { sender.present_recorded(foreign, 1) }.unwrap_err();
    assert!(
        matches!(&e, SenderError::Vulkan(vk_export::Error::InvalidArgument(m)) if m.contains("another sender")),
        "{e}"
    );
    // Abandoned (c2 never submitted): no frame numbered, its slot back.
    // SAFETY: c2 is never submitted.
    unsafe { sender.abandon_recorded(second) }.unwrap();
    assert_eq!(sender.stats().presented, 0);
    sender
        .acquire(Duration::from_millis(100))
        .expect("the abandoned slot");
    // Presented after its command buffer ran: numbered 1, its slot back.
    let fence = engine.submit(c1);
    engine.wait(fence);
    // SAFETY: c1 completed.
    assert_eq!(unsafe { sender.present_recorded(first, 5) }.unwrap(), 1);
    assert_eq!(sender.stats().presented, 1);
    sender
        .acquire(Duration::from_millis(100))
        .expect("the presented slot back in the ring");
    // SAFETY: a valid handle of ours, not pending (never submitted).
    unsafe { ctx.device().free_command_buffers(engine.pool, &[c2, c3]) };
    drop((sender, other, engine, app));
    assert_no_validation_errors(&ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}
