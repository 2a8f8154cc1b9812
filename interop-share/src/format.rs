//! Image formats this crate can export, one type per `VkFormat`.
//!
//! The set is closed (the trait is sealed): each format is one that CUDA can
//! map as an array with a matching channel layout (1, 2 or 4 channels of 8,
//! 16 or 32 bits). Three-channel formats are absent on purpose: CUDA arrays
//! cannot have three channels.
//!
//! # Contract
//!
//! * **CUDA and DLPack see the bytes in memory, in memory order.** A CUDA
//!   array (and a DLPack tensor of a copy of it) has [`Format::CHANNELS`]
//!   channels of [`Format::CHANNEL`] per texel, channel 0 first in memory.
//!   Nothing is reordered or converted:
//!   * BGRA formats ([`Bgra8Unorm`], [`Bgra8Srgb`]) arrive as B, G, R, A
//!     bytes: channel 0 is **blue**.
//!   * sRGB formats ([`Rgba8Srgb`], [`Bgra8Srgb`]) arrive as the encoded
//!     bytes (no linearisation): the same array descriptor as their UNORM
//!     twins, `UNSIGNED_INT8` x 4. Vulkan encodes on writes through views and
//!     clears, and decodes on sampling; CUDA does neither.
//!   * A packed format ([`Format::PACKED`], [`A2b10g10r10UnormPack32`]) is one
//!     32-bit channel holding the packed word; its fields are for the reader
//!     to unpack.
//! * **Storage usage is the driver's to grant.** Most drivers (NVIDIA's and
//!   lavapipe among them) give sRGB formats no `STORAGE_IMAGE` feature: such
//!   an image is made with `usage::Sampled` or `usage::ColorAttachment` (CUDA
//!   reads it through a texture, or copies it with the driver), and the
//!   preflight refuses storage usage naming the missing feature.
//! * **Multi-planar formats are not [`Format`]s.** A 4:2:0 two-plane image
//!   (`G8_B8R8_2PLANE_420_UNORM`, `G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16`)
//!   is no one CUDA array: CUDA's own `NV12` array format gives wrong texels
//!   and a non-disjoint image's second plane lies at an offset the driver
//!   does not report (H100 probe, `docs/probes/multiplanar.c`). So
//!   `ExportableImage<Nv12Planes>` does not compile; these formats are
//!   [`PlanarFormat`]s, exported only as *disjoint* images (one allocation
//!   per plane, `vk_export::ExportablePlanarImage`), each plane imported as a
//!   CUDA array of its own single-plane format ([`PlanarFormat::Luma`],
//!   [`PlanarFormat::Chroma`]).

use ash::vk;

mod sealed {
    pub trait Sealed {}
}

/// What one channel of a texel is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelType {
    /// 8-bit unsigned (UNORM or UINT in Vulkan).
    U8,
    /// 8-bit signed.
    I8,
    /// 16-bit unsigned.
    U16,
    /// 16-bit signed.
    I16,
    /// 16-bit IEEE half float.
    F16,
    /// 32-bit unsigned.
    U32,
    /// 32-bit signed.
    I32,
    /// 32-bit float.
    F32,
}

impl ChannelType {
    /// Bytes per channel.
    pub const fn bytes(self) -> u32 {
        match self {
            ChannelType::U8 | ChannelType::I8 => 1,
            ChannelType::U16 | ChannelType::I16 | ChannelType::F16 => 2,
            ChannelType::U32 | ChannelType::I32 | ChannelType::F32 => 4,
        }
    }
}

/// A `VkFormat` as a type: what the CUDA side needs to know at compile time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an image format this crate exports as one CUDA array",
    note = "multi-planar formats (`Nv12Planes`, `P010Planes`) are exported only as disjoint images, \
            one CUDA array per plane: `vk_export::ExportablePlanarImage`; or send NV12/P010 as \
            pitched buffers (the guide's \"Planar video: NV12 and P010\")"
)]
pub trait Format: sealed::Sealed + Send + Sync + 'static {
    /// The Vulkan format.
    const VK: vk::Format;
    /// Channels per texel (1, 2 or 4).
    const CHANNELS: u32;
    /// Type of each channel.
    const CHANNEL: ChannelType;
    /// Bytes per texel.
    const TEXEL_BYTES: u32 = Self::CHANNELS * Self::CHANNEL.bytes();
    /// The format's name, for messages.
    const NAME: &'static str;
    /// The texel is one packed word ([`Format::CHANNELS`] is 1): its
    /// components are bit fields of the one channel, which CUDA and DLPack
    /// see as the whole word (an unsigned integer of
    /// [`Format::TEXEL_BYTES`]), not as separate channels.
    const PACKED: bool = false;
}

