//! Ring layouts and GStreamer video formats, both ways, and the row copies
//! between a ring's planes and a GStreamer buffer's.
//!
//! # Contract
//!
//! * [`ring_video`] maps a ring to caps: RGBA8 buffer rings to `RGBA`, NV12
//!   and P010 buffer rings to `NV12` and `P010_10LE`; image rings of
//!   `R8G8B8A8_UNORM`/`B8G8R8A8_UNORM` and their `_SRGB` variants to
//!   `RGBA`/`BGRA` with `colorimetry=sRGB` (Vulkan's `_SRGB` changes how
//!   shaders sample the bytes, not the bytes: a renderer's `_UNORM`
//!   target holds sRGB-encoded bytes just the same, so both are
//!   GStreamer's sRGB RGB, which is also its default),
//!   `A2B10G10R10_UNORM_PACK32` to `RGB10A2_LE` (both: R in bits 0-9, G
//!   10-19, B 20-29, A 30-31 of a little-endian word), `R16_UNORM` to
//!   `GRAY16_LE`. Any other ring is refused with a message that lists what
//!   works ([`SUPPORTED`]). The caps say `framerate=0/1`: a sender presents
//!   when it likes.
//! * [`Planes`] describes where each plane's rows lie in a block of bytes:
//!   a ring's read ([`Planes::of_ring`]: the ring's row pitch and chroma
//!   offset; an image ring's read is tightly packed) or a GStreamer video
//!   buffer ([`Planes::of_info`]: `GstVideoInfo`'s default strides and
//!   offsets). [`to_buffer`] makes the GStreamer buffer from a ring's
//!   bytes: as they are when the layouts agree; with a `GstVideoMeta`
//!   giving the ring's strides and offsets when downstream accepts one;
//!   else copied row by row into the default layout. [`Planes::pack`]
//!   copies a mapped GStreamer frame (its own strides, a `GstVideoMeta`'s
//!   included) into a ring's layout.
//! * [`sink_planar`] tells what ring the sink makes for negotiated caps.
//! * [`FrameBytes`] from a [`Recycler`] go back to it when GStreamer frees
//!   the buffer that wraps them: a stream reuses a few allocations instead
//!   of allocating (and first touching) a frame's bytes per frame.

use std::sync::{Arc, Mutex};

use cuda_interop_frames::protocol::{Planar, RingLayout, SlotFormat};
use gst_video::prelude::*;
use vk_export::ash::vk;

/// What `cudainteropsrc` takes, in words (its refusal's list).
pub(crate) const SUPPORTED: &str = "buffer rings of RGBA8 (RGBA), NV12 (NV12) and P010 \
     (P010_10LE); image rings of R8G8B8A8_UNORM or _SRGB (RGBA), B8G8R8A8_UNORM or _SRGB (BGRA), \
     A2B10G10R10_UNORM_PACK32 (RGB10A2_LE) and R16_UNORM (GRAY16_LE)";

/// The most planes a ring has (NV12, P010: luma and chroma).
const MAX_PLANES: usize = 2;

/// Where each plane's rows lie in a block of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Planes {
    /// Planes (1 or 2).
    pub(crate) n: usize,
    /// Byte offset of each plane's first row.
    pub(crate) offsets: [usize; MAX_PLANES],
    /// Bytes from one row to the next, per plane.
    pub(crate) strides: [usize; MAX_PLANES],
    /// Rows per plane.
    pub(crate) rows: [usize; MAX_PLANES],
    /// Bytes of pixels in a row, per plane.
    pub(crate) row_bytes: [usize; MAX_PLANES],
}

/// A ring as GStreamer video: the format, whether its caps say sRGB, and
/// where a read's bytes put the planes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingVideo {
    /// The video format.
    pub(crate) format: gst_video::VideoFormat,
    /// An `_SRGB` image format (the caps say sRGB either way: see the
    /// module contract).
    pub(crate) srgb: bool,
    /// The planes of a read's bytes.
    pub(crate) planes: Planes,
    /// Pixels per row.
    pub(crate) width: u32,
    /// Rows.
    pub(crate) height: u32,
}

