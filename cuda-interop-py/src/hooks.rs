//! Test hooks (feature `test-hooks`, built only by `cargo xtask test` for
//! pytest; never in a wheel): the module's `_`-prefixed functions.
//!
//! # Contract
//!
//! * `_host_frame(n)`: a one-message frame over `n` bytes of host memory
//!   (`kDLCPU`), each byte its index modulo 256; `_host_frames_alive()`:
//!   how many such buffers (and host ring slots) are not yet freed.
//! * `_connect_host_ring(path, timeout, record_signals=False,
//!   accept_delay=0.0, delivery=None)`: `connect`, but a hello makes a ring
//!   over host memory, and without `delivery` it does not subscribe (the
//!   producer serves it lossless, as a receiver of protocol v1);
//!   `_signals(receiver)` lists a recording ring's "released" signals;
//!   `_interface_dict(frame)` is the interface dictionary a CUDA ring frame
//!   of that layout would have.
//! * Uses `errors`, `frame`, `host` and `receiver` of this crate; none of
//!   them uses this module.

use std::sync::atomic::Ordering;

use cuda_interop::dlpack::DL_CPU;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::seconds;
use crate::frame::{Frame, Payload};
use crate::host::{HostBytes, HOST_ALIVE};
use crate::receiver::Receiver;

/// Test hook: a one-message frame over `nbytes` bytes of host memory
/// (`kDLCPU`), each byte its index modulo 256.
#[pyfunction]
pub(crate) fn _host_frame(nbytes: u64) -> PyResult<Frame> {
    let len = usize::try_from(nbytes).map_err(|_| PyValueError::new_err("too large"))?;
    let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
    Ok(Frame::single(
        0,
        nbytes,
        (DL_CPU, 0),
        Payload::Host(HostBytes::new(bytes)),
    ))
}

/// Test hook: the `__cuda_array_interface__` dictionary a CUDA ring frame
/// with this frame's layout would have (its `stream` key `None`).
#[pyfunction]
pub(crate) fn _interface_dict<'py>(
    py: Python<'py>,
    frame: PyRef<'py, Frame>,
) -> PyResult<Bound<'py, PyDict>> {
    let data = frame.ring_data()?;
    frame.interface(py, data, Some(None))
}

/// Test hook: how many test-hook host buffers are not yet freed.
#[pyfunction]
pub(crate) fn _host_frames_alive() -> usize {
    HOST_ALIVE.load(Ordering::SeqCst)
}

/// Test hook: `connect`, but a hello makes a ring over host memory
/// (`kDLCPU` frames, no setup message, no CUDA). With `record_signals`, its
/// frames take stream arguments as a CUDA ring's do, and each "released"
/// signal is recorded ([`_signals`]) instead of enqueued.
#[pyfunction]
#[pyo3(signature = (socket_path, timeout, record_signals=false, accept_delay=0.0, delivery=None))]
pub(crate) fn _connect_host_ring(
    py: Python<'_>,
    socket_path: &str,
    timeout: f64,
    record_signals: bool,
    accept_delay: f64,
    delivery: Option<&str>,
) -> PyResult<Receiver> {
    let delivery = delivery.map(crate::receiver::parse_delivery).transpose()?;
    let mut receiver = Receiver::connect(py, socket_path, timeout, delivery, Some(record_signals))?;
    receiver.accept_delay = seconds("accept_delay", accept_delay)?;
    Ok(receiver)
}

/// Test hook: the "released" signals a recording host ring made so far, as
/// `(slot, frame, stream)`.
#[pyfunction]
pub(crate) fn _signals(receiver: &Receiver) -> Vec<(u32, u64, usize)> {
    receiver.signals()
}
