//! The Python exceptions for the crates' errors, and argument checks.
//!
//! # Contract
//!
//! * `TimeoutError` for a timeout (also another thread's `next()` receiving
//!   for the whole timeout), `ConnectionError` for socket errors and a
//!   connection that is over (the sender closed it, dropped this receiver,
//!   or it was given up or closed here), `ValueError` for a malformed
//!   message, record or packet, a frame this receiver does not hold, and
//!   bad arguments, `RuntimeError` for CUDA and Vulkan errors. The message
//!   is the error's own; a drop's adds what to do about it in Python terms.
//! * Uses no other module of this crate.

use std::time::Duration;

use cuda_interop_frames::discovery::DiscoveryError;
use cuda_interop_frames::protocol::DropReason;
use cuda_interop_frames::transport::ConsumerError;
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::PyErr;
use vk_export::wire::WireError;

/// A Vulkan-side error as the Python exception its kind calls for.
pub(crate) fn vk_error(error: vk_export::Error) -> PyErr {
    use vk_export::Error as E;
    let message = error.to_string();
    match error {
        E::Timeout(_) => PyTimeoutError::new_err(message),
        E::Wire(WireError::Closed) | E::Socket { .. } | E::PeerRefused { .. } => {
            PyConnectionError::new_err(message)
        }
        E::Wire(_) | E::Record(_) => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// A CUDA-side error as the Python exception its kind calls for.
pub(crate) fn cuda_error(error: cuda_interop::Error) -> PyErr {
    match error {
        cuda_interop::Error::Vulkan(e) => vk_error(e),
        cuda_interop::Error::Timeout(_) => PyTimeoutError::new_err(error.to_string()),
        cuda_interop::Error::InvalidArgument(m) => PyValueError::new_err(m),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

/// What a Python receiver does about a drop for `reason`.
fn python_hint(reason: &DropReason) -> &'static str {
    match reason {
        DropReason::HeldTooLong { .. } => {
            "in Python: release every frame (frame.release(), or leave `with frame:`) and call \
             Receiver.next() often enough: a frame counts as held from when the sender sent it \
             until its release; then connect again (cuda_interop.connect or connect_named)"
        }
        DropReason::GpuReleaseMissing { .. } => {
            "in Python: release frames on a stream that runs (frame.release(stream=\
             torch.cuda.current_stream())) and do not block that stream; then connect again"
        }
        DropReason::TooManyReceivers { .. } | DropReason::TooManyConnects { .. } => {
            "close receivers you no longer use (Receiver.close(), or `with` blocks), then \
             connect again"
        }
        // The error's own text ends "connect again": say with what.
        _ => "with cuda_interop.connect or connect_named",
    }
}

/// A frame receiver's error as the Python exception its kind calls for.
pub(crate) fn consumer_error(error: ConsumerError) -> PyErr {
    use ConsumerError as E;
    match error {
        E::Vulkan(e) => vk_error(e),
        E::Cuda(e) => cuda_error(e),
        E::Dropped(reason) => {
            PyConnectionError::new_err(format!("{error} ({})", python_hint(&reason)))
        }
        E::ConnectTimeout { .. } | E::Timeout(_) | E::Busy(_) => {
            PyTimeoutError::new_err(error.to_string())
        }
        E::Connect { .. } | E::Poll(_) | E::Recv(_) | E::Closed | E::GivenUp(_) => {
            PyConnectionError::new_err(error.to_string())
        }
        E::Packet(_)
        | E::Protocol(_)
        | E::MultiImage { .. }
        | E::NotHeld { .. }
        | E::NotThisReceiver { .. } => PyValueError::new_err(error.to_string()),
        E::LatestHoldsOne { sequence } => PyRuntimeError::new_err(format!(
            "a latest receiver holds one frame at a time: release frame {sequence} first \
             (frame.release(), or leave its `with` block) before the next next()"
        )),
    }
}

/// A discovery error as the Python exception its kind calls for.
pub(crate) fn discovery_error(error: DiscoveryError) -> PyErr {
    match error {
        DiscoveryError::Connect(e) => consumer_error(e),
        DiscoveryError::Name { .. } => PyValueError::new_err(error.to_string()),
        e => PyConnectionError::new_err(e.to_string()),
    }
}

/// Seconds from Python as a `Duration`: finite and not negative.
pub(crate) fn seconds(name: &str, value: f64) -> Result<Duration, PyErr> {
    if !value.is_finite() {
        return Err(PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, not {value}"
        )));
    }
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, not {value}"
        ))
    })
}
