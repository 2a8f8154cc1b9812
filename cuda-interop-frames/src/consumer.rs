//! The consumer's side of the frame-ring protocol ([`crate::protocol`]):
//! connecting to a producer, the ring's memory imported once into CUDA, its
//! semaphores, the packets, and which slots this consumer holds.
//!
//! # Contract
//!
//! * [`connect`] connects with a bound on a full backlog; [`peek`],
//!   [`recv_packet`] and [`Ring::lock_receiving`] wait at most until the
//!   caller's deadline; [`send_packet`] is bounded by the connection's
//!   `SO_SNDTIMEO`. Nothing here waits without a bound.
//! * A [`Ring`] is made from the producer's hello and setup message
//!   ([`Ring::import`]): each slot's buffer is imported and mapped once, and
//!   kept mapped as long as the ring or any clone of the slot's
//!   [`SlotMemory`] lives. An image ring's slots are its images mapped as
//!   CUDA arrays (any format of `vk_export::format::SUPPORTED`), each beside
//!   a tightly packed buffer of this consumer that
//!   [`Ring::enqueue_readable`] copies the frame into (the crate's copy
//!   kernel), on the ring's wait stream after "produced". The "produced" and "released" timelines are
//!   imported on the same CUDA device. [`Ring::from_parts`] makes a ring over
//!   memory the caller provides (no CUDA).
//! * A slot is held from its frame packet ([`Ring::accept_frame`]) until the
//!   frame's release ([`Ring::send_release`]); a frame packet for a slot this
//!   consumer still holds, a slot out of range, or a frame number that does
//!   not go up is a protocol error.
//! * After [`Ring::break_off`] the consumer holds nothing (the producer takes
//!   every slot back when the socket goes): releases do nothing from then on.
//! * Errors are [`ConsumerError`] and [`SendError`]: plain Rust values (a
//!   destructor can format them without any interpreter), whose variants say
//!   which kind of failure it was (timeout, connection, protocol, CUDA or
//!   Vulkan).

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use cuda_interop::dlpack::{DLDataType, DLDataTypeCode, ManagedTensor};
use cuda_interop::{
    CopyEngine, CudaDevice, DeviceBuffer, ExternalSemaphore, OwnedArray, PitchedMut, Stream,
};
use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendFlags};
use vk_export::markers::DeviceLocal;
use vk_export::semaphore_kinds::Timeline;
use vk_export::socket::Connection;
use vk_export::{Context, HeadlessOptions};

use crate::protocol::{Kind, Packet, PacketError, MAGIC, PACKET_LEN, SETUP_TAG};

/// Why a consumer's call failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// [`connect`]: the producer's backlog stayed full for the timeout.
    #[error("cannot connect to {path}: its backlog stayed full for {timeout:?}")]
    ConnectTimeout {
        /// The socket path.
        path: String,
        /// The bound that passed.
        timeout: Duration,
    },
    /// [`connect`]: a system call failed.
    #[error("cannot connect to {path}: {call} failed: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// The call that failed.
        call: &'static str,
        /// Its error.
        source: std::io::Error,
    },
    /// No message arrived within the timeout.
    #[error("no message from the producer within {0:?}")]
    Timeout(Duration),
    /// Another thread was receiving for the whole timeout
    /// ([`Ring::lock_receiving`]).
    #[error("no frame within {0:?}: another thread's next() was receiving")]
    Busy(Duration),
    /// `poll` on the socket failed.
    #[error("poll on the producer's socket failed: {0}")]
    Poll(std::io::Error),
    /// `recv` on the socket failed.
    #[error("recv from the producer failed: {0}")]
    Recv(std::io::Error),
    /// The producer closed the connection.
    #[error("the producer closed the connection")]
    Closed,
    /// The connection was given up ([`Ring::break_off`]); the reason.
    #[error("the connection to the producer was given up ({0}); connect again")]
    GivenUp(String),
    /// A packet that is not a valid frame-protocol packet.
    #[error(transparent)]
    Packet(#[from] PacketError),
    /// A valid packet or message the protocol does not allow here.
    #[error("{0}")]
    Protocol(String),
    /// A Vulkan-side error (wire message, record, device).
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
    /// A CUDA-side error.
    #[error(transparent)]
    Cuda(#[from] cuda_interop::Error),
}

/// Why a packet could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The send timeout passed with the socket still full.
    #[error("the producer did not take a release message within the send timeout (10 s)")]
    Timeout,
    /// Only part of the packet went.
    #[error("sent {sent} of {len} bytes of a release to the producer")]
    Short {
        /// Bytes sent.
        sent: usize,
        /// Bytes of the packet.
        len: usize,
    },
    /// The socket refused it (the producer left: `EPIPE`, `ECONNRESET`).
    #[error("cannot send a release to the producer: {0}")]
    Failed(std::io::Error),
}

