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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

#[derive(Default)]
struct PayloadState {
    signal_pending: AtomicBool,
    /// The pending signal's token was dropped unused: a new one may be
    /// minted for it ([`BinaryPayload::reclaim`]).
    orphaned: AtomicBool,
    /// The handle the pending signal is on, when it is on one handle only
    /// (a temporary SYNC_FD import replaces one handle's payload, not the
    /// shared one's); 0 when every handle of the payload sees it.
    pending_on: AtomicU64,
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

    /// `Ok` if `signal` was minted for this payload and every handle of it
    /// sees the signal (for a wait through any handle, a CUDA one say).
    pub fn check(&self, signal: &BinarySignal) -> Result<()> {
        self.check_on(signal, 0)
    }

    /// `Ok` if `signal` was minted for this payload and the handle `handle`
    /// (a nonzero id its owner chose) sees the signal: a signal on one
    /// handle only ([`SignalReservation::submitted_on`]) is waited for
    /// through that handle, never through another, where nothing is pending.
    pub fn check_on(&self, signal: &BinarySignal, handle: u64) -> Result<()> {
        if !signal.is_for(self) {
            return Err(Error::BinarySemaphore(
                "the token was minted by a signal of another semaphore; wait on the semaphore that was signalled"
                    .into(),
            ));
        }
        let on = self.0.pending_on.load(Ordering::Acquire);
        if on != 0 && on != handle {
            return Err(Error::BinarySemaphore(
                "the token stands for a temporary SYNC_FD import into one handle of this semaphore: wait \
                 through that handle (the others, and CUDA's, see no pending signal)"
                    .into(),
            ));
        }
        Ok(())
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
        if !signal.is_for(self) {
            return self.check(&signal);
        }
        signal.payload = None;
        self.0.pending_on.store(0, Ordering::Release);
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
    pub unsafe fn submitted(self) -> BinarySignal {
        // SAFETY: forwarded; 0: every handle of the payload sees it.
        unsafe { self.submitted_on(0) }
    }

    /// As [`SignalReservation::submitted`], for a signal that only the
    /// handle `handle` (a nonzero id) sees: its token is waited for through
    /// that handle alone ([`BinaryPayload::check_on`]).
    ///
    /// # Safety
    /// As for [`SignalReservation::submitted`], on that handle.
    pub unsafe fn submitted_on(mut self, handle: u64) -> BinarySignal {
        let payload = self.payload.take().expect("a reservation is used once");
        payload.0.pending_on.store(handle, Ordering::Release);
        payload.0.orphaned.store(false, Ordering::Release);
        BinarySignal {
            payload: Some(payload),
        }
    }
}

impl Drop for SignalReservation {
    fn drop(&mut self) {
        if let Some(p) = self.payload.take() {
            p.0.pending_on.store(0, Ordering::Release);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal that one handle alone sees (a temporary SYNC_FD import) is
    /// waited for through that handle only, also after its token was
    /// dropped and reclaimed (found by review: the other handles of the
    /// payload, and CUDA's, would wait on a payload with nothing pending).
    #[test]
    fn a_signal_on_one_handle_is_waited_for_through_that_handle_only() {
        let payload = BinaryPayload::new();
        // SAFETY: a test of the bookkeeping alone: no GPU work exists.
        let token = unsafe { payload.reserve_signal().unwrap().submitted_on(5) };
        assert!(payload.check(&token).is_err(), "a wait through any handle");
        assert!(payload.check_on(&token, 6).is_err(), "another handle");
        payload.check_on(&token, 5).unwrap();
        drop(token);
        let again = payload
            .reclaim()
            .expect("the orphaned signal's replacement");
        assert!(
            payload.check_on(&again, 6).is_err(),
            "the replacement keeps the tag"
        );
        payload.check_on(&again, 5).unwrap();
        // SAFETY: as above.
        unsafe { payload.consume(again) }.unwrap();
        assert!(!payload.is_signal_pending());
        // The next signal is seen by every handle again.
        // SAFETY: as above.
        let token = unsafe { payload.reserve_signal().unwrap().submitted() };
        payload.check(&token).unwrap();
        payload.check_on(&token, 6).unwrap();
        // SAFETY: as above.
        unsafe { payload.consume(token) }.unwrap();
    }

    /// Four threads signal and wait one payload at once: every signal
    /// reserved while another is pending is refused, every minted token is
    /// consumed once, and the payload ends unsignalled. Miri runs it (`cargo
    /// +nightly miri test -p interop-share token`) for data races and UB in
    /// the bookkeeping (issue 22 item 3).
    #[test]
    fn threads_signalling_one_payload_take_turns() {
        let payload = BinaryPayload::new();
        let taken = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (payload, taken) = (&payload, &taken);
                s.spawn(move || {
                    for _ in 0..10 {
                        let Ok(reservation) = payload.reserve_signal() else {
                            continue;
                        };
                        // SAFETY: a test of the bookkeeping alone: no GPU
                        // work exists; the "signal" is this call.
                        let token = unsafe { reservation.submitted_on(t) };
                        payload.check_on(&token, t).unwrap();
                        // SAFETY: as above; the "wait" is this call.
                        unsafe { payload.consume(token) }.unwrap();
                        taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        assert!(taken.into_inner() >= 1);
        assert!(!payload.is_signal_pending());
    }
}
