//! The Python module `cuda_interop`: receive buffers a Vulkan producer in
//! another process shares over a Unix socket (the `vk-export` wire format),
//! import them into CUDA, and hand them to DLPack consumers (PyTorch, CuPy,
//! JAX) without copying.
//!
//! # Contract
//!
//! * `connect(socket_path, timeout) -> Receiver` connects to a
//!   `vk_export::socket::Listener` (a `SOCK_SEQPACKET` Unix socket whose
//!   listening process runs as this user). A full backlog is waited on for at
//!   most `timeout` seconds.
//! * `Receiver.next(timeout) -> Frame` waits at most `timeout` seconds for one
//!   message, with the GIL released for the whole call (receive, Vulkan and
//!   CUDA set-up, import). Resource 0 must be a device-local buffer; the other
//!   resources of the message are dropped (their fds closed). The first frame
//!   creates one headless Vulkan context on the device whose `deviceUUID` the
//!   record names, and the CUDA device paired with it by UUID; later frames of
//!   the same device reuse them. The record is verified on that Vulkan device
//!   before CUDA imports it.
//! * `Frame.__dlpack__(stream=None, max_version=None, dl_device=None,
//!   copy=None)` hands the whole buffer out once, as a 1-D `uint8` tensor on
//!   `(kDLCUDA, ordinal)` (`Frame.__dlpack_device__()`). With `max_version`
//!   of major 1 or more the capsule is a DLPack 1.0 `"dltensor_versioned"`;
//!   with `None` (a consumer that predates DLPack 1.0) it is a legacy
//!   `"dltensor"`, as the protocol requires. The capsule's destructor calls
//!   the tensor's deleter only if no consumer took it (a consumer renames it
//!   `"used_dltensor_versioned"` / `"used_dltensor"` and calls the deleter
//!   itself), so the mapping, the CUDA import and the memory are freed exactly
//!   once. No stream ordering is done: the contents are what the producer
//!   wrote before it sent the message (semaphores come later).
//! * `Frame.release()` (and leaving `with frame:`) frees a frame that was not
//!   handed out; handing out after that, or twice, raises `BufferError`.
//! * Errors carry the crates' messages: `TimeoutError` for a timeout,
//!   `ConnectionError` for socket errors and a peer that closed or was
//!   refused, `ValueError` for a malformed message or record and for bad
//!   arguments, `RuntimeError` for CUDA and Vulkan errors (no CUDA driver, no
//!   matching device). No call waits without a bound.
//! * Built with the `test-hooks` feature (only `cargo xtask test` does, for
//!   pytest), the module also has `_host_frame(n)` and `_host_frames_alive()`:
//!   a frame over `n` bytes of host memory (`kDLCPU`), to test the capsule
//!   protocol without a GPU. The wheel (`maturin build`) has no such hooks.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

use cuda_interop::dlpack::{
    DLDataType, DLDataTypeCode, DLManagedTensor, DLManagedTensorVersioned, ManagedTensor, DL_CUDA,
};
use cuda_interop::{CudaDevice, ImportedBuffer};
use pyo3::exceptions::{
    PyBufferError, PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use vk_export::markers::DeviceLocal;
use vk_export::socket::Connection;
use vk_export::wire::WireError;
use vk_export::{Context, HeadlessOptions};

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// A Vulkan-side error as the Python exception its kind calls for.
fn vk_error(error: vk_export::Error) -> PyErr {
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
fn cuda_error(error: cuda_interop::Error) -> PyErr {
    match error {
        cuda_interop::Error::Vulkan(e) => vk_error(e),
        cuda_interop::Error::Timeout(_) => PyTimeoutError::new_err(error.to_string()),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Seconds from Python as a `Duration`: finite and not negative.
fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, not {value}"
        ))
    })
}

