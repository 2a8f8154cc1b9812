//! The CUDA receiver example's host side: reading a slot a
//! `CudaReceiver` imported back to host memory (to check the demo
//! pattern), and the `--host-staging` baseline (each frame copied to host
//! memory and uploaded again, what a pipeline without interop does).
//!
//! # Contract
//!
//! * [`read_slot`] copies a byte range of a slot to host memory after the
//!   work already on the stream, bounded by the caller's timeout; a range
//!   outside the slot is refused.
//! * [`check`] tells whether frame `f` in a slot (or its staged copy) is
//!   the demo pattern's: every row of an image ring (one copy of the
//!   frame), five rows of a buffer ring (the first, the band's first and
//!   last, the row after the band, the last).
//! * [`Staging::stage`] copies the frame whole into pageable host memory
//!   and uploads it into a CUDA buffer of the receiver's own, waiting for
//!   both.

use std::time::Duration;

use cuda_interop::sys::{CUresult, Driver};
use cuda_interop::{CudaDevice, DeviceBuffer, Stream};
use cuda_interop_frames::cuda_receiver::Slot;
use cuda_interop_frames::protocol::RingLayout;

use super::demo;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Copies `dst.len()` bytes from byte `at` of `slot` to `dst`, after the
/// work already enqueued on `stream` (of the slot's device), and waits for
/// it within `timeout`.
pub fn read_slot(
    stream: &Stream,
    slot: &Slot,
    at: u64,
    dst: &mut [u8],
    timeout: Duration,
) -> Res<()> {
    let len = dst.len() as u64;
    if at.checked_add(len).is_none_or(|end| end > slot.len) {
        return Err(format!("{len} bytes at {at} of a slot of {} bytes", slot.len).into());
    }
    // A copy into pageable memory blocks in the driver until it is done:
    // queued behind a wait nobody signals it would never return, so the
    // stream drains (bounded) first.
    stream.synchronize(timeout)?;
    let copy = Driver::global()
        .map_err(|e| e.to_string())?
        .fns()
        .cuMemcpyDtoHAsync
        .ok_or("the CUDA driver lacks cuMemcpyDtoHAsync")?;
    let current = stream.device().enter()?;
    // SAFETY: `slot` is borrowed from a live CudaReceiver, so its `len`
    // bytes at `data` stay mapped device memory of the stream's device
    // (current here) for the call, and [at, at + len) lies inside them
    // (checked above); `dst` is a live, writable host range of `len` bytes,
    // pageable, so the copy has completed when the call returns (the
    // driver's documented behaviour for device-to-pageable copies).
    let status = unsafe {
        copy(
            dst.as_mut_ptr().cast(),
            slot.data + at,
            dst.len(),
            stream.raw(),
        )
    };
    drop(current);
    if status != CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemcpyDtoHAsync from a slot failed: {status:?}").into());
    }
    Ok(stream.synchronize(timeout)?)
}

/// The ring in words: `image ring of R8G8B8A8_UNORM arrays` or `row pitch
/// 7680`.
pub fn ring_words(layout: &RingLayout) -> String {
    let Some(f) = layout.vk_format() else {
        return format!("row pitch {}", layout.row_pitch);
    };
    match vk_export::format::describe(vk_export::ash::vk::Format::from_raw(f as i32)) {
        Some(d) => format!("image ring of {} arrays", d.0),
        None => format!("image ring of VkFormat {f}"),
    }
}

/// Whether frame `f` in `slot` is the demo pattern's (see the module
/// contract); `staged`: its host copy, read instead of the slot.
pub fn check(
    stream: &Stream,
    layout: &RingLayout,
    slot: &Slot,
    staged: Option<&[u8]>,
    f: u64,
    timeout: Duration,
) -> Res<bool> {
    let (height, pitch) = (layout.height, layout.row_pitch as usize);
    let row = layout.width as usize * layout.texel_bytes() as usize;
    let mut frame = Vec::new();
    let (rows, whole): (Vec<u32>, Option<&[u8]>) = if layout.is_image_ring() || staged.is_some() {
        let whole = match staged {
            Some(host) => host,
            None => {
                frame.resize(layout.checked_frame_bytes()? as usize, 0);
                read_slot(stream, slot, 0, &mut frame, timeout)?;
                &frame
            }
        };
        let rows = if layout.is_image_ring() {
            (0..height).collect()
        } else {
            sampled(f, height)
        };
        (rows, Some(whole))
    } else {
        (sampled(f, height), None)
    };
    let mut line = vec![0u8; row];
    for y in rows {
        let at = y as usize * pitch;
        match whole {
            Some(bytes) => line.copy_from_slice(&bytes[at..at + row]),
            None => read_slot(stream, slot, at as u64, &mut line, timeout)?,
        }
        if !demo::check_demo_row(&line, f, y, height) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The five rows checked of a buffer ring's frame `f`.
fn sampled(f: u64, height: u32) -> Vec<u32> {
    let (start, end) = demo::band_rows(f, height);
    vec![0, start, end - 1, end.min(height - 1), height - 1]
}

/// The `--host-staging` baseline's buffers: a frame's bytes in pageable
/// host memory, and the receiver's own CUDA copy of them.
pub struct Staging {
    host: Vec<u8>,
    uploaded: DeviceBuffer,
}

impl Staging {
    /// Buffers for one frame of `layout` on `cuda`.
    pub fn new(cuda: &CudaDevice, layout: &RingLayout) -> Res<Staging> {
        let bytes = layout.checked_frame_bytes()? as usize;
        Ok(Staging {
            host: vec![0; bytes],
            uploaded: DeviceBuffer::new(cuda, bytes)?,
        })
    }

    /// Copies the frame in `slot` to host memory and uploads it again,
    /// after the work on `stream`; waits for both.
    pub fn stage(&mut self, stream: &Stream, slot: &Slot, timeout: Duration) -> Res<()> {
        read_slot(stream, slot, 0, &mut self.host, timeout)?;
        Ok(stream.copy_from_host(&self.host, &mut self.uploaded)?)
    }

    /// The host copy of the last frame staged.
    pub fn host(&self) -> &[u8] {
        &self.host
    }
}
