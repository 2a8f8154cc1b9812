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
//!   [`vulkan_receiver`] (its type parameters picked at run time).
//! * A peer is untrusted: everything decoded is checked, every wait is
//!   bounded by the caller's timeout, a receiver's fault never affects the
//!   sender or the other receivers, and a frame handed out is the frame it
//!   names or an error (see [`session`]).
//! * Errors are typed; their messages are the ones users see and say what
//!   to do.

pub mod cuda_receiver;
pub mod discovery;
pub mod host_receiver;
pub mod image_reader;
pub mod protocol;
pub mod sender;
pub mod session;
pub mod transport;
pub mod vulkan_receiver;

/// The README's code blocks, compiled as doctests so that they cannot rot
/// (here: this crate reaches every crate they use).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
