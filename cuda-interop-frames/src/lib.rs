//! The frame ring: a Vulkan producer writes frames into a small ring of
//! exportable buffers and serves them over a `SOCK_SEQPACKET` Unix socket;
//! consumers in other processes import the ring into CUDA once and then
//! take and give back one slot per frame.
//!
//! # Contract
//!
//! * [`protocol`] is the wire: fixed-size packets next to one `vk-export`
//!   wire message that shares the ring. It is std-only and checks
//!   everything it decodes.
//! * [`producer`] is the serving side (the `frame_server` example is its
//!   command line): it never writes a slot a consumer holds, and every wait
//!   it makes is bounded.
//! * [`consumer`] is the receiving side without Python (the `cuda_interop`
//!   Python module and the `frame_client` example use it): connecting,
//!   receiving and importing the ring, accepting frames and releasing them.
//! * Modules depend downwards only: `producer` and `consumer` use
//!   `protocol`, never each other.
//! * Errors are typed ([`protocol::PacketError`], [`consumer::ConsumerError`],
//!   [`consumer::SendError`], [`producer::ProducerError`]); their messages
//!   are the ones users see.

pub mod consumer;
pub mod producer;
pub mod protocol;
