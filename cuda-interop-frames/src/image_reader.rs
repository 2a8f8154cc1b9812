//! A Vulkan reader of an image ring whose format, memory class and usage
//! are known only at run time: one type over the typed
//! [`VulkanReceiver`]s, picked from the ring itself (what a C ABI, a
//! GStreamer element or a tool that takes "whatever the sender shares"
//! needs).
//!
//! # Contract
//!
//! * [`ImageReader::new`] reads the ring's `VkFormat` from the hello and
//!   the memory class and usage from the first image record, and makes the
//!   [`VulkanReceiver`] of those type parameters on the caller's
//!   [`Context`] (it imports and verifies, as every Vulkan receiver does).
//!   Formats: [`FORMATS`]; memory: device-local, or host-visible (a record
//!   whose memory is device-local, or not host-visible, counts as
//!   device-local, as the sender's type decides); usage: the presets
//!   `usage::Storage` or `usage::Sampled`. Anything else is an
//!   [`ImageReaderError`] that says what it was (a buffer ring, another
//!   format, another usage), so that a caller can word its own message.
//! * Every other method is the typed receiver's, unchanged:
//!   [`ImageReader::next`], [`ImageReader::read_pixels`] (tightly packed
//!   rows of texels, [`ImageReader::frame_bytes`] bytes) and
//!   [`ImageReader::release`] keep [`VulkanReceiver`]'s guarantees (bounded
//!   waits, pixels that are the frame's or an error, no GPU signal needed
//!   on release); [`ImageReader::image`] gives a slot's imported image,
//!   left between reads in `GENERAL`, owned by `VK_QUEUE_FAMILY_EXTERNAL`.
//! * Thread-safe (`Send + Sync`), as the receivers are.

use std::time::Duration;

use vk_export::ash::vk;
use vk_export::format::{
    A2b10g10r10UnormPack32, Bgra8Srgb, Bgra8Unorm, Format, R16Unorm, Rg16Unorm, Rgba16Sfloat,
    Rgba8Srgb, Rgba8Unorm,
};
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Usage};
use vk_export::wire::{Received, Resource};
use vk_export::Context;

use crate::protocol::RingLayout;
use crate::session::{has_semaphores, Frame, Session};
use crate::vulkan_receiver::{VulkanReceiver, VulkanReceiverError};

/// The `VkFormat`s an [`ImageReader`] reads.
pub const FORMATS: [vk::Format; 8] = [
    vk::Format::R8G8B8A8_UNORM,
    vk::Format::R8G8B8A8_SRGB,
    vk::Format::B8G8R8A8_UNORM,
    vk::Format::B8G8R8A8_SRGB,
    vk::Format::A2B10G10R10_UNORM_PACK32,
    vk::Format::R16_UNORM,
    vk::Format::R16G16_UNORM,
    vk::Format::R16G16B16A16_SFLOAT,
];

/// Why [`ImageReader::new`] made no reader.
#[derive(Debug, thiserror::Error)]
pub enum ImageReaderError {
    /// The ring is a buffer ring (RGBA8, NV12, P010), not an image ring.
    #[error(
        "the sender shares pitched buffers ({width}x{height}), not images: a host receiver \
         (host_receiver::HostReceiver) or a CUDA one (cuda_receiver::CudaReceiver) reads them"
    )]
    NotImages {
        /// The ring's width.
        width: u32,
        /// The ring's height.
        height: u32,
    },
    /// The images' format is not one of [`FORMATS`].
    #[error(
        "the sender's images are VkFormat {vk_format}: an image reader takes {}",
        format_names()
    )]
    Format {
        /// The raw `VkFormat`.
        vk_format: u32,
    },
    /// The images' usage is not one of the presets it reads.
    #[error(
        "the sender's images have usage {0:?}: an image reader takes images made with storage or \
         sampled usage (usage::Storage or usage::Sampled)"
    )]
    Usage(vk::ImageUsageFlags),
    /// The typed receiver refused the ring, or importing failed.
    #[error(transparent)]
    Receiver(#[from] VulkanReceiverError),
}

