//! The ring a receiver shares with its frames: the frames crate's consumer
//! ring, plus (feature `test-hooks`) the recording of "released" signals.
//!
//! # Contract
//!
//! * [`SharedRing`] derefs to `cuda_interop_frames::consumer::Ring`: layout,
//!   slots, semaphores and what this consumer holds live there. A ring
//!   without CUDA semaphores is read on the host ([`SharedRing::host`]:
//!   `cuda_interop_frames::host_receiver`).
//! * [`release_ring_slot`] is the one way a frame's slot goes back: the
//!   "released" signal (when there is a stream and the ring has CUDA
//!   semaphores, or is a recording host ring), then the release message.
//!   Nothing once the connection is gone.
//! * Errors are plain Rust values ([`ReleaseError`]), so that a destructor
//!   can format them without calling into Python.
//! * Uses only `errors` of this crate.

use std::ops::Deref;
#[cfg(feature = "test-hooks")]
use std::sync::{Mutex, PoisonError};

use cuda_interop_frames::consumer::{Ring, SendError};
use cuda_interop_frames::host_receiver::HostBuffers;
use pyo3::PyErr;

use crate::errors::{cuda_error, send_error};

/// A consumer ring and this module's test state of it.
pub(crate) struct SharedRing {
    ring: Ring,
    /// A ring without CUDA semaphores read on the host: its buffers on a
    /// Vulkan device of this process (each frame copied out, then released).
    pub(crate) host: Option<HostBuffers>,
    /// Test hook: a host ring that takes stream arguments and records, in
    /// place of each "released" signal, `(slot, frame, stream)`.
    #[cfg(feature = "test-hooks")]
    pub(crate) signal_log: Option<Mutex<Vec<(u32, u64, usize)>>>,
}

impl Deref for SharedRing {
    type Target = Ring;

    fn deref(&self) -> &Ring {
        &self.ring
    }
}

impl SharedRing {
    /// `ring`, recording nothing.
    pub(crate) fn new(ring: Ring) -> SharedRing {
        SharedRing {
            ring,
            host: None,
            #[cfg(feature = "test-hooks")]
            signal_log: None,
        }
    }

    /// Test hook: `ring` (a host ring), recording its "released" signals
    /// when `record_signals`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn recording(ring: Ring, record_signals: bool) -> SharedRing {
        SharedRing {
            ring,
            host: None,
            signal_log: record_signals.then(|| Mutex::new(Vec::new())),
        }
    }

    /// A ring over `host`'s buffers (no CUDA): its slots only say which
    /// frames this consumer holds.
    pub(crate) fn read_on_host(ring: Ring, host: HostBuffers) -> SharedRing {
        SharedRing {
            ring,
            host: Some(host),
            #[cfg(feature = "test-hooks")]
            signal_log: None,
        }
    }

    /// Whether frames of this ring take a CUDA stream to order on (and
    /// remember it for their release): rings with semaphores, and the
    /// test hook's recording host ring.
    pub(crate) fn orders_streams(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.signal_log.is_some() {
            return true;
        }
        self.gpu().is_some()
    }
}

/// Why a ring slot's release failed.
pub(crate) enum ReleaseError {
    /// The "released" signal could not be enqueued.
    Signal(cuda_interop::Error),
    /// The release message could not be sent.
    Send(SendError),
}

impl std::fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseError::Signal(e) => write!(f, "the release signal failed: {e}"),
            ReleaseError::Send(e) => e.fmt(f),
        }
    }
}

impl ReleaseError {
    /// The Python exception for it.
    pub(crate) fn into_py(self) -> PyErr {
        match self {
            ReleaseError::Signal(e) => cuda_error(e),
            ReleaseError::Send(e) => send_error(e),
        }
    }
}

/// Signals slot `slot`'s "released" timeline with `frame` after the work on
/// `stream` (if any, if the ring has CUDA semaphores, and unless the slot's
/// timeline already reached `frame`: an earlier attempt signalled), then
/// sends the release and marks the slot free. `signalled` says, on return,
/// whether the timeline was signalled for this frame.
///
/// # Safety
///
/// `stream`, if given, is 1 (the legacy default stream), the handle of a
/// stream object the frame or the caller holds across this call, or a
/// handle the consumer passed to this very call: a live stream of the
/// ring's device (or a default one) for the call.
pub(crate) unsafe fn release_ring_slot(
    ring: &SharedRing,
    slot: u32,
    frame: u64,
    stream: Option<usize>,
    signalled: &mut bool,
) -> Result<(), ReleaseError> {
    // After `Receiver.close()` or a connection given up, the producer has
    // taken the slot back: nothing to signal or send.
    if ring.is_gone() {
        return Ok(());
    }
    // SAFETY: the caller's guarantee on `stream`.
    unsafe { ring.signal_released(slot, frame, stream, signalled) }
        .map_err(ReleaseError::Signal)?;
    #[cfg(feature = "test-hooks")]
    if let (Some(log), Some(h), false) = (&ring.signal_log, stream, *signalled) {
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((slot, frame, h));
        *signalled = true;
    }
    ring.send_release(slot, frame, *signalled)
        .map_err(ReleaseError::Send)
}
