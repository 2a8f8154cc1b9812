//! The demo producer, shared by the frame examples and the crate's tests
//! (`#[path]`): a loop over a [`Sender`] that paints a test pattern into
//! every frame and reports what happens on stdout. It is not library code:
//! a sender of your own presents whatever it renders.
//!
//! # Contract
//!
//! * Each frame `f` (from 1) is written with transfer commands only, on the
//!   context's transfer queue where the device has a transfer-only family:
//!   the whole buffer filled with the `u32` `f` (little-endian RGBA bytes),
//!   then a band of `height / 16` rows at a row moving 8 rows a frame
//!   filled with `!f` ([`band_rows`]). Rows are
//!   [`ProducerOptions::row_pitch`] bytes apart. [`check_demo_row`] tells a
//!   receiver whether a row is frame `f`'s.
//! * [`run`] announces it as [`ProducerOptions::name`] (the default
//!   directory) when a name is given, else binds [`ProducerOptions::socket`].
//!   Frames are rendered only while a receiver is connected, and, with
//!   [`ProducerOptions::wait_for_receivers`], only once that many have
//!   subscribed ([`Sender::wait_for_receivers`], bounded by
//!   [`ProducerOptions::wait_timeout`]; the run time counts from then, and
//!   the run ends when they have all left).
//! * Bounded: the whole run ends after [`ProducerOptions::seconds`] (or
//!   [`ProducerOptions::frames`]). Progress goes to stdout, each line
//!   starting with [`ProducerOptions::tag`] (`[frame_server]`,
//!   `[renderer]`): every receiver that connects or leaves prints the
//!   number connected (`consumers=`), the process's fd count and, when a
//!   CUDA driver is there, `cuMemGetInfo`'s free memory, next to the values
//!   before the first receiver; every 5 s a line gives frames/s, frames
//!   presented and skipped, and back-pressure timeouts.
//! * [`ProducerOptions::image`] serves a ring of OPTIMAL images of one of
//!   the [`ImageFormat`]s instead (RGBA8, RGBA16F, BGRA8, A2B10G10R10,
//!   R16G16: texels of 4 or 8 bytes, the pattern's words copied bit for bit
//!   by [`record_demo_pattern_image`]).
//! * [`ProducerOptions::with_depth`] serves a multi-image ring instead
//!   (`--with-depth`): every slot a colour (RGBA8), a depth (R32_SFLOAT)
//!   and a segmentation (R32_UINT) image ([`DEPTH_PARTS`]), one frame.
//!   The application renders frame `f` into images of its own (RGBA8, a
//!   `D32_SFLOAT` depth attachment, R32_UINT; [`AppTargets`]) and
//!   publishes them with one `present_copy` (the depth by
//!   `vk_export::DepthSource`). Each part is the pattern's band over a
//!   background, with words of its own ([`part_words`]: the colour's are
//!   the image ring's, the depth's floats in [0, 1), the labels integers),
//!   all derived from `f`; [`check_part_row`] checks a row of any part.
//! * Memory and semaphores are what the device offers unless told
//!   ([`choose`], which says what it chose in one line): device-local slots
//!   where the device has device-local memory that is not host-visible,
//!   else host-visible (lavapipe); the timelines where the device exports
//!   semaphores (not lavapipe). [`ProducerOptions::host_visible`] and
//!   [`ProducerOptions::no_semaphores`] force the lavapipe choices;
//!   [`ProducerOptions::device_local`] and [`ProducerOptions::semaphores`]
//!   force what CUDA receivers need, and are refused (naming the flag to
//!   pass instead) where the device lacks it.

#![allow(dead_code, reason = "each example and test uses part of it")]

use std::time::{Duration, Instant};

use cuda_interop_frames::discovery::DiscoveryError;
use cuda_interop_frames::protocol::{PacketError, Planar, RingLayout};
use cuda_interop_frames::sender::{
    self, AcquireError, Address, ImagePart, ImageSender, ImageTarget, MultiImageSender, PartSource,
    Sender, SenderError, SenderOptions, SlotResource, WriteSlot,
};
use vk_export::ash::vk;
use vk_export::format::{
    A2b10g10r10UnormPack32, Bgra8Unorm, Format, R32Sfloat, R32Uint, Rg16Unorm, Rgba16Sfloat,
    Rgba8Srgb, Rgba8Unorm,
};
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Usage};
use vk_export::{
    Context, DepthCopy, DepthFormat, DepthSource, ExportableBuffer, HeadlessOptions, QueueRole,
    SourceImage, SourceSharing, SubmitSync, TimelineSemaphore,
};

type Res<T> = Result<T, ProducerError>;

/// What to serve, and for how long.
#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// What each progress line starts with.
    pub tag: &'static str,
    /// The name to announce (then `socket` is not used).
    pub name: Option<String>,
    /// The socket path (an existing file there is removed first).
    pub socket: String,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes from one row to the next (at least `width * 4`, a multiple of 4).
    pub row_pitch: u64,
    /// Slots in the ring (2 to `protocol::MAX_SLOTS`).
    pub slots: u32,
    /// How long the whole run lasts.
    pub seconds: f64,
    /// Stop after this many frames, if given.
    pub frames: Option<u64>,
    /// Frames a second at most (0: as fast as the receivers allow).
    pub fps: f64,
    /// Present nothing until this many receivers have subscribed, and stop
    /// when every receiver has left.
    pub wait_for_receivers: usize,
    /// How long to wait for them (then the run fails).
    pub wait_timeout: Duration,
    /// How long a receiver may hold a slot (or keep its GPU release waiting).
    pub hold_timeout: Duration,
    /// The Vulkan device's `deviceUUID` (default: the first device).
    pub device: Option<vk_export::DeviceUuid>,
    /// Host-visible ring memory, whatever the device offers.
    pub host_visible: bool,
    /// Device-local ring memory, or an error where the device has none.
    pub device_local: bool,
    /// Share only the slots, no timelines, whatever the device exports.
    pub no_semaphores: bool,
    /// Share the timelines, or an error where the device exports none.
    pub semaphores: bool,
    /// A ring of OPTIMAL images of this format
    /// ([`ImageSender`]) instead of pitched buffers
    /// (`row_pitch` then unused).
    pub image: Option<ImageFormat>,
    /// A buffer ring of planar YUV (NV12, P010) instead of RGBA8: the
    /// pattern's words fill both planes, the band lies in the luma plane.
    pub planar: Option<Planar>,
    /// A multi-image ring of colour, depth and segmentation
    /// ([`DEPTH_PARTS`]) instead (`image`, `planar` and `row_pitch` then
    /// unused; at most 3 slots).
    pub with_depth: bool,
    /// With `with_depth`: how many of [`DEPTH_PARTS`] (1 to 3) each frame
    /// has. One, the colour part alone through the same renderer and
    /// copies, is the baseline the three parts are measured against.
    pub parts: usize,
    /// With `with_depth`: a measurement knob: the application renders its
    /// images for the first frame only, and later frames copy them again
    /// (so their pattern is frame 1's: receivers must not check it). It
    /// separates the render's cost from the present's copies.
    pub render_once: bool,
    /// With `with_depth`: the application's images are created
    /// `CONCURRENT` (main and transfer families), so the present's copies
    /// may run on the transfer queue (copy engines): those of a ring of
    /// colour parts; a depth part is copied on a graphics family only, so
    /// its frames stay on the main queue.
    pub concurrent_targets: bool,
    /// With `with_depth`: a measurement knob: the depth part goes through a
    /// buffer even where the device could copy it directly
    /// (`vk_export::DepthCopy::ThroughBuffer`).
    pub depth_through_buffer: bool,
    /// With `with_depth`: a measurement knob: the application renders each
    /// image by a clear (the graphics engine writes it, as a renderer's
    /// draws do) and a copy of the band's rows only, instead of a fill and a
    /// copy of every byte on the copy engine. The same pattern either way.
    pub render_clears: bool,
}

