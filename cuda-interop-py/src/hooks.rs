//! Test hooks (feature `test-hooks`, built only by `cargo xtask test` for
//! pytest; never in a wheel): the module's `_`-prefixed functions.
//!
//! # Contract
//!
//! * `_host_frame(n)`: a one-message frame over `n` bytes of host memory
//!   (`kDLCPU`), each byte its index modulo 256; `_host_frames_alive()`:
//!   how many such buffers (and recording ring slots) are not yet freed.
//! * `_connect_recording(path, timeout, delivery="latest")`: `connect` to
//!   a real sender, but the ring is the `host` module's recording ring
//!   (frames over host memory that take streams as CUDA frames do);
//!   `_signals(receiver)` lists its recorded "released" signals as
//!   `(slot, frame, stream)`.
//! * Uses `errors`, `frame`, `host` and `receiver` of this crate; none of
//!   them uses this module.

use std::sync::atomic::Ordering;

use cuda_interop::dlpack::DL_CPU;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::seconds;
use crate::frame::{Frame, Payload};
use crate::host::{HostBytes, HOST_ALIVE};
use crate::receiver::{parse_delivery, Open, Receiver};

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

/// Test hook: how many test-hook host buffers are not yet freed.
#[pyfunction]
pub(crate) fn _host_frames_alive() -> usize {
    HOST_ALIVE.load(Ordering::SeqCst)
}

/// Test hook: `connect`, but the ring is a recording ring over host
/// memory (its frames take streams as CUDA frames do; each "released"
/// signal is recorded, see `_signals`).
#[pyfunction]
#[pyo3(signature = (socket_path, timeout, delivery="latest"))]
pub(crate) fn _connect_recording(
    py: Python<'_>,
    socket_path: &str,
    timeout: f64,
    delivery: &str,
) -> PyResult<Receiver> {
    let delivery = parse_delivery(delivery)?;
    let timeout = seconds("timeout", timeout)?;
    Receiver::connect(py, socket_path, timeout, delivery, Open::Recording)
}

/// Test hook: the "released" signals a recording ring made so far, as
/// `(slot, frame, stream)`.
#[pyfunction]
pub(crate) fn _signals(receiver: &Receiver) -> Vec<(u32, u64, usize)> {
    receiver.signals()
}
