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
//! * `Receiver.next(timeout) -> Frame` waits at most `timeout` seconds, with
//!   the GIL released for the whole call. The producer's first message
//!   decides what it speaks:
//!   - **a frame ring** ([`protocol`], served by the `frame_server` example):
//!     a hello packet and one setup message; the first call imports the
//!     ring's buffers (mapped once) and semaphores into CUDA, and every call
//!     returns the next frame: a `(height, width, 4)` `uint8` tensor with
//!     strides `(row_pitch, 4, 1)` elements, `tag` = the frame number.
//!   - **one buffer per message** (anything else): resource 0 must be a
//!     device-local buffer, handed out whole as a 1-D `uint8` tensor; the
//!     other resources are dropped (their fds closed).
//!
//!   The first frame creates one headless Vulkan context on the device whose
//!   `deviceUUID` the record names, and the CUDA device paired with it by
//!   UUID; records are verified on that Vulkan device before CUDA imports.
//! * `Frame.__dlpack__(stream=None, max_version=None, dl_device=None,
//!   copy=None)` hands the frame out once, on `(kDLCUDA, ordinal)`
//!   (`Frame.__dlpack_device__()`). With `max_version` of major 1 or more the
//!   capsule is a DLPack 1.0 `"dltensor_versioned"`, with `None` a legacy
//!   `"dltensor"`. The capsule's destructor calls the deleter only if no
//!   consumer took it (`"used_dltensor_versioned"` / `"used_dltensor"`), so
//!   what it keeps alive (a ring slot's mapping, or an import) is freed
//!   exactly once. **Stream ordering** (ring frames): the consumer's `stream`
//!   (a `CUstream` handle; `1` legacy default, `2` per-thread default, `None`
//!   the legacy default as the DLPack protocol says for CUDA, `-1` no
//!   ordering, `0` refused) waits on the GPU for the "produced" timeline at
//!   the frame's number before anything enqueued on it later.
//! * `Frame.__cuda_array_interface__` (ring frames on CUDA): version 3,
//!   `data`, `shape`, `strides` in bytes, `typestr` `"|u1"`, and `stream`: a
//!   stream of this module on which the "produced" wait is enqueued, which
//!   the consumer must order its work after (CuPy does). It does not say the
//!   consumer's stream, so such a frame's release must name it (as after a
//!   bare handle, below). A frame has one consumer protocol: after
//!   `__dlpack__` the interface raises `BufferError`, and the other way
//!   round.
//! * `Frame.release(stream=None)` (and leaving `with frame:`) gives a ring
//!   slot back: with a CUDA stream (`-1` none) the slot's "released"
//!   timeline is signalled with the frame number after the work enqueued on
//!   it so far, and the producer's next write to the slot waits for it; then
//!   the release message is sent. Without a stream the caller's reads must
//!   have completed. The default is the stream given to `__dlpack__` where
//!   it can still be named: the legacy default (`None` or `1`) or a stream
//!   object, which the frame keeps a reference to until the release (so its
//!   stream lives; not so for an `ExternalStream`, whose owner destroys the
//!   stream). A bare handle is the consumer's to keep alive only during
//!   `__dlpack__`, and `2` (also as an object, CuPy's `Stream.ptds`) names
//!   the calling thread's stream, so neither is used again: `release()`
//!   then raises `ValueError` asking for the stream, and so does leaving
//!   `with frame:` (unless the block raised: its exception wins, and the
//!   frame is given back as a drop would). A release whose signal was
//!   enqueued but whose message failed can be retried (the signal is not
//!   repeated). Idempotent; a ring frame dropped unreleased is released the
//!   same way, with the GIL released (after a bare handle: without
//!   ordering, and a `RuntimeWarning`); if that release fails, the
//!   connection is given up (the producer takes the slots back) and the
//!   next call raises `ConnectionError` with the reason. A reference cycle
//!   through a frame and its stream object is not collected (the collector
//!   would run the stream's `__del__`, which destroys it, first). A frame is
//!   used by one thread at a time: a call while another thread's call on
//!   the same frame runs raises `RuntimeError` (nothing is released twice).
//!   Tensors handed out
//!   keep the memory mapped after a release, but its contents are the
//!   producer's again. Handing out after a release, or twice, raises
//!   `BufferError`. A consumer holding every slot stalls the producer (which
//!   drops it after its hold timeout): hold at most `slots - 1` frames.
//! * `Receiver.close()` (and leaving `with receiver:`) shuts the connection
//!   down: the producer takes back the slots this consumer held, so the
//!   releases of frames still out do nothing (no signal, no message, no
//!   error), and a frame received but not yet handed out when it closes is
//!   not handed out. `next()` on several threads at once is allowed: frames
//!   are accepted in the order they arrive, and each call keeps its own
//!   timeout while another receives; a release on one thread and `next()`
//!   on another do not race (the slot is free before its release is sent).
//!   A receiver, a frame and an unconsumed capsule let go of the GIL while
//!   their CUDA resources are torn down (bounded waits for the GPU); a
//!   capsule destroyed while the interpreter shuts down is freed in place.
//! * Errors carry the crates' messages: `TimeoutError` for a timeout,
//!   `ConnectionError` for socket errors and a peer that closed or was
//!   refused, `ValueError` for a malformed message, record or packet and for
//!   bad arguments, `RuntimeError` for CUDA and Vulkan errors (no CUDA
//!   driver, no matching device). No call waits without a bound (packet
//!   sends: the socket's 10 s send timeout).
//! * Built with the `test-hooks` feature (only `cargo xtask test` does, for
//!   pytest), the module also has `_host_frame(n)`, `_host_frames_alive()`,
//!   `_connect_host_ring(path, timeout, record_signals=False)` (ring frames
//!   over host memory, `kDLCPU`, no CUDA; a real producer's setup message is
//!   dropped; with `record_signals` the frames take streams as CUDA frames
//!   do, and `_signals(receiver)` lists the "released" signals that would
//!   have been enqueued; `accept_delay` pauses between receiving a frame
//!   packet and accepting it) and `_interface_dict(frame)`, to test the protocols
//!   without a GPU. The wheel (`cargo xtask wheel`) has no such hooks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::DL_CUDA;
use cuda_interop::CudaDevice;
use pyo3::exceptions::{PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use vk_export::markers::DeviceLocal;
use vk_export::socket::Connection;
use vk_export::wire::WireError;
use vk_export::{Context, HeadlessOptions};

mod frame;
pub mod protocol;
mod ring;

use frame::{Frame, Payload};
use protocol::Kind;
use ring::{left, peek, recv_packet, NextMessage, Ring};

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
        cuda_interop::Error::InvalidArgument(m) => PyValueError::new_err(m),
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
    Receiver::connect(py, socket_path, timeout, None)
}