/// The formats of the demo's image rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    /// `VK_FORMAT_R8G8B8A8_UNORM`.
    Rgba8,
    /// `VK_FORMAT_R16G16B16A16_SFLOAT` (the pattern's words are copied bit
    /// for bit: each 8-byte texel is two `u32` words of the pattern).
    Rgba16f,
    /// `VK_FORMAT_B8G8R8A8_UNORM` (a receiver sees the word's bytes in
    /// memory order: B, G, R, A).
    Bgra8,
    /// `VK_FORMAT_A2B10G10R10_UNORM_PACK32` (each texel one word of the
    /// pattern).
    Rgb10a2,
    /// `VK_FORMAT_R16G16_UNORM` (each texel one word of the pattern).
    Rg16,
    /// `VK_FORMAT_R8G8B8A8_SRGB` (a receiver sees the encoded bytes, the
    /// word's as for RGBA8; the ring is `usage::Sampled`: sRGB formats have
    /// no storage usage, so CUDA reads it through a texture or a copy).
    Rgba8Srgb,
}

impl ImageFormat {
    /// Every format, with its option value.
    pub const ALL: [(ImageFormat, &'static str); 6] = [
        (ImageFormat::Rgba8, "rgba8"),
        (ImageFormat::Rgba16f, "rgba16f"),
        (ImageFormat::Bgra8, "bgra8"),
        (ImageFormat::Rgb10a2, "rgb10a2"),
        (ImageFormat::Rg16, "rg16"),
        (ImageFormat::Rgba8Srgb, "rgba8-srgb"),
    ];

    /// The option values, for help texts and errors.
    pub const NAMES: &'static str = "rgba8|rgba16f|bgra8|rgb10a2|rg16|rgba8-srgb";

    /// One of [`ImageFormat::NAMES`].
    pub fn parse(name: &str) -> Option<ImageFormat> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(f, _)| *f)
    }

    /// Its `VkFormat` and texel size.
    pub fn vk(self) -> (vk::Format, u32) {
        fn of<F: Format>() -> (vk::Format, u32) {
            (F::VK, F::TEXEL_BYTES)
        }
        match self {
            ImageFormat::Rgba8 => of::<Rgba8Unorm>(),
            ImageFormat::Rgba16f => of::<Rgba16Sfloat>(),
            ImageFormat::Bgra8 => of::<Bgra8Unorm>(),
            ImageFormat::Rgb10a2 => of::<A2b10g10r10UnormPack32>(),
            ImageFormat::Rg16 => of::<Rg16Unorm>(),
            ImageFormat::Rgba8Srgb => of::<Rgba8Srgb>(),
        }
    }
}

/// A format of the demo's image rings, with the usage its rings are made
/// (and imported) with: storage and sampled (a CUDA surface) where the
/// format allows storage, sampled alone for sRGB.
pub trait DemoFormat: Format {
    /// The rings' usage preset.
    type Usage: Usage;
}

macro_rules! demo_formats {
    ($($format:ty => $usage:ty),* $(,)?) => {$(
        impl DemoFormat for $format {
            type Usage = $usage;
        }
    )*};
}
demo_formats!(
    Rgba8Unorm => usage::Storage,
    Rgba16Sfloat => usage::Storage,
    Bgra8Unorm => usage::Storage,
    A2b10g10r10UnormPack32 => usage::Storage,
    Rg16Unorm => usage::Storage,
    Rgba8Srgb => usage::Sampled,
);

/// Calls `$run::<F, ..>($($arg),*)` with the vk-export format type `F` of
/// `$format` (an [`ImageFormat`], which must be in scope by that name) as
/// the first generic argument.
macro_rules! with_image_format {
    ($format:expr, $run:ident::<_ $(, $m:ty)*>($($arg:expr),*)) => {{
        use vk_export::format::{A2b10g10r10UnormPack32, Bgra8Unorm, Rg16Unorm, Rgba16Sfloat, Rgba8Srgb, Rgba8Unorm};
        match $format {
            ImageFormat::Rgba8 => $run::<Rgba8Unorm $(, $m)*>($($arg),*),
            ImageFormat::Rgba16f => $run::<Rgba16Sfloat $(, $m)*>($($arg),*),
            ImageFormat::Bgra8 => $run::<Bgra8Unorm $(, $m)*>($($arg),*),
            ImageFormat::Rgb10a2 => $run::<A2b10g10r10UnormPack32 $(, $m)*>($($arg),*),
            ImageFormat::Rg16 => $run::<Rg16Unorm $(, $m)*>($($arg),*),
            ImageFormat::Rgba8Srgb => $run::<Rgba8Srgb $(, $m)*>($($arg),*),
        }
    }};
}
#[allow(unused_imports, reason = "each example and test uses part of it")]
pub(crate) use with_image_format;

impl Default for ProducerOptions {
    /// The `frame_server` defaults: no name, `/tmp/cuda-interop-frames.sock`,
    /// 4 slots of 1920x1080 with unpadded rows, 300 s, no frame limit, no
    /// rate limit, no receivers waited for (60 s if asked), a 5 s hold
    /// timeout, the first device, memory and semaphores as the device
    /// offers ([`choose`]).
    fn default() -> ProducerOptions {
        ProducerOptions {
            tag: "[frame_server]",
            name: None,
            socket: "/tmp/cuda-interop-frames.sock".into(),
            width: 1920,
            height: 1080,
            row_pitch: 1920 * 4,
            slots: 4,
            seconds: 300.0,
            frames: None,
            fps: 0.0,
            wait_for_receivers: 0,
            wait_timeout: Duration::from_secs(60),
            hold_timeout: Duration::from_secs(5),
            device: None,
            host_visible: false,
            device_local: false,
            no_semaphores: false,
            semaphores: false,
            image: None,
            planar: None,
            with_depth: false,
            parts: DEPTH_PARTS.len(),
            render_once: false,
            concurrent_targets: false,
            depth_through_buffer: false,
            render_clears: false,
        }
    }
}

impl ProducerOptions {
    /// How many of [`DEPTH_PARTS`] a `with_depth` ring serves.
    pub fn part_count(&self) -> usize {
        self.parts.clamp(1, DEPTH_PARTS.len())
    }

    /// Checks the options [`run`] needs: at least 2 slots, a valid ring
    /// layout, a positive finite run time, a valid name, no contradiction.
    pub fn validate(&self) -> Result<(), ProducerError> {
        if self.slots < 2 {
            return Err(ProducerError::Options(
                "at least 2 slots are needed: pass --slots 2 or more".into(),
            ));
        }
        if self.host_visible && self.device_local {
            return Err(ProducerError::Options(
                "host-visible and device-local memory both asked for: pass --host-visible or \
                 --device-local, not both"
                    .into(),
            ));
        }
        if self.semaphores && self.no_semaphores {
            return Err(ProducerError::Options(
                "semaphores both asked for and refused: pass --semaphores or --no-semaphores, \
                 not both"
                    .into(),
            ));
        }
        self.layout().check()?;
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return Err(ProducerError::Options(
                "the run time must be a positive number of seconds: pass --seconds S with S > 0"
                    .into(),
            ));
        }
        if let Some(name) = &self.name {
            cuda_interop_frames::discovery::validate_name(name)?;
        }
        Ok(())
    }

    /// The layout every receiver gets.
    pub fn layout(&self) -> RingLayout {
        if self.with_depth {
            let parts: Vec<_> = depth_parts()
                .iter()
                .take(self.part_count())
                .map(ImagePart::layout)
                .collect();
            RingLayout::multi_image(self.slots, self.width, self.height, &parts)
        } else if let Some(format) = self.image {
            let (vk_format, texel_bytes) = format.vk();
            RingLayout::images(
                self.slots,
                self.width,
                self.height,
                vk_format.as_raw() as u32,
                texel_bytes,
            )
        } else if let Some(planar) = self.planar {
            RingLayout::planar(self.slots, self.width, self.height, self.row_pitch, planar)
        } else {
            RingLayout::buffers(self.slots, self.width, self.height, self.row_pitch)
        }
    }
}

