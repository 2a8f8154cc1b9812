//! The consumer's side of the frame-ring protocol ([`crate::protocol`]): the
//! ring's memory imported once into CUDA, its semaphores, the packets, and
//! which slots this consumer holds.
//!
//! # Contract
//!
//! * A [`Ring`] is made from the producer's hello and setup message: each
//!   slot's buffer is imported and mapped once, and kept mapped as long as
//!   the ring or any tensor handed out of it lives ([`SlotMemory`] is
//!   shared). The "produced" and "released" timelines are imported on the
//!   same CUDA device.
//! * Every packet read or written is bounded: reads by the caller's timeout
//!   (`poll`), writes by the connection's `SO_SNDTIMEO`.
//! * A slot is held from its frame packet until the frame's release; a frame
//!   packet for a slot this consumer still holds, a slot out of range, or a
//!   frame number that does not go up is a protocol error (`ValueError`).

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::{DLDataType, DLDataTypeCode, ManagedTensor};
use cuda_interop::{CudaDevice, ExternalSemaphore, Stream};
use pyo3::exceptions::{PyConnectionError, PyTimeoutError, PyValueError};
use pyo3::{PyErr, PyResult};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{RecvFlags, SendFlags};
use vk_export::markers::DeviceLocal;
use vk_export::semaphore_kinds::Timeline;
use vk_export::socket::Connection;

use crate::protocol::{Kind, Packet, PACKET_LEN, SETUP_TAG};
use crate::{cuda_error, vk_error};

/// What a peek at the next message found.
pub(crate) enum NextMessage {
    /// A frame-protocol packet (magic "CIFR").
    Packet,
    /// Anything else: left for `Connection::recv` (a wire message, garbage,
    /// or the end of the stream).
    Other,
}

/// The time left until `deadline`.
pub(crate) fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Waits until `conn` is readable (a message or a hang-up), at most until
/// `deadline`; `timeout` is what the caller asked for, for the message.
fn wait_readable(conn: &Connection, deadline: Instant, timeout: Duration) -> PyResult<()> {
    loop {
        let rest = left(deadline);
        let ts = rustix::event::Timespec {
            tv_sec: i64::try_from(rest.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(rest.subsec_nanos()),
        };
        let mut fds = [PollFd::new(conn, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => {
                return Err(PyTimeoutError::new_err(format!(
                    "no message from the producer within {timeout:?}"
                )))
            }
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) if !rest.is_zero() => continue,
            Err(e) => {
                return Err(PyConnectionError::new_err(format!(
                    "poll on the producer's socket failed: {}",
                    std::io::Error::from(e)
                )))
            }
        }
    }
}

/// Waits (bounded) for the next message and says whether it is a packet,
/// without taking it.
pub(crate) fn peek(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> PyResult<NextMessage> {
    wait_readable(conn, deadline, timeout)?;
    let mut head = [0u8; 4];
    match rustix::net::recv(
        conn.as_fd(),
        &mut head,
        RecvFlags::PEEK | RecvFlags::DONTWAIT,
    ) {
        Ok((4, _)) if head == crate::protocol::MAGIC => Ok(NextMessage::Packet),
        _ => Ok(NextMessage::Other),
    }
}

/// Receives one packet, waiting at most until `deadline`. Fds sent with it
/// (none are expected) are closed by the kernel.
pub(crate) fn recv_packet(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> PyResult<Packet> {
    loop {
        wait_readable(conn, deadline, timeout)?;
        let mut buf = [0u8; PACKET_LEN + 16];
        match rustix::net::recv(
            conn.as_fd(),
            &mut buf,
            RecvFlags::TRUNC | RecvFlags::DONTWAIT,
        ) {
            Ok((_, 0)) => {
                return Err(PyConnectionError::new_err(
                    "the producer closed the connection",
                ))
            }
            Ok((_, full)) => {
                let packet = if full == PACKET_LEN {
                    Packet::decode(&buf[..PACKET_LEN])
                } else {
                    Err(crate::protocol::PacketError::Length(full))
                };
                return packet.map_err(|e| PyValueError::new_err(e.to_string()));
            }
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(PyConnectionError::new_err(format!(
                    "recv from the producer failed: {}",
                    std::io::Error::from(e)
                )))
            }
        }
    }
}

/// Why a packet could not be sent. A plain Rust value (not a `PyErr`), so
/// that a destructor can format it without calling into Python.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The send timeout passed with the socket still full.
    Timeout,
    /// Only part of the packet went.
    Short { sent: usize, len: usize },
    /// The socket refused it (the producer left: `EPIPE`, `ECONNRESET`).
    Failed(std::io::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Timeout => f.write_str(
                "the producer did not take a release message within the send timeout (10 s)",
            ),
            SendError::Short { sent, len } => {
                write!(f, "sent {sent} of {len} bytes of a release to the producer")
            }
            SendError::Failed(e) => write!(f, "cannot send a release to the producer: {e}"),
        }
    }
}

