//! An OpenGL receiver bound to the thread that made it (GL calls need that
//! thread's current context): the only form in which one enters the
//! handle table.
//!
//! # Contract
//!
//! * [`ThreadBound::get`] gives the receiver on its own thread only; any
//!   other is `CI_INVALID_ARGUMENT`, touching nothing.
//! * Dropped on its own thread, the receiver is dropped (its GL objects
//!   deleted); dropped on another, it is leaked and reported, never
//!   dropped there.

use std::mem::ManuallyDrop;
use std::thread::ThreadId;

use cuda_interop_gl::GlReceiver;

use crate::{ci_status, CiError};

/// A GL receiver used and dropped only on the thread that made it.
pub(crate) struct ThreadBound {
    thread: ThreadId,
    receiver: ManuallyDrop<GlReceiver>,
}

// SAFETY: the receiver is reached only through `get`, which refuses every
// thread but `thread`, and dropped only on `thread` (elsewhere it is
// leaked): it never leaves the thread whose GL context it uses.
unsafe impl Send for ThreadBound {}
// SAFETY: as above: no reference to the receiver is given out on another
// thread (Debug prints the thread only; the wrong-thread drop reads only
// the session, which is Sync, and touches no GL).
unsafe impl Sync for ThreadBound {}

impl std::fmt::Debug for ThreadBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The thread only: the receiver is not touched off its thread.
        f.debug_struct("ThreadBound")
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl ThreadBound {
    /// Binds `receiver` to the calling thread.
    pub(crate) fn new(receiver: GlReceiver) -> ThreadBound {
        ThreadBound {
            thread: std::thread::current().id(),
            receiver: ManuallyDrop::new(receiver),
        }
    }

    /// The receiver, on its own thread only.
    pub(crate) fn get(&self) -> Result<&GlReceiver, CiError> {
        if std::thread::current().id() != self.thread {
            return Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                "an OpenGL receiver is used on another thread than the one that connected it: \
                 call ci_gl_receiver_* on that thread, with its GL context current",
            ));
        }
        Ok(&self.receiver)
    }
}

impl Drop for ThreadBound {
    fn drop(&mut self) {
        if std::thread::current().id() == self.thread {
            // SAFETY: dropped once, here, on its own thread.
            unsafe { ManuallyDrop::drop(&mut self.receiver) };
        } else {
            // No GL here; the session (no GL) ends, so the sender stops
            // waiting for this receiver.
            self.receiver
                .session()
                .close("the OpenGL receiver was dropped on another thread than its own: leaked");
            vk_export::report_drop_error(format_args!(
                "an OpenGL receiver's last reference went on another thread than its own: its \
                 textures, memory objects and Vulkan device are leaked (free it on the thread \
                 that connected it)"
            ));
        }
    }
}
