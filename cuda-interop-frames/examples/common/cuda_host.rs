//! The CUDA receiver example's host side: reading a slot a
//! `CudaReceiver` imported back to host memory (to check the demo
//! pattern), and the `--host-staging` baseline (each frame copied to host
//! memory and uploaded again, what a pipeline without interop does).
//!
//! # Contract
//!
//! * Slots are read back with `CudaReceiver::copy_to_host` (bounded, the
//!   frame checked still held after the copy).
//! * [`Checker::check`] tells whether frame `f` in a slot (or its staged
//!   copy) is the demo pattern's: every row of an image ring (read through
//!   the receiver's surface object where the copy kernels take its texel
//!   size), five rows of a buffer ring (the first, the band's first and
//!   last, the row after the band, the last; a planar ring's luma plane,
//!   and three rows of its chroma plane, the background).
//! * [`Staging::stage`] copies the frame whole into pageable host memory
//!   and uploads it into a CUDA buffer of the receiver's own, waiting for
//!   both.

use std::ffi::c_void;
use std::time::Duration;

use cuda_interop::{CudaDevice, DeviceBuffer, KernelUses, Module, Stream};
use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::session::Frame;

use super::demo;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The ring in words: `image ring of R8G8B8A8_UNORM arrays` or `row pitch
/// 7680`.
pub fn ring_words(layout: &cuda_interop_frames::protocol::RingLayout) -> String {
    if layout.is_multi_image() {
        return format!("multi-image ring of {} parts", layout.parts);
    }
    let Some(f) = layout.vk_format() else {
        return format!("row pitch {}", layout.row_pitch);
    };
    match vk_export::format::describe(vk_export::ash::vk::Format::from_raw(f as i32)) {
        Some(d) => format!("image ring of {} arrays", d.0),
        None => format!("image ring of VkFormat {f}"),
    }
}

/// Checks frames against the demo pattern (see the module contract): an
/// image ring of 4-, 8- or 16-byte texels is read through
/// `CudaReceiver::surface` (the crate's copy kernel, launched here as a
/// user's kernel would be, into a buffer of this checker's), other image
/// rings through `CudaReceiver::wait_on`'s packed copy.
pub struct Checker {
    /// The copy kernels' module and the buffer they copy into.
    through_surface: Option<(Module, DeviceBuffer)>,
    bytes: Vec<u8>,
}

impl Checker {
    /// A checker for `rx`'s ring.
    pub fn new(rx: &CudaReceiver) -> Res<Checker> {
        let layout = rx.layout();
        let through_surface = match layout.is_image_ring()
            && !layout.is_multi_image()
            && [4, 8, 16].contains(&layout.texel_bytes())
        {
            true => Some((
                Module::load_ptx(rx.cuda(), cuda_interop::kernels::COPY_PTX)?,
                DeviceBuffer::new(rx.cuda(), layout.checked_frame_bytes()? as usize)?,
            )),
            false => None,
        };
        Ok(Checker {
            through_surface,
            bytes: Vec::new(),
        })
    }