impl SendError {
    /// The Python exception for it.
    pub(crate) fn into_py(self) -> PyErr {
        match self {
            SendError::Timeout => PyTimeoutError::new_err(self.to_string()),
            _ => PyConnectionError::new_err(self.to_string()),
        }
    }
}

/// Sends one packet (bounded by the connection's send timeout).
pub(crate) fn send_packet(conn: &Connection, packet: &Packet) -> Result<(), SendError> {
    let bytes = packet.encode();
    match rustix::net::send(conn.as_fd(), &bytes, SendFlags::NOSIGNAL) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(SendError::Short {
            sent: n,
            len: bytes.len(),
        }),
        Err(rustix::io::Errno::AGAIN) => Err(SendError::Timeout),
        Err(e) => Err(SendError::Failed(std::io::Error::from(e))),
    }
}

/// One slot's buffer, mapped into CUDA; tensors handed out keep it alive.
pub(crate) struct CudaSlot {
    /// The whole-buffer tensor `ImportedBuffer::into_dlpack` made: it owns
    /// the mapping and the import, and is never handed out itself.
    _mapping: Mutex<ManagedTensor>,
}

/// What keeps one slot's memory alive: a [`CudaSlot`], or host memory for
/// the test hook. Every tensor handed out of the slot holds a clone.
#[derive(Clone)]
pub(crate) struct SlotMemory {
    _keep: Arc<dyn std::any::Any + Send + Sync>,
}

/// A slot: its memory's keeper and address.
pub(crate) struct Slot {
    pub(crate) memory: SlotMemory,
    pub(crate) data: u64,
    pub(crate) len: u64,
}

/// The CUDA side of a ring: semaphores and the streams their operations are
/// enqueued on.
pub(crate) struct GpuSync {
    pub(crate) cuda: CudaDevice,
    pub(crate) produced: ExternalSemaphore<Timeline>,
    pub(crate) released: Vec<ExternalSemaphore<Timeline>>,
    /// Waits for "produced"; the stream `__cuda_array_interface__` names.
    pub(crate) wait_stream: Mutex<Stream>,
    /// Signals of "released".
    pub(crate) release_stream: Mutex<Stream>,
}

/// A ring shared by a producer: its layout, memory, semaphores, and the
/// slots this consumer holds.
pub(crate) struct Ring {
    pub(crate) conn: Arc<Connection>,
    pub(crate) layout: Packet,
    pub(crate) slots: Vec<Slot>,
    pub(crate) gpu: Option<GpuSync>,
    /// Per slot, the frame this consumer holds there.
    held: Mutex<Vec<Option<u64>>>,
    /// The last frame number received.
    last_frame: Mutex<u64>,
    /// Why this consumer gave the connection up (a dropped frame's release
    /// failed, or `Receiver.close()`), if it did.
    broken: Mutex<Option<String>>,
    /// Held across receiving a frame packet and accepting it, so that two
    /// threads' `next()` calls accept frames in the order they arrived.
    pub(crate) receiving: Mutex<()>,
    /// Test hook: a host ring that takes stream arguments and records, in
    /// place of each "released" signal, `(slot, frame, stream)`.
    #[cfg(feature = "test-hooks")]
    pub(crate) signal_log: Option<Mutex<Vec<(u32, u64, usize)>>>,
}