macro_rules! formats {
    ($($(#[$doc:meta])* $name:ident => $vk:ident, $channels:expr, $ty:ident $(, $packed:ident)?;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Format for $name {
            const VK: vk::Format = vk::Format::$vk;
            const CHANNELS: u32 = $channels;
            const CHANNEL: ChannelType = ChannelType::$ty;
            const NAME: &'static str = stringify!($vk);
            $(const PACKED: bool = formats!(@packed $packed);)?
        }
    )*
        /// `(VkFormat, name, channels, channel type)` of every supported format.
        pub const SUPPORTED: &[(vk::Format, &str, u32, ChannelType)] = &[
            $((vk::Format::$vk, stringify!($vk), $channels, ChannelType::$ty),)*
        ];

        /// The packed formats of [`SUPPORTED`] ([`Format::PACKED`]).
        pub const PACKED: &[vk::Format] = &[$($(formats!(@vk $vk $packed),)?)*];
    };
    (@packed packed) => { true };
    (@vk $vk:ident packed) => { vk::Format::$vk };
}

formats! {
    /// `VK_FORMAT_R8_UNORM`.
    R8Unorm => R8_UNORM, 1, U8;
    /// `VK_FORMAT_R8G8_UNORM`.
    Rg8Unorm => R8G8_UNORM, 2, U8;
    /// `VK_FORMAT_R8G8B8A8_UNORM`: CUDA sees `UNSIGNED_INT8` x 4.
    Rgba8Unorm => R8G8B8A8_UNORM, 4, U8;
    /// `VK_FORMAT_R8G8B8A8_UINT`.
    Rgba8Uint => R8G8B8A8_UINT, 4, U8;
    /// `VK_FORMAT_R8G8B8A8_SRGB`: CUDA sees `UNSIGNED_INT8` x 4 holding the
    /// sRGB-encoded bytes (no linearisation), as for [`Rgba8Unorm`]. Drivers
    /// rarely grant it storage usage (lavapipe and NVIDIA do not): make it
    /// `usage::Sampled` or `usage::ColorAttachment`.
    Rgba8Srgb => R8G8B8A8_SRGB, 4, U8;
    /// `VK_FORMAT_B8G8R8A8_UNORM` (what swapchains and many capture APIs
    /// give): CUDA sees `UNSIGNED_INT8` x 4 in memory order, **B, G, R, A**:
    /// channel 0 (`x` of a `uchar4`, DLPack's `[..., 0]`) is blue.
    Bgra8Unorm => B8G8R8A8_UNORM, 4, U8;
    /// `VK_FORMAT_B8G8R8A8_SRGB`: B, G, R, A bytes as [`Bgra8Unorm`] (channel
    /// 0 is blue), sRGB-encoded as [`Rgba8Srgb`] (no linearisation, and
    /// rarely storage usage).
    Bgra8Srgb => B8G8R8A8_SRGB, 4, U8;
    /// `VK_FORMAT_A2B10G10R10_UNORM_PACK32`: one packed 32-bit word per
    /// texel, bits 0-9 R, 10-19 G, 20-29 B, 30-31 A (little-endian in memory:
    /// R's low 8 bits are byte 0). CUDA sees `UNSIGNED_INT32` x 1 (the whole
    /// word), DLPack `uint32`: unpack the fields yourself.
    A2b10g10r10UnormPack32 => A2B10G10R10_UNORM_PACK32, 1, U32, packed;
    /// `VK_FORMAT_R16_UNORM`: CUDA sees `UNSIGNED_INT16` x 1 (the raw
    /// integers, 65535 for 1.0), DLPack `uint16`.
    R16Unorm => R16_UNORM, 1, U16;
    /// `VK_FORMAT_R16G16_UNORM`: CUDA sees `UNSIGNED_INT16` x 2, DLPack
    /// `uint16` with 2 channels.
    Rg16Unorm => R16G16_UNORM, 2, U16;
    /// `VK_FORMAT_R16_SFLOAT`.
    R16Sfloat => R16_SFLOAT, 1, F16;
    /// `VK_FORMAT_R16G16B16A16_SFLOAT`: CUDA sees `HALF` x 4.
    Rgba16Sfloat => R16G16B16A16_SFLOAT, 4, F16;
    /// `VK_FORMAT_R16G16B16A16_UINT`.
    Rgba16Uint => R16G16B16A16_UINT, 4, U16;
    /// `VK_FORMAT_R32_UINT`.
    R32Uint => R32_UINT, 1, U32;
    /// `VK_FORMAT_R32_SFLOAT`: CUDA sees `FLOAT` x 1.
    R32Sfloat => R32_SFLOAT, 1, F32;
    /// `VK_FORMAT_R32G32_SFLOAT`.
    Rg32Sfloat => R32G32_SFLOAT, 2, F32;
    /// `VK_FORMAT_R32G32B32A32_SFLOAT`: CUDA sees `FLOAT` x 4.
    Rgba32Sfloat => R32G32B32A32_SFLOAT, 4, F32;
}

