//! Copies from an application's own image (`SourceImage`,
//! `Context::copy_image_from`) in a loop, in each way the copy can be made,
//! every one bounded: the crate's helper into a fresh and into a reused
//! exportable image, the source in the first memory type the image allows
//! and in device-local memory, the same commands recorded by the test
//! through `submit_and_wait_on`, by the test on its own command buffer and
//! fence, and on a context without a transfer queue. Each way runs until
//! its first failure (the failure is printed with its iteration, and the
//! stuck context is leaked, never idled, so that the other ways still run);
//! the test fails if any way failed. On the H200 the crate's copy of a
//! main-family source timed out once per few runs (GPU run 19): this says
//! which of the parts is the one that stalls. Lavapipe: one family, every
//! way on its one queue.

use std::time::{Duration, Instant};

use ash::vk;
use cuda_interop_testkit::app_image::{record_image_barrier, AppImage};
use cuda_interop_testkit::{pattern, vulkan, Image};
use vk_export::format::Rgba8Unorm;
use vk_export::{
    Context, HeadlessOptions, ImageDesc, QueueRole, SourceImage, SourceSharing, SubmitSync,
    TransferQueue, Validation,
};

const W: u32 = 48;
const H: u32 = 32;
const ROUNDS: u32 = 60;
/// Each submission's bound: a copy of 6 KiB takes microseconds.
const BOUND: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Copier {
    /// `Context::copy_image_from`.
    Helper,
    /// `submit_and_wait_on(Main)` with the test's barriers and copy.
    Recorded,
    /// The test's own command pool, buffer and fence on the main queue.
    Raw,
}

#[derive(Clone, Copy, Debug)]
struct Way {
    copier: Copier,
    device_local_source: bool,
    reuse_destination: bool,
    transfer_queue: bool,
    read_back: bool,
}

fn context(transfer_queue: bool) -> Context {
    if transfer_queue {
        vulkan(None)
    } else {
        Context::headless(&HeadlessOptions {
            validation: Validation::Required,
            transfer_queue: TransferQueue::Off,
            ..HeadlessOptions::default()
        })
        .unwrap()
    }
}

/// Records the source's move into TRANSFER_SRC_OPTIMAL, the copy into
/// `dst` (in `dst_layout`) and the move back.
///
/// # Safety
/// `cmd` is recording for a queue of the family that owns `app`; `dst` is a
/// live RGBA8 image of `W`x`H` or more with transfer-destination usage, in
/// `dst_layout`; both outlive the commands.
unsafe fn record_copy(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    app: &AppImage,
    dst: vk::Image,
    dst_layout: vk::ImageLayout,
) {
    let range = vk::ImageSubresourceRange {
        aspect_mask: vk::ImageAspectFlags::COLOR,
        base_mip_level: 0,
        level_count: 1,
        base_array_layer: 0,
        layer_count: 1,
    };
    let barrier = |image, old, new| {
        vk::ImageMemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
            .old_layout(old)
            .new_layout(new)
            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .image(image)
            .subresource_range(range)
    };
    let layers = vk::ImageSubresourceLayers {
        aspect_mask: vk::ImageAspectFlags::COLOR,
        mip_level: 0,
        base_array_layer: 0,
        layer_count: 1,
    };
    let region = vk::ImageCopy {
        src_subresource: layers,
        dst_subresource: layers,
        extent: vk::Extent3D {
            width: W,
            height: H,
            depth: 1,
        },
        ..Default::default()
    };
    let src = vk::ImageLayout::TRANSFER_SRC_OPTIMAL;
    // SAFETY: forwarded from the caller.
    unsafe {
        record_image_barrier(device, cmd, barrier(app.image, app.layout, src));
        device.cmd_copy_image(cmd, app.image, src, dst, dst_layout, &[region]);
        record_image_barrier(device, cmd, barrier(app.image, src, app.layout));
    }
}

/// The test's own submission of the copy on the main queue, waited for up
/// to `BOUND`. On a timeout the pool and fence are leaked (the GPU may
/// still use them).
fn raw_copy(ctx: &Context, app: &AppImage, dst: &AppImage) -> Result<(), String> {
    let device = ctx.device();
    // SAFETY: plain object creation on the context's live device; each is
    // destroyed below once its submission completed, or leaked.
    let (pool, cmd, fence) = unsafe {
        let pool = device
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(ctx.queue_family()),
                None,
            )
            .unwrap();
        let cmd = device
            .allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1),
            )
            .unwrap()[0];
        let fence = device
            .create_fence(&vk::FenceCreateInfo::default(), None)
            .unwrap();
        (pool, cmd, fence)
    };
    // SAFETY: recording a fresh command buffer of the main family, which
    // owns both images; they outlive it (the caller leaks them on failure).
    unsafe {
        device
            .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
            .unwrap();
        record_copy(device, cmd, app, dst.image, dst.layout);
        device.end_command_buffer(cmd).unwrap();
    }
    let cmds = [cmd];
    let submit = vk::SubmitInfo::default().command_buffers(&cmds);
    // SAFETY: the main queue under the context's lock; the command buffer
    // and fence live until the fence signals (leaked otherwise).
    ctx.with_queue_of(QueueRole::Main, |q| unsafe {
        device.queue_submit(q, &[submit], fence)
    })
    .unwrap()
    .map_err(|e| format!("vkQueueSubmit: {e}"))?;
    let nanos = BOUND.as_nanos() as u64;
    // SAFETY: the fence of this submission.
    match unsafe { device.wait_for_fences(&[fence], true, nanos) } {
        Ok(()) => {
            // SAFETY: the submission completed.
            unsafe {
                device.destroy_fence(fence, None);
                device.destroy_command_pool(pool, None);
            }
            Ok(())
        }
        Err(e) => Err(format!("vkWaitForFences: {e}")),
    }
}