impl Ring {
    /// Imports the ring the setup message shares, after `hello`.
    pub(crate) fn import(
        conn: Arc<Connection>,
        hello: Packet,
        mut setup: vk_export::wire::Received,
        cuda_for: impl FnOnce([u8; 16]) -> PyResult<CudaDevice>,
    ) -> PyResult<Ring> {
        let n = hello.slot as usize;
        let tag = setup.message().tag;
        let count = setup.message().resources.len();
        if tag != SETUP_TAG || count != 2 * n + 1 {
            return Err(PyValueError::new_err(format!(
                "after a hello for {n} slots the producer must send the ring: a message tagged \
                 {SETUP_TAG:#x} with {} resources ({n} buffers, \"produced\", {n} \"released\"); \
                 got tag {tag:#x} with {count}",
                2 * n + 1
            )));
        }
        let need = hello.frame_bytes().expect("a checked layout");
        let first = setup.take_buffer::<DeviceLocal>(0).map_err(vk_error)?;
        let cuda = cuda_for(first.record().info().device_uuid())?;
        let mut buffers = vec![first];
        for i in 1..n {
            buffers.push(setup.take_buffer::<DeviceLocal>(i).map_err(vk_error)?);
        }
        let mut slots = Vec::with_capacity(n);
        for (i, buffer) in buffers.into_iter().enumerate() {
            let imported = cuda
                .import_received_buffer(buffer)
                .map_err(|e| cuda_error(e.into_error()))?;
            let len = imported.size();
            if len < need {
                return Err(PyValueError::new_err(format!(
                    "slot {i}'s buffer has {len} bytes; a {}x{} frame with row pitch {} needs {need}",
                    hello.width, hello.height, hello.row_pitch
                )));
            }
            let byte_len = i64::try_from(len)
                .map_err(|_| PyValueError::new_err(format!("a buffer of {len} bytes")))?;
            let mapping = imported
                .into_dlpack(
                    DLDataType::scalar(DLDataTypeCode::UInt, 8),
                    &[byte_len],
                    None,
                    false,
                )
                .map_err(cuda_error)?;
            let data = mapping.tensor().data as u64;
            slots.push(Slot {
                memory: SlotMemory {
                    _keep: Arc::new(CudaSlot {
                        _mapping: Mutex::new(mapping),
                    }),
                },
                data,
                len,
            });
        }
        let semaphore = |setup: &mut vk_export::wire::Received, i: usize| {
            let received = setup.take_semaphore::<Timeline>(i).map_err(vk_error)?;
            cuda.import_received_semaphore(received)
                .map_err(|e| cuda_error(e.into_error()))
        };
        let produced = semaphore(&mut setup, n)?;
        let released = (0..n)
            .map(|i| semaphore(&mut setup, n + 1 + i))
            .collect::<PyResult<Vec<_>>>()?;
        let gpu = GpuSync {
            wait_stream: Mutex::new(Stream::new(&cuda).map_err(cuda_error)?),
            release_stream: Mutex::new(Stream::new(&cuda).map_err(cuda_error)?),
            cuda,
            produced,
            released,
        };
        Ok(Ring::new(conn, hello, slots, Some(gpu)))
    }