impl RingVideo {
    /// The caps' `GstVideoInfo`: the format and size, `framerate=0/1`, sRGB
    /// colorimetry for RGB formats (stated for an `_SRGB` ring, GStreamer's
    /// default for the others), GStreamer's default for YUV.
    pub(crate) fn info(&self) -> Result<gst_video::VideoInfo, String> {
        let mut builder = gst_video::VideoInfo::builder(self.format, self.width, self.height)
            .fps(gst::Fraction::new(0, 1));
        let srgb: gst_video::VideoColorimetry;
        if self.srgb {
            srgb = "sRGB"
                .parse()
                .map_err(|e| format!("GStreamer has no sRGB colorimetry: {e}"))?;
            builder = builder.colorimetry(&srgb);
        }
        builder
            .build()
            .map_err(|e| format!("no GStreamer video info for {self:?}: {e}"))
    }
}

/// The GStreamer format of `layout` and where a read's bytes put its
/// planes, or why GStreamer cannot take it (see the module contract).
pub(crate) fn ring_video(layout: &RingLayout) -> Result<RingVideo, String> {
    use gst_video::VideoFormat as V;
    let (format, srgb) = match layout.format {
        SlotFormat::Rgba8Buffer => (V::Rgba, false),
        SlotFormat::PlanarBuffer {
            planar: Planar::Nv12,
            ..
        } => (V::Nv12, false),
        SlotFormat::PlanarBuffer {
            planar: Planar::P010,
            ..
        } => (V::P01010le, false),
        SlotFormat::Image { vk_format } => match vk::Format::from_raw(vk_format as i32) {
            vk::Format::R8G8B8A8_UNORM => (V::Rgba, false),
            vk::Format::R8G8B8A8_SRGB => (V::Rgba, true),
            vk::Format::B8G8R8A8_UNORM => (V::Bgra, false),
            vk::Format::B8G8R8A8_SRGB => (V::Bgra, true),
            vk::Format::A2B10G10R10_UNORM_PACK32 => (V::Rgb10a2Le, false),
            vk::Format::R16_UNORM => (V::Gray16Le, false),
            other => {
                let named = vk_export::format::describe(other)
                    .map_or(format!("VkFormat {vk_format}"), |d| d.0.to_string());
                return Err(format!(
                    "the sender's {}x{} image ring is {named}, which has no GStreamer video \
                     format; cudainteropsrc takes {SUPPORTED}: publish one of those",
                    layout.width, layout.height
                ));
            }
        },
    };
    Ok(RingVideo {
        format,
        srgb,
        planes: Planes::of_ring(layout),
        width: layout.width,
        height: layout.height,
    })
}

/// The ring (planar or RGBA8) that `cudainteropsink` makes for `format`,
/// or `None` if it makes none.
pub(crate) fn sink_planar(format: gst_video::VideoFormat) -> Option<Option<Planar>> {
    match format {
        gst_video::VideoFormat::Rgba => Some(None),
        gst_video::VideoFormat::Nv12 => Some(Some(Planar::Nv12)),
        gst_video::VideoFormat::P01010le => Some(Some(Planar::P010)),
        _ => None,
    }
}

impl Planes {
    /// The planes of a read of `layout`'s ring: a buffer ring's rows at
    /// its pitch, the chroma plane at its offset; an image ring's rows
    /// tightly packed.
    pub(crate) fn of_ring(layout: &RingLayout) -> Planes {
        let (w, h, pitch) = (
            layout.width as usize,
            layout.height as usize,
            layout.row_pitch as usize,
        );
        match layout.format {
            SlotFormat::PlanarBuffer {
                planar,
                chroma_offset,
            } => {
                let row = w * planar.sample_bytes() as usize;
                Planes {
                    n: 2,
                    offsets: [0, chroma_offset as usize],
                    strides: [pitch, pitch],
                    rows: [h, h / 2],
                    row_bytes: [row, row],
                }
            }
            SlotFormat::Rgba8Buffer | SlotFormat::Image { .. } => {
                let row = w * layout.texel_bytes() as usize;
                Planes {
                    n: 1,
                    offsets: [0, 0],
                    strides: [pitch, 0],
                    rows: [h, 0],
                    row_bytes: [row, 0],
                }
            }
        }
    }

