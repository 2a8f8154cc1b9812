//! `Receiver`: a connection to a producer, and `connect`.
//!
//! # Contract
//!
//! * The producer's first message decides what it speaks (a frame ring, or
//!   one buffer per message); see the crate's contract (`lib.rs`).
//! * The protocol itself (packets, the ring's import, which slots are held)
//!   is `cuda_interop_frames::consumer`'s; this module turns it into Python
//!   calls, with the GIL released while it waits.
//! * Uses `errors`, `frame`, `ring` and (feature `test-hooks`) `host` of this
//!   crate; none of them uses this module.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::DL_CUDA;
use cuda_interop::CudaDevice;
use cuda_interop_frames::consumer::{
    self, deadline_after, left, peek, recv_packet, ConsumerError, NextMessage, Ring, Slot,
    SlotMemory,
};
use cuda_interop_frames::discovery::{Directory, DiscoveryError};
use cuda_interop_frames::host_receiver::HostBuffers;
use cuda_interop_frames::protocol::{self, Kind, Packet};
use cuda_interop_frames::receiver::Delivery;
use pyo3::exceptions::{PyConnectionError, PyValueError};
use pyo3::prelude::*;
use vk_export::markers::DeviceLocal;
use vk_export::socket::Connection;

use crate::errors::{consumer_error, cuda_error, seconds, send_error, vk_error};
use crate::frame::{Frame, Payload};
use crate::ring::SharedRing;

/// Connects to the producer's socket at `socket_path`, waiting at most
/// `timeout` seconds for room in its backlog, and subscribes in `delivery`
/// (`"latest"` or `"lossless"`).
#[pyfunction]
#[pyo3(signature = (socket_path, timeout, delivery="latest"))]
pub(crate) fn connect(
    py: Python<'_>,
    socket_path: &str,
    timeout: f64,
    delivery: &str,
) -> PyResult<Receiver> {
    let delivery = Some(parse_delivery(delivery)?);
    Receiver::connect(py, socket_path, timeout, delivery, None)
}

/// Connects to the sender named `name` in `$XDG_RUNTIME_DIR`'s directory
/// of senders (`cuda_interop_frames::discovery`), as [`connect`].
#[pyfunction]
#[pyo3(signature = (name, timeout, delivery="latest"))]
pub(crate) fn connect_named(
    py: Python<'_>,
    name: &str,
    timeout: f64,
    delivery: &str,
) -> PyResult<Receiver> {
    let delivery = Some(parse_delivery(delivery)?);
    let wait = seconds("timeout", timeout)?;
    let (path, connection) = py
        .detach(|| {
            let directory = Directory::from_env()?;
            let socket = directory.find(name)?.socket;
            let connection = directory.connect(name, wait)?;
            Ok((socket.display().to_string(), connection))
        })
        .map_err(discovery_error)?;
    Receiver::start(path, connection, delivery, None)
}

/// A discovery error as the Python exception its kind calls for.
fn discovery_error(error: DiscoveryError) -> PyErr {
    match error {
        DiscoveryError::Connect(e) => consumer_error(e),
        DiscoveryError::Name { .. } => PyValueError::new_err(error.to_string()),
        e => PyConnectionError::new_err(e.to_string()),
    }
}

/// `"latest"` or `"lossless"`.
pub(crate) fn parse_delivery(delivery: &str) -> PyResult<Delivery> {
    match delivery {
        "latest" => Ok(Delivery::Latest),
        "lossless" => Ok(Delivery::Lossless),
        other => Err(PyValueError::new_err(format!(
            "delivery must be \"latest\" or \"lossless\", not {other:?}"
        ))),
    }
}

/// The Vulkan context and the CUDA device paired with it, for one `deviceUUID`.
struct Devices {
    uuid: vk_export::DeviceUuid,
    cuda: CudaDevice,
}

/// What the producer speaks, learnt from its first message.
enum Mode {
    /// Nothing received yet.
    Unknown,
    /// One buffer per wire message.
    Single,
    /// The frame-ring protocol.
    Ring(Arc<SharedRing>),
    /// The ring could not be set up: every later call says why.
    Broken(String),
}

/// A connection to a producer; `next()` receives frames.
#[pyclass(frozen, module = "cuda_interop")]
pub(crate) struct Receiver {
    connection: Arc<Connection>,
    path: String,
    devices: Mutex<Option<Devices>>,
    mode: Mutex<Mode>,
    closed: AtomicBool,
    /// The delivery it subscribed in (`None`: it never subscribed, test
    /// hook only: the producer serves it lossless).
    delivery: Option<Delivery>,
    /// Latest mode: an acquire is out (asked, no frame yet). Changed only
    /// under the ring's receiving lock.
    asked: AtomicBool,
    /// The last frame number received (under the receiving lock).
    last: AtomicU64,
    /// Frames presented between received ones that it did not get, and
    /// frames received and given back unseen for a newer one (latest).
    dropped: AtomicU64,
    /// Test hook: a hello makes a ring over host memory, with no setup
    /// message; `Some(true)`: one that records its "released" signals.
    #[cfg(feature = "test-hooks")]
    host_ring: Option<bool>,
    /// Test hook: a pause between receiving a frame packet and accepting
    /// it, to widen the window two threads' next() calls race in.
    #[cfg(feature = "test-hooks")]
    pub(crate) accept_delay: Duration,
}

