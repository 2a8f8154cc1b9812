//! `list_senders()` and `SenderInfo`: the senders announced in the
//! directory of senders (`cuda_interop_frames::discovery`).
//!
//! # Contract
//!
//! * `list_senders()` returns the live senders of the default directory
//!   (`$XDG_RUNTIME_DIR/cuda-interop-frames`, else a private directory
//!   under `$TMPDIR` or `/tmp`), sorted by name, each a read-only
//!   `SenderInfo`; it waits for nothing (the GIL is released while the
//!   directory is read).
//! * Uses only `errors` of this crate.

use cuda_interop_frames::discovery::{self, SlotKind};
use pyo3::prelude::*;

use crate::errors::discovery_error;

/// One announced sender, as `list_senders()` found it.
#[pyclass(frozen, get_all, module = "cuda_interop")]
pub(crate) struct SenderInfo {
    /// Its name (what `connect_named` takes).
    name: String,
    /// Pixels per row.
    width: u32,
    /// Rows.
    height: u32,
    /// Bytes from one row to the next.
    row_pitch: u64,
    /// The pixel format, e.g. `"r8g8b8a8_unorm"`.
    format: String,
    /// What the ring's slots are: `"buffer"` or `"image"`.
    kind: &'static str,
    /// Slots in the ring.
    slots: u32,
    /// Frames presented per second, over the last second or so (0 before).
    fps: f64,
    /// The sender's process id, as the sender sees itself (for people: in
    /// another pid namespace it names another process or none).
    pid: u32,
    /// Its socket's path (what `connect` takes).
    socket: String,
}

#[pymethods]
impl SenderInfo {
    fn __repr__(&self) -> String {
        format!(
            "<cuda_interop.SenderInfo {:?} {}x{} {} {} slots={} fps={:.1} pid={}>",
            self.name,
            self.width,
            self.height,
            self.format,
            self.kind,
            self.slots,
            self.fps,
            self.pid
        )
    }
}

/// The live senders, sorted by name.
#[pyfunction]
pub(crate) fn list_senders(py: Python<'_>) -> PyResult<Vec<SenderInfo>> {
    let senders = py
        .detach(discovery::list_senders)
        .map_err(discovery_error)?;
    Ok(senders
        .into_iter()
        .map(|s| SenderInfo {
            name: s.name,
            width: s.width,
            height: s.height,
            row_pitch: s.row_pitch,
            format: s.format,
            kind: match s.kind {
                SlotKind::Buffer => "buffer",
                SlotKind::Image => "image",
            },
            slots: s.slots,
            fps: s.fps,
            pid: s.pid,
            socket: s.socket.display().to_string(),
        })
        .collect())
}