/// Why the producer stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The options cannot be served, or the run cannot start: what to pass
    /// instead ([`ProducerOptions::validate`], [`choose`], the wait for
    /// receivers).
    #[error("{0}")]
    Options(String),
    /// The ring layout is not a valid one.
    #[error(transparent)]
    Layout(#[from] PacketError),
    /// The name or the directory.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The sender failed.
    #[error(transparent)]
    Sender(#[from] SenderError),
    /// A Vulkan call failed (setup).
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
}

/// Open fds of this process.
fn fd_count() -> usize {
    // The directory's own fd is one of the entries.
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1))
}

/// `cuMemGetInfo`'s free bytes on the producer's GPU, if a CUDA driver is there.
struct CudaProbe(Option<cuda_interop::CudaDevice>);

impl CudaProbe {
    fn new(ctx: &Context, tag: &str) -> CudaProbe {
        match cuda_interop::CudaDevice::for_vulkan(ctx) {
            Ok(d) => CudaProbe(Some(d)),
            Err(e) => {
                println!("{tag} no CUDA for the memory report: {e}");
                CudaProbe(None)
            }
        }
    }

    fn free_mib(&self) -> Option<u64> {
        let device = self.0.as_ref()?;
        let get = cuda_interop::sys::Driver::global()
            .ok()?
            .fns()
            .cuMemGetInfo?;
        let _guard = device.enter().ok()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the device's primary context is current (the guard); the
        // call writes two sizes.
        let status = unsafe { get(&mut free, &mut total) };
        (status == cuda_interop::sys::CUresult::CUDA_SUCCESS).then_some(free as u64 >> 20)
    }
}

/// The pixel value (read as a little-endian `u32`) of the background of
/// frame `frame` of the demo pattern: the frame number itself.
pub fn background(frame: u64) -> u32 {
    frame as u32
}

/// The pixel value of the moving band of frame `frame`: every bit of the
/// background flipped.
pub fn band_value(frame: u64) -> u32 {
    !background(frame)
}

/// The rows `[start, end)` of the moving band of frame `frame` in an image
/// of `height` rows: `height / 16` rows (at least 1) moving down 8 rows a
/// frame.
pub fn band_rows(frame: u64, height: u32) -> (u32, u32) {
    let rows = (height / 16).max(1);
    let span = u64::from(height - rows + 1);
    let start = (frame.wrapping_mul(8) % span) as u32;
    (start, start + rows)
}

/// Records the demo pattern of frame `f` into `buffer` (`size` bytes, rows
/// of `row_bytes` bytes `pitch` apart): the whole buffer filled with `f`,
/// then the band ([`band_rows`] of `height`) with `!f`, transfer commands
/// only.
///
/// # Safety
///
/// `cmd` is a command buffer of `device` in the recording state, and
/// `buffer` a buffer of `device` of at least `size` bytes, made with
/// `TRANSFER_DST` usage, that outlives the commands' execution; `pitch` is
/// a multiple of 4, `row_bytes` rounded up to one is at most `pitch`, and
/// the band's rows lie inside the buffer.
pub unsafe fn record_demo_pattern(
    device: &vk_export::ash::Device,
    cmd: vk::CommandBuffer,
    buffer: vk::Buffer,
    size: u64,
    geometry: (u64, u32, u64),
    f: u64,
) {
    let words = (background(f), band_value(f));
    // SAFETY: the caller's guarantees are the function's.
    unsafe { record_pattern_words(device, cmd, buffer, (0, size), geometry, f, words) }
}

/// [`record_demo_pattern`] of words `(background, band)` into the `size`
/// bytes at `offset` of `buffer`.
///
/// # Safety
///
/// As [`record_demo_pattern`], for that range of the buffer (`offset` and
/// `size` multiples of 4).
pub unsafe fn record_pattern_words(
    device: &vk_export::ash::Device,
    cmd: vk::CommandBuffer,
    buffer: vk::Buffer,
    (offset, size): (u64, u64),
    (row_bytes, height, pitch): (u64, u32, u64),
    f: u64,
    (background, band): (u32, u32),
) {
    let (band_start, band_end) = band_rows(f, height);
    let band_offset = offset + u64::from(band_start) * pitch;
    let band_size = u64::from(band_end - band_start - 1) * pitch + row_bytes.next_multiple_of(4);
    let barrier = vk::BufferMemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(vk::AccessFlags::TRANSFER_WRITE)
        .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .buffer(buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    // SAFETY: the caller's guarantees; offsets and sizes are multiples of 4
    // inside the buffer.
    unsafe {
        device.cmd_fill_buffer(cmd, buffer, offset, size & !3, background);
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::TRANSFER,
            vk::DependencyFlags::empty(),
            &[],
            &[barrier],
            &[],
        );
        device.cmd_fill_buffer(cmd, buffer, band_offset, band_size, band);
    }
}

/// Records the demo pattern of frame `f` into an image slot of format `F`:
/// the pattern ([`record_demo_pattern`] over `u32` words, rows of `width`
/// texels unpadded) into `scratch`, then one copy of the whole of it into
/// the image (bit for bit), moved from `GENERAL` (where the sender gives
/// it) to `TRANSFER_DST_OPTIMAL` for the copy and back, transfer commands
/// only. Panics, recording nothing, if `F`'s texels are not whole words.
///
/// # Safety
///
/// As [`record_demo_pattern`] for `scratch` (at least `width * height *
/// F::TEXEL_BYTES` bytes, also with `TRANSFER_SRC` usage, not used by
/// pending commands), and `target` is the slot
/// [`WriteSlot::present_with`] gave this recording: an
/// image of `F` of `width` x `height` with `TRANSFER_DST` usage.
pub unsafe fn record_demo_pattern_image<F: Format>(
    device: &vk_export::ash::Device,
    cmd: vk::CommandBuffer,
    scratch: vk::Buffer,
    target: ImageTarget,
    (width, height): (u32, u32),
    f: u64,
) {
    assert!(
        F::TEXEL_BYTES % 4 == 0,
        "the demo pattern is made of u32 words; {} texels are {} bytes",
        F::NAME,
        F::TEXEL_BYTES
    );
    let words = width * (F::TEXEL_BYTES / 4);
    let size = u64::from(width) * u64::from(height) * u64::from(F::TEXEL_BYTES);
    let geometry = (u64::from(words) * 4, height, u64::from(words) * 4);
    let barrier = vk::BufferMemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(vk::AccessFlags::TRANSFER_READ)
        .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
        .buffer(scratch)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    let region = vk::BufferImageCopy::default()
        .image_subresource(vk::ImageSubresourceLayers {
            aspect_mask: vk::ImageAspectFlags::COLOR,
            mip_level: 0,
            base_array_layer: 0,
            layer_count: 1,
        })
        .image_extent(vk::Extent3D {
            width,
            height,
            depth: 1,
        });
    let layout = |old, new, src_access, dst_access| {
        vk::ImageMemoryBarrier::default()
            .src_access_mask(src_access)
            .dst_access_mask(dst_access)
            .old_layout(old)
            .new_layout(new)
            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .image(target.image)
            .subresource_range(vk::ImageSubresourceRange {
                aspect_mask: vk::ImageAspectFlags::COLOR,
                base_mip_level: 0,
                level_count: 1,
                base_array_layer: 0,
                layer_count: 1,
            })
    };
    let dst = vk::ImageLayout::TRANSFER_DST_OPTIMAL;
    let general = vk::ImageLayout::GENERAL;
    let write = vk::AccessFlags::TRANSFER_WRITE;
    // SAFETY: the caller's guarantees; the copy covers exactly the image,
    // from the first `size` bytes of the scratch buffer, and the image goes
    // back to GENERAL.
    unsafe {
        record_demo_pattern(device, cmd, scratch, size, geometry, f);
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::TRANSFER,
            vk::DependencyFlags::empty(),
            &[],
            &[barrier],
            &[layout(general, dst, vk::AccessFlags::empty(), write)],
        );
        device.cmd_copy_buffer_to_image(cmd, scratch, target.image, dst, &[region]);
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::TRANSFER,
            vk::PipelineStageFlags::TRANSFER,
            vk::DependencyFlags::empty(),
            &[],
            &[],
            &[layout(dst, general, write, write)],
        );
    }
}

