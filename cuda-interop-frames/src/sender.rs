//! The sender: a ring of exportable buffers, or of OPTIMAL exportable
//! images ([`ImageSender`]), on the application's Vulkan [`Context`] (its
//! own device through `Context::from_raw`, or a headless one), served to
//! any number of receivers over a Unix socket, found by name
//! ([`crate::discovery`]) or by path.
//!
//! # Contract
//!
//! * The application takes a free slot with [`Sender::acquire`] (a
//!   [`WriteSlot`] guard, which borrows the sender) and presents it with
//!   [`WriteSlot::present_with`]: the crate records the queue-family
//!   acquire, the application's commands, and the release to the external
//!   family in one submission that waits on the GPU for every receiver's
//!   "released" value of the slot and signals "produced" with the frame's
//!   sequence number. Sequence numbers go up by one per presented frame,
//!   from 1 (a frame whose submission timed out keeps its number and is not
//!   announced: receivers count the gap); each carries a `CLOCK_MONOTONIC`
//!   timestamp.
//! * Images ([`SlotResource`] says what a slot is): the application's
//!   commands get an [`ImageTarget`], the image in `GENERAL` owned by the
//!   command buffer's family (from `UNDEFINED` on its first frame, acquired
//!   from `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` after), and leave it in
//!   `GENERAL`; the release is to the external family in `GENERAL`, the
//!   layout CUDA uses and a Vulkan receiver acquires from.
//! * Work the crate does not record (another queue of the family: wgpu's,
//!   an engine's own submissions) writes an *opened* slot:
//!   [`WriteSlot::open`] submits the receivers' release waits and the
//!   acquire on its own and signals [`OpenSlot::ready`]; the application's
//!   submission waits for that value, writes the slot on a queue of
//!   [`OpenSlot::queue_family`] and signals a timeline of the context;
//!   [`OpenSlot::present`] waits for it on the GPU, releases, signals
//!   "produced" and announces the frame. A slot opened and dropped is
//!   released unnumbered.
//! * An image the application made itself (not exportable: a render
//!   target) is published by a GPU copy into the slot
//!   ([`WriteSlot::present_copy`] of a [`vk_export::SourceImage`], whose
//!   `unsafe` constructor is where the application states what only it
//!   knows of its image): same format by type, the extent checked, on the
//!   transfer queue where the source's sharing allows, the source left in
//!   its layout and with its owner.
//! * Frames are announced after their submission completed (the present
//!   waits for it, bounded), so a receiver without timelines is ordered by
//!   the frame packet.
//! * Delivery is each receiver's choice (see [`crate::protocol`]):
//!   *lossless* receivers get every frame and hold its slot until they
//!   release it; *latest* receivers get the newest frame when they ask. A
//!   receiver that has not subscribed within [`SUBSCRIBE_GRACE`] of
//!   connecting is served lossless (nothing is pushed to it before).
//! * GPU safety: a slot is written only when no receiver holds it, after
//!   every "released" value a receiver promised for it (a receiver that
//!   leaves with a promise outstanding keeps the slot blocked until the
//!   value is reached or [`SenderOptions::hold_timeout`] passes).
//! * Never unbounded, and latest receivers never make it wait: when no slot
//!   is free, [`Sender::acquire`] waits (up to its timeout) only if a slot
//!   is blocked by lossless receivers alone; otherwise it returns
//!   [`AcquireError::AllSlotsHeld`] at once and counts the frame as
//!   skipped. With `L` latest receivers each holding at most one frame, a
//!   ring of `L + 1` slots always has a free one. Frame packets are sent
//!   without blocking: a receiver whose socket is full is dropped. The
//!   socket threads' events wait in a queue of [`EVENT_QUEUE`] (a full
//!   queue holds back only the thread that posts), and a receiver has at
//!   most one acquire queued.
//! * A receiver that sends anything but its protocol's packets, releases a
//!   frame it does not hold, holds one longer than the hold timeout, or
//!   goes away is dropped; the others are not affected.
//! * Dropping the sender stops its threads (within [`POLL`]), disconnects
//!   every receiver, and removes its socket and directory entry; the
//!   buffers' own drops wait for their last GPU use.
//!
//! # Example
//!
//! A sender named `"cam"` on a headless context, filling each frame with
//! one colour, and a latest-mode receiver (in another process) that takes
//! frames by name:
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_interop_frames::discovery::{list_senders, Directory};
//! use cuda_interop_frames::receiver::{Delivery, FrameReceiver};
//! use cuda_interop_frames::sender::{monotonic_ns, Address, Sender, SenderOptions};
//! use vk_export::markers::DeviceLocal;
//! use vk_export::{Context, HeadlessOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The sender (its own `Context::from_raw` works the same way).
//! let ctx = Context::headless(&HeadlessOptions::default())?;
//! let address = Address::Named { directory: Directory::from_env()?, name: "cam".into() };
//! let mut sender = Sender::<DeviceLocal>::new(&ctx, SenderOptions::new(address, 1920, 1080, 4))?;
//! for _ in 0..100 {
//!     // Skipped frames (every slot held by latest receivers) just go on.
//!     let Ok(slot) = sender.acquire(Duration::from_millis(100)) else { continue };
//!     let size = slot.buffer().size();
//!     slot.present_with(monotonic_ns(), |device, cmd, buffer| {
//!         // SAFETY: the sender's command buffer, recording, and the slot's
//!         // buffer of `size` bytes, alive until the submission completes.
//!         unsafe { device.cmd_fill_buffer(cmd, buffer, 0, size, 0xff00_00ff) };
//!     })?;
//! }
//!
//! // A receiver, in another process: the newest frame each time it asks.
//! for s in list_senders()? {
//!     println!("{}: {}x{} {}, {:.0} frames/s", s.name, s.width, s.height, s.format, s.fps);
//! }
//! let directory = Directory::from_env()?;
//! let mut rx = FrameReceiver::connect_named(&directory, "cam", Delivery::Latest, Duration::from_secs(5))?;
//! let _ring = rx.take_setup(); // import it: consumer::Ring::import, or the frame_client example
//! let frame = rx.next_frame(Duration::from_secs(5))?;
//! println!("frame {} at {} ns, {} dropped before it", frame.sequence, frame.timestamp_ns, frame.dropped_before);
//! rx.release(frame, false)?; // true: its "released" timeline is signalled after GPU reads
//! # Ok(())
//! # }
//! ```

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{
    self, Receiver as EventReceiver, RecvTimeoutError, SyncSender as EventSender, TrySendError,
};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::SendFlags;
use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{usage, MemoryLocation, Optimal, Usage};
use vk_export::socket::{Connection, Exported, Listener};
use vk_export::{
    Context, ExportableBuffer, ExportableImage, ImageDesc, QueueRole, SourceImage, SubmitSync,
    TimelineSemaphore, WaitStrategy,
};

use crate::discovery::{Announcement, Directory, DiscoveryError, SenderInfo, SlotKind};
use crate::protocol::{self, Kind, Packet, PacketError, PACKET_LEN, SETUP_TAG};

/// How often the socket threads check whether to stop.
pub const POLL: Duration = Duration::from_millis(100);

