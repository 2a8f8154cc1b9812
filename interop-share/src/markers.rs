//! Type-level facts about an exportable resource: an image's tiling, where
//! its memory lives, what it may be used for, and a semaphore's kind.
//!
//! Each axis is a sealed trait with uninhabited marker types, named after the
//! Vulkan value they stand for. The CUDA side puts its rules on these types
//! (an array only for `Optimal` + `DeviceLocal`, a surface only for usages with
//! storage).
//!
//! Deliberately *not* typestated, and checked at run time instead: extent,
//! mip level count and array layers (values, not kinds), and the driver's
//! capabilities (asked before anything is created).

use ash::vk;

mod sealed {
    pub trait Sealed {}
}

/// Image tiling (type-level `VkImageTiling`). Sealed.
pub trait Tiling: sealed::Sealed + Send + Sync + 'static {
    /// The Vulkan value.
    const VK: vk::ImageTiling;
}
/// `VK_IMAGE_TILING_OPTIMAL`: the layout CUDA can map as an array.
#[derive(Debug)]
pub enum Optimal {}
/// `VK_IMAGE_TILING_LINEAR`: row-major with a row pitch; CUDA maps it as a buffer.
#[derive(Debug)]
pub enum Linear {}
impl sealed::Sealed for Optimal {}
impl sealed::Sealed for Linear {}
impl Tiling for Optimal {
    const VK: vk::ImageTiling = vk::ImageTiling::OPTIMAL;
}
impl Tiling for Linear {
    const VK: vk::ImageTiling = vk::ImageTiling::LINEAR;
}

/// Where the memory lives. Sealed.
///
/// A class is exact: it names the properties a memory type must have *and*
/// those it must not have. A driver with no memory type of the class (every
/// type host-visible, as on lavapipe and many integrated GPUs, has no
/// [`DeviceLocal`] type) reports [`crate::error::Error::Unsupported`].
pub trait MemoryLocation: sealed::Sealed + Send + Sync + 'static {
    /// Properties the memory type must have.
    const REQUIRED: vk::MemoryPropertyFlags;
    /// Properties the memory type must not have.
    const EXCLUDED: vk::MemoryPropertyFlags;
    /// Whether a memory type with these properties belongs to the class.
    fn admits(flags: vk::MemoryPropertyFlags) -> bool {
        flags.contains(Self::REQUIRED) && !flags.intersects(Self::EXCLUDED)
    }
    /// The class in words, for messages.
    fn describe() -> String {
        if Self::EXCLUDED.is_empty() {
            format!("{:?} memory", Self::REQUIRED)
        } else {
            format!("{:?} memory without {:?}", Self::REQUIRED, Self::EXCLUDED)
        }
    }
}
/// `DEVICE_LOCAL` memory that is **not** `HOST_VISIBLE`: the memory CUDA can
/// map as an array.
#[derive(Debug)]
pub enum DeviceLocal {}
/// `HOST_VISIBLE | HOST_COHERENT` memory (device-local or not).
#[derive(Debug)]
pub enum HostVisible {}
impl sealed::Sealed for DeviceLocal {}
impl sealed::Sealed for HostVisible {}
impl MemoryLocation for DeviceLocal {
    const REQUIRED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    const EXCLUDED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::HOST_VISIBLE;
}
impl MemoryLocation for HostVisible {
    const REQUIRED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::from_raw(
        vk::MemoryPropertyFlags::HOST_VISIBLE.as_raw()
            | vk::MemoryPropertyFlags::HOST_COHERENT.as_raw(),
    );
    const EXCLUDED: vk::MemoryPropertyFlags = vk::MemoryPropertyFlags::empty();
}

/// A usage preset (type-level `VkImageUsageFlags`). Sealed.
///
/// Every preset includes `TRANSFER_SRC | TRANSFER_DST`, so Vulkan can always
/// fill and read back the image.
pub trait Usage: sealed::Sealed + Send + Sync + 'static {
    /// The Vulkan usage flags.
    const VK: vk::ImageUsageFlags;
}

/// Usage presets.
pub mod usage {
    use super::{sealed, vk, Usage};
    const TRANSFER: u32 =
        vk::ImageUsageFlags::TRANSFER_SRC.as_raw() | vk::ImageUsageFlags::TRANSFER_DST.as_raw();
    macro_rules! presets {
        ($($(#[$doc:meta])* $name:ident = $($flag:ident)|*;)*) => {$(
            $(#[$doc])*
            #[derive(Debug)]
            pub enum $name {}
            impl sealed::Sealed for $name {}
            impl Usage for $name {
                const VK: vk::ImageUsageFlags =
                    vk::ImageUsageFlags::from_raw(TRANSFER $(| vk::ImageUsageFlags::$flag.as_raw())*);
            }
        )*};
    }
    presets! {
        /// `STORAGE | SAMPLED`: CUDA may read and write it through a surface.
        Storage = STORAGE | SAMPLED;
        /// `SAMPLED`: CUDA may read it through a texture object, not a surface.
        Sampled = SAMPLED;
        /// `COLOR_ATTACHMENT | SAMPLED`: a render target; CUDA reads it through a texture.
        ColorAttachment = COLOR_ATTACHMENT | SAMPLED;
        /// `COLOR_ATTACHMENT | STORAGE | SAMPLED`: a render target CUDA may also write.
        StorageColorAttachment = COLOR_ATTACHMENT | STORAGE | SAMPLED;
        /// Transfer only.
        Transfer = ;
    }
}

/// Binary or timeline (type-level `VkSemaphoreType`). Sealed.
pub trait SemaphoreKind: sealed::Sealed + Send + Sync + 'static {
    /// The Vulkan value.
    const VK: vk::SemaphoreType;
}
/// `VK_SEMAPHORE_TYPE_BINARY`.
#[derive(Debug)]
pub enum Binary {}
/// `VK_SEMAPHORE_TYPE_TIMELINE`.
#[derive(Debug)]
pub enum Timeline {}
impl sealed::Sealed for Binary {}
impl sealed::Sealed for Timeline {}
impl SemaphoreKind for Binary {
    const VK: vk::SemaphoreType = vk::SemaphoreType::BINARY;
}
impl SemaphoreKind for Timeline {
    const VK: vk::SemaphoreType = vk::SemaphoreType::TIMELINE;
}