    /// The default layout of `info` (GStreamer's strides and offsets);
    /// `row_bytes` and `rows` are taken from `like` (the same format and
    /// size).
    pub(crate) fn of_info(info: &gst_video::VideoInfo, like: &Planes) -> Planes {
        let mut planes = *like;
        for i in 0..like.n {
            planes.offsets[i] = info.offset()[i];
            planes.strides[i] = info.stride()[i] as usize;
        }
        planes
    }

    /// Whether GStreamer's default layout of `info` (its strides and
    /// offsets, no `GstVideoMeta`) is `self`'s: then an element writing a
    /// frame of `info` into memory the sink offers writes the ring's rows.
    pub(crate) fn is_default_of(&self, info: &gst_video::VideoInfo) -> bool {
        info.n_planes() as usize == self.n
            && (0..self.n).all(|i| {
                info.offset().get(i) == Some(&self.offsets[i])
                    && info.stride().get(i).and_then(|&s| usize::try_from(s).ok())
                        == Some(self.strides[i])
            })
    }

    /// Bytes up to the end of the last plane's last whole row.
    pub(crate) fn span(&self) -> usize {
        (0..self.n)
            .map(|i| self.offsets[i] + self.rows[i] * self.strides[i])
            .max()
            .unwrap_or(0)
    }

    /// Copies every row of every plane from `src` (laid out as `from`) into
    /// `dst` (laid out as `self`).
    pub(crate) fn copy_rows(&self, dst: &mut [u8], from: &Planes, src: &[u8]) {
        for i in 0..self.n {
            let row = self.row_bytes[i];
            for y in 0..self.rows[i] {
                let s = from.offsets[i] + y * from.strides[i];
                let d = self.offsets[i] + y * self.strides[i];
                dst[d..d + row].copy_from_slice(&src[s..s + row]);
            }
        }
    }