/// Log lines a sender keeps until [`Sender::take_log`] takes them.
pub const LOG_LINES: usize = 1000;

/// Nanoseconds of `CLOCK_MONOTONIC` now: the clock of frame timestamps.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// Where receivers find the sender.
#[derive(Clone, Debug)]
pub enum Address {
    /// A name in a [`Directory`].
    Named {
        /// The directory.
        directory: Directory,
        /// The name ([`crate::discovery::validate_name`]).
        name: String,
    },
    /// A socket path (an existing file there is removed first).
    Path(PathBuf),
}

/// The ring and its service.
#[derive(Clone, Debug)]
pub struct SenderOptions {
    /// Where receivers find it.
    pub address: Address,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes from one row to the next (at least `width * 4`, a multiple of
    /// 4) of a buffer ring; an image ring ignores it (its hello gives the
    /// tightly packed row of its format).
    pub row_pitch: u64,
    /// Slots in the ring (2 to [`protocol::MAX_SLOTS`]).
    pub slots: u32,
    /// How long a receiver may hold a slot (or keep a GPU release waiting).
    pub hold_timeout: Duration,
    /// The queue the frames' submissions go to: [`QueueRole::Main`] for
    /// commands of any kind (the default), [`QueueRole::Transfer`] for
    /// transfer-only commands (copies, fills), which then run on the
    /// device's transfer-only queue where the context has one (no
    /// graphics-engine switch between the sender's work and CUDA's).
    pub queue: QueueRole,
    /// Share "produced" and "released" timelines (CUDA receivers need them;
    /// lavapipe exports none): without, frames are announced after their
    /// writes completed and a GPU-signalled release is a protocol error.
    pub semaphores: bool,
}

impl SenderOptions {
    /// A ring of `slots` RGBA8 frames of `width` x `height` with unpadded
    /// rows, a 5 s hold timeout, the main queue, with semaphores.
    pub fn new(address: Address, width: u32, height: u32, slots: u32) -> SenderOptions {
        SenderOptions {
            address,
            width,
            height,
            row_pitch: u64::from(width) * 4,
            slots,
            hold_timeout: Duration::from_secs(5),
            queue: QueueRole::Main,
            semaphores: true,
        }
    }

    /// The hello every receiver of a buffer ring gets (an image ring's is
    /// [`SlotResource::hello`]'s).
    pub fn hello(&self) -> Packet {
        Packet::hello(self.slots, self.width, self.height, self.row_pitch)
    }
}

/// Why the sender could not be made or run.
#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    /// The options are not a valid ring.
    #[error("bad sender options: {0}")]
    Options(String),
    /// The ring layout is not a valid one.
    #[error(transparent)]
    Layout(#[from] PacketError),
    /// Announcing or binding failed.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// A Vulkan call failed.
    #[error(transparent)]
    Vulkan(#[from] vk_export::Error),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Why [`Sender::acquire`] gave no slot.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// Every slot is held by latest receivers (or waits for a departed
    /// receiver's GPU): the frame is skipped (counted in
    /// [`SenderStats::skipped`]); try again for the next frame.
    #[error("every slot of the ring is held by a receiver: frame skipped")]
    AllSlotsHeld,
    /// Lossless receivers held every free-able slot for the whole timeout
    /// (their back-pressure); receivers that hold a slot past the hold
    /// timeout are dropped, so this ends.
    #[error("lossless receivers held every slot for {0:?}")]
    Timeout(Duration),
}

/// What the sender has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SenderStats {
    /// Frames presented.
    pub presented: u64,
    /// Frames skipped: [`AcquireError::AllSlotsHeld`].
    pub skipped: u64,
    /// Acquires that ended in [`AcquireError::Timeout`].
    pub backpressure_timeouts: u64,
    /// Receivers connected now.
    pub receivers: usize,
    /// Receivers served since the start.
    pub connected: u64,
    /// Receivers dropped for a fault (not counting clean departures).
    pub dropped: u64,
    /// Connections that could not be set up (gone before the ring was sent).
    pub refused: u64,
    /// Frames presented per second over the last second or so.
    pub fps: f64,
}

/// What the socket threads tell the sender.
enum Event {
    Connected(Connection),
    Packet { id: u64, packet: Packet },
    Gone { id: u64, why: String, fault: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Connected less than [`SUBSCRIBE_GRACE`] ago without a subscribe:
    /// nothing is pushed to it yet.
    Undecided,
    Lossless,
    Latest,
}

/// How long a new receiver's subscribe is waited for (frames are not
/// pushed to it meanwhile) before it is served lossless, the mode of
/// receivers that never subscribe (protocol v1's behaviour). The sender
/// never blocks on it.
pub const SUBSCRIBE_GRACE: Duration = Duration::from_millis(250);

/// One receiver.
struct Peer {
    id: u64,
    _conn: Connection,
    stream: UnixStream,
    mode: Mode,
    connected_at: Instant,
    /// Whether it sent anything (a subscribe must come first).
    spoke: bool,
    /// Latest mode: it asked for a frame.
    wants: bool,
    /// The last frame sent to it.
    last_sent: u64,
    released: Vec<TimelineSemaphore>,
    /// Per slot: the frame it holds and since when.
    held: Vec<Option<(u64, Instant)>>,
    /// Per slot: the "released" value its GPU signals.
    gpu_wait: Vec<Option<u64>>,
    reader: Option<JoinHandle<()>>,
    /// Tells its reader to stop (set before joining it).
    closed: Arc<AtomicBool>,
    /// Its reader's "an acquire is queued" flag, cleared when handled.
    acquire_queued: Arc<AtomicBool>,
    frames_sent: u64,
}

/// The "released" promises of a receiver that left: its slots stay blocked
/// until the values are reached or the hold timeout passes.
struct Orphan {
    released: Vec<TimelineSemaphore>,
    gpu_wait: Vec<Option<u64>>,
    since: Instant,
}

fn reached(semaphore: &TimelineSemaphore, value: u64) -> bool {
    semaphore.value().is_ok_and(|v| v >= value)
}

/// Events queued for the sender at most: a socket thread whose event does
/// not fit waits (its own thread only) until it does or it is told to stop.
pub const EVENT_QUEUE: usize = 1024;

/// Queues `event`, waiting while the queue is full; false when the sender
/// is gone or `stop` or `closed` is set.
fn post(
    events: &EventSender<Event>,
    mut event: Event,
    stop: &AtomicBool,
    closed: &AtomicBool,
) -> bool {
    loop {
        match events.try_send(event) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if stop.load(Ordering::Relaxed) || closed.load(Ordering::Relaxed) {
                    return false;
                }
                event = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// What a receiver's socket thread shares with the sender.
struct ReaderFlags {
    /// The sender stops.
    stop: Arc<AtomicBool>,
    /// The sender dropped this receiver.
    closed: Arc<AtomicBool>,
    /// An acquire of this receiver is queued already: another is the same
    /// request, and is not queued (a receiver cannot flood the queue).
    acquire_queued: Arc<AtomicBool>,
}

/// Reads one receiver's packets until it goes away or is stopped.
fn read_packets(id: u64, mut stream: UnixStream, events: EventSender<Event>, flags: ReaderFlags) {
    let (stop, closed) = (&*flags.stop, &*flags.closed);
    let (why, fault) = loop {
        if stop.load(Ordering::Relaxed) || closed.load(Ordering::Relaxed) {
            return;
        }
        let mut buf = [0u8; PACKET_LEN + 16];
        match stream.read(&mut buf) {
            Ok(0) => break ("disconnected".to_string(), false),
            Ok(n) => match Packet::decode(&buf[..n]) {
                Ok(packet) => {
                    if packet.kind == Kind::Acquire
                        && flags.acquire_queued.swap(true, Ordering::AcqRel)
                    {
                        continue;
                    }
                    if !post(&events, Event::Packet { id, packet }, stop, closed) {
                        return;
                    }
                }
                Err(e) => break (format!("sent a bad packet: {e}"), true),
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                break ("disconnected (connection reset)".to_string(), false)
            }
            Err(e) => break (format!("read failed: {e}"), true),
        }
    };
    post(&events, Event::Gone { id, why, fault }, stop, closed);
}

mod sealed {
    pub trait Sealed {}
    impl<M: vk_export::markers::MemoryLocation> Sealed for vk_export::ExportableBuffer<M> {}
    impl<F, M, U> Sealed for vk_export::ExportableImage<F, vk_export::markers::Optimal, M, U> {}
}

/// What a ring's slots are: [`ExportableBuffer`]s (pitched RGBA8 frames,
/// the default) or OPTIMAL [`ExportableImage`]s of one format and usage
/// ([`ImageSender`]). Sealed: the crate records each kind's ownership
/// barriers itself.
pub trait SlotResource<M: MemoryLocation>: Exported + sealed::Sealed + Sized {
    /// What [`WriteSlot::present_with`]'s closure records into.
    type Target: Copy;
    /// What discovery lists.
    const KIND: SlotKind;
    /// The hello of a ring of these slots for `opts`.
    fn hello(opts: &SenderOptions) -> Result<Packet, SenderError>;
    /// The format name discovery lists.
    fn format_name() -> String;
    /// One slot for `opts`.
    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError>;
    /// The closure's view of the slot, recorded on `family`.
    fn target(&self, family: u32) -> Self::Target;
    /// Records the slot's acquisition by `family`: from
    /// `VK_QUEUE_FAMILY_EXTERNAL` if `from_external` (it was released
    /// there by an earlier frame), else from nothing (its first frame).
    ///
    /// # Safety
    /// `cmd` is a command buffer of `device` in the recording state, for a
    /// queue of `family`; the slot outlives the commands.
    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    );
    /// Records the release of the slot by `family` to
    /// `VK_QUEUE_FAMILY_EXTERNAL`, after every earlier command's writes.
    ///
    /// # Safety
    /// As [`SlotResource::record_acquire`].
    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    );
}

/// The acquire and release stages and accesses of both kinds: full
/// barriers, as the crate's helpers use.
fn acquire_access() -> (vk::AccessFlags, vk::AccessFlags) {
    (
        vk::AccessFlags::empty(),
        vk::AccessFlags::MEMORY_WRITE | vk::AccessFlags::MEMORY_READ,
    )
}

impl<M: MemoryLocation> SlotResource<M> for ExportableBuffer<M> {
    type Target = vk::Buffer;
    const KIND: SlotKind = SlotKind::Buffer;

