//! The ring a receiver shares with its frames: a `CudaReceiver` of the
//! frames crate (or, feature `test-hooks`, a recording stand-in over host
//! memory), and whether the Python receiver closed it.
//!
//! # Contract
//!
//! * No state of frames lives here: which frames are held, taken and given
//!   back is the library session's (`cuda_interop_frames::session`); a
//!   frame is a library `Frame`, released once by value.
//! * [`SharedRing::release`] is the one way a Python frame's slot goes
//!   back: after the consumer's stream (the slot's "released" timeline
//!   signalled there) when one is given, else as reads that completed.
//!   After [`SharedRing::close`] a release does nothing: the sender took
//!   every slot back.
//! * Until the library can make a foreign stream wait for "produced",
//!   [`SharedRing::make_readable`] waits for it on the host (bounded by
//!   the stream timeout): reads enqueued afterwards on any stream see the
//!   frame.
//! * Errors are plain Rust values (`ConsumerError`), so that a destructor
//!   can format them without calling into Python.
//! * Uses no other module of this crate but (feature `test-hooks`) `host`.

use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(feature = "test-hooks")]
use cuda_interop::dlpack::DL_CPU;
use cuda_interop::dlpack::DL_CUDA;
use cuda_interop_frames::cuda_receiver::{CudaReceiver, SlotMemory};
use cuda_interop_frames::protocol::RingLayout;
use cuda_interop_frames::session::{Frame, Session};
use cuda_interop_frames::transport::ConsumerError;

/// What receives the ring's frames.
pub(crate) enum Backend {
    /// The ring imported into CUDA.
    Cuda(Box<CudaReceiver>),
    /// Test hook: host memory standing in for the slots; "released"
    /// signals recorded instead of enqueued.
    #[cfg(feature = "test-hooks")]
    Recording(crate::host::RecordingRing),
}

/// A ring and whether the Python receiver closed it.
pub(crate) struct SharedRing {
    backend: Backend,
    closed: AtomicBool,
}

/// Where a slot's memory is, and what keeps it alive.
pub(crate) struct SlotView {
    pub(crate) memory: SlotMemory,
    pub(crate) data: u64,
    pub(crate) len: u64,
}

impl SharedRing {
    pub(crate) fn new(backend: Backend) -> SharedRing {
        SharedRing {
            backend,
            closed: AtomicBool::new(false),
        }
    }

    /// The library session: frames, layout, statistics, why it ended.
    pub(crate) fn session(&self) -> &Session {
        match &self.backend {
            Backend::Cuda(cuda) => cuda.session(),
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => ring.session(),
        }
    }

    pub(crate) fn layout(&self) -> &RingLayout {
        self.session().layout()
    }

    /// The frames' DLPack device.
    pub(crate) fn device(&self) -> (i32, i32) {
        match &self.backend {
            Backend::Cuda(cuda) => (DL_CUDA, cuda.cuda().ordinal()),
            #[cfg(feature = "test-hooks")]
            Backend::Recording(_) => (DL_CPU, 0),
        }
    }

    /// Bytes of slot `index`'s memory.
    pub(crate) fn slot_len(&self, index: u32) -> u64 {
        match &self.backend {
            Backend::Cuda(cuda) => cuda.slots()[index as usize].len,
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => ring.slot(index).2,
        }
    }

    /// `frame`'s memory, if this receiver still holds it.
    pub(crate) fn slot(&self, frame: &Frame) -> Result<SlotView, ConsumerError> {
        match &self.backend {
            Backend::Cuda(cuda) => {
                let slot = cuda.slot(frame)?;
                Ok(SlotView {
                    memory: slot.memory.clone(),
                    data: slot.data,
                    len: slot.len,
                })
            }
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => {
                ring.session().check_held(frame)?;
                let (memory, data, len) = ring.slot(frame.slot());
                Ok(SlotView { memory, data, len })
            }
        }
    }