/// The Vulkan context and the CUDA device paired with it, for one `deviceUUID`.
struct Devices {
    uuid: [u8; 16],
    cuda: CudaDevice,
}

/// What the producer speaks, learnt from its first message.
enum Mode {
    /// Nothing received yet.
    Unknown,
    /// One buffer per wire message.
    Single,
    /// The frame-ring protocol.
    Ring(Arc<Ring>),
    /// The ring could not be set up: every later call says why.
    Broken(String),
}

/// A connection to a producer; `next()` receives frames.
#[pyclass(frozen, module = "cuda_interop")]
struct Receiver {
    connection: Arc<Connection>,
    path: String,
    devices: Mutex<Option<Devices>>,
    mode: Mutex<Mode>,
    closed: AtomicBool,
    /// Test hook: a hello makes a ring over host memory, with no setup
    /// message; `Some(true)`: one that records its "released" signals.
    #[cfg(feature = "test-hooks")]
    host_ring: Option<bool>,
    /// Test hook: a pause between receiving a frame packet and accepting
    /// it, to widen the window two threads' next() calls race in.
    #[cfg(feature = "test-hooks")]
    accept_delay: Duration,
}

impl Receiver {
    fn connect(
        py: Python<'_>,
        socket_path: &str,
        timeout: f64,
        #[cfg_attr(not(feature = "test-hooks"), allow(unused_variables))] host_ring: Option<bool>,
    ) -> PyResult<Self> {
        let timeout = seconds("timeout", timeout)?;
        let path = socket_path.to_owned();
        let connection = py.detach(|| connect_with_timeout(&path, timeout))?;
        Ok(Receiver {
            connection: Arc::new(connection),
            path,
            devices: Mutex::new(None),
            mode: Mutex::new(Mode::Unknown),
            closed: AtomicBool::new(false),
            #[cfg(feature = "test-hooks")]
            host_ring,
            #[cfg(feature = "test-hooks")]
            accept_delay: Duration::ZERO,
        })
    }