    fn hello(opts: &SenderOptions) -> Result<Packet, SenderError> {
        let hello = opts.hello();
        hello.check_layout()?;
        Ok(hello)
    }

    fn format_name() -> String {
        "rgba8".into()
    }

    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError> {
        let frame_bytes = opts.hello().frame_bytes().expect("a checked layout");
        let size = (u64::from(opts.height) * opts.row_pitch).max(frame_bytes);
        Ok(ExportableBuffer::<M>::new(ctx, size)?)
    }

    fn target(&self, _family: u32) -> vk::Buffer {
        self.raw()
    }

    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        if !from_external {
            return;
        }
        let (src, dst) = acquire_access();
        let barrier = buffer_barrier(self.raw(), vk::QUEUE_FAMILY_EXTERNAL, family, src, dst);
        // SAFETY: the caller's recording command buffer; the buffer is alive.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[],
                &[barrier],
                &[],
            )
        };
    }

    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        let barrier = buffer_barrier(
            self.raw(),
            family,
            vk::QUEUE_FAMILY_EXTERNAL,
            vk::AccessFlags::MEMORY_WRITE,
            vk::AccessFlags::empty(),
        );
        // SAFETY: as in record_acquire.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                vk::DependencyFlags::empty(),
                &[],
                &[barrier],
                &[],
            )
        };
    }
}

fn buffer_barrier(
    buffer: vk::Buffer,
    src_family: u32,
    dst_family: u32,
    src_access: vk::AccessFlags,
    dst_access: vk::AccessFlags,
) -> vk::BufferMemoryBarrier<'static> {
    vk::BufferMemoryBarrier::default()
        .src_access_mask(src_access)
        .dst_access_mask(dst_access)
        .src_queue_family_index(src_family)
        .dst_queue_family_index(dst_family)
        .buffer(buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE)
}

/// The slot an image ring's [`WriteSlot::present_with`] closure records
/// into: when the closure runs, `image` is owned by `queue_family` (the
/// family of the command buffer) in `VK_IMAGE_LAYOUT_GENERAL`, every earlier
/// access to it is done, and the closure must leave it in `GENERAL` (its
/// own barriers may move it to other layouts in between). The crate then
/// releases it to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTarget {
    /// The slot's image: one level, one layer, colour.
    pub image: vk::Image,
    /// The family of the queue the commands run on.
    pub queue_family: u32,
}

/// A sender of a ring of OPTIMAL images of format `F` in memory `M` with
/// usage `U` (default: storage and sampled, which CUDA surfaces and
/// textures need; every preset has transfer source and destination, which
/// Vulkan receivers' read-backs need).
pub type ImageSender<F, M, U = usage::Storage> = Sender<M, ExportableImage<F, Optimal, M, U>>;

fn image_barrier(
    image: vk::Image,
    (old, new): (vk::ImageLayout, vk::ImageLayout),
    (src_family, dst_family): (u32, u32),
    (src_access, dst_access): (vk::AccessFlags, vk::AccessFlags),
) -> vk::ImageMemoryBarrier<'static> {
    vk::ImageMemoryBarrier::default()
        .src_access_mask(src_access)
        .dst_access_mask(dst_access)
        .old_layout(old)
        .new_layout(new)
        .src_queue_family_index(src_family)
        .dst_queue_family_index(dst_family)
        .image(image)
        .subresource_range(vk::ImageSubresourceRange {
            aspect_mask: vk::ImageAspectFlags::COLOR,
            base_mip_level: 0,
            level_count: vk::REMAINING_MIP_LEVELS,
            base_array_layer: 0,
            layer_count: vk::REMAINING_ARRAY_LAYERS,
        })
}

impl<F: Format, M: MemoryLocation, U: Usage> SlotResource<M> for ExportableImage<F, Optimal, M, U> {
    type Target = ImageTarget;
    const KIND: SlotKind = SlotKind::Image;