    /// Whether `frame` is the demo pattern's, read after the work on
    /// `stream` (`CudaReceiver::wait_produced` first); `staged`: its host
    /// copy, read instead of the slot.
    pub fn check(
        &mut self,
        rx: &CudaReceiver,
        frame: &Frame,
        stream: &Stream,
        staged: Option<&[u8]>,
        timeout: Duration,
    ) -> Res<bool> {
        let (layout, f) = (rx.layout(), frame.sequence());
        if layout.is_multi_image() {
            return self.check_parts(rx, frame, stream, timeout);
        }
        let (height, pitch) = (layout.height, layout.row_pitch as usize);
        let row = layout.width as usize * layout.texel_bytes() as usize;
        // Images without storage usage (sRGB) have no surface: they are
        // read through the packed copy instead.
        let surface = match (staged, &self.through_surface) {
            (None, Some(_)) => rx.surface(frame).ok().flatten(),
            _ => None,
        };
        let whole = match (staged, &self.through_surface, surface) {
            (Some(host), _, _) => Some(host),
            (None, Some((module, scratch)), Some(surface)) => {
                self.bytes.resize(layout.checked_frame_bytes()? as usize, 0);
                let bytes = &mut self.bytes;
                read_through_surface(rx, frame, stream, module, scratch, &surface, bytes)?;
                Some(&self.bytes[..])
            }
            (None, _, _) if layout.is_image_ring() => {
                rx.wait_on(frame, stream)?; // the packed copy
                self.bytes.resize(layout.checked_frame_bytes()? as usize, 0);
                rx.copy_to_host(frame, stream, 0, &mut self.bytes, timeout)?;
                Some(&self.bytes[..])
            }
            (None, _, _) => None,
        };
        let rows: Vec<u32> = match layout.is_image_ring() {
            true => (0..height).collect(),
            false => sampled(f, height),
        };
        // (byte offset, bytes, the row the pattern expects): the rows
        // above, then a planar ring's chroma plane at the receiver's chroma
        // address (its first, middle and last rows), all the background (a
        // row past the luma plane's band).
        let mut lines: Vec<(u64, usize, u32)> = rows
            .into_iter()
            .map(|y| (u64::from(y) * pitch as u64, row, y))
            .collect();
        if let Some(chroma) = rx.chroma(frame)? {
            let at = chroma.ptr - rx.slot(frame)?.data;
            lines.extend([0, chroma.rows / 2, chroma.rows - 1].map(|y| {
                (
                    at + u64::from(y) * chroma.pitch,
                    chroma.row_bytes as usize,
                    height,
                )
            }));
        }
        let mut line = Vec::new();
        for (at, len, y) in lines {
            line.resize(len, 0);
            match whole {
                Some(bytes) => line.copy_from_slice(&bytes[at as usize..][..len]),
                None => rx.copy_to_host(frame, stream, at, &mut line, timeout)?,
            }
            if !demo::check_demo_row(&line, f, y, height) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Checker {
    /// A multi-image ring's frame (`frame_server --with-depth`): every
    /// part copied out (`CudaReceiver::wait_on`), read back whole, every
    /// texel checked against its part's pattern (`demo::check_part_row`).
    fn check_parts(
        &mut self,
        rx: &CudaReceiver,
        frame: &Frame,
        stream: &Stream,
        timeout: Duration,
    ) -> Res<bool> {
        let (layout, f) = (*rx.layout(), frame.sequence());
        rx.wait_on(frame, stream)?; // every part's packed copy
        for (p, part) in rx.parts().iter().enumerate() {
            let row = part.row_bytes(layout.width) as usize;
            self.bytes.resize(row * layout.height as usize, 0);
            let name = part.name.as_str();
            rx.copy_part_to_host(frame, name, stream, 0, &mut self.bytes, timeout)?;
            let ok = self
                .bytes
                .chunks_exact(row)
                .zip(0..)
                .all(|(line, y)| demo::check_part_row(line, p, f, y, layout.height));
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Copies an image ring's frame into `scratch` (tightly packed rows) with
/// the copy kernel reading `CudaReceiver::surface`, then to `dst`; checks
/// the frame is still held after the copy.
fn read_through_surface(
    rx: &CudaReceiver,
    frame: &Frame,
    stream: &Stream,
    module: &Module,
    scratch: &DeviceBuffer,
    surface: &cuda_interop::Surface<'_>,
    dst: &mut [u8],
) -> Res<()> {
    let layout = rx.layout();
    let kernel = module.function(&format!("array_to_linear_{}b_r4", layout.texel_bytes()))?;
    let (mut surf, mut ptr, mut pitch, mut width, mut height) = (
        surface.raw(),
        scratch.device_ptr(),
        layout.row_pitch,
        layout.width,
        layout.height,
    );
    let mut args: [*mut c_void; 5] = [
        (&mut surf as *mut u64).cast(),
        (&mut ptr as *mut u64).cast(),
        (&mut pitch as *mut u64).cast(),
        (&mut width as *mut u32).cast(),
        (&mut height as *mut u32).cast(),
    ];
    // The kernels' shape: 16 x 16 threads, each moving 4 rows of a column.
    let grid = [width.div_ceil(16), height.div_ceil(64), 1];
    // SAFETY: the arguments are the copy kernel's five parameters (u64
    // surface, u64 destination, u64 pitch, u32 width, u32 height) in its
    // order, alive across the call; it writes `height` rows of `width`
    // texels of `texel_bytes` at `pitch` bytes apart: exactly the scratch
    // buffer, sized for one frame; the surface and the buffer are named in
    // the uses, so their drops wait for the kernel.
    unsafe {
        stream.launch_tracked(
            &kernel,
            grid,
            [16, 16, 1],
            0,
            &mut args,
            KernelUses::new().buffer(scratch).surface(surface),
        )
    }?;
    stream.copy_to_host(scratch, dst)?;
    Ok(rx.session().check_held(frame)?)
}

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