/// Connects with `connect(2)` bounded by `timeout` (`SO_SNDTIMEO`: how long
/// a full backlog is waited on), then wraps the socket as a [`Connection`]
/// (peer check, default send timeout).
pub fn connect(path: &str, timeout: Duration) -> Result<Connection, ConsumerError> {
    use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let failed = |call: &'static str, e: Errno| ConsumerError::Connect {
        path: path.to_owned(),
        call,
        source: std::io::Error::from(e),
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
            return Err(ConsumerError::ConnectTimeout {
                path: path.to_owned(),
                timeout,
            })
        }
        Err(e) => return Err(failed("connect", e)),
    }
    Ok(Connection::from_fd(fd)?)
}

/// The CUDA device paired by UUID with a new headless Vulkan context on the
/// device whose `deviceUUID` is `uuid` (the CUDA device keeps the context:
/// records are verified on it).
pub fn cuda_device_for(uuid: vk_export::DeviceUuid) -> Result<CudaDevice, ConsumerError> {
    let vulkan = Context::headless(&HeadlessOptions {
        device_uuid: Some(uuid),
        ..HeadlessOptions::default()
    })?;
    Ok(CudaDevice::for_vulkan(&vulkan)?)
}

/// What a peek at the next message found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextMessage {
    /// A frame-protocol packet (magic "CIFR").
    Packet,
    /// Anything else: left for `Connection::recv` (a wire message, garbage,
    /// or the end of the stream).
    Other,
}

/// The time left until `deadline`.
pub fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// `mutex`'s guard, waiting at most `bound` for it (a poisoned lock is
/// taken as is: what it guards stays consistent); [`cuda_interop::Error::Timeout`]
/// otherwise, also when this thread holds it already.
fn lock_within<T>(
    mutex: &Mutex<T>,
    bound: Duration,
) -> Result<MutexGuard<'_, T>, cuda_interop::Error> {
    let deadline = Instant::now() + bound;
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Ok(guard),
            Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(TryLockError::WouldBlock) => return Err(cuda_interop::Error::Timeout(bound)),
        }
    }
}

/// A deadline `timeout` from now; a year from now for bounds too large to
/// add ("no bound" enough).
pub fn deadline_after(timeout: Duration) -> Instant {
    Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600))
}