/// Whether row `y` of frame `f` (`height` rows; read as little-endian
/// `u32` words, whatever the texel size) is the demo pattern's.
pub fn check_demo_row(row: &[u8], f: u64, y: u32, height: u32) -> bool {
    check_part_row(row, 0, f, y, height)
}

/// The parts of a `--with-depth` ring, in slot order.
pub const DEPTH_PARTS: [&str; 3] = ["color", "depth", "segmentation"];

/// The parts of a `--with-depth` ring: RGBA8 colour, R32_SFLOAT depth (a
/// `D32_SFLOAT` attachment's copy), R32_UINT segmentation.
pub fn depth_parts() -> Vec<ImagePart> {
    let part = |r: Result<ImagePart, PacketError>| r.expect("a valid part");
    vec![
        part(ImagePart::new::<Rgba8Unorm>(DEPTH_PARTS[0])),
        part(ImagePart::new::<R32Sfloat>(DEPTH_PARTS[1])),
        part(ImagePart::new::<R32Uint>(DEPTH_PARTS[2])),
    ]
}

/// The `(background, band)` words (little-endian `u32`s) of part `part` of
/// frame `f` of a `--with-depth` ring: the colour's are the image ring's
/// ([`background`], [`band_value`]); the depth's are the bits of `k /
/// 4096` and `(2k + 1) / 8192` for `k = f % 4096` (floats in [0, 1), exact
/// in 32 bits, as a `D32_SFLOAT` attachment holds them); the labels'
/// `f << 8 | 1` and `f << 8 | 2`.
pub fn part_words(part: usize, f: u64) -> (u32, u32) {
    match part {
        0 => (background(f), band_value(f)),
        1 => {
            let k = (f % 4096) as f32;
            ((k / 4096.0).to_bits(), ((2.0 * k + 1.0) / 8192.0).to_bits())
        }
        _ => (((f as u32) << 8) | 1, ((f as u32) << 8) | 2),
    }
}

/// Whether row `y` of part `part` of frame `f` (`height` rows, read as
/// little-endian `u32` words) is the pattern's ([`part_words`]; part 0 is
/// [`check_demo_row`]'s).
pub fn check_part_row(row: &[u8], part: usize, f: u64, y: u32, height: u32) -> bool {
    let (band_start, band_end) = band_rows(f, height);
    let (background, band) = part_words(part, f);
    let want = if (band_start..band_end).contains(&y) {
        band
    } else {
        background
    };
    row.chunks_exact(4)
        .all(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]) == want)
}

/// Serves frames as the module contract says until the run time or the
/// frame count is reached, and stops cleanly (every receiver disconnected,
/// the socket file and the directory entry removed).
pub fn run(opts: &ProducerOptions) -> Result<(), ProducerError> {
    opts.validate()?;
    let ctx = Context::headless(&HeadlessOptions {
        device_uuid: opts.device,
        depth_copy: match opts.depth_through_buffer {
            true => DepthCopy::ThroughBuffer,
            false => DepthCopy::IfAvailable,
        },
        ..HeadlessOptions::default()
    })?;
    let (choice, line) = choose(&ctx, opts)?;
    println!("{line}");
    if opts.with_depth {
        return run_with_depth(ctx, opts, choice);
    }
    match (choice.host_visible, opts.image) {
        (true, None) => run_buffers::<HostVisible>(ctx, opts, choice),
        (false, None) => run_buffers::<DeviceLocal>(ctx, opts, choice),
        (true, Some(format)) => {
            with_image_format!(format, run_images::<_, HostVisible>(ctx, opts, choice))
        }
        (false, Some(format)) => {
            with_image_format!(format, run_images::<_, DeviceLocal>(ctx, opts, choice))
        }
    }
}

/// What [`choose`] picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Host-visible slots (else device-local).
    pub host_visible: bool,
    /// Share the "produced" and "released" timelines.
    pub semaphores: bool,
}

/// The memory and semaphores of `opts`'s ring on `ctx` (see the module
/// contract), and one progress line saying what was chosen, why, and which
/// receivers take the ring.
pub fn choose(ctx: &Context, opts: &ProducerOptions) -> Result<(Choice, String), ProducerError> {
    let name = &ctx.identity().name;
    // SAFETY: the context's live instance and one of its physical devices.
    let memory = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    let types = &memory.memory_types[..(memory.memory_type_count as usize).min(32)];
    let offers_device_local = types.iter().any(|t| DeviceLocal::admits(t.property_flags));
    let exports = ctx.supports_semaphore_fds();
    if opts.device_local && !offers_device_local {
        return Err(ProducerError::Options(format!(
            "{name} has no device-local memory that is not host-visible (a CPU driver, such as \
             lavapipe): pass --host-visible instead of --device-local (or neither, to take what \
             the device offers); CUDA receivers need a GPU's driver"
        )));
    }
    if opts.semaphores && !exports {
        return Err(ProducerError::Options(format!(
            "{name} exports no semaphores (VK_KHR_external_semaphore_fd, which lavapipe lacks): \
             pass --no-semaphores instead of --semaphores (or neither, to take what the device \
             offers); CUDA receivers need a GPU driver that exports them"
        )));
    }
    let choice = Choice {
        host_visible: opts.host_visible || (!opts.device_local && !offers_device_local),
        semaphores: !opts.no_semaphores && exports,
    };
    let memory = match (choice.host_visible, opts.host_visible || opts.device_local) {
        (_, true) => "as told",
        (true, false) => "the device has no device-local memory that is not host-visible",
        (false, false) => "the device offers them",
    };
    let timelines = match (choice.semaphores, opts.semaphores || opts.no_semaphores) {
        (_, true) => "as told",
        (true, false) => "the device exports semaphores",
        (false, false) => "the device exports none",
    };
    let cuda = !choice.host_visible && choice.semaphores;
    let takers = match (
        opts.image.is_some() || opts.with_depth,
        cuda,
        choice.host_visible,
    ) {
        (true, true, _) => "CUDA and Vulkan receivers take the ring",
        (true, false, _) => {
            "Vulkan receivers take the ring (vulkan_client); CUDA ones need device-local slots \
             and timelines"
        }
        (false, true, _) => "CUDA receivers take the ring (frame_client, the Python module)",
        (false, false, true) => {
            "host receivers take the ring (the Python module's host reader); CUDA ones need \
             device-local slots and timelines"
        }
        (false, false, false) => {
            "no receiver takes this ring: pass --semaphores (CUDA) or --host-visible (host)"
        }
    };
    let line = format!(
        "{} chose on {name}: {} slots ({memory}), {} ({timelines}); {takers}",
        opts.tag,
        if choice.host_visible {
            "host-visible"
        } else {
            "device-local"
        },
        if choice.semaphores {
            "timelines shared"
        } else {
            "no timelines"
        },
    );
    Ok((choice, line))
}

