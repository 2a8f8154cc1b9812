//! Zero-copy Vulkan ⇄ CUDA sharing of memory and semaphores, where the
//! recipes that fail do not compile.
//!
//! # Layers
//!
//! | crate | what it is |
//! |---|---|
//! | `cuda-interop-sys` | generated driver API bindings, libcuda loaded at run time |
//! | `vk-export` | exportable Vulkan images, buffers, semaphores; records; sockets |
//! | `cuda-interop` (this) | the safe import into CUDA |
//!
//! # Contract
//!
//! * **One device, matched by UUID.** A [`CudaDevice`] can only be made from
//!   a Vulkan device's `deviceUUID` ([`CudaDevice::for_vulkan`]); it retains
//!   the **primary** context, shared with the CUDA runtime, cudarc and
//!   PyTorch in the same process. Every call pushes that context and pops it
//!   afterwards, so values can be used and dropped on any thread (the
//!   [`ContextGuard`] that does it stays on its own thread).
//! * **Imports take their facts from the record.** Size
//!   (`VkMemoryRequirements.size`), dedicated flag and handle type come from
//!   `vk-export`'s record, never from the caller. The fd is consumed only on
//!   success; a failed import returns it inside [`ImportError`].
//! * **Only the working recipe compiles.** [`ImportedImage::map_array`]
//!   exists only for `Optimal` tiling in `DeviceLocal` memory; surfaces only
//!   for storage usage; the array descriptor (format, channels, levels, layers,
//!   cube, `SURFACE_LDST`, `COLOR_ATTACHMENT`) is derived from the image type.
//!   See [`markers`]. A two-plane 4:2:0 image
//!   ([`vk_export::ExportablePlanarImage`], disjoint) is imported one plane
//!   at a time ([`CudaDevice::import_planar_image`]), each plane an array of
//!   its own format; CUDA's `NV12` array format is never used.
//! * **Borrows give the destruction order:** surfaces and textures, then the
//!   mipmapped array or mapped buffer, then the external memory, then the
//!   Vulkan resource (kept alive by the import), then the context.
//! * **The GPU's last use, not a borrow, decides when memory is freed.**
//!   Every stream-ordered operation on imported memory, an imported
//!   semaphore or a [`DeviceBuffer`] is recorded as a use of that resource
//!   (on a [`Stream`] of this crate a position in the stream, with no driver
//!   call: the destructor records the one event it waits for, behind it and
//!   whatever the stream was given after it, unless a host wait already saw
//!   the stream drain; on a foreign stream an event); its destructor waits
//!   for those uses (at most [`DROP_WAIT_LIMIT`]) before it frees anything, so `mem::forget` of a mapping cannot free memory under
//!   a pending copy. Past the limit the resource is leaked (an import together
//!   with its Vulkan memory) and the leak is reported through
//!   [`drop_errors`]. Kernel launches are not tracked: [`Stream::launch`] is
//!   `unsafe` for that reason.
//! * **Every host wait is bounded.** [`Stream::synchronize`] and
//!   [`Event::synchronize`] take a timeout and return [`Error::Timeout`];
//!   helpers that block use their stream's [`Stream::timeout`]. Copies to or
//!   from host memory first wait for their stream to drain, so a copy queued
//!   behind a semaphore wait nobody signals is refused instead of blocking
//!   inside the driver.
//! * **Errors** name the driver call with the CUDA error name and string and,
//!   where a cause is known, the invariant to check. A sticky error (illegal
//!   address) poisons the process: later calls return [`Error::Poisoned`].
//!   CUDA used in a forked child returns [`Error::ForkedChild`].
//!
//! # Host waits
//!
//! To wait on the host for a value CUDA signals, use the Vulkan timeline
//! semaphore's [`vk_export::WaitStrategy::ADAPTIVE`] (the default): on NVIDIA's
//! Linux driver `vkWaitSemaphores` wakes ~10 ms late for CUDA signals, while
//! polling the counter sees them within microseconds.

// Modules, in layers: each module uses only modules listed before it
// (`crate::x` paths point up this list, never down), so the module graph is
// a DAG. The ground first, then the device, the queue, the resources, and
// the operations on them.

// Ground: errors, ...
mod error;
// ... driver calls and bounded host waits, which report them.
mod driver;
mod wait;

// Leaves on the ground: the fenced generated code, kernels, marker traits,
// DLPack structures.
pub mod dlpack;
mod generated;
pub mod kernels;
pub mod markers;

// Event lists behind stream work (below every owner of one).
mod events;
// The device handle, its primary context and its per-device state.
mod context;
// Pairing by UUID.
mod device;
// A mark behind stream work, on a raw stream.
mod completion;
// The queue, and the events recorded on it.
mod stream;
// Last-use records, taken on streams.
mod last_use;

// Resources: PTX modules; the import handle of Vulkan memory.
mod external;
mod module;
// What is mapped from an import: linear memory ...
mod linear;
// ... and arrays.
mod array;
// The typed imports, and the mappings each offers.
mod import;
// Two-plane images: one typed import per plane.
mod planar;

// Operations on the resources.
mod copy;
// Colour conversion (uses the copies' linear memory views).
pub mod convert;
mod launch;
mod semaphore;

pub use array::{array_descriptor, LevelArray, MappedArray, Surface, Texture};
pub use completion::Completion;
pub use context::{ContextGuard, CudaDevice};
pub use copy::{CopyEngine, Pitched, PitchedMut};
pub use device::{list_devices, DeviceListing};
pub use driver::{driver_version, drop_errors};
pub use error::{DriverError, Error, ImportError, Result};
pub use events::DROP_WAIT_LIMIT;
pub use external::ExternalMemory;
pub use import::{ImportedBuffer, ImportedImage, OwnedArray};
pub use launch::KernelUses;
pub use linear::{DeviceBuffer, DeviceSlice, MappedBuffer};
pub use module::{Function, Module};
pub use planar::{ImportedPlanarImage, ImportedPlane, PlanarImportError};
pub use semaphore::{ExternalSemaphore, SignalOp, WaitOp};
pub use stream::{Event, Stream};
pub use vk_export::BinarySignal;
pub use wait::HostWait;

pub use cuda_interop_sys as sys;
pub use vk_export;

/// The guide's code blocks, compiled as doctests for the same reason.
#[doc = include_str!("../../docs/guide.md")]
#[cfg(doctest)]
pub struct GuideDoctests;
