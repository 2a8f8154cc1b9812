//! `libcuda_interop`: a C ABI over `cuda-interop-frames` for C and C++
//! engines and plugins (issue 33, first cut): a headless Vulkan context, a
//! named sender of a buffer ring, and a host receiver that reads frames on
//! any Vulkan driver. The header is `include/cuda_interop.h`; the README
//! says what is there and the ABI stability rules.
//!
//! # Contract
//!
//! * Every exported function returns a [`ci_status`] (`ci_status`) and, on the
//!   calling thread, sets the message [`ci_last_error_message`] returns: the
//!   empty string after `CI_OK`, else what went wrong and what to do.
//! * No panic crosses the ABI: every entry point runs under
//!   `catch_unwind`, and a panic becomes [`ci_status::CI_PANIC`] with its message.
//! * Every handle is checked before use (see `handles`): NULL is
//!   [`ci_status::CI_NULL_POINTER`]; a freed handle, a value that never was a
//!   handle, or a handle of another kind is [`ci_status::CI_WRONG_HANDLE`]. Handle
//!   values are never dereferenced, so none of these is undefined
//!   behaviour. What the library cannot check is what the C side promises
//!   in each function's `# Safety`: out-pointers and buffers are valid for
//!   writes of their size, strings are NUL-terminated, option structs are
//!   readable.
//! * Values the C side passes as integers (deliveries, validation modes)
//!   are checked, never transmuted into Rust enums.
//! * Thread safety is stated per function; in short: every function may be
//!   called from any thread; calls on one sender are serialized (a second
//!   thread waits for the first); a receiver's calls may run concurrently
//!   (one thread receives at a time, `ci_receiver_next` on a second one
//!   waits within its timeout and then returns [`ci_status::CI_BUSY`]).

mod ffi;
mod gl_receive;
mod handles;
mod opened;
mod receive;
mod thread_bound;
mod vulkan;
mod vulkan_receive;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

pub use ffi::*;
pub use gl_receive::*;
pub use opened::*;
pub use receive::*;
pub use vulkan::*;
pub use vulkan_receive::*;

/// The ABI's major version: the `N` of the soname `libcuda_interop.so.N`
/// (see the README's stability rules).
pub const CI_ABI_VERSION_MAJOR: u32 = 0;

/// What a call did: `CI_OK` or why not. Values are stable; new ones may be
/// added within 0.x (treat an unknown one as an error).
#[repr(C)]
#[allow(non_camel_case_types, reason = "the C names: ci_status, CI_OK")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ci_status {
    /// Success.
    CI_OK = 0,
    /// An argument is out of range (the message says which).
    CI_INVALID_ARGUMENT = 1,
    /// A required pointer (handle, out-pointer, string) is NULL.
    CI_NULL_POINTER = 2,
    /// A handle that is not live (freed, or never one) or of another kind.
    CI_WRONG_HANDLE = 3,
    /// Nothing came within the timeout.
    CI_TIMEOUT = 4,
    /// The sender dropped this receiver (and said why): connect again.
    CI_DROPPED = 5,
    /// The connection is over (the sender stopped or crashed): connect
    /// again.
    CI_CLOSED = 6,
    /// No sender has that name.
    CI_NOT_FOUND = 7,
    /// A live sender has that name already.
    CI_NAME_TAKEN = 8,
    /// A Vulkan call failed.
    CI_VULKAN = 9,
    /// A CUDA call failed.
    CI_CUDA = 10,
    /// The device or the ring lacks what the call needs.
    CI_UNSUPPORTED = 11,
    /// A panic inside the library (a bug: please report the message).
    CI_PANIC = 12,
    /// Every slot is held by latest receivers: the frame was skipped; try
    /// again for the next one.
    CI_SKIPPED = 13,
    /// Another thread was receiving on this receiver for the whole timeout.
    CI_BUSY = 14,
    /// The peer broke the frame protocol.
    CI_PROTOCOL = 15,
    /// A system call failed.
    CI_IO = 16,
    /// The destination buffer is smaller than a frame.
    CI_BUFFER_TOO_SMALL = 17,
}

/// An error: the status and the message the thread gets.
#[derive(Debug)]
pub(crate) struct CiError {
    status: ci_status,
    message: String,
}

impl CiError {
    pub(crate) fn new(status: ci_status, message: impl Into<String>) -> CiError {
        CiError {
            status,
            message: message.into(),
        }
    }
}

thread_local! {
    static MESSAGE: RefCell<CString> = RefCell::new(CString::default());
}

fn set_message(message: &str) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    MESSAGE.with(|m| *m.borrow_mut() = c);
}

/// Runs one entry point's body: its status, the thread's message set, no
/// panic let out.
pub(crate) fn entry(body: impl FnOnce() -> Result<(), CiError>) -> ci_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            set_message("");
            ci_status::CI_OK
        }
        Ok(Err(e)) => {
            set_message(&e.message);
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            // A payload whose drop panics again would abort: forget it.
            std::mem::forget(payload);
            set_message(&format!(
                "the library panicked ({what}): a bug, please report it with this message"
            ));
            ci_status::CI_PANIC
        }
    }
}

/// The calling thread's message about its last call: "" after `CI_OK`. The
/// pointer stays valid until the thread's next call of a function of this
/// library other than this one; never NULL.
///
/// Thread safety: any thread; each thread has its own message.
#[no_mangle]
pub extern "C" fn ci_last_error_message() -> *const c_char {
    MESSAGE
        .try_with(|m| m.borrow().as_ptr())
        .unwrap_or(c"(the thread is exiting: no message)".as_ptr())
}

/// Bytes of `ci_ring_layout::format_name` and `ci_sender_info::format`: a
/// lower-case name (at most 31 bytes) and its NUL, padded.
pub const CI_FORMAT_NAME_CAPACITY: usize = 32;

/// `name` as a NUL-terminated, zero-padded array (cut to fit).
pub(crate) fn name_array<const N: usize>(name: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (d, b) in out.iter_mut().zip(name.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    out
}

/// A timeout in seconds, checked.
pub(crate) fn seconds(what: &str, s: f64) -> Result<Duration, CiError> {
    if !(s.is_finite() && (0.0..=1.0e9).contains(&s)) {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!("{what} is {s}: pass a number of seconds from 0 to 1e9"),
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A required out-pointer or argument pointer, checked for NULL.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<(), CiError> {
    if p.is_null() {
        Err(CiError::new(
            ci_status::CI_NULL_POINTER,
            format!("{what} is NULL: pass a valid pointer"),
        ))
    } else {
        Ok(())
    }
}

/// A frame's description (`ci_frame_get_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ci_frame_info {
    /// Its sequence number (from 1, one per presented frame).
    pub sequence: u64,
    /// When it was presented: nanoseconds of `CLOCK_MONOTONIC`.
    pub timestamp_ns: u64,
    /// Frames presented since this receiver's previous one that it did not
    /// get (0 for its first).
    pub dropped_before: u64,
    /// Bytes from one row to the next.
    pub row_pitch: u64,
    /// Bytes of the frame (`row_pitch * height`): what `ci_receiver_read`
    /// writes.
    pub frame_bytes: u64,
    /// Its slot in the ring.
    pub slot: u32,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
}