    fn hello(opts: &SenderOptions) -> Result<Packet, SenderError> {
        let hello = Packet::image_hello(
            opts.slots,
            opts.width,
            opts.height,
            F::VK.as_raw() as u32,
            F::TEXEL_BYTES,
        );
        hello.check_layout()?;
        Ok(hello)
    }

    fn format_name() -> String {
        F::NAME.to_ascii_lowercase()
    }

    fn create(ctx: &Context, opts: &SenderOptions) -> Result<Self, SenderError> {
        Ok(ExportableImage::new(
            ctx,
            ImageDesc::new_2d(opts.width, opts.height),
        )?)
    }

    fn target(&self, family: u32) -> ImageTarget {
        ImageTarget {
            image: self.raw(),
            queue_family: family,
        }
    }

    unsafe fn record_acquire(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
        from_external: bool,
    ) {
        // Its first frame: from UNDEFINED (nothing to keep), no transfer;
        // later ones: acquired from the external family in GENERAL, the
        // layout every release (the sender's, a Vulkan receiver's) leaves.
        let (layouts, families) = if from_external {
            (
                (vk::ImageLayout::GENERAL, vk::ImageLayout::GENERAL),
                (vk::QUEUE_FAMILY_EXTERNAL, family),
            )
        } else {
            (
                (vk::ImageLayout::UNDEFINED, vk::ImageLayout::GENERAL),
                (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
            )
        };
        let barrier = image_barrier(self.raw(), layouts, families, acquire_access());
        // SAFETY: the caller's recording command buffer; the image is alive.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[],
                &[],
                &[barrier],
            )
        };
    }

    unsafe fn record_release(
        &self,
        device: &vk_export::ash::Device,
        cmd: vk::CommandBuffer,
        family: u32,
    ) {
        let general = vk::ImageLayout::GENERAL;
        let barrier = image_barrier(
            self.raw(),
            (general, general),
            (family, vk::QUEUE_FAMILY_EXTERNAL),
            (vk::AccessFlags::MEMORY_WRITE, vk::AccessFlags::empty()),
        );
        // SAFETY: as in record_acquire.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                vk::DependencyFlags::empty(),
                &[],
                &[],
                &[barrier],
            )
        };
    }
}

/// A frame sender (see the module contract).
pub struct Sender<M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    ctx: Context,
    opts: SenderOptions,
    hello: Packet,
    slots: Vec<R>,
    _memory: std::marker::PhantomData<M>,
    produced: Option<TimelineSemaphore>,
    /// What [`WriteSlot::open`] signals (local, made on first use), and its
    /// last value.
    opened: Option<TimelineSemaphore>,
    opened_value: u64,
    peers: Vec<Peer>,
    orphans: Vec<Orphan>,
    next_id: u64,
    events_tx: EventSender<Event>,
    events: EventReceiver<Event>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    announcement: Option<Announcement>,
    socket: PathBuf,
    released_to_external: Vec<bool>,
    /// The newest presented frame: `(slot, frame, timestamp)`.
    newest: Option<(u32, u64, u64)>,
    next_slot: u32,
    stats: SenderStats,
    fps_window: (Instant, u64),
    log: Vec<String>,
}

impl<M: MemoryLocation, R: SlotResource<M>> Sender<M, R> {
    /// Makes the ring on `ctx`, binds its socket (announcing it by name if
    /// the address is a name) and starts accepting receivers.
    pub fn new(ctx: &Context, opts: SenderOptions) -> Result<Self, SenderError> {
        if opts.slots < 2 {
            return Err(SenderError::Options("at least 2 slots are needed".into()));
        }
        let hello = R::hello(&opts)?;
        if opts.semaphores && !ctx.supports_semaphore_fds() {
            return Err(SenderError::Options(
                "this Vulkan device exports no semaphores (VK_KHR_external_semaphore_fd): \
                 set SenderOptions::semaphores to false (then CUDA receivers refuse the ring)"
                    .into(),
            ));
        }
        let slots = (0..opts.slots)
            .map(|_| R::create(ctx, &opts))
            .collect::<Result<Vec<_>, _>>()?;
        let produced = if opts.semaphores {
            Some(TimelineSemaphore::new(ctx)?)
        } else {
            None
        };
        let (listener, announcement) = match &opts.address {
            Address::Named { directory, name } => {
                let info = SenderInfo {
                    name: name.clone(),
                    width: opts.width,
                    height: opts.height,
                    row_pitch: hello.row_pitch,
                    format: R::format_name(),
                    kind: R::KIND,
                    slots: opts.slots,
                    fps: 0.0,
                    pid: 0,
                    socket: PathBuf::new(),
                };
                let (l, a) = directory.announce(info)?;
                (l, Some(a))
            }
            Address::Path(path) => {
                let _ = std::fs::remove_file(path);
                (Listener::bind(path)?, None)
            }
        };
        let socket = listener.path().to_owned();
        let (events_tx, events) = mpsc::sync_channel(EVENT_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (tx, stop) = (events_tx.clone(), stop.clone());
            std::thread::spawn(move || accept_loop(listener, tx, stop))
        };
        Ok(Sender {
            ctx: ctx.clone(),
            released_to_external: vec![false; opts.slots as usize],
            opts,
            hello,
            slots,
            _memory: std::marker::PhantomData,
            produced,
            opened: None,
            opened_value: 0,
            peers: Vec::new(),
            orphans: Vec::new(),
            next_id: 1,
            events_tx,
            events,
            stop,
            acceptor: Some(acceptor),
            announcement,
            socket,
            newest: None,
            next_slot: 0,
            stats: SenderStats::default(),
            fps_window: (Instant::now(), 0),
            log: Vec::new(),
        })
    }

    /// The socket receivers connect to.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The options it was made with.
    pub fn options(&self) -> &SenderOptions {
        &self.opts
    }

    /// The hello receivers get (the ring's layout).
    pub fn layout(&self) -> &Packet {
        &self.hello
    }

    /// The ring's buffers or images, slot by slot (record into them only in
    /// [`WriteSlot::present_with`]: the crate's own helpers would not know
    /// their ownership).
    pub fn resources(&self) -> &[R] {
        &self.slots
    }

    /// What it has done so far.
    pub fn stats(&self) -> SenderStats {
        SenderStats {
            receivers: self.peers.len(),
            ..self.stats
        }
    }

    /// Keeps a log line; only the last [`LOG_LINES`] are kept.
    fn note(&mut self, line: String) {
        if self.log.len() >= LOG_LINES {
            self.log.remove(0);
        }
        self.log.push(line);
    }

    /// Takes the lines it logged since the last call: `receiver N
    /// connected`, `receiver N left after F frames (why)`, and setup
    /// failures.
    pub fn take_log(&mut self) -> Vec<String> {
        std::mem::take(&mut self.log)
    }

