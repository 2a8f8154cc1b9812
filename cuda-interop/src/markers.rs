//! What CUDA may do with a Vulkan image, as traits on `vk-export`'s markers.
//!
//! Each capability is a trait implemented only for the markers that allow it;
//! a call that needs it names it in a `where` clause, so a wrong recipe fails
//! to compile with the message below instead of `CUDA_ERROR_INVALID_VALUE`
//! at run time.
//!
//! Not typestated, and checked at run time instead (before any driver call):
//! extent against the device's array and surface limits, mip level count,
//! cube shape, buffer offsets and lengths, timeline values.

use vk_export::markers::{usage, DeviceLocal, Linear, MemoryLocation, Optimal, Tiling, Usage};

/// Tilings CUDA can map as an array: only `Optimal`.
#[diagnostic::on_unimplemented(
    message = "a `{Self}`-tiled image cannot be mapped as a CUDA array",
    label = "CUDA arrays need VK_IMAGE_TILING_OPTIMAL",
    note = "create the image with `vk_export::markers::Optimal` tiling, or map this linear image with `map_buffer()` and its row pitch"
)]
pub trait ArrayTiling: Tiling {}
impl ArrayTiling for Optimal {}

/// Memory CUDA can map as an array: only `DeviceLocal`.
#[diagnostic::on_unimplemented(
    message = "an image in `{Self}` memory cannot be mapped as a CUDA array",
    label = "CUDA arrays need DEVICE_LOCAL memory (a host-visible image fails with CUDA_ERROR_INVALID_VALUE)",
    note = "create the image with `vk_export::markers::DeviceLocal` memory"
)]
pub trait ArrayMemory: MemoryLocation {}
impl ArrayMemory for DeviceLocal {}

/// Tilings CUDA can map as a linear buffer: only `Linear`.
#[diagnostic::on_unimplemented(
    message = "a `{Self}`-tiled image cannot be mapped as a linear CUDA buffer",
    label = "optimal tiling is an opaque, driver-specific layout",
    note = "map it with `map_array()`, or create the image with `vk_export::markers::Linear` tiling"
)]
pub trait BufferTiling: Tiling {}
impl BufferTiling for Linear {}

/// Usages that allow a CUDA surface (read and write): those with `STORAGE`.
#[diagnostic::on_unimplemented(
    message = "an image with usage `{Self}` cannot have a CUDA surface",
    label = "surfaces need VK_IMAGE_USAGE_STORAGE_BIT (CUDA_ARRAY3D_SURFACE_LDST)",
    note = "create the image with `usage::Storage` or `usage::StorageColorAttachment`, or read it through `texture()`"
)]
pub trait SurfaceUsage: Usage {}
impl SurfaceUsage for usage::Storage {}
impl SurfaceUsage for usage::StorageColorAttachment {}