/// Waits until `conn` is readable (a message or a hang-up), at most until
/// `deadline`; `timeout` is what the caller asked for, for the message.
fn wait_readable(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ConsumerError> {
    loop {
        let rest = left(deadline);
        let ts = rustix::event::Timespec {
            tv_sec: i64::try_from(rest.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(rest.subsec_nanos()),
        };
        let mut fds = [PollFd::new(conn, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => return Err(ConsumerError::Timeout(timeout)),
            Ok(_) => return Ok(()),
            Err(Errno::INTR) if !rest.is_zero() => continue,
            Err(e) => return Err(ConsumerError::Poll(std::io::Error::from(e))),
        }
    }
}

/// Waits (bounded) for the next message and says whether it is a packet,
/// without taking it.
pub fn peek(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> Result<NextMessage, ConsumerError> {
    wait_readable(conn, deadline, timeout)?;
    let mut head = [0u8; 4];
    match rustix::net::recv(
        conn.as_fd(),
        &mut head,
        RecvFlags::PEEK | RecvFlags::DONTWAIT,
    ) {
        Ok((4, _)) if head == MAGIC => Ok(NextMessage::Packet),
        _ => Ok(NextMessage::Other),
    }
}

/// Receives one packet, waiting at most until `deadline`. Fds sent with it
/// (none are expected) are closed by the kernel.
pub fn recv_packet(
    conn: &Connection,
    deadline: Instant,
    timeout: Duration,
) -> Result<Packet, ConsumerError> {
    loop {
        wait_readable(conn, deadline, timeout)?;
        let mut buf = [0u8; PACKET_LEN + 16];
        match rustix::net::recv(
            conn.as_fd(),
            &mut buf,
            RecvFlags::TRUNC | RecvFlags::DONTWAIT,
        ) {
            Ok((_, 0)) => return Err(ConsumerError::Closed),
            Ok((_, full)) if full == PACKET_LEN => return Ok(Packet::decode(&buf[..PACKET_LEN])?),
            Ok((_, full)) => return Err(PacketError::Length(full).into()),
            Err(Errno::AGAIN | Errno::INTR) => continue,
            Err(e) => return Err(ConsumerError::Recv(std::io::Error::from(e))),
        }
    }
}

/// Sends one packet (bounded by the connection's send timeout).
pub fn send_packet(conn: &Connection, packet: &Packet) -> Result<(), SendError> {
    let bytes = packet.encode();
    match rustix::net::send(conn.as_fd(), &bytes, SendFlags::NOSIGNAL) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(SendError::Short {
            sent: n,
            len: bytes.len(),
        }),
        Err(Errno::AGAIN) => Err(SendError::Timeout),
        Err(e) => Err(SendError::Failed(std::io::Error::from(e))),
    }
}

/// The bytes of one frame of the ring `hello` announces, after checking
/// its layout ([`Packet::check_layout`]): a hello built by hand is not
/// trusted either.
pub fn frame_bytes_of(hello: &Packet) -> Result<u64, ConsumerError> {
    hello
        .check_layout()
        .map_err(|e| ConsumerError::Protocol(format!("the sender's hello: {e}")))?;
    hello.frame_bytes().ok_or_else(|| {
        ConsumerError::Protocol(format!(
            "the sender's hello: a {}x{} frame with row pitch {} does not fit in 64 bits",
            hello.width, hello.height, hello.row_pitch
        ))
    })
}

/// Checks that `setup` is the ring a hello for `hello.slot` slots announces
/// (and that the hello's layout is one, [`frame_bytes_of`]):
/// tagged [`SETUP_TAG`], with `2 * slots + 1` resources.
pub fn check_setup(hello: &Packet, setup: &vk_export::wire::Received) -> Result<(), ConsumerError> {
    frame_bytes_of(hello)?;
    let n = hello.slot as usize;
    let tag = setup.message().tag;
    let count = setup.message().resources.len();
    let what = if hello.is_image_ring() {
        "images"
    } else {
        "buffers"
    };
    if tag == SETUP_TAG && count == n {
        let instead = if hello.is_image_ring() {
            "or receive the images on Vulkan (vulkan_receiver::VulkanReceiver, from Rust)"
        } else {
            "or read the host-visible buffers on the host (host_receiver::HostBuffers; the \
             Python module does, giving NumPy arrays)"
        };
        return Err(ConsumerError::Protocol(format!(
            "the sender shares {n} {what} and no semaphores (a Vulkan driver without \
             VK_KHR_external_semaphore_fd, such as lavapipe, or frame_server --no-semaphores): \
             a CUDA receiver needs the \"produced\" and \"released\" timelines; run the \
             sender on a GPU whose driver exports semaphores, {instead}"
        )));
    }
    if tag != SETUP_TAG || count != 2 * n + 1 {
        return Err(ConsumerError::Protocol(format!(
            "after a hello for {n} slots the producer must send the ring: a message tagged \
             {SETUP_TAG:#x} with {} resources ({n} {what}, \"produced\", {n} \"released\"); \
             got tag {tag:#x} with {count}",
            2 * n + 1
        )));
    }
    Ok(())
}

/// The slots of a buffer ring: each buffer imported and mapped whole.
fn buffer_slots(
    cuda: &CudaDevice,
    hello: &Packet,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    let need = frame_bytes_of(hello)?;
    let mut slots = Vec::with_capacity(hello.slot as usize);
    for i in 0..hello.slot as usize {
        let buffer = setup.take_buffer::<DeviceLocal>(i)?;
        let imported = cuda
            .import_received_buffer(buffer)
            .map_err(|e| e.into_error())?;
        let len = imported.size();
        if len < need {
            return Err(ConsumerError::Protocol(format!(
                "slot {i}'s buffer has {len} bytes; a {}x{} frame with row pitch {} needs {need}",
                hello.width, hello.height, hello.row_pitch
            )));
        }
        let byte_len = i64::try_from(len)
            .map_err(|_| ConsumerError::Protocol(format!("a buffer of {len} bytes")))?;
        let mapping = imported.into_dlpack(
            DLDataType::scalar(DLDataTypeCode::UInt, 8),
            &[byte_len],
            None,
            false,
        )?;
        let data = mapping.tensor().data as u64;
        slots.push(Slot {
            memory: SlotMemory::new(Arc::new(CudaSlot {
                _mapping: Mutex::new(mapping),
            })),
            data,
            len,
            image: None,
        });
    }
    Ok(slots)
}

/// Calls macro `$m` with every format [`image_slots`] imports: those of
/// `vk_export::format::SUPPORTED` (a unit test checks the two agree).
macro_rules! image_formats {
    ($m:ident) => {
        $m!(
            R8Unorm,
            Rg8Unorm,
            Rgba8Unorm,
            Rgba8Uint,
            R16Sfloat,
            Rgba16Sfloat,
            Rgba16Uint,
            R32Uint,
            R32Sfloat,
            Rg32Sfloat,
            Rgba32Sfloat
        )
    };
}

/// The slots of an image ring, for the format the hello names (one of
/// `vk_export::format::SUPPORTED`).
fn image_slots(
    cuda: &CudaDevice,
    hello: &Packet,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    use vk_export::format::*;
    let raw = vk_export::ash::vk::Format::from_raw(hello.format as i32);
    macro_rules! by_format {
        ($($format:ty),*) => {
            $(if raw == <$format>::VK {
                return image_slots_of::<$format>(cuda, hello, setup);
            })*
        };
    }
    image_formats!(by_format);
    Err(ConsumerError::Protocol(format!(
        "the sender's images are VkFormat {}, which vk-export cannot map into CUDA \
         (supported: {})",
        hello.format,
        SUPPORTED.iter().map(|f| f.1).collect::<Vec<_>>().join(", ")
    )))
}

/// [`image_slots`] for images of format `F`: each image imported and mapped
/// as a CUDA array, beside a tightly packed buffer of its rows.
fn image_slots_of<F: vk_export::format::Format>(
    cuda: &CudaDevice,
    hello: &Packet,
    setup: &mut vk_export::wire::Received,
) -> Result<Vec<Slot>, ConsumerError> {
    use vk_export::markers::{usage, Optimal};
    let len = frame_bytes_of(hello)?;
    if hello.row_pitch != u64::from(hello.width) * u64::from(F::TEXEL_BYTES) {
        return Err(ConsumerError::Protocol(format!(
            "an image ring of {} announces rows of {} bytes for {} texels",
            F::NAME,
            hello.row_pitch,
            hello.width
        )));
    }
    let mut slots = Vec::with_capacity(hello.slot as usize);
    for i in 0..hello.slot as usize {
        let image = setup.take_image::<F, Optimal, DeviceLocal, usage::Storage>(i)?;
        let extent = image.record().info().extent();
        if extent != [hello.width, hello.height, 1] {
            return Err(ConsumerError::Protocol(format!(
                "slot {i}'s image is {}x{}x{}, not the hello's {}x{}",
                extent[0], extent[1], extent[2], hello.width, hello.height
            )));
        }
        let array = cuda
            .import_received_image(image)
            .map_err(|e| e.into_error())?
            .into_mapped_array()?;
        let bytes = usize::try_from(len)
            .map_err(|_| ConsumerError::Protocol(format!("a frame of {len} bytes")))?;
        let rows = DeviceBuffer::new(cuda, bytes)?;
        let data = rows.device_ptr();
        let slot = Arc::new(ImageSlot {
            array,
            rows: Mutex::new(rows),
        });
        slots.push(Slot {
            memory: SlotMemory::new(slot.clone()),
            data,
            len,
            image: Some(slot),
        });
    }
    Ok(slots)
}

/// An image slot: the image as a CUDA array, and the pitched buffer this
/// consumer copies each frame into (what its tensors address).
struct ImageSlot<F> {
    // Dropped first: the array's drop waits (bounded) for the copies out of
    // it; the buffer's own drop waits for them too (each is recorded on both).
    array:
        OwnedArray<F, vk_export::markers::Optimal, DeviceLocal, vk_export::markers::usage::Storage>,
    rows: Mutex<DeviceBuffer>,
}

mod sealed {
    /// Only this crate's image slots are [`super::CopyOut`]: the ring runs
    /// them under its wait stream's lock and relies on what they copy.
    pub trait Sealed {}
}

/// What [`Ring::enqueue_readable`] does with an image slot, whatever its
/// format (sealed: this crate's image slots only).
pub trait CopyOut: sealed::Sealed + Send + Sync {
    /// Enqueues on `stream` the copy of the slot's image (level 0) into its
    /// pitched buffer ([`Slot::data`]); returns the engine that copies.
    fn enqueue_copy_out(&self, stream: &Stream) -> Result<CopyEngine, cuda_interop::Error>;
}

impl<F: vk_export::format::Format> sealed::Sealed for ImageSlot<F> {}

impl<F: vk_export::format::Format> CopyOut for ImageSlot<F> {
    fn enqueue_copy_out(&self, stream: &Stream) -> Result<CopyEngine, cuda_interop::Error> {
        let level = self.array.array().level(0)?;
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        level.enqueue_copy_to(stream, PitchedMut::buffer(&mut rows))
    }
}

/// One slot's buffer, mapped into CUDA.
struct CudaSlot {
    /// The whole-buffer tensor `ImportedBuffer::into_dlpack` made: it owns
    /// the mapping and the import, and is never handed out itself.
    _mapping: Mutex<ManagedTensor>,
}

/// What keeps one slot's memory alive (a CUDA mapping, or whatever the
/// caller of [`Ring::from_parts`] gave). Every tensor handed out of the slot
/// should hold a clone.
#[derive(Clone)]
pub struct SlotMemory {
    _keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotMemory")
    }
}

impl SlotMemory {
    /// Memory kept alive by `keep` (dropped with the last clone).
    pub fn new(keep: Arc<dyn std::any::Any + Send + Sync>) -> SlotMemory {
        SlotMemory { _keep: keep }
    }
}

/// A slot: its memory's keeper and address.
pub struct Slot {
    /// Keeps the memory alive.
    pub memory: SlotMemory,
    /// The first byte's address (a CUDA device pointer for an imported ring;
    /// for an image ring, this consumer's pitched copy of the image).
    pub data: u64,
    /// Bytes at `data`.
    pub len: u64,
    /// An image ring's slot: what copies the image to `data`.
    pub image: Option<Arc<dyn CopyOut>>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("data", &self.data)
            .field("len", &self.len)
            .field("image", &self.image.is_some())
            .finish()
    }
}

/// The CUDA side of a ring: semaphores and the streams their operations are
/// enqueued on.
pub struct GpuSync {
    /// The device the ring is imported on.
    pub cuda: CudaDevice,
    /// The "produced" timeline: frame `f` is written once it reaches `f`.
    pub produced: ExternalSemaphore<Timeline>,
    /// Per slot, its "released" timeline.
    pub released: Vec<ExternalSemaphore<Timeline>>,
    /// Waits for "produced" (a consumer may name it as the stream its reads
    /// must follow).
    pub wait_stream: Mutex<Stream>,
    /// Signals of "released".
    pub release_stream: Mutex<Stream>,
}

impl std::fmt::Debug for GpuSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSync")
            .field("ordinal", &self.cuda.ordinal())
            .field("slots", &self.released.len())
            .finish_non_exhaustive()
    }
}