    /// Serves receivers (connections, requests, releases) for up to
    /// `timeout`, returning early after the first event; [`Sender::acquire`]
    /// does this too. Useful while not presenting.
    pub fn serve(&mut self, timeout: Duration) {
        match self.events.recv_timeout(timeout) {
            Ok(event) => self.handle(event),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        self.pump();
    }

    /// Handles every queued event, and drops receivers that held a slot
    /// past the hold timeout.
    fn pump(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            self.handle(event);
        }
        self.drop_stuck();
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Connected(conn) => {
                if let Err(e) = self.add(conn) {
                    self.stats.refused += 1;
                    self.note(format!("a receiver could not be set up: {e}"));
                }
            }
            Event::Packet { id, packet } => self.on_packet(id, packet),
            Event::Gone { id, why, fault } => self.remove(id, &why, fault),
        }
    }

    fn add(&mut self, conn: Connection) -> Result<(), SenderError> {
        let id = self.next_id;
        self.next_id += 1;
        let n = self.opts.slots as usize;
        let released = (0..if self.produced.is_some() { n } else { 0 })
            .map(|_| TimelineSemaphore::new(&self.ctx))
            .collect::<vk_export::Result<Vec<_>>>()?;
        let stream = UnixStream::from(conn.as_fd().try_clone_to_owned()?);
        stream.set_read_timeout(Some(POLL))?;
        send_now(&stream, &self.hello)?;
        let mut resources: Vec<&dyn Exported> = Vec::with_capacity(2 * n + 1);
        resources.extend(self.slots.iter().map(|b| b as &dyn Exported));
        if let Some(produced) = &self.produced {
            resources.push(produced);
        }
        resources.extend(released.iter().map(|s| s as &dyn Exported));
        // Bounded by the connection's send timeout; the message is small
        // next to a socket's buffer, so only a peer gone wrong waits here.
        conn.set_send_timeout(Duration::from_secs(1))?;
        conn.send_exported(SETUP_TAG, &resources)?;
        // A receiver subscribes right after connecting, so its subscribe
        // is almost always here already: taken now, no frame is pushed to
        // a latest receiver as if it were lossless. (If it comes later,
        // the frames pushed meanwhile are ones it holds and releases.)
        let mut early = [0u8; PACKET_LEN + 16];
        let first = match rustix::net::recv(&stream, &mut early, rustix::net::RecvFlags::DONTWAIT) {
            Ok((n, _)) if n > 0 => Some(Packet::decode(&early[..n.min(early.len())])),
            _ => None,
        };
        let (closed, acquire_queued) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let reader = {
            let (stream, events) = (stream.try_clone()?, self.events_tx.clone());
            let flags = ReaderFlags {
                stop: self.stop.clone(),
                closed: closed.clone(),
                acquire_queued: acquire_queued.clone(),
            };
            std::thread::spawn(move || read_packets(id, stream, events, flags))
        };
        self.peers.push(Peer {
            id,
            _conn: conn,
            stream,
            mode: Mode::Undecided,
            connected_at: Instant::now(),
            spoke: false,
            wants: false,
            last_sent: 0,
            released,
            held: vec![None; n],
            gpu_wait: vec![None; n],
            reader: Some(reader),
            closed,
            acquire_queued,
            frames_sent: 0,
        });
        self.stats.connected += 1;
        self.note(format!("receiver {id} connected"));
        match first {
            Some(Ok(packet)) => self.on_packet(id, packet),
            Some(Err(e)) => self.remove(id, &format!("sent a bad packet: {e}"), true),
            None => {}
        }
        Ok(())
    }

    fn remove(&mut self, id: u64, why: &str, fault: bool) {
        let Some(i) = self.peers.iter().position(|p| p.id == id) else {
            return;
        };
        let mut peer = self.peers.swap_remove(i);
        peer.closed.store(true, Ordering::Relaxed);
        let _ = peer.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = peer.reader.take() {
            let _ = r.join();
        }
        let pending = peer
            .gpu_wait
            .iter()
            .enumerate()
            .any(|(s, w)| w.is_some_and(|v| !reached(&peer.released[s], v)));
        if pending {
            self.orphans.push(Orphan {
                released: std::mem::take(&mut peer.released),
                gpu_wait: std::mem::take(&mut peer.gpu_wait),
                since: Instant::now(),
            });
        }
        if fault {
            self.stats.dropped += 1;
        }
        let frames = peer.frames_sent;
        self.note(format!("receiver {id} left after {frames} frames ({why})"));
    }

    fn on_packet(&mut self, id: u64, packet: Packet) {
        let newest = self.newest;
        let Some(peer) = self.peers.iter_mut().find(|p| p.id == id) else {
            return;
        };
        let first = !peer.spoke;
        peer.spoke = true;
        let fault: Option<(String, bool)> = match packet.kind {
            Kind::Subscribe if first => {
                peer.mode = if packet.flags == protocol::MODE_LATEST {
                    Mode::Latest
                } else {
                    Mode::Lossless
                };
                None
            }
            Kind::Subscribe => Some(("subscribed twice (or after its first request)".into(), true)),
            Kind::Acquire if peer.mode == Mode::Latest => {
                peer.acquire_queued.store(false, Ordering::Release);
                peer.wants = true;
                if let Some((slot, frame, ts)) = newest.filter(|n| n.1 > peer.last_sent) {
                    send_frame(peer, slot, frame, ts).err()
                } else {
                    None
                }
            }
            Kind::Acquire => Some((
                "asked for a frame, but it is a lossless receiver".into(),
                true,
            )),
            Kind::Release => {
                let slot = packet.slot as usize;
                match peer.held.get(slot).copied().flatten() {
                    Some(_)
                        if packet.flags & protocol::RELEASE_GPU_SIGNALLED != 0
                            && peer.released.is_empty() =>
                    {
                        Some((
                            "released with a GPU signal, but this ring has no semaphores".into(),
                            true,
                        ))
                    }
                    Some((held, _)) if held == packet.frame => {
                        peer.held[slot] = None;
                        peer.gpu_wait[slot] = (packet.flags & protocol::RELEASE_GPU_SIGNALLED != 0)
                            .then_some(packet.frame);
                        None
                    }
                    _ => Some((
                        format!(
                            "released frame {} of slot {slot}, which it does not hold",
                            packet.frame
                        ),
                        true,
                    )),
                }
            }
            other => Some((
                format!("sent a {other:?} packet, which only senders send"),
                true,
            )),
        };
        if let Some((why, fault)) = fault {
            self.remove(id, &why, fault);
        }
    }

    fn drop_stuck(&mut self) {
        let limit = self.opts.hold_timeout;
        let stuck: Vec<(u64, u64)> = self
            .peers
            .iter()
            .filter_map(|p| {
                p.held
                    .iter()
                    .flatten()
                    .find(|(_, since)| since.elapsed() > limit)
                    .map(|(frame, _)| (p.id, *frame))
            })
            .collect();
        for (id, frame) in stuck {
            self.remove(
                id,
                &format!("held frame {frame} longer than {limit:?}"),
                true,
            );
        }
        self.orphans.retain(|o| {
            o.since.elapsed() < limit
                && o.gpu_wait
                    .iter()
                    .enumerate()
                    .any(|(s, w)| w.is_some_and(|v| !reached(&o.released[s], v)))
        });
    }

    /// What keeps `slot` from being written: `None` if nothing; else
    /// whether lossless receivers alone hold it (worth waiting for).
    fn blocked(&self, slot: usize) -> Option<bool> {
        let orphaned = self
            .orphans
            .iter()
            .any(|o| o.gpu_wait[slot].is_some_and(|v| !reached(&o.released[slot], v)));
        let holders: Vec<Mode> = self
            .peers
            .iter()
            .filter(|p| p.held[slot].is_some())
            .map(|p| p.mode)
            .collect();
        if holders.is_empty() && !orphaned {
            None
        } else {
            Some(!orphaned && holders.iter().all(|m| *m != Mode::Latest))
        }
    }

    /// Whether every GPU release of `slot` has been reached already.
    fn releases_reached(&self, slot: usize) -> bool {
        self.peers
            .iter()
            .all(|p| p.gpu_wait[slot].is_none_or(|v| reached(&p.released[slot], v)))
    }

    /// A free slot (preferring one whose GPU releases are done), or whether
    /// waiting could give one.
    fn pick(&self) -> Result<u32, bool> {
        let n = self.opts.slots;
        let order = (0..n).map(|i| (self.next_slot + i) % n);
        let free: Vec<u32> = order
            .clone()
            .filter(|&s| self.blocked(s as usize).is_none())
            .collect();
        if let Some(&s) = free
            .iter()
            .find(|&&s| self.releases_reached(s as usize))
            .or(free.first())
        {
            return Ok(s);
        }
        Err(order
            .into_iter()
            .any(|s| self.blocked(s as usize) == Some(true)))
    }

    /// A slot to write the next frame into (see the module contract):
    /// waits up to `timeout` only for lossless receivers' releases.
    pub fn acquire(&mut self, timeout: Duration) -> Result<WriteSlot<'_, M, R>, AcquireError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.pump();
            match self.pick() {
                Ok(slot) => {
                    // Its old frame is no longer one to hand out.
                    if self.newest.is_some_and(|n| n.0 == slot) {
                        self.newest = None;
                    }
                    return Ok(WriteSlot { sender: self, slot });
                }
                Err(false) => {
                    self.stats.skipped += 1;
                    return Err(AcquireError::AllSlotsHeld);
                }
                Err(true) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.stats.backpressure_timeouts += 1;
                        return Err(AcquireError::Timeout(timeout));
                    }
                    if let Ok(event) = self.events.recv_timeout(left.min(POLL)) {
                        self.handle(event);
                    }
                }
            }
        }
    }

    /// Host-waits (bounded) for the receivers' GPU releases of slot `s`
    /// promised so far; a receiver whose GPU never signals is dropped here,
    /// not left to stall the queue.
    fn drop_late_releasers(&mut self, s: usize) {
        let mut late = Vec::new();
        for p in &self.peers {
            if let Some(v) = p.gpu_wait[s] {
                if let Err(e) =
                    p.released[s].wait(v, self.opts.hold_timeout, WaitStrategy::ADAPTIVE)
                {
                    late.push((
                        p.id,
                        format!("its GPU release of frame {v} did not arrive: {e}"),
                    ));
                }
            }
        }
        for (id, why) in late {
            self.remove(id, &why, true);
        }
    }

    /// A submission's sync that waits on the GPU for the receivers' promised
    /// releases of slot `s`, with the sender's bound.
    fn release_waits<'p>(peers: &'p [Peer], s: usize, hold_timeout: Duration) -> SubmitSync<'p> {
        let mut sync = SubmitSync::new().timeout(hold_timeout.max(Duration::from_secs(5)));
        for p in peers {
            if let Some(v) = p.gpu_wait[s] {
                sync = sync.wait_timeline(&p.released[s], v);
            }
        }
        sync
    }

    /// Presents `slot`: `record`'s commands on `role`'s queue (after a GPU
    /// wait for `wait`, if given) between the slot's ownership barriers.
    fn present(
        &mut self,
        slot: u32,
        timestamp_ns: u64,
        role: QueueRole,
        wait: Option<(&TimelineSemaphore, u64)>,
        record: impl FnOnce(&vk_export::ash::Device, vk::CommandBuffer, R::Target),
    ) -> Result<u64, SenderError> {
        let s = slot as usize;
        let f = self.stats.presented + 1;
        self.drop_late_releasers(s);
        let mut sync = Self::release_waits(&self.peers, s, self.opts.hold_timeout);
        if let Some((semaphore, value)) = wait {
            sync = sync.wait_timeline(semaphore, value);
        }
        if let Some(produced) = &self.produced {
            sync = sync.signal_timeline(produced, f);
        }
        let resource = &self.slots[s];
        let from_external = self.released_to_external[s];
        let presented = self
            .ctx
            .submit_and_wait_on(role, sync, |device, cmd, family| {
                // SAFETY: recording into the command buffer submit_and_wait
                // gave, for a queue of `family`; the slot lives in
                // `self.slots` for the sender's life and submit_and_wait
                // waits for the commands (a timeout leaves them pending and
                // the slot's drop waits for them).
                unsafe { resource.record_acquire(device, cmd, family, from_external) };
                record(device, cmd, resource.target(family));
                // SAFETY: as above.
                unsafe { resource.record_release(device, cmd, family) };
            });
        self.submitted(s, f, &presented);
        presented?;
        self.announce(slot, f, timestamp_ns);
        Ok(f)
    }

    /// After a present-like submission of frame `f` into slot `s`: one that
    /// was submitted (it completed, or timed out and still runs) released
    /// the slot and signals "produced" with `f`, so the slot counts as
    /// released and `f` as used (numbered, never announced after a timeout:
    /// receivers see the gap), and no later frame signals `f` again.
    fn submitted(&mut self, s: usize, f: u64, outcome: &Result<(), vk_export::Error>) {
        if outcome.is_ok() || matches!(outcome, Err(vk_export::Error::Timeout(_))) {
            self.released_to_external[s] = true;
            self.stats.presented = self.stats.presented.max(f);
        }
    }

    /// Opens `slot` for the application's own submissions on a queue of
    /// `role`'s family: the receivers' releases waited for and the acquire
    /// recorded in one submission, waited for (bounded), which signals the
    /// returned value of the sender's "opened" timeline.
    fn open(&mut self, slot: u32, role: QueueRole) -> Result<u64, SenderError> {
        let s = slot as usize;
        self.drop_late_releasers(s);
        if self.opened.is_none() {
            self.opened = Some(TimelineSemaphore::new_local(&self.ctx)?);
        }
        let value = self.opened_value + 1;
        let opened = self.opened.as_ref().expect("made above");
        let sync = Self::release_waits(&self.peers, s, self.opts.hold_timeout)
            .signal_timeline(opened, value);
        let resource = &self.slots[s];
        let from_external = self.released_to_external[s];
        let opened = self
            .ctx
            .submit_and_wait_on(role, sync, |device, cmd, family| {
                // SAFETY: as in `present`: the sender's command buffer for a
                // queue of `family`, the slot alive beyond the submission.
                unsafe { resource.record_acquire(device, cmd, family, from_external) };
            });
        // Submitted (a timeout too: it still runs): the value is used, and
        // the slot is owned by the family now (in GENERAL for an image),
        // not external; a later frame's acquire starts from UNDEFINED.
        if opened.is_ok() || matches!(opened, Err(vk_export::Error::Timeout(_))) {
            self.opened_value = value;
            self.released_to_external[s] = false;
        }
        opened?;
        Ok(value)
    }

    /// Releases an opened `slot` to the external family on `role`'s queue
    /// after a GPU wait for `written` (if given), signalling "produced"
    /// with the next frame number when `frame` is `Some`.
    fn close(
        &mut self,
        slot: u32,
        role: QueueRole,
        written: Option<(&TimelineSemaphore, u64)>,
        frame: Option<u64>,
    ) -> Result<(), SenderError> {
        let s = slot as usize;
        let mut sync =
            SubmitSync::new().timeout(self.opts.hold_timeout.max(Duration::from_secs(5)));
        if let Some((semaphore, value)) = written {
            sync = sync.wait_timeline(semaphore, value);
        }
        if let (Some(produced), Some(f)) = (&self.produced, frame) {
            sync = sync.signal_timeline(produced, f);
        }
        let resource = &self.slots[s];
        let closed = self
            .ctx
            .submit_and_wait_on(role, sync, |device, cmd, family| {
                // SAFETY: as in `present`; the slot was acquired for
                // `family` by `open` (same role, same family).
                unsafe { resource.record_release(device, cmd, family) };
            });
        // A timeout is a submitted release that has not completed: it still
        // runs, so the slot counts as released (never released twice), and
        // a frame's number as used.
        if closed.is_ok() || matches!(closed, Err(vk_export::Error::Timeout(_))) {
            self.released_to_external[s] = true;
            if let Some(f) = frame {
                self.submitted(s, f, &closed);
            }
        }
        Ok(closed?)
    }

    /// After frame `f` of `slot` completed: the sender's bookkeeping, and
    /// the frame packet to each receiver it is due to.
    fn announce(&mut self, slot: u32, f: u64, timestamp_ns: u64) {
        self.stats.presented = f;
        self.newest = Some((slot, f, timestamp_ns));
        self.next_slot = (slot + 1) % self.opts.slots;
        let mut faults = Vec::new();
        for p in &mut self.peers {
            if p.mode == Mode::Undecided && p.connected_at.elapsed() >= SUBSCRIBE_GRACE {
                p.mode = Mode::Lossless;
            }
            let due = match p.mode {
                Mode::Undecided => false,
                Mode::Lossless => true,
                Mode::Latest => p.wants,
            };
            if due {
                if let Err((why, fault)) = send_frame(p, slot, f, timestamp_ns) {
                    faults.push((p.id, why, fault));
                }
            }
        }
        for (id, why, fault) in faults {
            self.remove(id, &why, fault);
        }
        self.update_fps();
    }

    fn update_fps(&mut self) {
        let (since, at) = self.fps_window;
        let elapsed = since.elapsed();
        if elapsed >= Duration::from_secs(1) {
            self.stats.fps = (self.stats.presented - at) as f64 / elapsed.as_secs_f64();
            self.fps_window = (Instant::now(), self.stats.presented);
            if let Some(a) = &mut self.announcement {
                if let Err(e) = a.set_fps(self.stats.fps) {
                    self.note(format!("the directory entry could not be updated: {e}"));
                }
            }
        }
    }
}