fn run_buffers<M: MemoryLocation>(ctx: Context, opts: &ProducerOptions, choice: Choice) -> Res<()> {
    let sender = Sender::<M>::new(&ctx, sender_options(opts, choice)?)?;
    let pattern = Pattern::of(&sender);
    serve(&ctx, opts, sender, |slot| pattern.present(slot))
}

/// What presenting the demo pattern into a buffer ring's slot needs: the
/// slots' size and the ring's geometry.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    size: u64,
    geometry: (u64, u32, u64),
}

impl Pattern {
    /// For `sender`'s ring.
    pub fn of<M: MemoryLocation>(sender: &Sender<M>) -> Pattern {
        let layout = sender.layout();
        Pattern {
            size: sender.buffers()[0].size(),
            geometry: (
                u64::from(layout.width) * layout.texel_bytes(),
                layout.height,
                layout.row_pitch,
            ),
        }
    }

    /// Presents frame `slot.sequence()` of the pattern in `slot`, stamped
    /// now; its sequence number.
    pub fn present<M: MemoryLocation>(self, slot: WriteSlot<'_, M>) -> Result<u64, SenderError> {
        let f = slot.sequence();
        let Pattern { size, geometry } = self;
        slot.present_with(sender::monotonic_ns(), |device, cmd, buffer| {
            // SAFETY: the sender gives its recording command buffer and the
            // slot's buffer (`size` bytes, every slot's, transfer usage, kept
            // alive past the submission's wait); the layout was checked at
            // the sender's making, so the band lies inside it.
            unsafe { record_demo_pattern(device, cmd, buffer, size, geometry, f) }
        })
    }

    /// One frame of the pattern, if `sender` gives a slot within `timeout`:
    /// `Ok(false)` when every slot was held (skipped, or back-pressure),
    /// after serving receivers for a millisecond.
    pub fn present_next<M: MemoryLocation>(
        self,
        sender: &mut Sender<M>,
        timeout: Duration,
    ) -> Result<bool, SenderError> {
        match sender.acquire(timeout) {
            Ok(slot) => self.present(slot).map(|_| true),
            Err(AcquireError::AllSlotsHeld | AcquireError::Timeout(_)) => {
                sender.serve(Duration::from_millis(1));
                Ok(false)
            }
        }
    }
}

fn run_images<F: DemoFormat, M: MemoryLocation>(
    ctx: Context,
    opts: &ProducerOptions,
    choice: Choice,
) -> Res<()> {
    let sender = ImageSender::<F, M, F::Usage>::new(&ctx, sender_options(opts, choice)?)?;
    let bytes = u64::from(opts.width) * u64::from(opts.height) * u64::from(F::TEXEL_BYTES);
    let scratch = ExportableBuffer::<M>::new(&ctx, bytes)?;
    let extent = (opts.width, opts.height);
    let result = serve(&ctx, opts, sender, |slot| {
        let f = slot.sequence();
        slot.present_with(sender::monotonic_ns(), |device, cmd, target| {
            // SAFETY: the sender's recording command buffer and its slot of
            // `F` and `extent` (transfer usage, every preset has it); the
            // scratch buffer has the frame's bytes and transfer usage, and
            // present_with waits for each frame's commands, so no earlier
            // frame's copy still reads it.
            unsafe { record_demo_pattern_image::<F>(device, cmd, scratch.raw(), target, extent, f) }
        })
    });
    if result.is_err() {
        // A failed present may have left a submission that reads it
        // pending (vk-export does not track the closure's commands).
        std::mem::forget(scratch);
    }
    result
}

/// Serves a `--with-depth` ring on `ctx` (the memory `choice` says): each
/// frame rendered into the application's [`AppTargets`] and published with
/// one `present_copy` (see the module contract).
pub fn run_with_depth(ctx: Context, opts: &ProducerOptions, choice: Choice) -> Res<()> {
    match choice.host_visible {
        true => run_parts::<HostVisible>(ctx, opts, choice),
        false => run_parts::<DeviceLocal>(ctx, opts, choice),
    }
}

fn run_parts<M: MemoryLocation>(ctx: Context, opts: &ProducerOptions, choice: Choice) -> Res<()> {
    let sender_opts = SenderOptions {
        // The copies run where the application's images are: the main queue.
        queue: QueueRole::Main,
        ..sender_options(opts, choice)?
    }
    .with_parts(
        depth_parts()
            .into_iter()
            .take(opts.part_count())
            .collect::<Vec<_>>(),
    );
    let sender = MultiImageSender::<M>::new(&ctx, sender_opts)?;
    println!(
        "{} depth copies: {}",
        opts.tag,
        match ctx.copies_depth_to_color() {
            true => "one vkCmdCopyImage on the main queue (VK_KHR_maintenance8)",
            false => "through a buffer",
        }
    );
    let mut targets = AppTargets::new(
        &ctx,
        opts.width,
        opts.height,
        opts.part_count(),
        opts.concurrent_targets,
    )?;
    targets.render_clears = opts.render_clears;
    let result = serve(&ctx, opts, sender, |slot| {
        let f = slot.sequence();
        // Rendered on the GPU, not waited for: the copies wait for it.
        let rendered = match (opts.render_once, targets.rendered_value()) {
            (true, Some(value)) => value,
            _ => targets.render(f)?,
        };
        let (color, depth, labels) = targets.sources()?;
        let sources: [&dyn PartSource; 3] = [&color, &depth, &labels];
        let wait = Some((targets.timeline(), rendered));
        slot.present_copy(sender::monotonic_ns(), &sources[..targets.parts], wait)
    });
    if result.is_err() {
        // A failed submission may still use them: leaked, not destroyed.
        std::mem::forget(targets);
    } else {
        drop(targets);
    }
    if ctx.validation_enabled() {
        let ids = ctx.validation_error_ids();
        println!(
            "{} validation errors: {} {ids:?}",
            opts.tag,
            ctx.validation_errors()
        );
    }
    result
}

/// A failed `call` of the application's own.
fn vkerr(call: &'static str) -> impl Fn(vk::Result) -> vk_export::Error {
    move |result| vk_export::Error::Vulkan {
        call,
        result,
        hint: "",
    }
}

/// The layouts the application keeps its `--with-depth` images in between
/// frames (as a renderer's attachments are).
const TARGET_LAYOUTS: [vk::ImageLayout; 3] = [
    vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
    vk::ImageLayout::DEPTH_STENCIL_ATTACHMENT_OPTIMAL,
    vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
];

/// The application's own images of a `--with-depth` frame (no external
/// memory: a renderer's colour target, depth attachment and label target:
/// RGBA8, `D32_SFLOAT`, R32_UINT), and a scratch buffer each frame's
/// pattern is written into before it is copied into them. "Rendering" is
/// one submission of its own command buffer on the main queue, not waited
/// for, that leaves each image in its [`TARGET_LAYOUTS`] layout, owned by
/// the main family, and signals its timeline, which the present's copies
/// wait for on the GPU (one host wait a frame, the present's, as for a
/// ring of one image). Dropped, it waits (bounded) for its last render and
/// the context's queues, or leaks the images.
pub struct AppTargets {
    ctx: Context,
    extent: [u32; 2],
    images: [(vk::Image, vk::DeviceMemory); 3],
    scratch: vk::Buffer,
    scratch_memory: vk::DeviceMemory,
    /// Whether the images hold a frame (else they are in `UNDEFINED`).
    rendered: bool,
    /// The render's command pool and buffer (main family).
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    /// What each render signals, and the last value.
    timeline: TimelineSemaphore,
    value: u64,
    /// How many of the images (in [`AppTargets::FORMATS`] order) each
    /// render draws and each present copies out.
    parts: usize,
    /// How the images are shared between the context's queue families.
    sharing: SourceSharing,
    /// Render by clears and a band copy ([`ProducerOptions::render_clears`]).
    pub render_clears: bool,
}