    /// Every part's memory of `frame` of a multi-image ring, in part
    /// order, if this receiver still holds it.
    pub(crate) fn part_slots(&self, frame: &Frame) -> Result<Vec<SlotView>, ConsumerError> {
        match &self.backend {
            Backend::Cuda(cuda) => Ok(cuda
                .part_slots(frame)?
                .iter()
                .map(|slot| SlotView {
                    memory: slot.memory.clone(),
                    data: slot.data,
                    len: slot.len,
                })
                .collect()),
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => {
                ring.session().check_held(frame)?;
                Ok((0..ring.session().parts().len())
                    .map(|p| {
                        let (memory, data, len) = ring.part(frame.slot(), p);
                        SlotView { memory, data, len }
                    })
                    .collect())
            }
        }
    }

    /// Makes reads enqueued from now on see `frame` (see the module
    /// contract), where that is needed: a consumer `stream` is ordered after
    /// "produced" (and an image ring's copy) on the GPU, without a host
    /// wait; without one, an image ring's copy is waited for on the host
    /// (bounded), and a buffer ring handed out with stream `-1` is ordered
    /// by the consumer itself.
    ///
    /// # Safety
    ///
    /// `stream`, if given, is 1 (the legacy default stream), 2 (the calling
    /// thread's default stream) or a live stream of the ring's device, for
    /// the call.
    pub(crate) unsafe fn make_readable(
        &self,
        frame: &Frame,
        stream: Option<usize>,
    ) -> Result<(), ConsumerError> {
        match &self.backend {
            Backend::Cuda(cuda) => match stream {
                // SAFETY: the caller's guarantee for `handle`.
                Some(handle) => unsafe { cuda.wait_on_raw(frame, handle) },
                None if !self.layout().is_image_ring() => cuda.slot(frame).map(drop),
                None => {
                    let via = cuda.enqueue_readable(frame)?;
                    via.synchronize(via.timeout())?;
                    Ok(())
                }
            },
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => ring.session().check_held(frame),
        }
    }

    /// Enqueues the wait for `frame` (and an image ring's copy) on the
    /// receiver's own stream and returns that stream's handle, which a CUDA
    /// Array Interface consumer orders its work after; `None` without CUDA.
    pub(crate) fn interface_stream(&self, frame: &Frame) -> Result<Option<usize>, ConsumerError> {
        match &self.backend {
            Backend::Cuda(cuda) => Ok(Some(cuda.enqueue_readable(frame)?.raw() as usize)),
            #[cfg(feature = "test-hooks")]
            Backend::Recording(ring) => ring.session().check_held(frame).map(|()| None),
        }
    }

    /// Gives `frame` back: after the work enqueued on `stream` so far when
    /// given, else as a frame whose reads have completed. Nothing after
    /// [`SharedRing::close`].
    ///
    /// # Safety
    ///
    /// `stream`, if given, is 1 (the legacy default stream), 2 (the calling
    /// thread's default stream) or a live stream of the ring's device, for
    /// the call.
    pub(crate) unsafe fn release(
        &self,
        frame: Frame,
        stream: Option<usize>,
    ) -> Result<(), ConsumerError> {
        if self.is_closed() {
            // The sender took the slot back when the connection closed.
            drop(frame);
            return Ok(());
        }
        match (&self.backend, stream) {
            // SAFETY: the caller's guarantee on `stream`.
            (Backend::Cuda(cuda), Some(h)) => unsafe { cuda.release_after_raw(frame, h) },
            (Backend::Cuda(cuda), None) => cuda.session().release(frame, false),
            #[cfg(feature = "test-hooks")]
            (Backend::Recording(ring), stream) => ring.release(frame, stream),
        }
    }

    /// Shuts the connection down: the sender takes every slot back, and
    /// releases of frames still out do nothing.
    pub(crate) fn close(&self, why: &str) {
        self.closed.store(true, Ordering::Release);
        self.session().close(why);
    }

    /// Test hook: the "released" signals a recording ring made so far, as
    /// `(slot, frame, stream)`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn signals(&self) -> Vec<(u32, u64, usize)> {
        match &self.backend {
            Backend::Recording(ring) => ring.signals(),
            Backend::Cuda(_) => Vec::new(),
        }
    }

    /// Whether [`SharedRing::close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