impl<M: MemoryLocation> Sender<M, ExportableBuffer<M>> {
    /// The ring's buffers, slot by slot ([`Sender::resources`]).
    pub fn buffers(&self) -> &[ExportableBuffer<M>] {
        &self.slots
    }
}

impl<F: Format, M: MemoryLocation, U: Usage> ImageSender<F, M, U> {
    /// The ring's images, slot by slot ([`Sender::resources`]).
    pub fn images(&self) -> &[ExportableImage<F, Optimal, M, U>] {
        &self.slots
    }
}

/// Sends `packet` without waiting for room (`EAGAIN` is an error: the
/// receiver stopped reading far beyond what the protocol lets it).
fn send_now(stream: &UnixStream, packet: &Packet) -> std::io::Result<()> {
    let bytes = packet.encode();
    match rustix::net::send(stream, &bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(std::io::Error::other(format!(
            "sent {n} of {} bytes",
            bytes.len()
        ))),
        Err(Errno::AGAIN) => Err(std::io::Error::other(
            "its socket is full: it stopped reading",
        )),
        Err(e) => Err(e.into()),
    }
}

/// Sends frame `frame` of `slot` to `peer` and marks it held there; on
/// failure, why and whether it is the peer's fault (a full socket) rather
/// than a departure (`EPIPE`, `ECONNRESET`).
fn send_frame(peer: &mut Peer, slot: u32, frame: u64, ts: u64) -> Result<(), (String, bool)> {
    send_now(&peer.stream, &Packet::frame(slot, frame, ts)).map_err(|e| {
        let gone = matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        );
        (format!("a frame packet could not be sent: {e}"), !gone)
    })?;
    peer.held[slot as usize] = Some((frame, Instant::now()));
    peer.frames_sent += 1;
    peer.last_sent = frame;
    peer.wants = false;
    Ok(())
}