impl AppTargets {
    const FORMATS: [vk::Format; 3] = [
        vk::Format::R8G8B8A8_UNORM,
        vk::Format::D32_SFLOAT,
        vk::Format::R32_UINT,
    ];

    /// The three images and the scratch buffer on `ctx`'s device; with
    /// `concurrent`, the images are `CONCURRENT` between the main and the
    /// transfer family (where they differ), so copies of them may run on
    /// the transfer queue.
    pub fn new(
        ctx: &Context,
        width: u32,
        height: u32,
        parts: usize,
        concurrent: bool,
    ) -> Result<AppTargets, vk_export::Error> {
        let device = ctx.device();
        let families = [ctx.queue_family(), ctx.queue_family_of(QueueRole::Transfer)];
        let concurrent = concurrent && families[0] != families[1];
        // SAFETY: a plain query on the context's live instance.
        let props = unsafe {
            ctx.instance()
                .get_physical_device_memory_properties(ctx.physical_device())
        };
        // A renderer's targets live in device-local memory: the first
        // allowed type with DEVICE_LOCAL, else the first allowed (the
        // first type need not be the GPU's memory: on NVIDIA type 0 is
        // system memory, which made every fill and copy cross PCIe).
        let memory_type = |bits: u32, want: vk::MemoryPropertyFlags| {
            let allowed = |i: &u32| bits & (1 << i) != 0;
            let has = |i: &u32, flags| {
                props.memory_types[*i as usize]
                    .property_flags
                    .contains(flags)
            };
            (0..props.memory_type_count)
                .filter(allowed)
                .find(|i| has(i, want | vk::MemoryPropertyFlags::DEVICE_LOCAL))
                .or_else(|| {
                    (0..props.memory_type_count)
                        .filter(allowed)
                        .find(|i| has(i, want))
                })
                .ok_or_else(|| {
                    vk_export::Error::InvalidArgument(format!("no memory type with {want:?}"))
                })
        };
        let mut made = AppTargets {
            ctx: ctx.clone(),
            extent: [width, height],
            images: [(vk::Image::null(), vk::DeviceMemory::null()); 3],
            scratch: vk::Buffer::null(),
            scratch_memory: vk::DeviceMemory::null(),
            rendered: false,
            parts: parts.clamp(1, 3),
            pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            timeline: TimelineSemaphore::new_local(ctx)?,
            value: 0,
            sharing: match concurrent {
                true => SourceSharing::Concurrent,
                false => SourceSharing::Exclusive(ctx.queue_family()),
            },
            render_clears: false,
        };
        // SAFETY: creation on the context's live device, kept in `made`,
        // whose drop destroys it once.
        unsafe {
            made.pool = device
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default().queue_family_index(ctx.queue_family()),
                    None,
                )
                .map_err(vkerr("vkCreateCommandPool"))?;
            made.cmd = device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(made.pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(vkerr("vkAllocateCommandBuffers"))?[0];
        }
        for (i, format) in Self::FORMATS.into_iter().enumerate() {
            let attachment = match format {
                vk::Format::D32_SFLOAT => vk::ImageUsageFlags::DEPTH_STENCIL_ATTACHMENT,
                _ => vk::ImageUsageFlags::COLOR_ATTACHMENT,
            };
            let mut info = vk::ImageCreateInfo::default()
                .image_type(vk::ImageType::TYPE_2D)
                .format(format)
                .extent(vk::Extent3D {
                    width,
                    height,
                    depth: 1,
                })
                .mip_levels(1)
                .array_layers(1)
                .samples(vk::SampleCountFlags::TYPE_1)
                .tiling(vk::ImageTiling::OPTIMAL)
                .usage(
                    vk::ImageUsageFlags::TRANSFER_SRC
                        | vk::ImageUsageFlags::TRANSFER_DST
                        | attachment,
                )
                .sharing_mode(vk::SharingMode::EXCLUSIVE)
                .initial_layout(vk::ImageLayout::UNDEFINED);
            if concurrent {
                info = info
                    .sharing_mode(vk::SharingMode::CONCURRENT)
                    .queue_family_indices(&families);
            }
            // SAFETY: creation, allocation and binding on the context's live
            // device; each object is kept in `made` at once, whose drop
            // destroys it once.
            unsafe {
                let image = device
                    .create_image(&info, None)
                    .map_err(vkerr("vkCreateImage"))?;
                made.images[i].0 = image;
                let reqs = device.get_image_memory_requirements(image);
                let alloc = vk::MemoryAllocateInfo::default()
                    .allocation_size(reqs.size)
                    .memory_type_index(memory_type(
                        reqs.memory_type_bits,
                        vk::MemoryPropertyFlags::empty(),
                    )?);
                let memory = device
                    .allocate_memory(&alloc, None)
                    .map_err(vkerr("vkAllocateMemory"))?;
                made.images[i].1 = memory;
                device
                    .bind_image_memory(image, memory, 0)
                    .map_err(vkerr("vkBindImageMemory"))?;
            }
        }
        let bytes = u64::from(width) * u64::from(height) * 4 * 3;
        // SAFETY: as above.
        unsafe {
            let buffer = device
                .create_buffer(
                    &vk::BufferCreateInfo::default().size(bytes).usage(
                        vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST,
                    ),
                    None,
                )
                .map_err(vkerr("vkCreateBuffer"))?;
            made.scratch = buffer;
            let reqs = device.get_buffer_memory_requirements(buffer);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(reqs.size)
                .memory_type_index(memory_type(
                    reqs.memory_type_bits,
                    vk::MemoryPropertyFlags::empty(),
                )?);
            made.scratch_memory = device
                .allocate_memory(&alloc, None)
                .map_err(vkerr("vkAllocateMemory"))?;
            device
                .bind_buffer_memory(buffer, made.scratch_memory, 0)
                .map_err(vkerr("vkBindBufferMemory"))?;
        }
        Ok(made)
    }

