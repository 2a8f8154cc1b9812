//! The Vulkan half of the two producer variants (issue 19), without CUDA:
//! where the bench finds no CUDA device (CI's lavapipe, with the validation
//! layer) or runs with `--vulkan-only`, each variant records and submits
//! its frames on its queue (the copy producer's "transfer" role is the main
//! family where the device has no transfer-only family), untimed.
//!
//! # Contract
//!
//! * Per variant: zero-copy frames with the host standing in for CUDA (it
//!   waits for each frame and signals `consumed`), one batch of 3 frames in
//!   one submit, the producer alone, and the staging copy, whose first texel
//!   is checked against what the variant writes (the clear colour, the
//!   source buffer's fill). A wrong texel is a [`Report::fail`]; validation
//!   errors fail the run where the caller checks them (`finish`).
//! * Every wait is bounded ([`WAIT_LIMIT`]); a producer's drop waits for
//!   its last frame before the images and semaphores it uses drop
//!   (declaration order).

use vk_export::ash::vk;
use vk_export::format::{Format, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Optimal};
use vk_export::{Context, ExportableImage, ImageDesc, TimelineSemaphore};

use crate::common::{has_device_local_only, SPIN, WAIT_LIMIT};
use crate::producer::{After, HostBuffer, Producer, Variant, SOURCE_FILL};
use crate::report::Report;
use crate::Res;

const SLOTS: usize = 3;
const SIZE: u32 = 64;

/// The clear colour of the render producer as RGBA8 UNORM bytes (within
/// one step).
const CLEARED: [u8; 4] = [64, 128, 191, 255];

/// Runs both variants in the memory class the device offers for
/// exportable storage images.
pub(crate) fn vulkan_only(ctx: &Context, report: &mut Report) -> Res<()> {
    if has_device_local_only(ctx) {
        run::<DeviceLocal>(ctx, report, "device-local")
    } else {
        run::<HostVisible>(ctx, report, "host-visible")
    }
}

fn run<M: MemoryLocation>(ctx: &Context, report: &mut Report, class: &str) -> Res<()> {
    let images = (0..SLOTS)
        .map(|_| {
            ExportableImage::<Rgba8Unorm, Optimal, M, usage::Storage>::new(
                ctx,
                ImageDesc::new_2d(SIZE, SIZE),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let extent = vk::Extent2D {
        width: SIZE,
        height: SIZE,
    };
    let raw: Vec<_> = images.iter().map(|i| (i.raw(), extent)).collect();
    let release: Vec<_> = (0..SLOTS).map(|_| After::Release).collect();
    let bytes = (SIZE * SIZE * Rgba8Unorm::TEXEL_BYTES) as usize;
    for variant in [Variant::Render, Variant::Copy] {
        let produced = TimelineSemaphore::new_local(ctx)?;
        let consumed = TimelineSemaphore::new_local(ctx)?;
        let alone = TimelineSemaphore::new_local(ctx)?;
        let staged = TimelineSemaphore::new_local(ctx)?;
        let host = HostBuffer::new(ctx, bytes)?;
        let texel = Rgba8Unorm::TEXEL_BYTES;
        let mut producer = Producer::new(
            ctx,
            variant,
            texel,
            &raw,
            &release,
            Some(consumed.raw()),
            produced.raw(),
        )?;
        // Zero-copy frames: the host is the consumer.
        let mut frame = 0u64;
        for _ in 0..2 * SLOTS {
            frame += 1;
            let slot = ((frame - 1) % SLOTS as u64) as usize;
            producer.submit(slot, frame.saturating_sub(SLOTS as u64), frame)?;
            produced.wait(frame, WAIT_LIMIT, SPIN)?;
            consumed.signal(frame)?;
        }
        // One batch of SLOTS frames in one submit.
        let batch: Vec<(usize, u64, u64)> = (frame + 1..=frame + SLOTS as u64)
            .map(|f| {
                (
                    ((f - 1) % SLOTS as u64) as usize,
                    f.saturating_sub(SLOTS as u64),
                    f,
                )
            })
            .collect();
        producer.submit_batch(&batch)?;
        frame += SLOTS as u64;
        produced.wait(frame, WAIT_LIMIT, SPIN)?;
        consumed.signal(frame)?;
        drop(producer);

        let mut producer_alone =
            Producer::new(ctx, variant, texel, &raw, &release, None, alone.raw())?;
        for v in 1..=SLOTS as u64 {
            producer_alone.submit((v - 1) as usize, 0, v)?;
        }
        alone.wait(SLOTS as u64, WAIT_LIMIT, SPIN)?;
        drop(producer_alone);

        let mut staging = Producer::new(
            ctx,
            variant,
            texel,
            &raw[..1],
            &[After::CopyTo(host.buffer)],
            None,
            staged.raw(),
        )?;
        staging.submit(0, 0, 1)?;
        staged.wait(1, WAIT_LIMIT, SPIN)?;
        let mut first = [0u8; 4];
        // SAFETY: the staging copy completed (its value was reached; its
        // command buffer made the buffer host-visible); the mapping holds
        // `bytes` >= 4 bytes.
        unsafe { std::ptr::copy_nonoverlapping(host.mapped, first.as_mut_ptr(), 4) };
        drop(staging);
        let expected = match variant {
            Variant::Render => CLEARED,
            Variant::Copy => SOURCE_FILL.to_le_bytes(),
        };
        let describe = variant.describe(ctx);
        // The clear colour's 0.5 is a tie in UNORM rounding: one step either way.
        let close = first.iter().zip(expected).all(|(&a, b)| a.abs_diff(b) <= 1);
        if close {
            report.note(format!(
                "producer variants, Vulkan only: {} ({describe}), {class} {SIZE}x{SIZE} RGBA8 images: {} zero-copy frames, a batch of {SLOTS} in one submit, {SLOTS} alone, one staged frame whose first texel is {first:?} as written: ok",
                variant.name(),
                2 * SLOTS,
            ));
        } else {
            report.fail(format!(
                "producer variants, Vulkan only: {} ({describe}): the staged frame's first texel is {first:?}, not {expected:?}",
                variant.name()
            ));
        }
    }
    report.note(format!(
        "producer variants, Vulkan only: validation layer {}, {} validation errors",
        if ctx.validation_enabled() {
            "on"
        } else {
            "off"
        },
        ctx.validation_errors()
    ));
    Ok(())
}