impl Receiver {
    pub(crate) fn connect(
        py: Python<'_>,
        socket_path: &str,
        timeout: f64,
        delivery: Option<Delivery>,
        host_ring: Option<bool>,
    ) -> PyResult<Self> {
        let timeout = seconds("timeout", timeout)?;
        let path = socket_path.to_owned();
        let connection = py
            .detach(|| consumer::connect(&path, timeout))
            .map_err(consumer_error)?;
        Receiver::start(path, connection, delivery, host_ring)
    }

    /// The receiver of `connection` (to `path`): subscribes in `delivery`
    /// first, if given.
    fn start(
        path: String,
        connection: Connection,
        delivery: Option<Delivery>,
        #[cfg_attr(not(feature = "test-hooks"), allow(unused_variables))] host_ring: Option<bool>,
    ) -> PyResult<Self> {
        if let Some(delivery) = delivery {
            let mode = match delivery {
                Delivery::Latest => protocol::MODE_LATEST,
                Delivery::Lossless => protocol::MODE_LOSSLESS,
            };
            consumer::send_packet(&connection, &Packet::subscribe(mode)).map_err(|e| {
                PyConnectionError::new_err(format!("cannot subscribe to {path}: {e}"))
            })?;
        }
        Ok(Receiver {
            connection: Arc::new(connection),
            path,
            devices: Mutex::new(None),
            mode: Mutex::new(Mode::Unknown),
            closed: AtomicBool::new(false),
            delivery,
            asked: AtomicBool::new(false),
            last: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            #[cfg(feature = "test-hooks")]
            host_ring,
            #[cfg(feature = "test-hooks")]
            accept_delay: Duration::ZERO,
        })
    }