fn accept_loop(listener: Listener, tx: EventSender<Event>, stop: Arc<AtomicBool>) {
    let never = AtomicBool::new(false);
    while !stop.load(Ordering::Relaxed) {
        // A timeout, or a peer refused (another user): keep listening.
        if let Ok(conn) = listener.accept(POLL) {
            if !post(&tx, Event::Connected(conn), &stop, &never) {
                return;
            }
        }
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> Drop for Sender<M, R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let ids: Vec<u64> = self.peers.iter().map(|p| p.id).collect();
        for id in ids {
            self.remove(id, "the sender stops", false);
        }
        // Connections accepted but not yet handled close with the channel.
        while self.events.try_recv().is_ok() {}
        self.announcement = None;
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> std::fmt::Debug for Sender<M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("socket", &self.socket)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> std::fmt::Debug for WriteSlot<'_, M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSlot")
            .field("slot", &self.slot)
            .finish()
    }
}

/// A slot taken for writing the next frame; [`WriteSlot::present_with`]
/// publishes it. Dropped unpresented, the slot stays free.
pub struct WriteSlot<'a, M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    sender: &'a mut Sender<M, R>,
    slot: u32,
}

impl<M: MemoryLocation> WriteSlot<'_, M, ExportableBuffer<M>> {
    /// The slot's buffer.
    pub fn buffer(&self) -> &ExportableBuffer<M> {
        &self.sender.slots[self.slot as usize]
    }
}