/// One plane of a two-plane 4:2:0 image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plane {
    /// Plane 0: luma (Y), full resolution, one channel.
    Luma,
    /// Plane 1: chroma (Cb, Cr interleaved), half width and half height,
    /// two channels.
    Chroma,
}

impl Plane {
    /// Both planes, in plane order.
    pub const ALL: [Plane; 2] = [Plane::Luma, Plane::Chroma];

    /// The plane's index (0 or 1).
    pub const fn index(self) -> usize {
        match self {
            Plane::Luma => 0,
            Plane::Chroma => 1,
        }
    }

    /// `VK_IMAGE_ASPECT_PLANE_0_BIT` or `VK_IMAGE_ASPECT_PLANE_1_BIT`.
    pub const fn aspect(self) -> vk::ImageAspectFlags {
        match self {
            Plane::Luma => vk::ImageAspectFlags::PLANE_0,
            Plane::Chroma => vk::ImageAspectFlags::PLANE_1,
        }
    }

    /// The plane's extent for an image of `width` x `height` (both even).
    pub const fn extent(self, width: u32, height: u32) -> [u32; 2] {
        match self {
            Plane::Luma => [width, height],
            Plane::Chroma => [width / 2, height / 2],
        }
    }

    /// Channels per texel of the plane (1 or 2).
    pub const fn channels(self) -> u32 {
        match self {
            Plane::Luma => 1,
            Plane::Chroma => 2,
        }
    }
}

/// A two-plane 4:2:0 `VkFormat` as a type. Sealed.
///
/// Plane 0 (luma) is a `W x H` image of [`PlanarFormat::Luma`], plane 1
/// (chroma) a `W/2 x H/2` image of [`PlanarFormat::Chroma`] (Cb then Cr),
/// which is each plane's Vulkan-compatible single-plane format (the
/// format of a copy to or from the plane's aspect) and the CUDA array it
/// maps as.
pub trait PlanarFormat: sealed::Sealed + Send + Sync + 'static {
    /// The multi-planar Vulkan format.
    const VK: vk::Format;
    /// The format's name, for messages.
    const NAME: &'static str;
    /// Plane 0's format (one channel).
    type Luma: Format;
    /// Plane 1's format (two channels: Cb, Cr).
    type Chroma: Format;
}

macro_rules! planar_formats {
    ($($(#[$doc:meta])* $name:ident => $vk:ident, $luma:ident, $chroma:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl PlanarFormat for $name {
            const VK: vk::Format = vk::Format::$vk;
            const NAME: &'static str = stringify!($vk);
            type Luma = $luma;
            type Chroma = $chroma;
        }
    )*
        /// `(VkFormat, name, luma format, chroma format)` of every supported
        /// two-plane format.
        pub const PLANAR: &[(vk::Format, &str, vk::Format, vk::Format)] = &[
            $((vk::Format::$vk, stringify!($vk), <$luma as Format>::VK, <$chroma as Format>::VK),)*
        ];
    };
}

