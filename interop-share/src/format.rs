//! Image formats this crate can export, one type per `VkFormat`.
//!
//! The set is closed (the trait is sealed): each format is one that CUDA can
//! map as an array with a matching channel layout (1, 2 or 4 channels of 8,
//! 16 or 32 bits). Three-channel formats are absent on purpose: CUDA arrays
//! cannot have three channels.

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
}

macro_rules! formats {
    ($($(#[$doc:meta])* $name:ident => $vk:ident, $channels:expr, $ty:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Format for $name {
            const VK: vk::Format = vk::Format::$vk;
            const CHANNELS: u32 = $channels;
            const CHANNEL: ChannelType = ChannelType::$ty;
            const NAME: &'static str = stringify!($vk);
        }
    )*
        /// `(VkFormat, name, channels, channel type)` of every supported format.
        pub const SUPPORTED: &[(vk::Format, &str, u32, ChannelType)] = &[
            $((vk::Format::$vk, stringify!($vk), $channels, ChannelType::$ty),)*
        ];
    };
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

/// The entry of [`SUPPORTED`] for a raw format, if any.
pub fn describe(format: vk::Format) -> Option<(&'static str, u32, ChannelType)> {
    SUPPORTED
        .iter()
        .find(|f| f.0 == format)
        .map(|f| (f.1, f.2, f.3))
}
