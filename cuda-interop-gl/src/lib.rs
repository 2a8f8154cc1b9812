//! OpenGL receivers of cuda-interop frame rings: the tools that receive in
//! OpenGL (OBS sources, Processing, openFrameworks, a GL viewer) read a
//! named sender's image slots as GL textures, zero copy.
//!
//! # Contract
//!
//! * [`GlReceiver`] imports each image slot of a ring into the caller's GL
//!   context: its memory as a memory object (`GL_EXT_memory_object_fd`,
//!   the fd owned by GL once imported, closed here if GL refused its
//!   arguments, leaked after any other error),
//!   a 2D texture of the slot's format on it (optimal tiling, as the slot
//!   was made). The GL implementation must be on the ring's device
//!   (`GL_DEVICE_UUID_EXT` among the context's, `GL_DRIVER_UUID_EXT`
//!   equal to the ring's): otherwise [`Error::Mismatch`] with both sides.
//! * Formats: `R8G8B8A8_UNORM` and `_SRGB` (`GL_RGBA8`,
//!   `GL_SRGB8_ALPHA8`), `B8G8R8A8_UNORM` and `_SRGB` (the same, with a
//!   swizzle so that sampling returns R, G, B, A; the texture's bytes stay
//!   B, G, R, A), `R16G16B16A16_SFLOAT` (`GL_RGBA16F`). Buffer rings and
//!   other formats are [`Error::Unsupported`], saying which receiver takes
//!   them.
//! * Which wait a receiver uses is [`GlReceiver::wait_mode`] (its `Debug`
//!   also says why), chosen once, when it is made:
//!   * [`WaitMode::Gpu`] where the ring shares its timelines and the
//!     context lists `GL_EXT_semaphore`, `GL_EXT_semaphore_fd` and
//!     `GL_NV_timeline_semaphore` (NVIDIA's GL; the ring's semaphores are
//!     Vulkan timelines, which `GL_EXT_semaphore` alone would wait for as
//!     binary ones): the "produced" timeline (GL's own duplicate of its
//!     fd) and this receiver's per-slot "released" timelines are imported
//!     into GL. [`GlReceiver::texture`] returns at once, behind
//!     `glWaitSemaphoreEXT` for the frame's number (the texture from
//!     `GL_LAYOUT_GENERAL_EXT`, where the sender released it): the GL work
//!     submitted after it waits on the GPU. [`GlReceiver::release`] has GL
//!     signal the slot's "released" timeline with the frame's number after
//!     the GL work submitted so far (`glSignalSemaphoreEXT`, to
//!     `GL_LAYOUT_GENERAL_EXT`, flushed) and tells the sender so; the
//!     sender waits for that value on the GPU before it writes the slot,
//!     and drops a receiver whose value is not reached within its hold
//!     timeout. Nothing waits on the host; a GL wait a sender never
//!     satisfies stalls the context's later work (the bounded
//!     [`GlReceiver::read_pixels`], [`GlReceiver::finish`] and the drop
//!     report it as a timeout).
//!   * [`WaitMode::Host`] where the ring shares its timelines but the
//!     context lacks one of those extensions (Mesa's llvmpipe, 22.3, has
//!     none of the three), or `CUDA_INTEROP_GL_WAIT=host` ([`WAIT_ENV`])
//!     asks for it, or GL refused the timelines' import: the texture is
//!     handed out after a host wait (within the caller's timeout) for the
//!     "produced" timeline, imported on a Vulkan device of the receiver's,
//!     and a release fences the GL work submitted so far and waits for it
//!     (bounded) before it gives the frame back; a fence that does not
//!     signal in time ends the session, and the sender may then write the
//!     slots under reads still running.
//!   * [`WaitMode::FrameMessage`] where the ring shares no semaphores
//!     (lavapipe's): the frame message, sent after the sender's writes
//!     completed, orders the reads; releases are fenced as in `Host`.
//!
//!   Outside `Gpu`, no GL-side acquire (`glWaitSemaphoreEXT`) is made: GL
//!   reads the memory as the sender left it (`GENERAL`, released to the
//!   external family); llvmpipe and NVIDIA read it exact (the tests), a
//!   driver that needs the acquire for optimal tiling would not.
//! * Every fd given to GL (a slot's memory, a timeline) is GL's once the
//!   import succeeded, closed here after GL refused its arguments (the
//!   import had no effect), and leaked after any other GL error (whether
//!   GL took it is unknown).
//! * Each slot's record is verified on a Vulkan device of the ring's (a
//!   headless context the receiver keeps) as a Vulkan import would be,
//!   before GL is given its size and dedicated flag.
//! * Every GL call needs the context current on the calling thread: the
//!   constructor is `unsafe` with that contract, the receiver is neither
//!   `Send` nor `Sync`. [`HeadlessGl`] makes a windowless context through
//!   EGL for tools and tests.

mod gl;
mod headless;
mod receiver;

pub use gl::Gl;
pub use headless::HeadlessGl;
pub use receiver::{GlReceiver, WaitMode, WAIT_ENV};

/// What went wrong, in words that say what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No GL (or EGL) to work with: what is missing and what to install.
    #[error("{0}")]
    Unavailable(String),
    /// The loader found no address for this GL entry point.
    #[error(
        "the GL implementation has no {0} (OpenGL 4.5 with GL_EXT_memory_object_fd is needed)"
    )]
    Missing(String),
    /// The context lacks an extension the receiver needs.
    #[error("{renderer} lacks {extension}: importing Vulkan memory into OpenGL needs it")]
    Extension {
        /// The GL renderer string.
        renderer: String,
        /// The extension.
        extension: &'static str,
    },
    /// The GL implementation is not on the ring's device and driver.
    #[error("{0}")]
    Mismatch(String),
    /// A ring this receiver does not take.
    #[error("{0}")]
    Unsupported(String),
    /// A GL call failed.
    #[error("{call} failed with GL error {code:#x}")]
    Gl {
        /// What was called.
        call: &'static str,
        /// `glGetError`'s code.
        code: u32,
    },
    /// The GL work did not complete in time.
    #[error("the GL work on frame {0}'s texture did not complete in time")]
    Timeout(u64),
    /// The session (connection, protocol, the sender's drop).
    #[error(transparent)]
    Consumer(#[from] cuda_interop_frames::transport::ConsumerError),
    /// The Vulkan side (the "produced" timeline's import or wait).
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
}

/// The README's example, compiled as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