    /// A ring over host memory (test hook): no CUDA, no setup message.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn host(conn: Arc<Connection>, hello: Packet, record_signals: bool) -> Ring {
        let len = hello.frame_bytes().expect("a checked layout");
        let slots = (0..hello.slot)
            .map(|i| {
                let bytes = crate::frame::HostBytes::new(
                    (0..len).map(|b| (b as u8).wrapping_add(i as u8)).collect(),
                );
                let data = bytes.data();
                Slot {
                    memory: SlotMemory {
                        _keep: Arc::new(bytes),
                    },
                    data,
                    len,
                }
            })
            .collect();
        let mut ring = Ring::new(conn, hello, slots, None);
        ring.signal_log = record_signals.then(|| Mutex::new(Vec::new()));
        ring
    }

    fn new(conn: Arc<Connection>, layout: Packet, slots: Vec<Slot>, gpu: Option<GpuSync>) -> Ring {
        Ring {
            conn,
            held: Mutex::new(vec![None; slots.len()]),
            layout,
            slots,
            gpu,
            last_frame: Mutex::new(0),
            broken: Mutex::new(None),
            receiving: Mutex::new(()),
            #[cfg(feature = "test-hooks")]
            signal_log: None,
        }
    }

    /// Whether frames of this ring take a CUDA stream to order on (and
    /// remember it for their release): rings with semaphores, and the
    /// test hook's recording host ring.
    pub(crate) fn orders_streams(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.signal_log.is_some() {
            return true;
        }
        self.gpu.is_some()
    }

    /// Gives the connection up after a failure nobody can be told of (a
    /// dropped frame's release): shuts the socket down, so the producer
    /// takes back every slot this consumer holds, and keeps `why` for the
    /// next call on the receiver.
    ///
    /// Also what `Receiver.close()` does to its ring. From then on this
    /// consumer holds nothing: the producer has taken every slot back, so
    /// later releases are done without a signal or a message.
    pub(crate) fn break_off(&self, why: String) {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(why);
        let _ = rustix::net::shutdown(&*self.conn, rustix::net::Shutdown::Both);
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter_mut()
            .for_each(|h| *h = None);
    }

    /// Whether the connection is gone for this consumer (given up or
    /// closed): the producer has taken its slots back.
    pub(crate) fn is_gone(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Why the connection was given up, if it was.
    pub(crate) fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Checks a frame packet against what this consumer holds, and marks
    /// its slot held.
    pub(crate) fn accept_frame(&self, packet: &Packet) -> PyResult<()> {
        if packet.kind != Kind::Frame {
            return Err(PyValueError::new_err(format!(
                "expected a frame packet from the producer, got {:?}",
                packet.kind
            )));
        }
        let slot = packet.slot as usize;
        if slot >= self.slots.len() {
            return Err(PyValueError::new_err(format!(
                "frame {} names slot {slot} of a ring of {}",
                packet.frame,
                self.slots.len()
            )));
        }
        let mut last = self
            .last_frame
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if packet.frame <= *last {
            return Err(PyValueError::new_err(format!(
                "frame number {} after {}: frame numbers must go up",
                packet.frame, *last
            )));
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = self.broken() {
            // Received before the connection was given up or closed: the
            // producer has taken the slot back already.
            return Err(PyConnectionError::new_err(format!(
                "the connection to the producer was given up ({why}); connect again"
            )));
        }
        if let Some(old) = held[slot] {
            return Err(PyValueError::new_err(format!(
                "the producer sent frame {} into slot {slot}, which still holds frame {old} \
                 (not released): a producer bug",
                packet.frame
            )));
        }
        held[slot] = Some(packet.frame);
        *last = packet.frame;
        Ok(())
    }

    /// Marks `slot` free, just before the release of `frame` is sent (the
    /// producer cannot send a new frame for it before it gets the release,
    /// so a `next()` on another thread never finds it still held).
    pub(crate) fn mark_released(&self, slot: u32, frame: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get_mut(slot as usize) {
            if *h == Some(frame) {
                *h = None;
            }
        }
    }

    /// Marks `slot` held by `frame` again: its release could not be sent.
    pub(crate) fn mark_held(&self, slot: u32, frame: u64) {
        // Checked under the `held` lock: a break_off clears `held` after
        // marking the ring gone, so either it sees this mark or this sees it.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_gone() {
            return;
        }
        if let Some(h @ None) = held.get_mut(slot as usize) {
            *h = Some(frame);
        }
    }

    /// How many slots this consumer holds.
    pub(crate) fn held_count(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .flatten()
            .count()
    }
}
