//! What two processes sharing Vulkan and CUDA resources must agree on, with
//! nothing that calls Vulkan or CUDA: the typed records of exported
//! resources, the wire format that carries them, the Unix socket that carries
//! the wire format with its fds, the fd ownership rule of an import, and
//! binary-semaphore signal tokens.
//!
//! # Contract
//!
//! * **Below both sides.** `vk-export` (the Vulkan side) and `cuda-interop`
//!   (the CUDA side) build on this crate; it imports neither. It uses `ash`
//!   for Vulkan *types* only (formats, flags), never a function.
//! * **Records are validated values** ([`record`]): whatever made one (an
//!   export, the wire decoder, [`record::ImageInfo::from_fields`]), it
//!   satisfies every shape rule. A record is still its maker's word: only the
//!   importing device can check it against the memory behind an fd.
//! * **Fds are `OwnedFd`**, and each is closed exactly once ([`fd`],
//!   [`socket`]); a failed import hands its fd back in [`fd::ImportError`].
//! * **Every wait is bounded** ([`socket`]).
//!
//! Module order, each importing only those before it: [`limits`], [`error`], [`uuid`],
//! [`format`](mod@format), [`markers`], [`record`], [`received`], [`fd`], [`token`],
//! [`wire`], [`socket`].

pub mod error;
pub mod fd;
pub mod format;
pub mod limits;
pub mod markers;
pub mod received;
pub mod record;
pub mod socket;
pub mod token;
pub mod uuid;
pub mod wire;

pub use error::{Error, Result, WireError};
pub use uuid::{DeviceUuid, DriverUuid};

pub use ash;