/// A ring shared by a producer: its layout, memory, semaphores, and the
/// slots this consumer holds.
pub struct Ring {
    conn: Arc<Connection>,
    layout: Packet,
    slots: Vec<Slot>,
    gpu: Option<GpuSync>,
    /// Per slot, the frame this consumer holds there.
    held: Mutex<Vec<Option<u64>>>,
    /// The last frame number received.
    last_frame: Mutex<u64>,
    /// Why this consumer gave the connection up, if it did.
    broken: Mutex<Option<String>>,
    /// Held across receiving a frame packet and accepting it.
    receiving: Mutex<()>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("layout", &self.layout)
            .field("slots", &self.slots)
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// Imports the ring the setup message shares, after `hello`; `cuda_for`
    /// gives the CUDA device for the resources' `deviceUUID`. A buffer
    /// ring's slots are its buffers; an image ring's slots are pitched
    /// buffers of this consumer, one per image, which
    /// [`Ring::enqueue_readable`] fills from the images.
    pub fn import(
        conn: Arc<Connection>,
        hello: Packet,
        mut setup: vk_export::wire::Received,
        cuda_for: impl FnOnce(vk_export::DeviceUuid) -> Result<CudaDevice, ConsumerError>,
    ) -> Result<Ring, ConsumerError> {
        check_setup(&hello, &setup)?;
        let uuid = match &setup.message().resources[0] {
            vk_export::wire::Resource::Image(info) => info.device_uuid(),
            vk_export::wire::Resource::Buffer(info) => info.device_uuid(),
            _ => {
                return Err(ConsumerError::Protocol(
                    "the ring's first resource is neither a buffer nor an image".into(),
                ))
            }
        };
        let cuda = cuda_for(uuid)?;
        let slots = if hello.is_image_ring() {
            image_slots(&cuda, &hello, &mut setup)?
        } else {
            buffer_slots(&cuda, &hello, &mut setup)?
        };
        let n = slots.len();
        let semaphore = |setup: &mut vk_export::wire::Received, i: usize| {
            let received = setup.take_semaphore::<Timeline>(i)?;
            cuda.import_received_semaphore(received)
                .map_err(|e| ConsumerError::Cuda(e.into_error()))
        };
        let produced = semaphore(&mut setup, n)?;
        let released = (0..n)
            .map(|i| semaphore(&mut setup, n + 1 + i))
            .collect::<Result<Vec<_>, _>>()?;
        let gpu = GpuSync {
            wait_stream: Mutex::new(Stream::new(&cuda)?),
            release_stream: Mutex::new(Stream::new(&cuda)?),
            cuda,
            produced,
            released,
        };
        Ok(Ring::from_parts(conn, hello, slots, Some(gpu)))
    }

