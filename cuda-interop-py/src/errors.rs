//! The Python exceptions for the crates' errors, and argument checks.
//!
//! # Contract
//!
//! * `TimeoutError` for a timeout, `ConnectionError` for socket errors and a
//!   peer that closed or was refused (or a connection given up),
//!   `ValueError` for a malformed message, record or packet and for bad
//!   arguments, `RuntimeError` for CUDA and Vulkan errors. The message is
//!   the error's own.
//! * Uses no other module of this crate.

use std::time::Duration;

use cuda_interop_frames::consumer::{ConsumerError, SendError};
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

/// A frame consumer's error as the Python exception its kind calls for.
pub(crate) fn consumer_error(error: ConsumerError) -> PyErr {
    use ConsumerError as E;
    match error {
        E::Vulkan(e) => vk_error(e),
        E::Cuda(e) => cuda_error(e),
        E::ConnectTimeout { .. } | E::Timeout(_) | E::Busy(_) => {
            PyTimeoutError::new_err(error.to_string())
        }
        E::Connect { .. } | E::Poll(_) | E::Recv(_) | E::Closed | E::GivenUp(_) => {
            PyConnectionError::new_err(error.to_string())
        }
        E::Packet(_) | E::Protocol(_) => PyValueError::new_err(error.to_string()),
    }
}

/// A release message's send error as the Python exception for it.
pub(crate) fn send_error(error: SendError) -> PyErr {
    match error {
        SendError::Timeout => PyTimeoutError::new_err(error.to_string()),
        _ => PyConnectionError::new_err(error.to_string()),
    }
}

/// Seconds from Python as a `Duration`: finite and not negative.
pub(crate) fn seconds(name: &str, value: f64) -> Result<Duration, PyErr> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, not {value}"
        ))
    })
}
