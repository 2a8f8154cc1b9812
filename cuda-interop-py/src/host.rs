//! Test hook (feature `test-hooks`): host memory standing in for CUDA
//! memory, so that pytest can drive frames and rings without a GPU.
//!
//! # Contract
//!
//! * Every [`HostBytes`] alive is counted in [`HOST_ALIVE`] (pytest checks
//!   that frames free their memory exactly once).
//! * [`host_ring`] makes a ring over host memory from a hello alone (no
//!   setup message, no CUDA): slot `i`'s byte `b` is `b + i` modulo 256.
//! * Uses no other module of this crate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuda_interop_frames::consumer::{Ring, Slot, SlotMemory};
use cuda_interop_frames::protocol::Packet;
use vk_export::socket::Connection;

/// Counts the live host buffers of the test hooks.
pub(crate) static HOST_ALIVE: AtomicUsize = AtomicUsize::new(0);

/// Host memory for the test hooks, counted in [`HOST_ALIVE`].
pub(crate) struct HostBytes(Box<[u8]>);

impl HostBytes {
    pub(crate) fn new(bytes: Vec<u8>) -> HostBytes {
        HOST_ALIVE.fetch_add(1, Ordering::SeqCst);
        HostBytes(bytes.into_boxed_slice())
    }

    /// The first byte's address (stable: the box never moves its heap memory).
    pub(crate) fn data(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        HOST_ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A ring over host memory for `hello` (checked): no CUDA, no setup message.
pub(crate) fn host_ring(conn: Arc<Connection>, hello: Packet) -> Ring {
    let len = hello.frame_bytes().expect("a checked layout");
    let slots = (0..hello.slot)
        .map(|i| {
            let bytes = HostBytes::new((0..len).map(|b| (b as u8).wrapping_add(i as u8)).collect());
            let data = bytes.data();
            Slot {
                memory: SlotMemory::new(Arc::new(bytes)),
                data,
                len,
                image: None,
            }
        })
        .collect();
    Ring::from_parts(conn, hello, slots, None)
}