/// Connects with `connect(2)` bounded by `timeout` (`SO_SNDTIMEO`: how long
/// a full backlog is waited on), then wraps the socket as a [`Connection`]
/// (peer check, default send timeout).
fn connect_with_timeout(path: &str, timeout: Duration) -> PyResult<Connection> {
    use rustix::io::Errno;
    use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let failed = |call: &str, e: Errno| {
        PyConnectionError::new_err(format!(
            "cannot connect to {path}: {call} failed: {}",
            std::io::Error::from(e)
        ))
    };
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| failed("socket(AF_UNIX, SOCK_SEQPACKET)", e))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| failed("a Unix socket path", e))?;
    // SO_SNDTIMEO of zero means "forever": the shortest bound it can express.
    let bound = timeout.max(Duration::from_micros(1));
    net::sockopt::set_socket_timeout(&fd, net::sockopt::Timeout::Send, Some(bound))
        .map_err(|e| failed("setsockopt(SO_SNDTIMEO)", e))?;
    match net::connect(&fd, &addr) {
        Ok(()) => {}
        Err(Errno::AGAIN | Errno::INPROGRESS) => {
            return Err(PyTimeoutError::new_err(format!(
                "cannot connect to {path}: its backlog stayed full for {timeout:?}"
            )))
        }
        Err(e) => return Err(failed("connect", e)),
    }
    Connection::from_fd(fd).map_err(vk_error)
}

/// Connects to the producer's socket at `socket_path`, waiting at most
/// `timeout` seconds for room in its backlog.
#[pyfunction]
fn connect(py: Python<'_>, socket_path: &str, timeout: f64) -> PyResult<Receiver> {
    let timeout = seconds("timeout", timeout)?;
    let path = socket_path.to_owned();
    let connection = py.detach(|| connect_with_timeout(&path, timeout))?;
    Ok(Receiver {
        connection,
        path,
        devices: Mutex::new(None),
    })
}

/// The Vulkan context and the CUDA device paired with it, for one `deviceUUID`.
struct Devices {
    uuid: [u8; 16],
    cuda: CudaDevice,
}

/// A connection to a producer; `next()` receives frames.
#[pyclass(frozen, module = "cuda_interop")]
struct Receiver {
    connection: Connection,
    path: String,
    devices: Mutex<Option<Devices>>,
}

impl Receiver {
    /// The CUDA device for `uuid`, made with its Vulkan context on first use.
    fn cuda_for(&self, uuid: [u8; 16]) -> PyResult<CudaDevice> {
        let mut devices = self
            .devices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(d) = devices.as_ref().filter(|d| d.uuid == uuid) {
            return Ok(d.cuda.clone());
        }
        let vulkan = Context::headless(&HeadlessOptions {
            device_uuid: Some(uuid),
            ..HeadlessOptions::default()
        })
        .map_err(vk_error)?;
        // The CUDA device keeps its Vulkan context (records are verified on it).
        let cuda = CudaDevice::for_vulkan(&vulkan).map_err(cuda_error)?;
        *devices = Some(Devices {
            uuid,
            cuda: cuda.clone(),
        });
        Ok(cuda)
    }

    fn receive(&self, timeout: Duration) -> PyResult<Frame> {
        let mut received = self.connection.recv(timeout).map_err(vk_error)?;
        let tag = received.message().tag;
        let buffer = received.take_buffer::<DeviceLocal>(0).map_err(vk_error)?;
        let cuda = self.cuda_for(buffer.record().info().device_uuid())?;
        let imported = cuda
            .import_received_buffer(buffer)
            .map_err(|e| cuda_error(e.into_error()))?;
        Ok(Frame {
            tag,
            size: imported.size(),
            device: (DL_CUDA, cuda.ordinal()),
            payload: Some(Payload::Imported(imported)),
        })
    }
}

#[pymethods]
impl Receiver {
    /// Waits at most `timeout` seconds for the next message and imports its
    /// buffer (resource 0) into CUDA.
    fn next(&self, py: Python<'_>, timeout: f64) -> PyResult<Frame> {
        let timeout = seconds("timeout", timeout)?;
        py.detach(|| self.receive(timeout))
    }