impl<F: Format, M: MemoryLocation, U: Usage> WriteSlot<'_, M, ExportableImage<F, Optimal, M, U>> {
    /// The slot's image.
    pub fn image(&self) -> &ExportableImage<F, Optimal, M, U> {
        &self.sender.slots[self.slot as usize]
    }

    /// Publishes an image the application made without external memory
    /// (a render target: binding exportable memory to it after the fact
    /// would give another layout, garbled pixels) by a GPU copy into the
    /// slot: `vkCmdCopyImage` from `source` (its format is the ring's, by
    /// type; its region at its offset is the ring's extent, checked before
    /// anything is recorded), between the slot's ownership barriers, on the
    /// transfer queue for a `CONCURRENT` source, one the transfer family
    /// owns, or one the application released to it
    /// ([`vk_export::SourceSharing::ReleasedToTransfer`]: the crate
    /// records the acquire and the release back), else on the main queue
    /// of the family that owns it ([`SourceImage::check_copy`]); after a GPU wait for `wait`'s timeline
    /// value if given (the application's rendering signals it), and
    /// leaving the source in its layout. Then as
    /// [`WriteSlot::present_with`]: waits for the copy (bounded), announces
    /// the frame, returns its sequence number. A refused copy
    /// ([`SenderError::Vulkan`] with [`vk_export::Error::InvalidArgument`])
    /// leaves the slot free and the frame unnumbered.
    pub fn present_copy(
        self,
        timestamp_ns: u64,
        source: &SourceImage<F>,
        wait: Option<(&TimelineSemaphore, u64)>,
    ) -> Result<u64, SenderError> {
        let extent = [self.sender.opts.width, self.sender.opts.height];
        let role = source.check_copy(&self.sender.ctx, extent)?;
        self.sender.present(
            self.slot,
            timestamp_ns,
            role,
            wait,
            |device, cmd, target| {
                // SAFETY: check_copy returned `role` for this extent, and
                // this is the recording command buffer of that role's queue
                // (of `target.queue_family`); the slot's image is the
                // sender's, of format F with transfer usage (every preset),
                // of `extent`, in GENERAL owned by that family between the
                // acquire and release barriers around this closure, and it
                // outlives the submission (the sender's slots do; a timed-out
                // one is waited for by their drops); the source's facts are
                // `SourceImage::new`'s contract.
                unsafe {
                    source.record_copy_to(device, cmd, target.queue_family, target.image, extent)
                }
            },
        )
    }
}

impl<'a, M: MemoryLocation, R: SlotResource<M>> WriteSlot<'a, M, R> {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The sequence number the frame gets when presented.
    pub fn sequence(&self) -> u64 {
        self.sender.stats.presented + 1
    }

    /// Records `record`'s commands (given the device, the command buffer
    /// and the slot: its buffer, or an [`ImageTarget`] for an image ring)
    /// between the crate's ownership barriers,
    /// submits them (waiting on the GPU for receivers' releases of the slot),
    /// waits for them (bounded), and announces the frame with
    /// `timestamp_ns` ([`monotonic_ns`] for "now"). Returns its sequence
    /// number.
    pub fn present_with(
        self,
        timestamp_ns: u64,
        record: impl FnOnce(&vk_export::ash::Device, vk::CommandBuffer, R::Target),
    ) -> Result<u64, SenderError> {
        let role = self.sender.opts.queue;
        self.sender
            .present(self.slot, timestamp_ns, role, None, record)
    }

    /// Opens the slot for the application's own submissions (another
    /// queue of `role`'s family, as wgpu's or an engine's: commands this
    /// crate does not record): one submission on `role`'s queue waits on
    /// the GPU for the receivers' releases of the slot and acquires it for
    /// that family (an image in `GENERAL`), and is waited for (bounded).
    /// The application's work then waits for [`OpenSlot::ready`] on the
    /// GPU, writes the slot on a queue of [`OpenSlot::queue_family`]
    /// (leaving an image in `GENERAL`), signals a timeline of this context,
    /// and [`OpenSlot::present`] publishes the frame after it.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use cuda_interop_frames::sender::{monotonic_ns, ImageSender};
    /// # use vk_export::{format::Rgba8Unorm, markers::DeviceLocal, QueueRole, TimelineSemaphore};
    /// # fn f(sender: &mut ImageSender<Rgba8Unorm, DeviceLocal>, done: &TimelineSemaphore, n: u64)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let slot = sender.acquire(Duration::from_millis(100))?.open(QueueRole::Main)?;
    /// let (opened, value) = slot.ready();
    /// // ... the application's submission: waits (opened, value), writes
    /// // slot.resource() on a queue of slot.queue_family(), signals (done, n) ...
    /// # let _ = (opened, value);
    /// let sequence = slot.present(monotonic_ns(), (done, n))?;
    /// # let _ = sequence; Ok(()) }
    /// ```
    pub fn open(self, role: QueueRole) -> Result<OpenSlot<'a, M, R>, SenderError> {
        let WriteSlot { sender, slot } = self;
        let ready = sender.open(slot, role)?;
        let family = sender.ctx.queue_family_of(role);
        Ok(OpenSlot {
            sender,
            slot,
            role,
            family,
            ready,
            closed: false,
        })
    }
}

/// A slot opened for the application's own submissions
/// ([`WriteSlot::open`]): acquired for [`OpenSlot::queue_family`] until
/// [`OpenSlot::present`] releases it and publishes the frame. Dropped
/// without presenting, it is released (bounded, on the same queue) and
/// left free with no frame numbered: work the application submitted that
/// writes it must have completed by then (it would write a later frame).
pub struct OpenSlot<'a, M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    sender: &'a mut Sender<M, R>,
    slot: u32,
    role: QueueRole,
    family: u32,
    ready: u64,
    /// Released to the external family (or its release submitted).
    closed: bool,
}

impl<M: MemoryLocation, R: SlotResource<M>> OpenSlot<'_, M, R> {
    /// The slot's index.
    pub fn index(&self) -> u32 {
        self.slot
    }

    /// The slot's buffer or image.
    pub fn resource(&self) -> &R {
        &self.sender.slots[self.slot as usize]
    }

    /// The queue family the slot is acquired for: the application writes
    /// it on a queue of this family only.
    pub fn queue_family(&self) -> u32 {
        self.family
    }

    /// The timeline value the application's writes wait for on the GPU
    /// (already reached when `open` returned; waiting for it orders the
    /// acquire's memory dependency before the writes on another queue).
    pub fn ready(&self) -> (&TimelineSemaphore, u64) {
        (
            self.sender.opened.as_ref().expect("made by open"),
            self.ready,
        )
    }

    /// The sequence number the frame gets when presented.
    pub fn sequence(&self) -> u64 {
        self.sender.stats.presented + 1
    }

    /// Publishes the frame: one submission on the opening role's queue
    /// waits on the GPU for `written` (the application's timeline value,
    /// signalled after its last write; a timeline of the sender's context),
    /// releases the slot to the external family, signals "produced", and is
    /// waited for (bounded); then the frame is announced with
    /// `timestamp_ns`. Returns its sequence number. On an error the slot is
    /// released by the drop, unnumbered.
    pub fn present(
        mut self,
        timestamp_ns: u64,
        written: (&TimelineSemaphore, u64),
    ) -> Result<u64, SenderError> {
        let f = self.sender.stats.presented + 1;
        let closed = self
            .sender
            .close(self.slot, self.role, Some(written), Some(f));
        // Released (or its release submitted): the drop must not release
        // it again.
        self.closed = self.sender.released_to_external[self.slot as usize];
        closed?;
        self.sender.announce(self.slot, f, timestamp_ns);
        Ok(f)
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> Drop for OpenSlot<'_, M, R> {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if let Err(e) = self.sender.close(self.slot, self.role, None, None) {
            self.sender.note(format!(
                "slot {} opened and dropped unpresented: its release failed: {e}",
                self.slot
            ));
        }
    }
}

impl<M: MemoryLocation, R: SlotResource<M>> std::fmt::Debug for OpenSlot<'_, M, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSlot")
            .field("slot", &self.slot)
            .field("queue_family", &self.family)
            .field("ready", &self.ready)
            .finish()
    }
}