    /// A ring of `layout` (a checked hello) over `slots` the caller
    /// provides, with `gpu`'s semaphores or none (then releases carry no
    /// GPU signal).
    pub fn from_parts(
        conn: Arc<Connection>,
        layout: Packet,
        slots: Vec<Slot>,
        gpu: Option<GpuSync>,
    ) -> Ring {
        Ring {
            conn,
            held: Mutex::new(vec![None; slots.len()]),
            layout,
            slots,
            gpu,
            last_frame: Mutex::new(0),
            broken: Mutex::new(None),
            receiving: Mutex::new(()),
        }
    }

    /// The connection to the producer.
    pub fn conn(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// The producer's hello.
    pub fn layout(&self) -> &Packet {
        &self.layout
    }

    /// The slots.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The CUDA semaphores and streams, for an imported ring.
    pub fn gpu(&self) -> Option<&GpuSync> {
        self.gpu.as_ref()
    }

    /// Enqueues on the ring's wait stream what makes frame `frame` of
    /// `slot` (held by this consumer) readable at [`Slot::data`]: the wait
    /// for "produced" to reach `frame`, then, in an image ring, the copy of
    /// the slot's image into its pitched buffer. Returns the wait stream,
    /// locked, for the caller to order its reads after (or to wait for);
    /// `None` for a ring without CUDA semaphores ([`Ring::from_parts`]).
    /// Enqueue it once per frame: a second copy would overwrite the
    /// buffer the first one's readers read; and release the frame on a
    /// stream ordered after the returned one's work.
    ///
    /// The stream's lock is waited for at most [`Stream::DEFAULT_TIMEOUT`]
    /// ([`cuda_interop::Error::Timeout`]): a second call while this
    /// thread still holds the guard of the first fails so, instead of
    /// waiting for itself.
    pub fn enqueue_readable(
        &self,
        slot: u32,
        frame: u64,
    ) -> Result<Option<MutexGuard<'_, Stream>>, cuda_interop::Error> {
        let Some(gpu) = &self.gpu else {
            return Ok(None);
        };
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.get(slot as usize).copied().flatten() != Some(frame) {
            return Err(cuda_interop::Error::InvalidArgument(format!(
                "frame {frame} of slot {slot} is not held by this consumer"
            )));
        }
        drop(held);
        let via = lock_within(&gpu.wait_stream, Stream::DEFAULT_TIMEOUT)?;
        gpu.produced.wait(&via, frame)?;
        if let Some(image) = &self.slots[slot as usize].image {
            image.enqueue_copy_out(&via)?;
        }
        Ok(Some(via))
    }