    /// The socket path this receiver connected to.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __repr__(&self) -> String {
        format!("<cuda_interop.Receiver {}>", self.path)
    }
}

/// Counts the live host buffers of `_host_frame`.
#[cfg(feature = "test-hooks")]
static HOST_ALIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Host memory for the `_host_frame` test hook.
#[cfg(feature = "test-hooks")]
struct HostBytes(Vec<u8>);

#[cfg(feature = "test-hooks")]
impl Drop for HostBytes {
    fn drop(&mut self) {
        HOST_ALIVE.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

enum Payload {
    Imported(ImportedBuffer<DeviceLocal>),
    #[cfg(feature = "test-hooks")]
    Host(HostBytes),
}

/// One received buffer: hand it to a DLPack consumer once
/// (`torch.from_dlpack(frame)`), or `release()` it.
#[pyclass(module = "cuda_interop")]
struct Frame {
    tag: u64,
    size: u64,
    device: (i32, i32),
    payload: Option<Payload>,
}

impl Frame {
    fn tensor(&mut self) -> PyResult<ManagedTensor> {
        let payload = self.payload.take().ok_or_else(|| {
            PyBufferError::new_err("the frame was already handed out or released")
        })?;
        let dtype = DLDataType::scalar(DLDataTypeCode::UInt, 8);
        let len = i64::try_from(self.size)
            .map_err(|_| PyValueError::new_err(format!("{} bytes", self.size)))?;
        match payload {
            Payload::Imported(buffer) => buffer
                .into_dlpack(dtype, &[len], None, false)
                .map_err(cuda_error),
            #[cfg(feature = "test-hooks")]
            Payload::Host(mut bytes) => {
                let data = bytes.0.as_mut_ptr() as u64;
                let device = cuda_interop::dlpack::DLDevice {
                    device_type: cuda_interop::dlpack::DL_CPU,
                    device_id: 0,
                };
                // SAFETY: `data` is the start of the `size` bytes of the Vec
                // that `owner` holds; moving the Vec into the box does not
                // move its heap allocation, which lives as long as the owner.
                unsafe {
                    ManagedTensor::new(
                        Box::new(bytes),
                        data,
                        self.size,
                        device,
                        dtype,
                        &[len],
                        None,
                        false,
                    )
                }
                .map_err(cuda_error)
            }
        }
    }
}

#[pymethods]
impl Frame {
    /// The DLPack protocol: the buffer as a 1-D `uint8` tensor, in a capsule
    /// a consumer takes once.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // Any stream is accepted: nothing is pending on this side to order.
        let _ = stream;
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "cuda_interop frames are shared memory; they cannot be exported as a copy",
            ));
        }
        if let Some(wanted) = dl_device.filter(|&d| d != self.device) {
            return Err(PyBufferError::new_err(format!(
                "the frame is on DLPack device {:?}, not {wanted:?}",
                self.device
            )));
        }
        let tensor = self.tensor()?;
        if max_version.is_some_and(|(major, _)| major >= 1) {
            let managed = tensor.into_versioned();
            let pointer = NonNull::new(managed.cast::<c_void>()).expect("a Box is not null");
            // SAFETY: `pointer` is a DLManagedTensorVersioned this capsule
            // now owns; its destructor frees it unless a consumer took it.
            let capsule = unsafe {
                PyCapsule::new_with_pointer_and_destructor(
                    py,
                    pointer,
                    VERSIONED,
                    Some(delete_versioned_capsule),
                )
            };
            if capsule.is_err() {
                // SAFETY: no capsule took `managed`; its deleter runs once, here.
                unsafe { call_versioned_deleter(managed) };
            }
            capsule
        } else {
            let managed = tensor.into_legacy().map_err(cuda_error)?;
            let pointer = NonNull::new(managed.cast::<c_void>()).expect("a Box is not null");
            // SAFETY: as above, for the legacy structure.
            let capsule = unsafe {
                PyCapsule::new_with_pointer_and_destructor(
                    py,
                    pointer,
                    LEGACY,
                    Some(delete_legacy_capsule),
                )
            };
            if capsule.is_err() {
                // SAFETY: no capsule took `managed`; its deleter runs once, here.
                unsafe { call_legacy_deleter(managed) };
            }
            capsule
        }
    }

    /// `(device_type, device_id)`: `(2, ordinal)` (kDLCUDA) for a received frame.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }

    /// The producer's tag for this message (a frame number, a stream id).
    #[getter]
    fn tag(&self) -> u64 {
        self.tag
    }

    /// Bytes in the buffer.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.size
    }

    /// Whether the frame can still be handed out.
    #[getter]
    fn available(&self) -> bool {
        self.payload.is_some()
    }

    /// Frees the import now, if it was not handed out (idempotent).
    fn release(&mut self, py: Python<'_>) {
        if let Some(payload) = self.payload.take() {
            // Dropping an import may wait (bounded) for the GPU's last use.
            py.detach(move || drop(payload));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, py: Python<'_>, _exc: Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "<cuda_interop.Frame tag={} nbytes={} device={:?}{}>",
            self.tag,
            self.size,
            self.device,
            if self.payload.is_some() {
                ""
            } else {
                " (handed out or released)"
            }
        )
    }
}

