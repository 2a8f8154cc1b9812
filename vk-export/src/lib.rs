//! The Vulkan side of Vulkan ⇄ CUDA (and Vulkan ⇄ Vulkan) memory sharing on
//! Linux, on [`ash`].
//!
//! # Contract
//!
//! * **Your Vulkan.** Everything works on the application's own instance,
//!   physical device and device, wrapped once in a [`Context`]
//!   ([`Context::from_raw`]). [`Context::headless`] creates one for tools,
//!   tests and examples, picking the physical device by `deviceUUID` if asked.
//! * **Preflight first.** Every constructor asks the driver whether the exact
//!   format, usage, tiling and handle type can be exported and imported
//!   (`vkGetPhysicalDeviceImageFormatProperties2` and friends) before it
//!   creates anything. An unsupported request is [`Error::Unsupported`] and no
//!   Vulkan object exists.
//! * **Typed resources.** [`ExportableImage`] carries its format, tiling,
//!   memory location and usage preset as types, so the CUDA side knows at
//!   compile time what it may do with it. It is always created with
//!   `VkExternalMemoryImageCreateInfo`, allocated with export info and a
//!   dedicated allocation where the driver requires or prefers one, and it
//!   records what an importer needs ([`ImageInfo`]). [`ExportableBuffer`] and
//!   [`Semaphore`] (binary and timeline) likewise.
//! * **Two-plane 4:2:0 images only disjoint.** [`ExportablePlanarImage`]
//!   (`Nv12Planes`, `P010Planes`) binds each plane to memory of its own and
//!   exports each as an fd, which CUDA maps as an array of the plane's
//!   format; a non-disjoint multi-planar image is never made (its second
//!   plane maps into CUDA only at an offset the driver does not report).
//! * **Fds are `OwnedFd`.** Each export is a new fd that the caller owns; a
//!   successful import consumes its fd, a failed one hands it back in
//!   [`ImportError`]. The driver only ever gets a duplicate.
//! * **Import only from a record, verified.** [`ExportableImage::import_received`]
//!   creates the image from the exporter's [`ImageRecord`] and checks what this
//!   device derives for it against the record before the driver sees the fd;
//!   bare fds need the `unsafe` [`ExportableImage::import_fd`].
//! * **Cross-process.** [`wire`] defines a versioned, checksummed record of the
//!   resources and [`socket`] sends it with its fds over a Unix socket
//!   (`SCM_RIGHTS`), validating everything before anything is imported.
//! * **Errors** name the Vulkan call, its `VkResult` and what to do.
//! * **Async** (feature `tokio`, off by default): timeline waits
//!   (`Semaphore::<Timeline>::wait_async`) and socket accepts and receives
//!   (`accept_async`, `recv_async`) as bounded, cancellation-safe futures.
//!
//! What this crate does *not* check: that commands recorded by the caller are
//! correct. It validates what the caller cannot know (driver capabilities,
//! records from another process), not ordinary Vulkan usage.

mod buffer;
mod context;
mod error;
mod exported;
mod image;
mod memory;
mod ownership;
mod planar;
mod queues;
mod requirements;
mod semaphore;
mod submit;
mod transfer;
mod validation;
mod wait;

// What two processes agree on lives in `interop-share`; these are its
// modules under their old paths here.
pub use interop_share::{format, markers, socket, token, wire};
/// Semaphore kinds ([`Binary`], [`Timeline`]) as a module, for paths.
pub mod semaphore_kinds {
    pub use interop_share::markers::{Binary, SemaphoreKind, Timeline};
}

pub use buffer::{ExportableBuffer, BUFFER_USAGE};
pub use context::{
    drop_errors, report_drop_error, Context, DepthCopy, DeviceIdentity, HeadlessOptions,
    TransferQueue, Validation, DROP_WAIT,
};
pub use error::{Error, Result};
pub use exported::PlaneToSend;
pub use image::{ExportableImage, ImageCapability, ImageDesc};
pub use interop_share::fd::{
    check_export_fd, import_with_duplicate, ImportError, ImportFailure, KeepAlive,
};
pub use interop_share::received::{
    PeerCredentials, ReceivedBuffer, ReceivedImage, ReceivedPlanarImage, ReceivedSemaphore,
};
pub use interop_share::record::{
    BufferFields, BufferInfo, BufferRecord, ImageFields, ImageInfo, ImageRecord, PlanarImageFields,
    PlanarImageInfo, PlanarImageRecord, PlaneMemory, SemaphoreInfo, SemaphoreRecord, PLANAR_USAGE,
};
pub use interop_share::token::{BinaryPayload, BinarySignal, SignalReservation};
pub use interop_share::uuid::{DeviceUuid, DriverUuid, ParseUuidError};
pub use ownership::{DepthFormat, DepthSource, SharedLayout, SourceImage, SourceSharing};
pub use planar::ExportablePlanarImage;
pub use queues::{QueueChoice, QueueRole, Queues};
pub use requirements::{
    DeviceRequirements, OPTIONAL_DEVICE_EXTENSIONS, REQUIRED_DEVICE_EXTENSIONS,
};
#[cfg(feature = "tokio")]
pub use semaphore::ASYNC_POLL_PERIOD;
pub use semaphore::{
    Binary, BinarySemaphore, Semaphore, SemaphoreKind, SubmittedSignals, SyncFd, Timeline,
    TimelinePoint, TimelineSemaphore,
};
pub use transfer::SubmitSync;
pub use validation::ValidationMessenger;
pub use wait::WaitStrategy;

pub use ash;
pub use interop_share;

/// `VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT`: the one memory handle type
/// this crate exports and imports (the one CUDA imports on Linux).
pub const MEMORY_HANDLE_TYPE: ash::vk::ExternalMemoryHandleTypeFlags =
    ash::vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