    /// "Renders" frame `f`: each image filled with its part's pattern
    /// ([`part_words`]) by one submission of the application's own on the
    /// main queue, not waited for: it signals the returned value of
    /// [`AppTargets::timeline`], which the present waits for on the GPU.
    pub fn render(&mut self, f: u64) -> Result<u64, vk_export::Error> {
        let device = self.ctx.device();
        // The last render completed (the present that waited for it on the
        // GPU returned after its copies completed); said here, bounded,
        // before its command buffer is recorded again.
        if self.value > 0 {
            self.timeline.wait(
                self.value,
                Duration::from_secs(5),
                vk_export::WaitStrategy::Block,
            )?;
        }
        let cmd = self.cmd;
        // SAFETY: the pool and its one command buffer are this value's, for
        // the main family; the buffer's last submission completed (above).
        unsafe {
            device
                .reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty())
                .map_err(vkerr("vkResetCommandPool"))?;
            device
                .begin_command_buffer(
                    cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(vkerr("vkBeginCommandBuffer"))?;
        }
        // SAFETY: `cmd` is recording, for a queue of the main family.
        unsafe { self.record(device, cmd, f) };
        // SAFETY: as above.
        unsafe { device.end_command_buffer(cmd) }.map_err(vkerr("vkEndCommandBuffer"))?;
        let value = self.value + 1;
        let signals = [self.timeline.raw()];
        let signal_values = [value];
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&signal_values);
        let cmds = [cmd];
        let submit = vk::SubmitInfo::default()
            .command_buffers(&cmds)
            .signal_semaphores(&signals)
            .push_next(&mut timeline);
        let submit_on = |q| {
            // SAFETY: the main queue under the context's lock; the command
            // buffer, images, scratch buffer and timeline live until the
            // submission completed (the next render and the drop wait for
            // its value).
            unsafe { device.queue_submit(q, &[submit], vk::Fence::null()) }
        };
        self.ctx
            .with_queue_of(QueueRole::Main, submit_on)?
            .map_err(vkerr("vkQueueSubmit"))?;
        self.value = value;
        self.rendered = true;
        Ok(value)
    }

    /// The value of [`AppTargets::timeline`] the last render signals, if
    /// any render was submitted.
    pub fn rendered_value(&self) -> Option<u64> {
        self.rendered.then_some(self.value)
    }

    /// What each render signals (its value [`AppTargets::render`] returns).
    pub fn timeline(&self) -> &TimelineSemaphore {
        &self.timeline
    }

    /// Records the fills and copies of frame `f` into `cmd`.
    ///
    /// # Safety
    /// `cmd` is a command buffer of the context's device in the recording
    /// state, for a queue of the main family, submitted once after the last
    /// render completed; every earlier use of the images (the last frame's
    /// copies out) completed or is on the main queue before it.
    unsafe fn record(&self, device: &vk_export::ash::Device, cmd: vk::CommandBuffer, f: u64) {
        let [width, height] = self.extent;
        let part_bytes = u64::from(width) * u64::from(height) * 4;
        let row = u64::from(width) * 4;
        let (images, scratch, rendered) = (self.images, self.scratch, self.rendered);
        let barrier = |image, aspect, old, new| {
            vk::ImageMemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
                .old_layout(old)
                .new_layout(new)
                .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                .image(image)
                .subresource_range(vk::ImageSubresourceRange {
                    aspect_mask: aspect,
                    base_mip_level: 0,
                    level_count: 1,
                    base_array_layer: 0,
                    layer_count: 1,
                })
        };
        let all = vk::PipelineStageFlags::ALL_COMMANDS;
        for (p, &(image, _)) in images.iter().enumerate().take(self.parts) {
            let aspect = match p {
                1 => vk::ImageAspectFlags::DEPTH,
                _ => vk::ImageAspectFlags::COLOR,
            };
            let at = part_bytes * p as u64;
            let old = match rendered {
                true => TARGET_LAYOUTS[p],
                false => vk::ImageLayout::UNDEFINED,
            };
            let dst = vk::ImageLayout::TRANSFER_DST_OPTIMAL;
            let region = vk::BufferImageCopy::default()
                .buffer_offset(at)
                .image_subresource(vk::ImageSubresourceLayers {
                    aspect_mask: aspect,
                    mip_level: 0,
                    base_array_layer: 0,
                    layer_count: 1,
                })
                .image_extent(vk::Extent3D {
                    width,
                    height,
                    depth: 1,
                });
            let written = vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
            let (background, band) = part_words(p, f);
            let (band_start, band_end) = band_rows(f, height);
            // The band's rows: the bytes a clear render copies.
            let band_region = vk::BufferImageCopy {
                buffer_offset: at + u64::from(band_start) * row,
                image_offset: vk::Offset3D {
                    x: 0,
                    y: band_start as i32,
                    z: 0,
                },
                image_extent: vk::Extent3D {
                    width,
                    height: band_end - band_start,
                    depth: 1,
                },
                ..region
            };
            let range = vk::ImageSubresourceRange {
                aspect_mask: aspect,
                base_mip_level: 0,
                level_count: 1,
                base_array_layer: 0,
                layer_count: 1,
            };
            // SAFETY: the caller's: a recording command buffer of a
            // main-queue submission whose timeline value the next render,
            // the present and the drop wait for; the images and the
            // scratch buffer are this value's, alive past it (its
            // drop waits for the queues); part `p`'s range of the
            // scratch buffer holds its whole image, 4-byte words,
            // the depth ones floats in [0, 1) (part_words), which a
            // D32_SFLOAT copy or clear requires; the images have
            // transfer-destination usage (clears and copies); every
            // earlier use of the images (the last frame's copies out) is
            // on this queue, ordered by the full barriers.
            unsafe {
                if self.render_clears {
                    device.cmd_fill_buffer(
                        cmd,
                        scratch,
                        band_region.buffer_offset,
                        u64::from(band_end - band_start) * row,
                        band,
                    );
                } else {
                    record_pattern_words(
                        device,
                        cmd,
                        scratch,
                        (at, part_bytes),
                        (row, height, row),
                        f,
                        (background, band),
                    );
                }
                device.cmd_pipeline_barrier(
                    cmd,
                    all,
                    all,
                    vk::DependencyFlags::empty(),
                    &[written],
                    &[],
                    &[barrier(image, aspect, old, dst)],
                );
                if self.render_clears {
                    let bytes = background.to_le_bytes();
                    match p {
                        1 => device.cmd_clear_depth_stencil_image(
                            cmd,
                            image,
                            dst,
                            &vk::ClearDepthStencilValue {
                                depth: f32::from_bits(background),
                                stencil: 0,
                            },
                            &[range],
                        ),
                        0 => device.cmd_clear_color_image(
                            cmd,
                            image,
                            dst,
                            // UNORM: each byte b as (b + 0.25) / 255,
                            // which rounding to nearest and truncation
                            // (the spec only recommends the first) both
                            // write back as b.
                            &vk::ClearColorValue {
                                float32: bytes.map(|b| (f32::from(b) + 0.25) / 255.0),
                            },
                            &[range],
                        ),
                        _ => device.cmd_clear_color_image(
                            cmd,
                            image,
                            dst,
                            &vk::ClearColorValue {
                                uint32: [background, 0, 0, 0],
                            },
                            &[range],
                        ),
                    }
                    device.cmd_pipeline_barrier(
                        cmd,
                        all,
                        all,
                        vk::DependencyFlags::empty(),
                        &[written],
                        &[],
                        &[],
                    );
                    device.cmd_copy_buffer_to_image(cmd, scratch, image, dst, &[band_region]);
                } else {
                    device.cmd_copy_buffer_to_image(cmd, scratch, image, dst, &[region]);
                }
                device.cmd_pipeline_barrier(
                    cmd,
                    all,
                    all,
                    vk::DependencyFlags::empty(),
                    &[],
                    &[],
                    &[barrier(image, aspect, dst, TARGET_LAYOUTS[p])],
                );
            }
        }
    }

    /// The copy sources of the last rendered frame, in [`DEPTH_PARTS`]
    /// order.
    pub fn sources(
        &self,
    ) -> Result<(SourceImage<Rgba8Unorm>, DepthSource, SourceImage<R32Uint>), vk_export::Error>
    {
        let own = self.sharing;
        let [c, d, s] = self.images.map(|(image, _)| image);
        // SAFETY: live images of the context's device of these formats and
        // extent, with transfer-source usage, each in its TARGET_LAYOUTS
        // layout, owned by the main family (or CONCURRENT between it and
        // the transfer family, as `sharing` says) after `render`'s submission,
        // which completed before this returns (it is waited for); nothing
        // else writes them until the next `render`, which comes after the
        // present that copies them returned (the copies completed or, after
        // a timeout, the run ends and the drop waits for the queues).
        unsafe {
            Ok((
                SourceImage::new(c, self.extent, TARGET_LAYOUTS[0], own)?,
                DepthSource::new(
                    d,
                    DepthFormat::D32Sfloat,
                    self.extent,
                    TARGET_LAYOUTS[1],
                    own,
                )?,
                SourceImage::new(s, self.extent, TARGET_LAYOUTS[2], own)?,
            ))
        }
    }
}

