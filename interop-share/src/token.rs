//! Binary semaphore signals as values: a [`BinarySignal`] exists only after a
//! real signal operation was submitted, names the payload it belongs to, and
//! one wait consumes it.
//!
//! # Contract
//!
//! * A **payload** ([`BinaryPayload`]) is shared by every handle of this
//!   process that refers to one binary semaphore's payload: the Vulkan
//!   semaphore, its imports into other Vulkan devices, its imports into CUDA.
//!   It is either *unsignalled* or *signal pending*.
//! * **Signalling** reserves the payload first ([`BinaryPayload::reserve_signal`]:
//!   a second signal while one is pending is an [`Error::BinarySemaphore`],
//!   also under `mem::forget` of the first token), then submits, then mints
//!   the token ([`SignalReservation::submitted`], `unsafe`: only the code that
//!   really submitted the signal may call it). A reservation dropped without
//!   `submitted` releases the payload.
//! * **Waiting** checks that the token is this payload's
//!   ([`BinaryPayload::check`]), enqueues the wait, then consumes the token
//!   ([`BinaryPayload::consume`], `unsafe` for the same reason), which makes the payload unsignalled again.
//!   No token, no wait: "wait without a signal" and "wait twice" do not
//!   compile; a token of another semaphore is a typed error.
//! * A token that is dropped unused leaves its payload *signal pending* and
//!   the signal orphaned: [`BinaryPayload::reclaim`] mints its one
//!   replacement (a helper that failed before submitting drops its tokens).
//!   A token that is `mem::forget`-ten leaves the payload pending for good:
//!   nobody can wait for that signal without `unsafe`.
//! * The state is per process: a payload that arrived from another process
//!   (`import_received`) starts unsignalled here, and signals or waits of
//!   the peer are invisible to it. A binary semaphore shared between
//!   processes needs one signalling side (or a timeline).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

#[derive(Default)]
struct PayloadState {
    signal_pending: AtomicBool,
    /// The pending signal's token was dropped unused: a new one may be
    /// minted for it ([`BinaryPayload::reclaim`]).
    orphaned: AtomicBool,
}

/// The state of one binary semaphore payload in this process.
#[derive(Clone, Default)]
pub struct BinaryPayload(Arc<PayloadState>);

impl fmt::Debug for BinaryPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BinaryPayload")
            .field("signal_pending", &self.is_signal_pending())
            .finish()
    }
}

/// A reserved binary signal: the payload counts as pending until this is
/// either turned into a token or dropped (which releases it).
#[derive(Debug)]
pub struct SignalReservation {
    payload: Option<BinaryPayload>,
}

/// A submitted binary signal that exactly one wait must consume (a CUDA
/// stream wait or a Vulkan submission's wait).
#[must_use = "a binary signal must be waited on exactly once; dropping it leaves the semaphore signalled"]
pub struct BinarySignal {
    /// `None` once consumed.
    payload: Option<BinaryPayload>,
}

impl Drop for BinarySignal {
    /// A token dropped unused leaves its signal pending and orphaned, so
    /// that [`BinaryPayload::reclaim`] can hand out its one replacement.
    /// (`mem::forget` skips this: the signal then stays pending for good.)
    fn drop(&mut self) {
        if let Some(p) = self.payload.take() {
            p.0.orphaned.store(true, Ordering::Release);
        }
    }
}

impl fmt::Debug for BinarySignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BinarySignal")
    }
}

impl BinaryPayload {
    /// A payload of which this process knows nothing yet (unsignalled): for
    /// a semaphore imported from elsewhere.
    pub fn new() -> BinaryPayload {
        BinaryPayload::default()
    }

    /// Whether a signal is pending (or reserved).
    pub fn is_signal_pending(&self) -> bool {
        self.0.signal_pending.load(Ordering::Acquire)
    }

    /// Reserves the payload for one signal; `Err` if a signal is already
    /// pending (Vulkan and CUDA forbid signalling a binary semaphore twice).
    pub fn reserve_signal(&self) -> Result<SignalReservation> {
        self.0
            .signal_pending
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| {
                Error::BinarySemaphore(
                    "a signal is already pending on this binary semaphore: wait for it first \
                     (a forgotten or dropped token leaves it pending)"
                        .into(),
                )
            })?;
        Ok(SignalReservation {
            payload: Some(self.clone()),
        })
    }

    /// `Ok` if `signal` was minted for this payload.
    pub fn check(&self, signal: &BinarySignal) -> Result<()> {
        if signal.is_for(self) {
            Ok(())
        } else {
            Err(Error::BinarySemaphore(
                "the token was minted by a signal of another semaphore; wait on the semaphore that was signalled"
                    .into(),
            ))
        }
    }

    /// Consumes `signal` once its wait has been enqueued or submitted; the
    /// payload is unsignalled again. `Err` (and nothing changes) if the
    /// token is another payload's.
    ///
    /// # Safety
    /// A wait for this signal was successfully submitted to a Vulkan queue
    /// or enqueued on a CUDA stream (otherwise a later signal would be a
    /// second signal of a signalled binary semaphore).
    pub unsafe fn consume(&self, mut signal: BinarySignal) -> Result<()> {
        self.check(&signal)?;
        signal.payload = None;
        self.0.signal_pending.store(false, Ordering::Release);
        Ok(())
    }

    /// The replacement token for a pending signal whose token was dropped
    /// unused (a helper that failed before submitting, say): `Some` at most
    /// once per such drop, `None` if no signal is pending or its token is
    /// still alive (or was `mem::forget`-ten).
    pub fn reclaim(&self) -> Option<BinarySignal> {
        self.0
            .orphaned
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .filter(|_| self.is_signal_pending())
            .map(|_| BinarySignal {
                payload: Some(self.clone()),
            })
    }
}

impl SignalReservation {
    /// Turns the reservation into the token of a submitted signal.
    ///
    /// # Safety
    /// A signal operation on this payload was successfully submitted to a
    /// Vulkan queue or enqueued on a CUDA stream after the reservation was
    /// made, and no wait has consumed it.
    pub unsafe fn submitted(mut self) -> BinarySignal {
        let payload = self.payload.take().expect("a reservation is used once");
        payload.0.orphaned.store(false, Ordering::Release);
        BinarySignal {
            payload: Some(payload),
        }
    }
}

impl Drop for SignalReservation {
    fn drop(&mut self) {
        if let Some(p) = self.payload.take() {
            p.0.signal_pending.store(false, Ordering::Release);
        }
    }
}

impl BinarySignal {
    /// Whether this token belongs to `payload`.
    pub fn is_for(&self, payload: &BinaryPayload) -> bool {
        self.payload
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(&p.0, &payload.0))
    }
}
