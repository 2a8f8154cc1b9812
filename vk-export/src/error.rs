//! The Vulkan side's errors: [`Error`] is [`interop_share::Error`] (one enum
//! for the transport and the Vulkan side), plus the constructors this crate
//! uses to name a failed call and what to do.

use ash::vk;

pub use interop_share::error::{Error, Result};

/// Maps a `VkResult` of `call` to [`Error::Vulkan`] with a hint.
pub(crate) fn vk_error(call: &'static str, hint: &'static str) -> impl FnOnce(vk::Result) -> Error {
    move |result| Error::Vulkan { call, result, hint }
}

/// [`Error::Unsupported`]: nothing was created.
pub(crate) fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Unsupported {
        what: what.into(),
        reason: reason.into(),
    }
}