    /// Checks that `buffer`'s `GstVideoMeta`, if it has one, keeps every row
    /// of every plane inside the buffer, before the buffer is mapped as
    /// video: GStreamer checks only each plane's offset, and a mapped
    /// plane's slice spans stride x rows whatever the buffer's size, so a
    /// meta that lies would have the rows read from past the buffer.
    pub(crate) fn check_meta(&self, buffer: &gst::BufferRef) -> Result<(), String> {
        let Some(meta) = buffer.meta::<gst_video::VideoMeta>() else {
            return Ok(());
        };
        if meta.n_planes() as usize != self.n {
            return Err(format!(
                "the buffer's video meta has {} planes, the caps {}",
                meta.n_planes(),
                self.n
            ));
        }
        let size = buffer.size();
        for i in 0..self.n {
            let (row, rows) = (self.row_bytes[i], self.rows[i]);
            let stride = meta.stride()[i];
            let end = usize::try_from(stride)
                .ok()
                .filter(|&s| s >= row)
                .and_then(|s| s.checked_mul(rows.saturating_sub(1)))
                .and_then(|last| last.checked_add(meta.offset()[i]))
                .and_then(|first| first.checked_add(row));
            match end {
                Some(end) if end <= size => {}
                _ => {
                    return Err(format!(
                        "the buffer's video meta puts plane {i} ({rows} rows of {row} bytes) at \
                         offset {} with stride {stride}, past the buffer's {size} bytes",
                        meta.offset()[i]
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether `buffer` (video of `info`, laid out as its `GstVideoMeta`
    /// says if it has one) holds its planes exactly where `self` puts them
    /// (the same offsets and strides), in one memory of at least `len`
    /// bytes: then its bytes go into a slot as they are, without
    /// [`Planes::pack`]'s copy.
    pub(crate) fn same_layout(
        &self,
        buffer: &gst::BufferRef,
        info: &gst_video::VideoInfo,
        len: usize,
    ) -> bool {
        if buffer.n_memory() != 1 || buffer.size() < len || info.n_planes() as usize != self.n {
            return false;
        }
        let meta = buffer.meta::<gst_video::VideoMeta>();
        let (offsets, strides): (&[usize], &[i32]) = match &meta {
            Some(meta) => (meta.offset(), meta.stride()),
            None => (info.offset(), info.stride()),
        };
        (0..self.n).all(|i| {
            offsets.get(i) == Some(&self.offsets[i])
                && strides.get(i).and_then(|&s| usize::try_from(s).ok()) == Some(self.strides[i])
        })
    }

    /// `frame`'s pixels (each plane at its own stride, a `GstVideoMeta`'s
    /// if the buffer has one) laid out as `self`, `len` bytes (at least
    /// [`Planes::span`]).
    pub(crate) fn pack(
        &self,
        frame: &gst_video::VideoFrameRef<&gst::BufferRef>,
        len: usize,
    ) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len.max(self.span())];
        if frame.n_planes() as usize != self.n {
            return Err(format!(
                "a {} frame of {} planes for a ring of {}",
                frame.format(),
                frame.n_planes(),
                self.n
            ));
        }
        for i in 0..self.n {
            let data = frame
                .plane_data(i as u32)
                .map_err(|e| format!("plane {i} of the buffer: {e}"))?;
            let stride = frame.plane_stride()[i] as usize;
            let row = self.row_bytes[i];
            for y in 0..self.rows[i] {
                let s = y * stride;
                let d = self.offsets[i] + y * self.strides[i];
                let src = data.get(s..s + row).ok_or_else(|| {
                    format!(
                        "row {y} of plane {i} lies past the buffer's {} bytes",
                        data.len()
                    )
                })?;
                out[d..d + row].copy_from_slice(src);
            }
        }
        Ok(out)
    }
}

/// How many freed allocations a [`Recycler`] keeps (a pipeline holds a
/// few buffers at once; more are freed, not kept).
const RECYCLED_MAX: usize = 8;

/// Allocations of freed [`FrameBytes`], for the next frames.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recycler(Arc<Mutex<Vec<Vec<u8>>>>);

impl Recycler {
    /// `len` bytes, in a kept allocation where there is one; their
    /// contents are unspecified (the caller overwrites them).
    pub(crate) fn take(&self, len: usize) -> FrameBytes {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut bytes = kept.unwrap_or_default();
        bytes.resize(len, 0);
        FrameBytes {
            bytes,
            home: Some(self.clone()),
        }
    }
}

/// A frame's bytes, given back to their [`Recycler`] (if any) when dropped.
#[derive(Debug)]
pub(crate) struct FrameBytes {
    bytes: Vec<u8>,
    home: Option<Recycler>,
}

impl FrameBytes {
    /// Bytes of no recycler.
    pub(crate) fn new(bytes: Vec<u8>) -> FrameBytes {
        FrameBytes { bytes, home: None }
    }

    fn resize(&mut self, len: usize) {
        self.bytes.resize(len, 0);
    }
}

impl std::ops::Deref for FrameBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for FrameBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl AsRef<[u8]> for FrameBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsMut<[u8]> for FrameBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for FrameBytes {
    fn drop(&mut self) {
        if let Some(home) = &self.home {
            let mut kept = home.0.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() < RECYCLED_MAX {
                kept.push(std::mem::take(&mut self.bytes));
            }
        }
    }
}

/// Makes the GStreamer buffer of a ring's read `bytes` (laid out as
/// `planes`) for `info` (see the module contract): `meta` says whether
/// downstream accepts a `GstVideoMeta`. The second value says whether the
/// rows were copied into the default layout.
pub(crate) fn to_buffer(
    mut bytes: FrameBytes,
    planes: &Planes,
    info: &gst_video::VideoInfo,
    meta: bool,
) -> Result<(gst::Buffer, bool), String> {
    let default = Planes::of_info(info, planes);
    if default == *planes {
        bytes.resize(info.size().max(bytes.len()));
        return Ok((gst::Buffer::from_mut_slice(bytes), false));
    }
    if meta {
        bytes.resize(planes.span().max(bytes.len()));
        let mut buffer = gst::Buffer::from_mut_slice(bytes);
        let strides: Vec<i32> = planes.strides[..planes.n]
            .iter()
            .map(|s| *s as i32)
            .collect();
        gst_video::VideoMeta::add_full(
            buffer.get_mut().expect("a new buffer is writable"),
            gst_video::VideoFrameFlags::empty(),
            info.format(),
            info.width(),
            info.height(),
            &planes.offsets[..planes.n],
            &strides,
        )
        .map_err(|e| format!("cannot add a GstVideoMeta: {e}"))?;
        return Ok((buffer, false));
    }
    let mut out = vec![0u8; info.size()];
    default.copy_rows(&mut out, planes, &bytes);
    Ok((gst::Buffer::from_mut_slice(out), true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init() {
        gst::init().unwrap();
    }

    /// GStreamer's RGB10A2_LE is Vulkan's A2B10G10R10_UNORM_PACK32: R in
    /// the low 10 bits of the little-endian word, then G, B, A (GStreamer's
    /// own unpacking of one pixel says so).
    #[test]
    fn rgb10a2_le_is_a2b10g10r10_pack32() {
        init();
        let info = gst_video::VideoFormatInfo::from_format(gst_video::VideoFormat::Rgb10a2Le);
        let word: u32 = 1 | (2 << 10) | (3 << 20) | (1 << 30);
        let src = word.to_le_bytes();
        assert_eq!(info.unpack_format(), gst_video::VideoFormat::Argb64);
        let mut argb64 = [0u8; 8];
        info.unpack(
            gst_video::VideoPackFlags::empty(),
            &mut argb64,
            &[&src[..]],
            &[4],
            0,
            0,
            1,
        );
        let c = |i: usize| u16::from_ne_bytes([argb64[2 * i], argb64[2 * i + 1]]) >> 6;
        // A (2 bits, 1 of 3), R, G, B (10 bits each).
        assert_eq!((c(1), c(2), c(3)), (1, 2, 3));
        assert_eq!(c(0) >> 8, 1, "alpha 1 of 3 is about a third");
    }

    #[test]
    fn padded_rgba_rows_become_a_meta_or_default_rows() {
        init();
        let layout = RingLayout::buffers(3, 3, 2, 16);
        let video = ring_video(&layout).unwrap();
        let info = video.info().unwrap();
        let bytes: Vec<u8> = (0..layout.frame_bytes().unwrap() as u8).collect();
        let (copied, repacked) =
            to_buffer(FrameBytes::new(bytes.clone()), &video.planes, &info, false).unwrap();
        assert!(repacked);
        let map = copied.map_readable().unwrap();
        assert_eq!(&map[..12], &bytes[..12]);
        assert_eq!(&map[12..24], &bytes[16..28]);
        let (with_meta, repacked) =
            to_buffer(FrameBytes::new(bytes), &video.planes, &info, true).unwrap();
        assert!(!repacked);
        let meta = with_meta.meta::<gst_video::VideoMeta>().unwrap();
        assert_eq!(meta.stride()[0], 16);
    }

    #[test]
    fn unsupported_image_formats_are_refused_with_the_list() {
        init();
        for (vk_format, texel) in [
            (vk::Format::R16G16B16A16_SFLOAT, 8),
            (vk::Format::R16G16_UNORM, 4),
        ] {
            let layout = RingLayout::images(2, 4, 4, vk_format.as_raw() as u32, texel);
            let e = ring_video(&layout).unwrap_err();
            assert!(e.contains("no GStreamer video format"), "{e}");
            assert!(e.contains("RGB10A2_LE"), "{e}");
        }
    }
}
