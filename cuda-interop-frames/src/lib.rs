//! Frame sharing: a Vulkan sender writes frames into a small ring of
//! exportable buffers and serves them over a `SOCK_SEQPACKET` Unix socket,
//! found by name; receivers in other processes import the ring once (into
//! CUDA, or their own Vulkan device) and then take and give back one slot
//! per frame, each receiver in the delivery mode it chose (latest: the
//! newest frame, never waited for; lossless: every frame, with bounded
//! back-pressure).
//!
//! # Contract
//!
//! * [`protocol`] is the wire: fixed-size packets next to one `vk-export`
//!   wire message that shares the ring. It is std-only and checks
//!   everything it decodes.
//! * [`discovery`] is the directory of named senders under
//!   `$XDG_RUNTIME_DIR` ([`discovery::list_senders`]).
//! * [`sender`] is the library sender ([`sender::Sender`]) on the
//!   application's Vulkan context: it never writes a slot a receiver holds
//!   or still reads on the GPU, never waits for a latest receiver, and every
//!   wait it makes is bounded.
//! * [`producer`] is the `frame_server` example's loop over a sender (a
//!   demo pattern, statistics on stdout).
//! * [`consumer`] is the receiving side's ring (connecting, importing the
//!   ring into CUDA, which slots are held), used by the `cuda_interop`
//!   Python module; [`receiver`] is the receiver's protocol handle
//!   (delivery mode, sequence numbers, timestamps, dropped frames), used by
//!   the `frame_client` example; [`vulkan_receiver`] receives image rings
//!   on the receiver's own Vulkan device and reads their pixels back;
//!   [`host_receiver`] reads host-visible buffer rings on the host without
//!   CUDA (the Python module's NumPy path).
//! * Slots are pitched buffers or OPTIMAL images
//!   ([`sender::ImageSender`]), released to `VK_QUEUE_FAMILY_EXTERNAL`
//!   (images in `GENERAL`) after each frame.
//! * Modules depend downwards only: `protocol` <- `consumer` <- `discovery`
//!   <- `receiver` <- `vulkan_receiver`; `consumer` <- `host_receiver`;
//!   `discovery` <- `sender` <- `producer`.
//! * Errors are typed; their messages are the ones users see.

pub mod consumer;
pub mod discovery;
pub mod host_receiver;
pub mod producer;
pub mod protocol;
pub mod receiver;
pub mod sender;
pub mod vulkan_receiver;

/// The README's code blocks, compiled as doctests so that they cannot rot
/// (here: this crate reaches every crate they use).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