impl Drop for AppTargets {
    fn drop(&mut self) {
        // The last render, then an empty submission waited for on each
        // queue: every earlier one (the renders, the copies out) completed.
        let rendered = self.value == 0
            || self
                .timeline
                .wait(
                    self.value,
                    Duration::from_secs(10),
                    vk_export::WaitStrategy::Block,
                )
                .is_ok();
        if !rendered {
            eprintln!("the application's images are leaked: its last render did not finish");
            return;
        }
        for role in [QueueRole::Main, QueueRole::Transfer] {
            let sync = SubmitSync::new().timeout(Duration::from_secs(10));
            if self
                .ctx
                .submit_and_wait_on(role, sync, |_, _, _| {})
                .is_err()
            {
                eprintln!("the application's images are leaked: a queue did not finish");
                return;
            }
        }
        let device = self.ctx.device();
        // SAFETY: made in `new` (null handles are ignored by Vulkan's
        // destroy and free calls), destroyed once, no GPU work uses them
        // any more (the waits above).
        unsafe {
            for (image, memory) in self.images {
                device.destroy_image(image, None);
                device.free_memory(memory, None);
            }
            device.destroy_buffer(self.scratch, None);
            device.free_memory(self.scratch_memory, None);
            device.destroy_command_pool(self.pool, None);
        }
    }
}

fn sender_options(opts: &ProducerOptions, choice: Choice) -> Res<SenderOptions> {
    let address = match &opts.name {
        Some(name) => Address::named(name)?,
        None => Address::Path(opts.socket.clone().into()),
    };
    Ok(SenderOptions {
        row_pitch: opts.row_pitch,
        planar: opts.planar,
        hold_timeout: opts.hold_timeout,
        semaphores: choice.semaphores,
        // The demo pattern is transfer commands only.
        queue: QueueRole::Transfer,
        ..SenderOptions::new(address, opts.width, opts.height, opts.slots)
    })
}

/// The serving loop of [`run`] over a sender the caller made (on a context
/// of its own, e.g. `Context::from_raw`, the `renderer` example):
/// `present` paints and presents each slot; `opts` gives the run's bounds,
/// name and the frame rate cap (its memory, semaphore and image fields are
/// the caller's sender's business and only named in the first line). The
/// progress lines are [`run`]'s (see the module contract), and so is the
/// wait for [`ProducerOptions::wait_for_receivers`].
pub fn serve<M: MemoryLocation, R: SlotResource<M>>(
    ctx: &Context,
    opts: &ProducerOptions,
    mut sender: Sender<M, R>,
    mut present: impl FnMut(WriteSlot<'_, M, R>) -> Result<u64, SenderError>,
) -> Result<(), ProducerError> {
    let tag = opts.tag;
    let what = if opts.with_depth {
        format!(
            "{} images each",
            DEPTH_PARTS[..opts.part_count()].join(" + ")
        )
    } else if let Some(format) = opts.image {
        format!("an OPTIMAL {:?} image each", format.vk().0)
    } else {
        format!("RGBA8, row pitch {} bytes", opts.row_pitch)
    };
    println!(
        "{tag} {} ({}), {} slots of {}x{} {what}",
        ctx.identity().name,
        ctx.identity().device_uuid_string(),
        opts.slots,
        opts.width,
        opts.height,
    );
    let cuda = CudaProbe::new(ctx, tag);
    let baseline = (fd_count(), cuda.free_mib());
    // "consumers" and "before any consumer" are the words the Python tests
    // and gpu_demo.sh read.
    let report = |what: &str, receivers: usize| {
        let show = |m: Option<u64>| m.map_or("n/a".to_string(), |m| m.to_string());
        println!(
            "{tag} {what}: consumers={receivers} fds={} cuda_free_mib={} (before any consumer: fds={} cuda_free_mib={})",
            fd_count(),
            show(cuda.free_mib()),
            baseline.0,
            show(baseline.1),
        );
    };
    // A named sender's socket is renamed into the directory once bound:
    // the directory is what receivers look in.
    let listening = match &sender.options().address {
        Address::Named { directory, name } => {
            format!("announced as {name:?} in {}", directory.path().display())
        }
        Address::Path(path) => format!("listening on {}", path.display()),
    };
    report(&listening, 0);
    let n = opts.wait_for_receivers;
    if n > 0 {
        println!(
            "{tag} waiting up to {:.1} s for {n} receiver(s) to subscribe before presenting",
            opts.wait_timeout.as_secs_f64()
        );
        if !sender.wait_for_receivers(n, opts.wait_timeout) {
            for line in sender.take_log() {
                println!("{tag} {line}");
            }
            return Err(ProducerError::Options(format!(
                "fewer than {n} receiver(s) subscribed within {:.1} s: start them sooner, or \
                 pass a longer --wait-timeout or a smaller --wait-for-receivers",
                opts.wait_timeout.as_secs_f64()
            )));
        }
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(opts.seconds);
    let period = (opts.fps > 0.0).then(|| Duration::from_secs_f64(1.0 / opts.fps));
    let (mut last_stats, mut last_presented) = (Instant::now(), 0u64);
    // Where the sender's time goes, per presented frame: waiting for a
    // free slot, and the present (the application's work and the copies).
    let (mut acquiring, mut presenting) = (Vec::new(), Vec::new());
    let mut receivers;
    let result = loop {
        let stats = sender.stats();
        receivers = stats.receivers;
        for line in sender.take_log() {
            // Arrivals and departures carry the fd and memory report.
            if line.contains(" connected") || line.contains(" left after ") {
                report(&line, receivers);
            } else {
                println!("{tag} {line}");
            }
        }
        // Receivers waited for: the run is theirs, and ends when they left.
        let served = n > 0 && stats.receivers == 0;
        if served || Instant::now() >= end || opts.frames.is_some_and(|n| stats.presented >= n) {
            println!(
                "{tag} done: {} frames presented, {} skipped (every slot held), \
                 {} back-pressure timeouts in {:.1} s",
                stats.presented,
                stats.skipped,
                stats.backpressure_timeouts,
                start.elapsed().as_secs_f64()
            );
            if !presenting.is_empty() {
                println!(
                    "{tag} per frame: waiting for a slot median {:.1} us, presenting median \
                     {:.1} us p90 {:.1} us",
                    quantile(&mut acquiring, 0.5),
                    quantile(&mut presenting, 0.5),
                    quantile(&mut presenting, 0.9),
                );
            }
            break Ok(());
        }
        if last_stats.elapsed() >= Duration::from_secs(5) {
            println!(
                "{tag} frame {}: {:.0} frames/s to {} receiver(s), {} skipped, {} back-pressure timeouts",
                stats.presented,
                (stats.presented - last_presented) as f64 / last_stats.elapsed().as_secs_f64(),
                stats.receivers,
                stats.skipped,
                stats.backpressure_timeouts
            );
            (last_stats, last_presented) = (Instant::now(), stats.presented);
        }
        if stats.receivers == 0 {
            sender.serve(sender::POLL);
            continue;
        }
        let frame_start = Instant::now();
        match sender.acquire(sender::POLL) {
            Ok(slot) => {
                let acquired = Instant::now();
                if let Err(e) = present(slot) {
                    break Err(e.into());
                }
                acquiring.push((acquired - frame_start).as_secs_f64() * 1e6);
                presenting.push(acquired.elapsed().as_secs_f64() * 1e6);
            }
            // Every slot held by latest receivers: this frame is skipped.
            Err(AcquireError::AllSlotsHeld) => sender.serve(Duration::from_millis(1)),
            Err(AcquireError::Timeout(_)) => {}
        }
        if let Some(p) = period {
            std::thread::sleep(p.saturating_sub(frame_start.elapsed()));
        }
    };
    drop(sender);
    report("stopped", 0);
    result
}

/// The `q` quantile (0 to 1) of `samples` (sorted here); NaN if empty.
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    quantile_of_sorted(samples, q)
}

/// The `q` quantile of `sorted` samples; NaN if there are none.
pub fn quantile_of_sorted(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}