/// Runs `way` for `ROUNDS` rounds or until its first failure, which it
/// returns with its round.
fn run(way: Way) -> Result<Duration, String> {
    let ctx = context(way.transfer_queue);
    let want = if way.device_local_source {
        vk::MemoryPropertyFlags::DEVICE_LOCAL
    } else {
        vk::MemoryPropertyFlags::empty()
    };
    let sync = || SubmitSync::new().timeout(BOUND);
    let reused = Image::new(&ctx, ImageDesc::new_2d(W, H)).unwrap();
    let start = Instant::now();
    let mut flags = None;
    for round in 0..ROUNDS {
        let texels = pattern((W * H * 4) as usize, round + 1);
        let layout = if round % 2 == 0 {
            vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL
        } else {
            vk::ImageLayout::TRANSFER_SRC_OPTIMAL
        };
        let app = AppImage::in_memory(&ctx, [W, H], &texels, layout, QueueRole::Main, &[], want);
        flags = Some(app.memory_flags);
        let fresh;
        let dst = if way.reuse_destination {
            &reused
        } else {
            fresh = Image::new(&ctx, ImageDesc::new_2d(W, H)).unwrap();
            &fresh
        };
        let outcome = match way.copier {
            Copier::Helper => {
                // SAFETY: `app` is a live RGBA8 image of this device, one
                // sample, transfer-source usage, W x H, in `layout`, owned
                // by the main family, filled by a completed submission,
                // untouched until it is dropped (after the copy returned Ok)
                // or leaked.
                let source = unsafe {
                    SourceImage::<Rgba8Unorm>::new(
                        app.image,
                        [W, H],
                        app.layout,
                        SourceSharing::Exclusive(app.family),
                    )
                }
                .unwrap();
                ctx.copy_image_from(&source, dst, sync())
                    .map_err(|e| format!("copy_image_from: {e}"))
            }
            Copier::Recorded => {
                // Into an image the test moves to GENERAL itself: the
                // crate's exportable image would keep its own state.
                let target = AppImage::in_memory(
                    &ctx,
                    [W, H],
                    &texels,
                    vk::ImageLayout::GENERAL,
                    QueueRole::Main,
                    &[],
                    want,
                );
                let r = ctx
                    .submit_and_wait_on(QueueRole::Main, sync(), |device, cmd, _| {
                        // SAFETY: the main family's command buffer; both
                        // images live until it completed (or are leaked).
                        unsafe {
                            record_copy(device, cmd, &app, target.image, vk::ImageLayout::GENERAL)
                        }
                    })
                    .map_err(|e| format!("submit_and_wait_on: {e}"));
                if r.is_err() {
                    std::mem::forget(target);
                }
                r
            }
            Copier::Raw => {
                let target = AppImage::in_memory(
                    &ctx,
                    [W, H],
                    &texels,
                    vk::ImageLayout::GENERAL,
                    QueueRole::Main,
                    &[],
                    want,
                );
                let r = raw_copy(&ctx, &app, &target);
                if r.is_err() {
                    std::mem::forget(target);
                }
                r
            }
        };
        let outcome = outcome.and_then(|()| {
            if way.read_back && way.copier == Copier::Helper {
                let read = ctx
                    .read_image(dst, 0, 0, sync())
                    .map_err(|e| format!("read_image: {e}"))?;
                if read != texels {
                    return Err("the texels read back differ from the source's".into());
                }
            }
            Ok(())
        });
        if let Err(e) = outcome {
            // Leaked: dropping either would idle a queue that may never be.
            std::mem::forget(app);
            std::mem::forget(reused);
            return Err(format!(
                "round {round} of {ROUNDS} (source memory {flags:?}, after {:?}): {e}",
                start.elapsed()
            ));
        }
    }
    let errors = ctx.validation_errors();
    println!("  source memory {flags:?}, validation errors {errors}");
    if errors != 0 {
        return Err(format!("{errors} validation errors (see stderr)"));
    }
    Ok(start.elapsed())
}

#[test]
fn copies_from_an_application_image_complete_round_after_round_in_every_way() {
    let base = Way {
        copier: Copier::Helper,
        device_local_source: false,
        reuse_destination: false,
        transfer_queue: true,
        read_back: true,
    };
    let ways = [
        base,
        Way {
            read_back: false,
            ..base
        },
        Way {
            reuse_destination: true,
            ..base
        },
        Way {
            device_local_source: true,
            ..base
        },
        Way {
            transfer_queue: false,
            ..base
        },
        Way {
            copier: Copier::Recorded,
            ..base
        },
        Way {
            copier: Copier::Raw,
            ..base
        },
        Way {
            copier: Copier::Raw,
            device_local_source: true,
            ..base
        },
    ];
    let mut failed = Vec::new();
    for way in ways {
        println!("{way:?}");
        match run(way) {
            Ok(took) => println!("  {ROUNDS} rounds in {took:?}"),
            Err(e) => {
                println!("  FAILED: {e}");
                failed.push(format!("{way:?}: {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "ways that failed: {failed:#?}");
}