/// [`FORMATS`] in words, for messages.
pub fn format_names() -> String {
    FORMATS
        .iter()
        .map(|f| format!("{f:?} ({})", f.as_raw()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What every typed receiver does, without its type parameters.
trait Reader: Send + Sync + std::fmt::Debug {
    fn session(&self) -> &Session;
    fn image(&self, slot: u32) -> Option<vk::Image>;
    fn next(&self, timeout: Duration) -> Result<Frame, VulkanReceiverError>;
    fn read_pixels(&self, frame: &Frame, timeout: Duration)
        -> Result<Vec<u8>, VulkanReceiverError>;
    fn wait_produced(&self, frame: &Frame, timeout: Duration) -> Result<(), VulkanReceiverError>;
    fn release(&self, frame: Frame) -> Result<(), VulkanReceiverError>;
}

impl<F: Format, M: MemoryLocation, U: Usage> Reader for VulkanReceiver<F, M, U>
where
    VulkanReceiver<F, M, U>: Send + Sync,
{
    fn session(&self) -> &Session {
        VulkanReceiver::session(self)
    }

    fn image(&self, slot: u32) -> Option<vk::Image> {
        self.images().get(slot as usize).map(|i| i.raw())
    }

    fn next(&self, timeout: Duration) -> Result<Frame, VulkanReceiverError> {
        VulkanReceiver::next(self, timeout)
    }

    fn read_pixels(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<u8>, VulkanReceiverError> {
        VulkanReceiver::read_pixels(self, frame, timeout)
    }

    fn wait_produced(&self, frame: &Frame, timeout: Duration) -> Result<(), VulkanReceiverError> {
        VulkanReceiver::wait_produced(self, frame, timeout)
    }

    fn release(&self, frame: Frame) -> Result<(), VulkanReceiverError> {
        VulkanReceiver::release(self, frame)
    }
}

/// A Vulkan receiver of an image ring of any of [`FORMATS`] (see the
/// module contract).
#[derive(Debug)]
pub struct ImageReader {
    reader: Box<dyn Reader>,
    format: vk::Format,
    texel_bytes: u32,
    usage: vk::ImageUsageFlags,
    timeline: bool,
}

fn typed<F: Format, M: MemoryLocation, U: Usage>(
    ctx: &Context,
    session: Session,
    setup: Received,
) -> Result<ImageReader, ImageReaderError>
where
    VulkanReceiver<F, M, U>: Send + Sync,
{
    let timeline = has_semaphores(session.layout(), &setup);
    let rx = VulkanReceiver::<F, M, U>::new(ctx, session, setup)?;
    Ok(ImageReader {
        reader: Box::new(rx),
        format: F::VK,
        texel_bytes: F::TEXEL_BYTES,
        usage: U::VK,
        timeline,
    })
}

/// [`typed`] for the memory class and usage the ring's first image record
/// names.
fn of_format<F: Format>(
    ctx: &Context,
    session: Session,
    setup: Received,
) -> Result<ImageReader, ImageReaderError> {
    let (flags, memory) = match setup.message().resources.first() {
        Some(Resource::Image(info)) => (info.usage(), info.memory_flags()),
        // VulkanReceiver::new refuses it with what it is.
        _ => (usage::Storage::VK, vk::MemoryPropertyFlags::DEVICE_LOCAL),
    };
    let device_local = DeviceLocal::admits(memory) || !HostVisible::admits(memory);
    match (device_local, flags) {
        (true, f) if f == usage::Sampled::VK => {
            typed::<F, DeviceLocal, usage::Sampled>(ctx, session, setup)
        }
        (false, f) if f == usage::Sampled::VK => {
            typed::<F, HostVisible, usage::Sampled>(ctx, session, setup)
        }
        (true, f) if f == usage::Storage::VK => {
            typed::<F, DeviceLocal, usage::Storage>(ctx, session, setup)
        }
        (false, f) if f == usage::Storage::VK => {
            typed::<F, HostVisible, usage::Storage>(ctx, session, setup)
        }
        (_, f) => Err(ImageReaderError::Usage(f)),
    }
}

impl ImageReader {
    /// Imports `session`'s image ring (its setup message) on `ctx`, as the
    /// [`VulkanReceiver`] its format, memory and usage call for.
    pub fn new(
        ctx: &Context,
        session: Session,
        setup: Received,
    ) -> Result<ImageReader, ImageReaderError> {
        let layout = *session.layout();
        let Some(format) = layout.vk_format() else {
            return Err(ImageReaderError::NotImages {
                width: layout.width,
                height: layout.height,
            });
        };
        match vk::Format::from_raw(format as i32) {
            vk::Format::R8G8B8A8_UNORM => of_format::<Rgba8Unorm>(ctx, session, setup),
            vk::Format::R8G8B8A8_SRGB => of_format::<Rgba8Srgb>(ctx, session, setup),
            vk::Format::B8G8R8A8_UNORM => of_format::<Bgra8Unorm>(ctx, session, setup),
            vk::Format::B8G8R8A8_SRGB => of_format::<Bgra8Srgb>(ctx, session, setup),
            vk::Format::A2B10G10R10_UNORM_PACK32 => {
                of_format::<A2b10g10r10UnormPack32>(ctx, session, setup)
            }
            vk::Format::R16_UNORM => of_format::<R16Unorm>(ctx, session, setup),
            vk::Format::R16G16_UNORM => of_format::<Rg16Unorm>(ctx, session, setup),
            vk::Format::R16G16B16A16_SFLOAT => of_format::<Rgba16Sfloat>(ctx, session, setup),
            _ => Err(ImageReaderError::Format { vk_format: format }),
        }
    }

    /// The session (layout, delivery, statistics, why it ended).
    pub fn session(&self) -> &Session {
        self.reader.session()
    }

    /// The ring's layout.
    pub fn layout(&self) -> &RingLayout {
        self.session().layout()
    }

    /// The images' `VkFormat`.
    pub fn format(&self) -> vk::Format {
        self.format
    }

    /// Bytes of one texel of the format.
    pub fn texel_bytes(&self) -> u64 {
        u64::from(self.texel_bytes)
    }

    /// Bytes of [`ImageReader::read_pixels`]'s result: `width * height *
    /// texel_bytes`.
    pub fn frame_bytes(&self) -> u64 {
        let layout = self.layout();
        u64::from(layout.width) * u64::from(layout.height) * self.texel_bytes()
    }

    /// The images' `VkImageUsageFlags` (a preset's).
    pub fn usage(&self) -> vk::ImageUsageFlags {
        self.usage
    }

    /// Whether the ring shares a "produced" timeline.
    pub fn has_semaphores(&self) -> bool {
        self.timeline
    }

    /// Slot `slot`'s imported image on the reader's device (see the module
    /// contract for its state between reads), if the ring has that slot.
    pub fn image(&self, slot: u32) -> Option<vk::Image> {
        self.reader.image(slot)
    }

    /// The next frame ([`VulkanReceiver::next`]).
    pub fn next(&self, timeout: Duration) -> Result<Frame, VulkanReceiverError> {
        self.reader.next(timeout)
    }

    /// The frame's pixels, tightly packed rows of texels
    /// ([`VulkanReceiver::read_pixels`]).
    pub fn read_pixels(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<u8>, VulkanReceiverError> {
        self.reader.read_pixels(frame, timeout)
    }

    /// Waits until the sender's writes of `frame` completed
    /// ([`VulkanReceiver::wait_produced`]).
    pub fn wait_produced(
        &self,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<(), VulkanReceiverError> {
        self.reader.wait_produced(frame, timeout)
    }

    /// Gives `frame` back ([`VulkanReceiver::release`]).
    pub fn release(&self, frame: Frame) -> Result<(), VulkanReceiverError> {
        self.reader.release(frame)
    }
}
