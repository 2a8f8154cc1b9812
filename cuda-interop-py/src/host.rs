//! Test hook (feature `test-hooks`): host memory standing in for CUDA
//! memory, so that pytest can drive frames and rings without a GPU.
//!
//! # Contract
//!
//! * Every [`HostBytes`] alive is counted in [`HOST_ALIVE`] (pytest checks
//!   that frames free their memory exactly once).
//! * A [`RecordingRing`] is a real library session (with a real sender:
//!   the `frame_server` example) whose slots are host memory of this
//!   process instead of the sender's (slot `i`'s byte `b` is `b + i`
//!   modulo 256; a multi-image ring's part `p`: `b + i + 64 * p`, each
//!   part as many bytes as its texels fill): its frames take stream
//!   arguments as CUDA frames do, and
//!   each "released" signal is recorded as `(slot, frame, stream)` instead
//!   of enqueued. Its releases carry no GPU promise (the test sender shares
//!   no semaphores).
//! * Uses no other module of this crate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cuda_interop_frames::cuda_receiver::SlotMemory;
use cuda_interop_frames::session::{Frame, Session};
use cuda_interop_frames::transport::ConsumerError;

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

    fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        HOST_ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A session whose slots are host memory here (see the module contract).
pub(crate) struct RecordingRing {
    slots: Vec<Arc<HostBytes>>,
    /// Per slot, a multi-image ring's parts (empty otherwise).
    parts: Vec<Vec<Arc<HostBytes>>>,
    signals: Mutex<Vec<(u32, u64, usize)>>,
    session: Session,
}

impl RecordingRing {
    /// The ring of `session` (its setup message is dropped: nothing is
    /// imported).
    pub(crate) fn new(session: Session) -> Result<RecordingRing, ConsumerError> {
        let layout = *session.layout();
        let len = layout.checked_frame_bytes()?;
        let slots = (0..layout.slots)
            .map(|i| {
                Arc::new(HostBytes::new(
                    (0..len).map(|b| (b as u8).wrapping_add(i as u8)).collect(),
                ))
            })
            .collect();
        let parts = (0..layout.slots)
            .map(|i| {
                (0u8..)
                    .zip(session.parts())
                    .map(|(p, part)| {
                        let len = part.row_bytes(layout.width) * u64::from(layout.height);
                        let first = (i as u8).wrapping_add(p.wrapping_mul(64));
                        Arc::new(HostBytes::new(
                            (0..len).map(|b| (b as u8).wrapping_add(first)).collect(),
                        ))
                    })
                    .collect()
            })
            .collect();
        Ok(RecordingRing {
            slots,
            parts,
            signals: Mutex::new(Vec::new()),
            session,
        })
    }

    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// Slot `index`'s memory: what keeps it alive, its address, its bytes.
    pub(crate) fn slot(&self, index: u32) -> (SlotMemory, u64, u64) {
        let bytes = &self.slots[index as usize];
        (SlotMemory::new(bytes.clone()), bytes.data(), bytes.len())
    }

    /// Part `part` of slot `index` of a multi-image ring, as [`Self::slot`].
    pub(crate) fn part(&self, index: u32, part: usize) -> (SlotMemory, u64, u64) {
        let bytes = &self.parts[index as usize][part];
        (SlotMemory::new(bytes.clone()), bytes.data(), bytes.len())
    }

    /// Records the "released" signal on `stream` (if any) of a frame this
    /// session holds, then releases it.
    pub(crate) fn release(&self, frame: Frame, stream: Option<usize>) -> Result<(), ConsumerError> {
        self.session.check_held(&frame)?;
        if let Some(h) = stream {
            self.signals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((frame.slot(), frame.sequence(), h));
        }
        self.session.release(frame, false)
    }

    /// The signals recorded so far.
    pub(crate) fn signals(&self) -> Vec<(u32, u64, usize)> {
        self.signals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
