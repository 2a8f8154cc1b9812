//! `Receiver`: a connection to a producer, `connect` and `connect_named`.
//!
//! # Contract
//!
//! * `connect` and `connect_named` connect, subscribe and take the ring
//!   (its layout and setup message, imported into CUDA, or read on the
//!   host without semaphores) within their timeout, through the library's
//!   session (`cuda_interop_frames::session::Session::start`). A producer
//!   of one buffer per wire message (anything that does not answer with
//!   the frame protocol) is served as before: see the crate's contract.
//! * Ring receiving has no state machine here: `next()` is the library
//!   receiver's (`CudaReceiver`, `HostReceiver`, or the test hook's
//!   recording ring), called in slices of at most [`SLICE`] with the GIL
//!   released, the signals checked between them (Ctrl-C raises
//!   `KeyboardInterrupt`), and the caller's timeout bounding the whole
//!   call. Which frames are held, dropped and why the connection ended is
//!   the session's.
//! * A frame of a host ring is read (a copy, checked afterwards to be the
//!   frame's: a drop during the read raises) and released before `next()`
//!   returns.
//! * Uses `errors`, `frame`, `ring` and (feature `test-hooks`) `host` of this
//!   crate; none of them uses this module.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::DL_CUDA;
use cuda_interop::CudaDevice;
use cuda_interop_frames::cuda_receiver::{cuda_device_for, CudaReceiver};
use cuda_interop_frames::discovery::{validate_name, Directory, DiscoveryError};
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::{Delivery, Message, PacketError};
use cuda_interop_frames::session::{has_semaphores, Session};
use cuda_interop_frames::transport::{
    self, deadline_after, hung_up, left, peek, try_recv_message, ConsumerError, NextMessage,
};
use pyo3::exceptions::{PyConnectionError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use rustix::net::RecvFlags;
use vk_export::markers::DeviceLocal;
use vk_export::socket::Connection;
use vk_export::wire::Received;

use crate::errors::{consumer_error, cuda_error, discovery_error, seconds, vk_error};
use crate::frame::{Frame, Payload};
use crate::ring::{Backend, SharedRing};

/// The longest wait between two checks for signals (Ctrl-C).
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Why a receiver is closed, for later calls.
const CLOSED: &str = "the receiver was closed";

/// Connects to the producer's socket at `socket_path` and subscribes in
/// `delivery` (`"latest"` or `"lossless"`), all within `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (socket_path, timeout, delivery="latest"))]
pub(crate) fn connect(
    py: Python<'_>,
    socket_path: &str,
    timeout: f64,
    delivery: &str,
) -> PyResult<Receiver> {
    let delivery = parse_delivery(delivery)?;
    let timeout = seconds("timeout", timeout)?;
    Receiver::connect(py, socket_path, timeout, delivery, Open::Import)
}

/// Connects to the sender named `name` in the directory of senders,
/// waiting up to `timeout` seconds for it to appear, as `connect`.
#[pyfunction]
#[pyo3(signature = (name, timeout, delivery="latest"))]
pub(crate) fn connect_named(
    py: Python<'_>,
    name: &str,
    timeout: f64,
    delivery: &str,
) -> PyResult<Receiver> {
    let delivery = parse_delivery(delivery)?;
    let timeout = seconds("timeout", timeout)?;
    let deadline = deadline_after(timeout);
    validate_name(name).map_err(discovery_error)?;
    let directory = py.detach(Directory::from_env).map_err(discovery_error)?;
    // Waited for in slices, so that Ctrl-C is seen between them.
    let info = loop {
        let slice = left(deadline).min(SLICE);
        match py.detach(|| directory.wait_for(name, slice)) {
            Ok(info) => break info,
            Err(DiscoveryError::NotFound { .. }) if !left(deadline).is_zero() => {
                py.check_signals()?
            }
            Err(DiscoveryError::NotFound { name, dir, .. }) => {
                return Err(discovery_error(DiscoveryError::NotFound {
                    name,
                    dir,
                    waited: timeout,
                }))
            }
            Err(e) => return Err(discovery_error(e)),
        }
    };
    let path = info.socket.display().to_string();
    let conn = py
        .detach(|| transport::connect(&path, left(deadline)))
        .map_err(consumer_error)?;
    Receiver::open(py, path, conn, delivery, left(deadline), Open::Import)
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

/// How a frame sender's ring is taken.
#[derive(Clone, Copy)]
pub(crate) enum Open {
    /// Imported into CUDA (with the ring's semaphores), or read on the host
    /// (a buffer ring without them).
    Import,
    /// Test hook: a recording ring over host memory (nothing imported).
    #[cfg(feature = "test-hooks")]
    Recording,
}

/// The Vulkan context and the CUDA device paired with it, for one `deviceUUID`.
struct Devices {
    uuid: vk_export::DeviceUuid,
    cuda: CudaDevice,
}

/// A producer of one buffer per wire message.
struct Single {
    conn: Connection,
    devices: Mutex<Option<Devices>>,
}

impl Single {
    /// The CUDA device for `uuid`, made with its Vulkan context on first use.
    fn cuda_for(&self, uuid: vk_export::DeviceUuid) -> Result<CudaDevice, ConsumerError> {
        let mut devices = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = devices.as_ref().filter(|d| d.uuid == uuid) {
            return Ok(d.cuda.clone());
        }
        let cuda = cuda_device_for(uuid)?;
        *devices = Some(Devices {
            uuid,
            cuda: cuda.clone(),
        });
        Ok(cuda)
    }

    /// The next wire message, waited for in slices with the signals checked
    /// between them, as [`in_slices`].
    fn recv(&self, py: Python<'_>, timeout: Duration) -> PyResult<Received> {
        let deadline = deadline_after(timeout);
        loop {
            let slice = left(deadline).min(SLICE);
            match py.detach(|| self.conn.recv(slice)) {
                Ok(received) => return Ok(received),
                Err(vk_export::Error::Timeout(_)) if !left(deadline).is_zero() => {
                    py.check_signals()?
                }
                Err(vk_export::Error::Timeout(_)) => {
                    return Err(PyTimeoutError::new_err(format!(
                        "no message from the producer within {timeout:?}"
                    )))
                }
                Err(e) => return Err(vk_error(e)),
            }
        }
    }

    /// The frame of one wire message, whose resource 0 must be a
    /// device-local buffer.
    fn import(&self, mut received: Received) -> PyResult<Frame> {
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
}

/// What the producer speaks, learnt when connecting.
enum Mode {
    /// One buffer per wire message.
    Single(Single),
    /// A frame ring on CUDA (or the test hook's recording ring).
    Ring(Arc<SharedRing>),
    /// A frame ring read on the host.
    Host(Arc<HostReceiver>),
    /// Only while the receiver is dropped.
    Gone,
}

impl Mode {
    /// Takes the ring of a frame sender on `conn`, or finds a producer of
    /// one buffer per message, within `timeout`.
    fn start(
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
        open: Open,
    ) -> Result<Mode, ConsumerError> {
        let deadline = deadline_after(timeout);
        let single = |conn| {
            Mode::Single(Single {
                conn,
                devices: Mutex::new(None),
            })
        };
        // A producer of one buffer per message speaks first (a frame sender
        // waits for the subscribe) and never reads.
        if speaks_first(&conn) {
            return Ok(single(conn));
        }
        // The session gets its own descriptor of the socket: if the peer
        // turns out to speak wire messages, this one goes on with them.
        let fd = rustix::io::fcntl_dupfd_cloexec(&conn, 0)
            .map_err(|e| ConsumerError::Poll(std::io::Error::from(e)))?;
        let theirs = Connection::from_fd(fd)?;
        // Multi-image rings too: their frames are dicts of tensors
        // (`Frame.tensors`).
        match Session::start_any(theirs, delivery, left(deadline)) {
            Ok((session, setup)) => {
                drop(conn);
                Mode::of_ring(session, setup, open)
            }
            // Not a frame-protocol packet: a producer of wire messages,
            // whose first message the session took.
            Err(ConsumerError::Packet(PacketError::Length(_) | PacketError::Magic(_))) => {
                Ok(single(conn))
            }
            // The subscribe could not be sent: the sender hung up, maybe
            // after saying why.
            Err(ConsumerError::Protocol(_)) if hung_up(&conn).unwrap_or(false) => {
                Err(goodbye_of(&conn))
            }
            // It closed with the subscribe unread: the kernel says "reset".
            Err(ConsumerError::Recv(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                Err(ConsumerError::Closed)
            }
            Err(e) => Err(e),
        }
    }

    /// The receiver of `session`'s ring.
    fn of_ring(session: Session, setup: Received, open: Open) -> Result<Mode, ConsumerError> {
        match open {
            Open::Import => {
                let layout = *session.layout();
                if has_semaphores(&layout, &setup) {
                    let cuda = CudaReceiver::from_session(session, setup, cuda_device_for)?;
                    Ok(Mode::Ring(Arc::new(SharedRing::new(Backend::Cuda(
                        Box::new(cuda),
                    )))))
                } else if layout.is_image_ring() {
                    session.close("an image ring without semaphores");
                    Err(ConsumerError::Protocol(format!(
                        "the sender shares {} images and no semaphores (a Vulkan driver without \
                         VK_KHR_external_semaphore_fd, such as lavapipe, or a sender run with \
                         --no-semaphores): Python reads image rings through CUDA only, which \
                         needs the \"produced\" and \"released\" timelines. Run the sender on a \
                         GPU whose driver exports semaphores, or have it serve buffers \
                         (frame_server without --image), which Python reads on the host as \
                         NumPy arrays",
                        layout.slots
                    )))
                } else {
                    let host = HostReceiver::from_session(session, setup)?;
                    Ok(Mode::Host(Arc::new(host)))
                }
            }
            #[cfg(feature = "test-hooks")]
            Open::Recording => {
                drop(setup);
                let ring = crate::host::RecordingRing::new(session)?;
                Ok(Mode::Ring(Arc::new(SharedRing::new(Backend::Recording(
                    ring,
                )))))
            }
        }
    }

    /// The session of a frame ring.
    fn session(&self) -> Option<&Session> {
        match self {
            Mode::Ring(ring) => Some(ring.session()),
            Mode::Host(host) => Some(host.session()),
            Mode::Single(_) | Mode::Gone => None,
        }
    }
}

/// Whether a message that is not a frame-protocol packet is queued on
/// `conn` now (the end of the stream is none: the session reports it).
fn speaks_first(conn: &Connection) -> bool {
    if !matches!(
        peek(conn, Instant::now(), Duration::ZERO),
        Ok(NextMessage::Other)
    ) {
        return false;
    }
    let mut head = [0u8; 1];
    matches!(
        rustix::net::recv(conn, &mut head, RecvFlags::PEEK | RecvFlags::DONTWAIT),
        Ok((_, n)) if n > 0
    )
}

/// Why a sender that hung up did: its goodbye among the queued messages,
/// else a plain close.
fn goodbye_of(conn: &Connection) -> ConsumerError {
    // The queue is bounded by the socket's buffer; the count bounds a
    // misbehaving kernel too.
    for _ in 0..10_000 {
        match try_recv_message(conn) {
            Ok(Some(Message::Goodbye(reason))) => return ConsumerError::Dropped(reason),
            Ok(Some(_)) | Err(ConsumerError::Packet(_)) => continue,
            Ok(None) | Err(_) => break,
        }
    }
    ConsumerError::Closed
}

/// Calls `call` with slices of `timeout` until it returns anything but a
/// timeout (or another thread's receiving) or the time is up, with the GIL
/// released during each call and the signals checked between them.
fn in_slices<T: Send>(
    py: Python<'_>,
    timeout: Duration,
    call: impl Fn(Duration) -> Result<T, ConsumerError> + Sync,
) -> PyResult<T> {
    let deadline = deadline_after(timeout);
    loop {
        let slice = left(deadline).min(SLICE);
        let error = match py.detach(|| call(slice)) {
            Ok(value) => return Ok(value),
            Err(e @ (ConsumerError::Timeout(_) | ConsumerError::Busy(_))) => e,
            Err(e) => return Err(consumer_error(e)),
        };
        if left(deadline).is_zero() {
            // Said with the caller's timeout, not the slice's.
            return Err(consumer_error(match error {
                ConsumerError::Busy(_) => ConsumerError::Busy(timeout),
                _ => ConsumerError::Timeout(timeout),
            }));
        }
        py.check_signals()?;
    }
}

/// A connection to a producer; `next()` receives frames.
#[pyclass(frozen, module = "cuda_interop")]
pub(crate) struct Receiver {
    mode: Mode,
    path: String,
    delivery: Delivery,
    closed: AtomicBool,
}

impl Receiver {
    pub(crate) fn connect(
        py: Python<'_>,
        socket_path: &str,
        timeout: Duration,
        delivery: Delivery,
        open: Open,
    ) -> PyResult<Self> {
        let deadline = deadline_after(timeout);
        let path = socket_path.to_owned();
        let conn = py
            .detach(|| transport::connect(&path, timeout))
            .map_err(consumer_error)?;
        Receiver::open(py, path, conn, delivery, left(deadline), open)
    }

    /// The receiver of `conn` (to `path`), set up within `timeout`.
    fn open(
        py: Python<'_>,
        path: String,
        conn: Connection,
        delivery: Delivery,
        timeout: Duration,
        open: Open,
    ) -> PyResult<Self> {
        let mode = py
            .detach(|| Mode::start(conn, delivery, timeout, open))
            .map_err(|e| match e {
                ConsumerError::Timeout(_) => PyTimeoutError::new_err(format!(
                    "{path} did not send its ring within the timeout ({timeout:?}): is it a \
                     cuda-interop frame sender, and still running? Raise the timeout, or check \
                     the sender"
                )),
                e => consumer_error(e),
            })?;
        Ok(Receiver {
            mode,
            path,
            delivery,
            closed: AtomicBool::new(false),
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

    /// Test hook: the "released" signals a recording ring made so far.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn signals(&self) -> Vec<(u32, u64, usize)> {
        match &self.mode {
            Mode::Ring(ring) => ring.signals(),
            _ => Vec::new(),
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The last owner of a ring tears its CUDA or Vulkan imports down,
        // which waits (bounded) for the GPU: not with the GIL held.
        let mode = std::mem::replace(&mut self.mode, Mode::Gone);
        Python::attach(|py| py.detach(move || drop(mode)));
    }
}

#[pymethods]
impl Receiver {
    /// Waits at most `timeout` seconds for the next frame (GIL released,
    /// Ctrl-C seen within 50 ms): a frame of the sender's ring, or the
    /// buffer (resource 0) of a one-buffer message.
    fn next(&self, py: Python<'_>, timeout: f64) -> PyResult<Frame> {
        let timeout = seconds("timeout", timeout)?;
        if let Some(closed) = self.closed_error() {
            return Err(closed);
        }
        match &self.mode {
            Mode::Single(single) => {
                let received = single.recv(py, timeout)?;
                py.detach(|| single.import(received))
            }
            Mode::Ring(ring) => {
                let frame = in_slices(py, timeout, |t| ring.session().next(t))?;
                Ok(Frame::of_ring(ring.clone(), frame))
            }
            Mode::Host(host) => {
                let deadline = deadline_after(timeout);
                let frame = in_slices(py, timeout, |t| host.next(t))?;
                py.detach(|| {
                    let sequence = frame.sequence();
                    let read = host.read(&frame, left(deadline));
                    // Read and checked (or failed): the slot goes back now.
                    // A release that fails says the connection ended after
                    // the read; the next call says why.
                    let _ = host.release(frame);
                    read.map(|bytes| Frame::host_copy(host.session().layout(), sequence, bytes))
                })
                .map_err(consumer_error)
            }
            Mode::Gone => unreachable!("a receiver being dropped is not called"),
        }
    }

    /// The ring's `(slots, width, height, row_pitch)`; `None` for a
    /// producer of one buffer per message.
    #[getter]
    fn layout(&self) -> Option<(u32, u32, u32, u64)> {
        self.mode.session().map(|s| {
            let l = s.layout();
            (l.slots, l.width, l.height, l.row_pitch)
        })
    }

    /// What the ring's frames are: `"r8g8b8a8_unorm"` for an RGBA8 buffer
    /// ring; `"nv12"` or `"p010"` for a planar one, whose frame is one
    /// `(rows, width)` tensor of its samples (`uint8`, `uint16`): the luma
    /// plane's `height` rows, then from row `chroma_row` the chroma plane's
    /// `height // 2` rows of `width // 2` Cb, Cr pairs; an image ring's
    /// `VkFormat` name in lower case. `None` for a producer of one buffer
    /// per message.
    #[getter]
    fn format(&self) -> Option<String> {
        self.mode.session().map(|s| {
            let l = s.layout();
            match (l.planar_format(), l.vk_format()) {
                (Some((planar, _)), _) => planar.name().to_string(),
                (None, Some(f)) => {
                    vk_export::format::describe(vk_export::ash::vk::Format::from_raw(f as i32))
                        .map_or_else(|| format!("vkformat_{f}"), |d| d.0.to_ascii_lowercase())
                }
                (None, None) => "r8g8b8a8_unorm".to_string(),
            }
        })
    }

    /// A planar ring's first chroma row in a frame's tensor (`height` when
    /// the chroma plane follows the luma plane): `luma = t[:height]`,
    /// `chroma = t[chroma_row:].view(height // 2, width // 2, 2)` in
    /// PyTorch. `None` for other rings.
    #[getter]
    fn chroma_row(&self) -> Option<u64> {
        self.mode.session().and_then(|s| {
            let l = s.layout();
            l.planar_format().map(|(_, offset)| offset / l.row_pitch)
        })
    }

    /// How many ring slots this receiver holds (frames received and not
    /// yet released; a host ring's frames are released by `next()`).
    #[getter]
    fn held(&self) -> usize {
        match &self.mode {
            Mode::Ring(ring) => ring.session().held(),
            _ => 0,
        }
    }

    /// Shuts the connection down now: the sender sees this receiver leave
    /// (and takes back the slots it held). Later calls raise `ConnectionError`.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        match &self.mode {
            Mode::Ring(ring) => ring.close(CLOSED),
            Mode::Host(host) => host.session().close(CLOSED),
            Mode::Single(single) => {
                let _ = rustix::net::shutdown(&single.conn, rustix::net::Shutdown::Both);
            }
            Mode::Gone => {}
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: Bound<'_, pyo3::types::PyTuple>) {
        self.close();
    }

    /// The socket path this receiver connected to.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The delivery it subscribed in: `"latest"` or `"lossless"`.
    #[getter]
    fn delivery(&self) -> &'static str {
        self.delivery.name()
    }

    /// Ring frames it did not get: those presented between two it received
    /// (frames before its first are not counted).
    #[getter]
    fn dropped(&self) -> u64 {
        self.mode.session().map_or(0, |s| s.stats().dropped)
    }

    /// Ring frames it received.
    #[getter]
    fn received(&self) -> u64 {
        self.mode.session().map_or(0, |s| s.stats().received)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cuda_interop.Receiver {} {}>",
            self.path,
            self.delivery.name()
        )
    }
}
