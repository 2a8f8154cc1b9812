//! Frame sharing between processes ("Spout for Linux"): a Vulkan sender
//! writes frames into a small ring of exportable buffers or images and
//! serves them over a `SOCK_SEQPACKET` Unix socket, found by name;
//! receivers in other processes import the ring once (into CUDA, their own
//! Vulkan device, or a host reader) and then take and give back one slot
//! per frame, each in the delivery it chose (latest: the newest frame,
//! never waited for; lossless: every frame, with bounded back-pressure).
//!
//! # Contract
//!
//! * Modules depend downwards only, along the data path: [`protocol`] (the
//!   typed messages, std-only) <- [`transport`] (one packet transport:
//!   connect, send, receive with a deadline, hang-up) <- [`discovery`]
//!   (named senders, each name owned by a lock for its sender's life) <-
//!   [`sender`] (the ring and its receivers' state machines) and
//!   [`session`] (the one receiver state machine) <- the receivers:
//!   [`cuda_receiver`], [`vulkan_receiver`], [`host_receiver`] (and the
//!   Python module, outside this crate); [`image_reader`] over
//!   [`vulkan_receiver`] (its type parameters picked at run time);
//!   [`parts_reader`] (multi-image rings: several named images a slot,
//!   one frame) beside it, over [`session`].
//! * A peer is untrusted: everything decoded is checked, every wait is
//!   bounded by the caller's timeout, a receiver's fault never affects the
//!   sender or the other receivers, and a frame handed out is the frame it
//!   names or an error (see [`session`]).
//! * Errors are typed; their messages are the ones users see and say what
//!   to do.

/// `$body` with the type `$f` set to the `vk_export` format whose `VkFormat`
/// is `$vk` (any of `vk_export::format::SUPPORTED`), else `$other`: where a
/// multi-image ring's parts, each of its own format, meet the typed images.
macro_rules! with_format {
    ($vk:expr, $f:ident => $body:expr, _ => $other:expr) => {{
        use vk_export::format as fmt;
        use vk_export::format::Format as _;
        let vk: vk_export::ash::vk::Format = $vk;
        with_format!(@each vk, $f, $body, $other;
            fmt::R8Unorm, fmt::Rg8Unorm, fmt::Rgba8Unorm, fmt::Rgba8Uint, fmt::Rgba8Srgb,
            fmt::Bgra8Unorm, fmt::Bgra8Srgb, fmt::A2b10g10r10UnormPack32, fmt::R16Unorm,
            fmt::Rg16Unorm, fmt::R16Sfloat, fmt::Rgba16Sfloat, fmt::Rgba16Uint, fmt::R32Uint,
            fmt::R32Sfloat, fmt::Rg32Sfloat, fmt::Rgba32Sfloat)
    }};
    (@each $vk:ident, $f:ident, $body:expr, $other:expr; $($ty:ty),*) => {
        $(if $vk == <$ty>::VK {
            type $f = $ty;
            $body
        } else)* {
            $other
        }
    };
}

pub mod cuda_receiver;
pub mod discovery;
pub mod host_receiver;
pub mod image_reader;
pub mod parts_reader;
pub mod protocol;
pub mod sender;
pub mod session;
pub mod transport;
pub mod vulkan_receiver;

#[cfg(test)]
mod tests {
    /// `with_format!` knows every format `vk-export` exports, and nothing
    /// else.
    #[test]
    fn with_format_covers_every_supported_format() {
        for (vk, name, ..) in vk_export::format::SUPPORTED {
            let got: Option<&str> = with_format!(*vk, F => Some(F::NAME), _ => None);
            assert_eq!(got, Some(*name));
        }
        let none: Option<&str> =
            with_format!(vk_export::ash::vk::Format::D32_SFLOAT, F => Some(F::NAME), _ => None);
        assert_eq!(none, None);
    }
}

/// The README's code blocks, compiled as doctests so that they cannot rot
/// (here: this crate reaches every crate they use).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