    /// The CUDA device for `uuid`, made with its Vulkan context on first use.
    fn cuda_for(&self, uuid: [u8; 16]) -> PyResult<CudaDevice> {
        let mut devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
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

    /// One wire message whose resource 0 is a device-local buffer.
    fn receive_single(&self, timeout: Duration) -> PyResult<Frame> {
        let mut received = self.connection.recv(timeout).map_err(vk_error)?;
        let tag = received.message().tag;
        let buffer = received.take_buffer::<DeviceLocal>(0).map_err(vk_error)?;
        let cuda = self.cuda_for(buffer.record().info().device_uuid())?;
        let imported = cuda
            .import_received_buffer(buffer)
            .map_err(|e| cuda_error(e.into_error()))?;
        Ok(Frame::single(
            tag,
            imported.size(),
            (DL_CUDA, cuda.ordinal()),
            Payload::Imported(imported),
        ))
    }

    /// The ring announced by `hello` (already received).
    fn setup_ring(&self, hello: protocol::Packet, deadline: Instant) -> PyResult<Ring> {
        if hello.kind != Kind::Hello {
            return Err(PyValueError::new_err(format!(
                "the producer's first packet must be a hello, not {:?}",
                hello.kind
            )));
        }
        #[cfg(feature = "test-hooks")]
        if let Some(record_signals) = self.host_ring {
            return Ok(Ring::host(self.connection.clone(), hello, record_signals));
        }
        let setup = self.connection.recv(left(deadline)).map_err(vk_error)?;
        Ring::import(self.connection.clone(), hello, setup, |uuid| {
            self.cuda_for(uuid)
        })
    }

    /// The error of a call on a closed receiver, if it was closed.
    fn closed_error(&self) -> Option<PyErr> {
        self.closed.load(Ordering::Acquire).then(|| {
            PyConnectionError::new_err(format!(
                "this receiver of {} was closed; connect again",
                self.path
            ))
        })
    }

    fn receive(&self, timeout: Duration) -> PyResult<Frame> {
        if let Some(closed) = self.closed_error() {
            return Err(closed);
        }
        // `Duration::MAX`-like bounds cannot be added to now: a year is "no bound" enough.
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
        let mut mode = self.mode.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match &*mode {
                Mode::Ring(ring) => {
                    let ring = ring.clone();
                    drop(mode);
                    if let Some(why) = ring.broken() {
                        return Err(PyConnectionError::new_err(format!(
                            "the connection to {} was given up ({why}); connect again",
                            self.path
                        )));
                    }
                    // A host ring (test hook) does not import the ring: the
                    // setup message of a real producer is received and dropped.
                    #[cfg(feature = "test-hooks")]
                    while self.host_ring.is_some()
                        && matches!(
                            peek(&self.connection, deadline, timeout)?,
                            NextMessage::Other
                        )
                    {
                        drop(self.connection.recv(left(deadline)).map_err(vk_error)?);
                    }
                    // Receive and accept as one step: two threads' next()
                    // calls accept frames in the order they arrived.
                    let receiving = lock_until(&ring.receiving, deadline, timeout)?;
                    let packet = recv_packet(&self.connection, deadline, timeout)
                        .map_err(|e| self.closed_error().unwrap_or(e))?;
                    #[cfg(feature = "test-hooks")]
                    std::thread::sleep(self.accept_delay);
                    ring.accept_frame(&packet)
                        .map_err(|e| self.closed_error().unwrap_or(e))?;
                    drop(receiving);
                    return Ok(Frame::of_ring(ring, &packet));
                }
                Mode::Single => return self.receive_single(left(deadline)),
                Mode::Broken(why) => {
                    return Err(PyConnectionError::new_err(format!(
                        "the producer's frame ring could not be set up ({why}); connect again"
                    )))
                }
                Mode::Unknown => match peek(&self.connection, deadline, timeout)? {
                    NextMessage::Packet => {
                        let ring = recv_packet(&self.connection, deadline, timeout)
                            .and_then(|hello| self.setup_ring(hello, deadline));
                        match ring {
                            Ok(ring) => {
                                // A close() that could not see this ring
                                // (it was being made) gives it up now; the
                                // loop then reports the close.
                                if self.closed.load(Ordering::Acquire) {
                                    ring.break_off("the receiver was closed".to_string());
                                }
                                *mode = Mode::Ring(Arc::new(ring));
                            }
                            Err(e) => {
                                *mode = Mode::Broken(e.to_string());
                                return Err(e);
                            }
                        }
                    }
                    NextMessage::Other => {
                        let frame = self.receive_single(left(deadline))?;
                        *mode = Mode::Single;
                        return Ok(frame);
                    }
                },
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The last owner of a ring tears its CUDA imports down, which waits
        // (bounded) for the GPU: not with the GIL held.
        let mode = std::mem::replace(
            self.mode.get_mut().unwrap_or_else(PoisonError::into_inner),
            Mode::Unknown,
        );
        let devices = self
            .devices
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Python::attach(|py| py.detach(move || drop((mode, devices))));
    }
}

#[pymethods]
impl Receiver {
    /// Waits at most `timeout` seconds for the next frame: a frame of the
    /// producer's ring (the first call also imports the ring), or the buffer
    /// (resource 0) of a one-buffer message.
    fn next(&self, py: Python<'_>, timeout: f64) -> PyResult<Frame> {
        let timeout = seconds("timeout", timeout)?;
        py.detach(|| self.receive(timeout))
    }

    /// The ring's layout once known: `(slots, width, height, row_pitch)`,
    /// else `None`.
    #[getter]
    fn layout(&self, py: Python<'_>) -> Option<(u32, u32, u32, u64)> {
        // A first `next()` holds the lock while it sets the ring up (bounded
        // by its timeout): wait for it without the GIL.
        py.detach(
            || match &*self.mode.lock().unwrap_or_else(PoisonError::into_inner) {
                Mode::Ring(r) => Some((
                    r.layout.slot,
                    r.layout.width,
                    r.layout.height,
                    r.layout.row_pitch,
                )),
                _ => None,
            },
        )
    }

    /// How many ring slots this consumer holds (frames received and not
    /// yet released).
    #[getter]
    fn held(&self, py: Python<'_>) -> usize {
        // As for `layout`.
        py.detach(
            || match &*self.mode.lock().unwrap_or_else(PoisonError::into_inner) {
                Mode::Ring(r) => r.held_count(),
                _ => 0,
            },
        )
    }

    /// Shuts the connection down now: the producer sees this consumer leave
    /// (and takes back the slots it held). Later calls raise `ConnectionError`.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // Frames still out are the producer's again: their releases become
        // no-ops, before the socket goes (break_off shuts it). A first
        // next() holding the state gives up the ring it makes itself.
        if let Ok(mode) = self.mode.try_lock() {
            if let Mode::Ring(ring) = &*mode {
                ring.break_off("the receiver was closed".to_string());
            }
        }
        let _ = rustix::net::shutdown(&*self.connection, rustix::net::Shutdown::Both);
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
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

/// Test hook: how many test-hook host buffers are not yet freed.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _host_frames_alive() -> usize {
    frame::HOST_ALIVE.load(std::sync::atomic::Ordering::SeqCst)
}

/// Test hook: `connect`, but a hello makes a ring over host memory
/// (`kDLCPU` frames, no setup message, no CUDA). With `record_signals`, its
/// frames take stream arguments as a CUDA ring's do, and each "released"
/// signal is recorded ([`_signals`]) instead of enqueued.
#[cfg(feature = "test-hooks")]
#[pyfunction]
#[pyo3(signature = (socket_path, timeout, record_signals=false, accept_delay=0.0))]
fn _connect_host_ring(
    py: Python<'_>,
    socket_path: &str,
    timeout: f64,
    record_signals: bool,
    accept_delay: f64,
) -> PyResult<Receiver> {
    let mut receiver = Receiver::connect(py, socket_path, timeout, Some(record_signals))?;
    receiver.accept_delay = seconds("accept_delay", accept_delay)?;
    Ok(receiver)
}

/// Test hook: the "released" signals a recording host ring made so far, as
/// `(slot, frame, stream)`.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _signals(receiver: &Receiver) -> Vec<(u32, u64, usize)> {
    match &*receiver.mode.lock().unwrap_or_else(PoisonError::into_inner) {
        Mode::Ring(ring) => ring.signal_log.as_ref().map_or_else(Vec::new, |log| {
            log.lock().unwrap_or_else(PoisonError::into_inner).clone()
        }),
        _ => Vec::new(),
    }
}

/// Takes `lock`, waiting at most until `deadline` (another thread's
/// `next()` holds it while it waits for a packet): `TimeoutError` after.
fn lock_until<'a>(
    lock: &'a Mutex<()>,
    deadline: Instant,
    timeout: Duration,
) -> PyResult<std::sync::MutexGuard<'a, ()>> {
    loop {
        match lock.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(PyTimeoutError::new_err(format!(
                    "no frame within {timeout:?}: another thread's next() was receiving"
                )))
            }
        }
    }
}

/// The `cuda_interop` module.
#[pymodule(name = "cuda_interop")]
fn cuda_interop_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    #[cfg(feature = "test-hooks")]
    {
        m.add_function(wrap_pyfunction!(frame::_host_frame, m)?)?;
        m.add_function(wrap_pyfunction!(_host_frames_alive, m)?)?;
        m.add_function(wrap_pyfunction!(_connect_host_ring, m)?)?;
        m.add_function(wrap_pyfunction!(_signals, m)?)?;
        m.add_function(wrap_pyfunction!(frame::_interface_dict, m)?)?;
    }
    m.add_class::<Receiver>()?;
    m.add_class::<Frame>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", protocol::VERSION)?;
    Ok(())
}