    /// The CUDA device for `uuid`, made with its Vulkan context on first use.
    fn cuda_for(&self, uuid: vk_export::DeviceUuid) -> Result<CudaDevice, consumer::ConsumerError> {
        let mut devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = devices.as_ref().filter(|d| d.uuid == uuid) {
            return Ok(d.cuda.clone());
        }
        let cuda = consumer::cuda_device_for(uuid)?;
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
        let cuda = self
            .cuda_for(buffer.record().info().device_uuid())
            .map_err(consumer_error)?;
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
    fn setup_ring(&self, hello: protocol::Packet, deadline: Instant) -> PyResult<SharedRing> {
        if hello.kind != Kind::Hello {
            return Err(PyValueError::new_err(format!(
                "the producer's first packet must be a hello, not {:?}",
                hello.kind
            )));
        }
        #[cfg(feature = "test-hooks")]
        if let Some(record_signals) = self.host_ring {
            let ring = crate::host::host_ring(self.connection.clone(), hello);
            return Ok(SharedRing::recording(ring, record_signals));
        }
        let setup = self.connection.recv(left(deadline)).map_err(vk_error)?;
        // A ring without semaphores (a Vulkan driver that exports none, such
        // as lavapipe) cannot be ordered in CUDA: it is read on the host.
        let n = hello.slot as usize;
        if setup.message().tag == protocol::SETUP_TAG && setup.message().resources.len() == n {
            let host = HostBuffers::import(&hello, setup).map_err(consumer_error)?;
            let slots = (0..hello.slot)
                .map(|_| Slot {
                    memory: SlotMemory::new(Arc::new(())),
                    data: 0,
                    len: host.frame_bytes(),
                    image: None,
                })
                .collect();
            let ring = Ring::from_parts(self.connection.clone(), hello, slots, None);
            return Ok(SharedRing::read_on_host(ring, host));
        }
        Ring::import(self.connection.clone(), hello, setup, |uuid| {
            self.cuda_for(uuid)
        })
        .map(SharedRing::new)
        .map_err(consumer_error)
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
        let deadline = deadline_after(timeout);
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
                    // Receive and accept as one step: two threads' next()
                    // calls accept frames in the order they arrived.
                    let receiving = ring
                        .lock_receiving(deadline, timeout)
                        .map_err(consumer_error)?;
                    let latest = self.delivery == Some(Delivery::Latest);
                    // Latest: ask for the newest frame, once (a request
                    // whose next() timed out stays asked).
                    if latest && !self.asked.load(Ordering::Acquire) {
                        consumer::send_packet(&self.connection, &Packet::acquire()).map_err(
                            |e| {
                                self.closed_error().unwrap_or_else(|| {
                                    PyConnectionError::new_err(format!(
                                        "cannot ask {} for a frame: {e}",
                                        self.path
                                    ))
                                })
                            },
                        )?;
                        self.asked.store(true, Ordering::Release);
                    }
                    // A host ring (test hook) does not import the ring: the
                    // setup message of a real producer is received and dropped.
                    #[cfg(feature = "test-hooks")]
                    while self.host_ring.is_some()
                        && matches!(
                            peek(&self.connection, deadline, timeout).map_err(consumer_error)?,
                            NextMessage::Other
                        )
                    {
                        drop(self.connection.recv(left(deadline)).map_err(vk_error)?);
                    }
                    let failed = |e| self.closed_error().unwrap_or_else(|| consumer_error(e));
                    let mut packet =
                        recv_packet(&self.connection, deadline, timeout).map_err(failed)?;
                    #[cfg(feature = "test-hooks")]
                    std::thread::sleep(self.accept_delay);
                    self.accept(&ring, &packet).map_err(failed)?;
                    // Latest: frames already queued behind it (pushed before
                    // the producer read the subscribe) are newer: keep the
                    // newest, give the others back unseen.
                    while self.delivery == Some(Delivery::Latest) {
                        let newer =
                            match recv_packet(&self.connection, Instant::now(), Duration::ZERO) {
                                Ok(newer) => newer,
                                Err(ConsumerError::Timeout(_)) => break,
                                Err(e) => return Err(failed(e)),
                            };
                        if let Err(e) = self.accept(&ring, &newer) {
                            // Not handed out: its slot goes back first.
                            let _ = ring.send_release(packet.slot, packet.frame, false);
                            return Err(failed(e));
                        }
                        let older = std::mem::replace(&mut packet, newer);
                        self.dropped.fetch_add(1, Ordering::AcqRel);
                        ring.send_release(older.slot, older.frame, false)
                            .map_err(send_error)?;
                    }
                    drop(receiving);
                    if let Some(host) = &ring.host {
                        // Copied out and waited for: the slot goes back now.
                        let read = host.read(packet.slot, packet.frame, left(deadline));
                        let sent = ring.send_release(packet.slot, packet.frame, false);
                        let bytes = read.map_err(consumer_error)?;
                        sent.map_err(send_error)?;
                        return Ok(Frame::host_copy(ring.layout(), packet.frame, bytes));
                    }
                    return Ok(Frame::of_ring(ring, &packet));
                }
                Mode::Single => return self.receive_single(left(deadline)),
                Mode::Broken(why) => {
                    return Err(PyConnectionError::new_err(format!(
                        "the producer's frame ring could not be set up ({why}); connect again"
                    )))
                }
                Mode::Unknown => {
                    match peek(&self.connection, deadline, timeout).map_err(consumer_error)? {
                        NextMessage::Packet => {
                            let ring = recv_packet(&self.connection, deadline, timeout)
                                .map_err(consumer_error)
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
                    }
                }
            }
        }
    }
}

impl Receiver {
    /// Accepts a frame packet into `ring` (under its receiving lock):
    /// counts the frames presented since the last one that this receiver
    /// did not get, and answers its request.
    fn accept(&self, ring: &SharedRing, packet: &Packet) -> Result<(), ConsumerError> {
        ring.accept_frame(packet)?;
        let last = self.last.swap(packet.frame, Ordering::AcqRel);
        if last != 0 {
            // accept_frame checked that frame numbers go up.
            self.dropped
                .fetch_add(packet.frame - last - 1, Ordering::AcqRel);
        }
        self.asked.store(false, Ordering::Release);
        Ok(())
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
                    r.layout().slot,
                    r.layout().width,
                    r.layout().height,
                    r.layout().row_pitch,
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

    /// The delivery it subscribed in: `"latest"` or `"lossless"`.
    #[getter]
    fn delivery(&self) -> Option<&'static str> {
        self.delivery.map(|d| match d {
            Delivery::Latest => "latest",
            Delivery::Lossless => "lossless",
        })
    }

    /// Ring frames it did not get: those presented between two it received
    /// (frames before its first are not counted), and, latest, those
    /// received behind a newer one and given back unseen.
    #[getter]
    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    fn __repr__(&self) -> String {
        format!("<cuda_interop.Receiver {}>", self.path)
    }
}

#[cfg(feature = "test-hooks")]
impl Receiver {
    /// Test hook: the "released" signals a recording host ring made so far,
    /// as `(slot, frame, stream)`.
    pub(crate) fn signals(&self) -> Vec<(u32, u64, usize)> {
        match &*self.mode.lock().unwrap_or_else(PoisonError::into_inner) {
            Mode::Ring(ring) => ring.signal_log.as_ref().map_or_else(Vec::new, |log| {
                log.lock().unwrap_or_else(PoisonError::into_inner).clone()
            }),
            _ => Vec::new(),
        }
    }
}