planar_formats! {
    /// `VK_FORMAT_G8_B8R8_2PLANE_420_UNORM` (NV12's layout): plane 0 is
    /// [`R8Unorm`] (CUDA `UNSIGNED_INT8` x 1), plane 1 [`Rg8Unorm`]
    /// (`UNSIGNED_INT8` x 2: Cb, Cr).
    Nv12Planes => G8_B8R8_2PLANE_420_UNORM, R8Unorm, Rg8Unorm;
    /// `VK_FORMAT_G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16` (P010's
    /// layout): 16-bit samples holding the 10-bit value in the top bits;
    /// plane 0 is [`R16Unorm`] (CUDA `UNSIGNED_INT16` x 1), plane 1
    /// [`Rg16Unorm`] (`UNSIGNED_INT16` x 2: Cb, Cr).
    P010Planes => G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16, R16Unorm, Rg16Unorm;
}

/// The entry of [`PLANAR`] for a raw format, if any: `(name, luma format,
/// chroma format)`.
pub fn describe_planar(format: vk::Format) -> Option<(&'static str, vk::Format, vk::Format)> {
    PLANAR
        .iter()
        .find(|f| f.0 == format)
        .map(|f| (f.1, f.2, f.3))
}

/// The entry of [`SUPPORTED`] for a raw format, if any.
pub fn describe(format: vk::Format) -> Option<(&'static str, u32, ChannelType)> {
    SUPPORTED
        .iter()
        .find(|f| f.0 == format)
        .map(|f| (f.1, f.2, f.3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packed format is one channel holding the whole word, and the only
    /// packed one is A2B10G10R10 (a new packed format needs its own note).
    #[test]
    fn packed_formats_are_one_word_channels() {
        const { assert!(A2b10g10r10UnormPack32::PACKED) };
        assert_eq!(PACKED, &[vk::Format::A2B10G10R10_UNORM_PACK32]);
        assert_eq!(
            describe(vk::Format::A2B10G10R10_UNORM_PACK32),
            Some(("A2B10G10R10_UNORM_PACK32", 1, ChannelType::U32))
        );
        assert_eq!(A2b10g10r10UnormPack32::TEXEL_BYTES, 4);
        const { assert!(!Bgra8Unorm::PACKED && !R16Unorm::PACKED && !Rgba8Srgb::PACKED) };
    }

    /// The new 8-bit formats share the UNORM8 x 4 layout; the 16-bit UNORMs
    /// are unsigned 16-bit channels.
    #[test]
    fn layouts_of_the_bgra_srgb_and_16_bit_formats() {
        for f in [
            vk::Format::B8G8R8A8_UNORM,
            vk::Format::B8G8R8A8_SRGB,
            vk::Format::R8G8B8A8_SRGB,
        ] {
            assert_eq!(describe(f).map(|d| (d.1, d.2)), Some((4, ChannelType::U8)));
        }
        assert_eq!(
            describe(vk::Format::R16_UNORM).map(|d| (d.1, d.2)),
            Some((1, ChannelType::U16))
        );
        assert_eq!(
            describe(vk::Format::R16G16_UNORM).map(|d| (d.1, d.2)),
            Some((2, ChannelType::U16))
        );
        assert_eq!(SUPPORTED.len(), 17);
    }

    /// The two-plane formats are no single-plane formats (an
    /// `ExportableImage` or image record of one is refused), and each
    /// plane's format has the plane's channel count.
    #[test]
    fn planar_formats_are_apart_from_the_single_plane_set() {
        for (vk, _, luma, chroma) in PLANAR {
            assert_eq!(describe(*vk), None);
            assert_eq!(describe(*luma).map(|d| d.1), Some(Plane::Luma.channels()));
            assert_eq!(
                describe(*chroma).map(|d| d.1),
                Some(Plane::Chroma.channels())
            );
        }
        assert_eq!(
            describe_planar(vk::Format::G8_B8R8_2PLANE_420_UNORM),
            Some((
                "G8_B8R8_2PLANE_420_UNORM",
                vk::Format::R8_UNORM,
                vk::Format::R8G8_UNORM
            ))
        );
        assert_eq!(
            describe_planar(vk::Format::G10X6_B10X6R10X6_2PLANE_420_UNORM_3PACK16)
                .map(|d| (d.1, d.2)),
            Some((vk::Format::R16_UNORM, vk::Format::R16G16_UNORM))
        );
        assert_eq!(describe_planar(vk::Format::R8_UNORM), None);
        assert_eq!(Plane::Chroma.extent(1920, 1080), [960, 540]);
    }
}