/// # Safety
/// `managed` came from `ManagedTensor::into_versioned` and its deleter has
/// not run.
unsafe fn call_versioned_deleter(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: the caller's guarantee: a live tensor whose deleter runs once.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
}

/// # Safety
/// `managed` came from `ManagedTensor::into_legacy` and its deleter has not run.
unsafe fn call_legacy_deleter(managed: *mut DLManagedTensor) {
    // SAFETY: the caller's guarantee: a live tensor whose deleter runs once.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
}

/// The capsule destructor: frees the tensor unless a consumer renamed the
/// capsule (took ownership, and calls the deleter itself).
unsafe extern "C" fn delete_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed, holding the
    // GIL. `PyCapsule_IsValid` sets no exception; when the name is still
    // ours, nobody took the pointer, which is the tensor `__dlpack__` put
    // there, and this is its only destructor call.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, USED_VERSIONED.as_ptr()) == 0
            && ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1
        {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            call_versioned_deleter(managed.cast());
        }
    }
}

/// As [`delete_versioned_capsule`], for the legacy `"dltensor"` capsule.
unsafe extern "C" fn delete_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `delete_versioned_capsule`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, USED_LEGACY.as_ptr()) == 0
            && ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1
        {
            let managed = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            call_legacy_deleter(managed.cast());
        }
    }
}

/// Test hook: a frame over `nbytes` bytes of host memory (`kDLCPU`), each
/// byte its index modulo 256.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _host_frame(nbytes: u64) -> PyResult<Frame> {
    let len = usize::try_from(nbytes).map_err(|_| PyValueError::new_err("too large"))?;
    let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
    HOST_ALIVE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(Frame {
        tag: 0,
        size: nbytes,
        device: (cuda_interop::dlpack::DL_CPU, 0),
        payload: Some(Payload::Host(HostBytes(bytes))),
    })
}

/// Test hook: how many `_host_frame` buffers are not yet freed.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _host_frames_alive() -> usize {
    HOST_ALIVE.load(std::sync::atomic::Ordering::SeqCst)
}

/// The `cuda_interop` module.
#[pymodule(name = "cuda_interop")]
fn cuda_interop_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(_host_frame, m)?)?;
        m.add_function(wrap_pyfunction!(_host_frames_alive, m)?)?;
    }
    m.add_class::<Receiver>()?;
    m.add_class::<Frame>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
