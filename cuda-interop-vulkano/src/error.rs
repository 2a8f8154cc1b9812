//! [`Error`]: what this crate's calls refuse or fail with.
//!
//! # Contract
//!
//! * A device that lacks something vk-export needs is [`Error::Missing`],
//!   naming the thing and the vulkano field to set when creating the device
//!   (or the instance); nothing is created before that check.
//! * Everything else refused before anything is created is
//!   [`Error::Refused`]; vk-export's and vulkano's failures keep their
//!   source.

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The vulkano device (or instance) lacks what vk-export needs.
    #[error(
        "the vulkano device lacks {what}: set {enable} when creating it \
         (cuda_interop_vulkano::device_extensions and device_features list all of it)"
    )]
    Missing {
        /// What is missing (an extension, a feature, an API version).
        what: &'static str,
        /// The vulkano field to set, as it is spelled in vulkano.
        enable: &'static str,
    },
    /// An argument this crate cannot take (a resource or queue of another
    /// device, a queue named twice, a wait on a value the same submission
    /// signals).
    #[error("refused: {0}")]
    Refused(String),
    /// vulkano refused or failed.
    #[error("vulkano: {0}")]
    Vulkano(String),
    /// A Vulkan call of this crate failed.
    #[error("{call} failed: {result}")]
    Vulkan {
        /// The call.
        call: &'static str,
        /// Its result.
        result: ash::vk::Result,
    },
    /// vk-export failed.
    #[error(transparent)]
    VkExport(#[from] vk_export::Error),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
