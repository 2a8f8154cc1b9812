//! The CUDA receiver example's host side: reading a slot a
//! `CudaReceiver` imported back to host memory (to check the demo
//! pattern), and the `--host-staging` baseline (each frame copied to host
//! memory and uploaded again, what a pipeline without interop does).
//!
//! # Contract
//!
//! * Slots are read back with `CudaReceiver::copy_to_host` (bounded, the
//!   frame checked still held after the copy).
//! * [`check`] tells whether frame `f` in a slot (or its staged copy) is
//!   the demo pattern's: every row of an image ring (one copy of the
//!   frame), five rows of a buffer ring (the first, the band's first and
//!   last, the row after the band, the last).
//! * [`Staging::stage`] copies the frame whole into pageable host memory
//!   and uploads it into a CUDA buffer of the receiver's own, waiting for
//!   both.

use std::time::Duration;

use cuda_interop::{CudaDevice, DeviceBuffer, Stream};
use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::session::Frame;

use super::demo;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The ring in words: `image ring of R8G8B8A8_UNORM arrays` or `row pitch
/// 7680`.
pub fn ring_words(layout: &cuda_interop_frames::protocol::RingLayout) -> String {
    let Some(f) = layout.vk_format() else {
        return format!("row pitch {}", layout.row_pitch);
    };
    match vk_export::format::describe(vk_export::ash::vk::Format::from_raw(f as i32)) {
        Some(d) => format!("image ring of {} arrays", d.0),
        None => format!("image ring of VkFormat {f}"),
    }
}

/// Whether `frame` is the demo pattern's (see the module contract);
/// `staged`: its host copy, read instead of the slot.
pub fn check(
    rx: &CudaReceiver,
    frame: &Frame,
    stream: &Stream,
    staged: Option<&[u8]>,
    timeout: Duration,
) -> Res<bool> {
    let (layout, f) = (rx.layout(), frame.sequence());
    let (height, pitch) = (layout.height, layout.row_pitch as usize);
    let row = layout.width as usize * layout.texel_bytes() as usize;
    let mut bytes = Vec::new();
    let (rows, whole): (Vec<u32>, Option<&[u8]>) = if layout.is_image_ring() || staged.is_some() {
        let whole = match staged {
            Some(host) => host,
            None => {
                bytes.resize(layout.checked_frame_bytes()? as usize, 0);
                rx.copy_to_host(frame, stream, 0, &mut bytes, timeout)?;
                &bytes
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
            None => rx.copy_to_host(frame, stream, at as u64, &mut line, timeout)?,
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
    pub fn new(
        cuda: &CudaDevice,
        layout: &cuda_interop_frames::protocol::RingLayout,
    ) -> Res<Staging> {
        let bytes = layout.checked_frame_bytes()? as usize;
        Ok(Staging {
            host: vec![0; bytes],
            uploaded: DeviceBuffer::new(cuda, bytes)?,
        })
    }

    /// Copies `frame` to host memory and uploads it again, after the work
    /// on `stream`; waits for both.
    pub fn stage(
        &mut self,
        rx: &CudaReceiver,
        frame: &Frame,
        stream: &Stream,
        timeout: Duration,
    ) -> Res<()> {
        rx.copy_to_host(frame, stream, 0, &mut self.host, timeout)?;
        Ok(stream.copy_from_host(&self.host, &mut self.uploaded)?)
    }

    /// The host copy of the last frame staged.
    pub fn host(&self) -> &[u8] {
        &self.host
    }
}