    /// Takes the lock held across receiving a frame packet and accepting it
    /// (so that two threads accept frames in the order they arrived),
    /// waiting at most until `deadline`; `timeout` is the caller's, for the
    /// error.
    pub fn lock_receiving(
        &self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<MutexGuard<'_, ()>, ConsumerError> {
        loop {
            match self.receiving.try_lock() {
                Ok(guard) => return Ok(guard),
                Err(TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(TryLockError::WouldBlock) => return Err(ConsumerError::Busy(timeout)),
            }
        }
    }

    /// Gives the connection up: shuts the socket down, so the producer
    /// takes back every slot this consumer holds, and keeps `why` (the
    /// first reason given) for [`Ring::broken`]. From then on this consumer
    /// holds nothing, and releases are done without a signal or a message.
    pub fn break_off(&self, why: String) {
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
    pub fn is_gone(&self) -> bool {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Why the connection was given up, if it was.
    pub fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Checks a frame packet against what this consumer holds, and marks
    /// its slot held.
    pub fn accept_frame(&self, packet: &Packet) -> Result<(), ConsumerError> {
        if packet.kind != Kind::Frame {
            return Err(ConsumerError::Protocol(format!(
                "expected a frame packet from the producer, got {:?}",
                packet.kind
            )));
        }
        let slot = packet.slot as usize;
        if slot >= self.slots.len() {
            return Err(ConsumerError::Protocol(format!(
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
            return Err(ConsumerError::Protocol(format!(
                "frame number {} after {}: frame numbers must go up",
                packet.frame, *last
            )));
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = self.broken() {
            // Received before the connection was given up or closed: the
            // producer has taken the slot back already.
            return Err(ConsumerError::GivenUp(why));
        }
        if let Some(old) = held[slot] {
            return Err(ConsumerError::Protocol(format!(
                "the producer sent frame {} into slot {slot}, which still holds frame {old} \
                 (not released): a producer bug",
                packet.frame
            )));
        }
        held[slot] = Some(packet.frame);
        *last = packet.frame;
        Ok(())
    }

    /// Signals slot `slot`'s "released" timeline with `frame` after the work
    /// enqueued on `stream` (a raw `CUstream`), when the ring has CUDA
    /// semaphores, unless `*signalled` or the timeline already reached
    /// `frame` (an earlier attempt signalled: a second signal would be
    /// refused). `*signalled` says, on return, whether the timeline was
    /// signalled for this frame. Without semaphores it does nothing.
    ///
    /// # Safety
    ///
    /// `stream`, if given, is 1 (the legacy default stream), 2 (the
    /// per-thread default stream) or a stream of the ring's CUDA device that
    /// stays alive for the call.
    pub unsafe fn signal_released(
        &self,
        slot: u32,
        frame: u64,
        stream: Option<usize>,
        signalled: &mut bool,
    ) -> Result<(), cuda_interop::Error> {
        let Some(gpu) = &self.gpu else {
            return Ok(());
        };
        let released = &gpu.released[slot as usize];
        *signalled |= released.last_signalled() >= frame;
        if let (Some(h), false) = (stream, *signalled) {
            let via = gpu
                .release_stream
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // SAFETY: the caller's guarantee: `h` is a live stream of the
            // ring's device (or a default one) for the call.
            let result = unsafe { released.signal_raw_stream(h as _, frame, &via) };
            *signalled = released.last_signalled() >= frame;
            result?;
        }
        Ok(())
    }

    /// Marks `slot` free and sends the release of `frame` (with
    /// `gpu_signalled`: its "released" timeline is or will be signalled).
    /// The slot is free before the message goes (the producer cannot send a
    /// new frame for it before it gets the release, so another thread never
    /// finds it still held); if the send fails, it is held again. Does
    /// nothing once the connection is gone ([`Ring::is_gone`]).
    pub fn send_release(
        &self,
        slot: u32,
        frame: u64,
        gpu_signalled: bool,
    ) -> Result<(), SendError> {
        if self.is_gone() {
            return Ok(());
        }
        self.mark_released(slot, frame);
        match send_packet(&self.conn, &Packet::release(slot, frame, gpu_signalled)) {
            Ok(()) => Ok(()),
            // Closed meanwhile: the producer took the slot back.
            Err(_) if self.is_gone() => Ok(()),
            Err(e) => {
                self.mark_held(slot, frame);
                Err(e)
            }
        }
    }

    /// Marks `slot` free, if it holds `frame`.
    fn mark_released(&self, slot: u32, frame: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get_mut(slot as usize) {
            if *h == Some(frame) {
                *h = None;
            }
        }
    }

    /// Marks `slot` held by `frame` again: its release could not be sent.
    fn mark_held(&self, slot: u32, frame: u64) {
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
    pub fn held_count(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .flatten()
            .count()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_rings_of_every_supported_format_are_imported() {
        use vk_export::format::*;
        macro_rules! list {
            ($($format:ty),*) => {
                [$(<$format>::VK),*]
            };
        }
        let dispatched = image_formats!(list);
        for (format, name, _, _) in SUPPORTED {
            assert!(
                dispatched.contains(format),
                "{name} is not imported by image_slots"
            );
        }
        assert_eq!(dispatched.len(), SUPPORTED.len());
    }

    use super::*;

    fn pair() -> (Arc<Connection>, Connection) {
        let (a, b) = Connection::pair().expect("socketpair");
        (Arc::new(a), b)
    }

    fn soon() -> (Instant, Duration) {
        let timeout = Duration::from_secs(5);
        (deadline_after(timeout), timeout)
    }

    /// A ring of `n` slots over host memory (nothing reads it).
    fn host_ring(conn: Arc<Connection>, n: u32) -> Ring {
        let hello = Packet::hello(n, 4, 4, 16);
        let slots = (0..n)
            .map(|_| Slot {
                memory: SlotMemory::new(Arc::new(vec![0u8; 64])),
                data: 0,
                len: 64,
                image: None,
            })
            .collect();
        Ring::from_parts(conn, hello, slots, None)
    }

    #[test]
    fn packets_round_trip_over_a_socket() {
        let (a, b) = pair();
        send_packet(&b, &Packet::frame(2, 9, 0)).expect("send");
        let (deadline, timeout) = soon();
        assert_eq!(
            peek(&a, deadline, timeout).expect("peek"),
            NextMessage::Packet
        );
        assert_eq!(
            recv_packet(&a, deadline, timeout).expect("recv"),
            Packet::frame(2, 9, 0)
        );
    }

    #[test]
    fn recv_is_bounded_and_typed() {
        let (a, b) = pair();
        let timeout = Duration::from_millis(20);
        assert!(matches!(
            recv_packet(&a, deadline_after(timeout), timeout),
            Err(ConsumerError::Timeout(t)) if t == timeout
        ));
        rustix::net::send(b.as_fd(), b"CIFRshort", SendFlags::empty()).expect("send");
        let (deadline, timeout) = soon();
        assert!(matches!(
            recv_packet(&a, deadline, timeout),
            Err(ConsumerError::Packet(PacketError::Length(9)))
        ));
        rustix::net::send(b.as_fd(), b"CIVX", SendFlags::empty()).expect("send");
        assert_eq!(
            peek(&a, deadline, timeout).expect("peek"),
            NextMessage::Other
        );
        drop(b);
        // The wire message is still queued; past it, the end of the stream.
        let _ = rustix::net::recv(a.as_fd(), &mut [0u8; 8], RecvFlags::empty());
        assert!(matches!(
            recv_packet(&a, deadline, timeout),
            Err(ConsumerError::Closed)
        ));
    }

    #[test]
    fn frames_are_checked_and_held_until_released() {
        let (a, b) = pair();
        let ring = host_ring(a, 2);
        ring.accept_frame(&Packet::frame(0, 1, 0)).expect("frame 1");
        assert_eq!(ring.held_count(), 1);
        // Frame numbers go up; a held slot is not sent again; slots in range.
        assert!(matches!(
            ring.accept_frame(&Packet::frame(1, 1, 0)),
            Err(ConsumerError::Protocol(_))
        ));
        assert!(matches!(
            ring.accept_frame(&Packet::frame(0, 2, 0)),
            Err(ConsumerError::Protocol(m)) if m.contains("still holds frame 1")
        ));
        assert!(matches!(
            ring.accept_frame(&Packet::frame(2, 3, 0)),
            Err(ConsumerError::Protocol(_))
        ));
        assert!(matches!(
            ring.accept_frame(&Packet::hello(2, 4, 4, 16)),
            Err(ConsumerError::Protocol(_))
        ));
        ring.send_release(0, 1, false).expect("release");
        assert_eq!(ring.held_count(), 0);
        let (deadline, timeout) = soon();
        assert_eq!(
            recv_packet(&b, deadline, timeout).expect("the release"),
            Packet::release(0, 1, false)
        );
        // Without semaphores a signal does nothing.
        let mut signalled = false;
        // SAFETY: no stream is named.
        unsafe { ring.signal_released(0, 1, None, &mut signalled) }.expect("no-op");
        assert!(!signalled);
    }

    #[test]
    fn a_failed_release_holds_the_slot_again() {
        let (a, b) = pair();
        let ring = host_ring(a, 2);
        ring.accept_frame(&Packet::frame(1, 1, 0)).expect("frame");
        drop(b);
        assert!(matches!(
            ring.send_release(1, 1, false),
            Err(SendError::Failed(_))
        ));
        assert_eq!(ring.held_count(), 1);
    }

    #[test]
    fn break_off_gives_everything_back() {
        let (a, _b) = pair();
        let ring = host_ring(a, 3);
        ring.accept_frame(&Packet::frame(0, 1, 0)).expect("frame");
        ring.accept_frame(&Packet::frame(1, 2, 0)).expect("frame");
        assert!(!ring.is_gone());
        ring.break_off("first".into());
        ring.break_off("second".into());
        assert!(ring.is_gone());
        assert_eq!(ring.broken().as_deref(), Some("first"));
        assert_eq!(ring.held_count(), 0);
        // Releases after it do nothing (the producer took the slots back).
        ring.send_release(0, 1, false).expect("a no-op");
        assert!(matches!(
            ring.accept_frame(&Packet::frame(2, 3, 0)),
            Err(ConsumerError::GivenUp(why)) if why == "first"
        ));
    }

    #[test]
    fn receiving_lock_is_bounded() {
        let (a, _b) = pair();
        let ring = host_ring(a, 2);
        let guard = ring
            .lock_receiving(deadline_after(Duration::ZERO), Duration::ZERO)
            .expect("free");
        let timeout = Duration::from_millis(5);
        assert!(matches!(
            ring.lock_receiving(deadline_after(timeout), timeout),
            Err(ConsumerError::Busy(_))
        ));
        drop(guard);
    }

    #[test]
    fn connect_errors_are_typed() {
        let error = connect(
            "/nonexistent/cuda-interop-frames-test.sock",
            Duration::from_secs(1),
        )
        .expect_err("no such socket");
        assert!(matches!(
            error,
            ConsumerError::Connect {
                call: "connect",
                ..
            }
        ));
        assert!(error.to_string().starts_with(
            "cannot connect to /nonexistent/cuda-interop-frames-test.sock: connect failed:"
        ));
    }
}
