//! The sender: a ring of exportable buffers, or of OPTIMAL exportable
//! images ([`ImageSender`]), on the application's Vulkan [`Context`] (its
//! own device through `Context::from_raw`, or a headless one), served to
//! receivers over a Unix socket, found by name ([`crate::discovery`]) or
//! by path.
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
//!   [`WriteSlot::open`] submits the acquire on its own and signals
//!   [`OpenSlot::ready`]; the application's submission waits for that
//!   value, writes the slot on a queue of [`OpenSlot::queue_family`] and
//!   signals a timeline of the context; [`OpenSlot::present`] waits for it
//!   on the GPU, releases, signals "produced" and announces the frame. A
//!   slot opened and dropped is released unnumbered.
//!   [`WriteSlot::open_detached`] opens it the same way without the borrow
//!   (an [`OpenedFrame`]: the sender is free meanwhile, and the frame can
//!   cross the C ABI); [`Sender::present_opened`] publishes it as
//!   [`OpenSlot::present`] does, [`Sender::abandon_opened`] (`unsafe`: no
//!   write of the application's may be pending) releases it unnumbered.
//!   An opened frame's slot is out of the ring until then; a sender
//!   dropped with one out leaks it as it leaks a recorded one (below), and
//!   its "opened" timeline with it.
//! * Commands recorded into the application's own command buffer (an
//!   engine's, still open, that it submits itself and that signals nothing
//!   this crate made): [`WriteSlot::record_into`] records the slot's
//!   acquire, the application's commands and the release there, and hands
//!   back a [`RecordedFrame`] (no borrow: the engine goes on with other
//!   frames); once the application knows its command buffer completed,
//!   [`Sender::present_recorded`] signals "produced" from the host and
//!   announces the frame. A recorded slot is out of the ring until then
//!   ([`Sender::abandon_recorded`] for one never submitted); a sender
//!   dropped with one outstanding leaks that slot (its image or buffer and
//!   memory), which the application's commands may still write, and with
//!   it the context's device objects (the slot keeps the context): present
//!   or abandon every recorded frame before dropping the sender where the
//!   device is to be destroyed. A ring for recorded frames needs a slot for
//!   each frame in flight, each frame receivers may hold, and one more.
//! * A host writer that cannot take a slice (a GStreamer element writing
//!   into memory a sink offered it) writes a *lent* slot of a host-visible
//!   buffer ring: [`WriteSlot::lend`] opens it for host writes as
//!   [`WriteSlot::present_bytes`] does and hands out a [`LentSlot`] (no
//!   borrow) whose pointer the writer writes the frame through;
//!   [`Sender::present_lent`] releases and announces it. A lent slot is out
//!   of the ring; dropped unpresented it comes back, no frame numbered. A
//!   sender dropped first hands the slot's buffer to the `LentSlot`, which
//!   destroys it in turn: nothing leaks, and the pointer stays valid.
//! * An image the application made itself (not exportable: a render
//!   target) is published by a GPU copy into the slot
//!   ([`WriteSlot::present_copy`] of a [`vk_export::SourceImage`], whose
//!   `unsafe` constructor is where the application states what only it
//!   knows of its image): same format by type, the extent checked, on the
//!   transfer queue where the source's sharing allows, the source left in
//!   its layout and with its owner.
//! * A multi-image ring ([`MultiImageSender`], [`SenderOptions::with_parts`]):
//!   every slot holds one image of each named part (colour, depth,
//!   segmentation, ...), the slot one resource of the state machine above
//!   (one sequence number, timestamp, "produced" value and "released"
//!   promise for all its images; every barrier covers them all); its
//!   [`WriteSlot::present_copy`] takes one [`PartSource`] per part (a
//!   depth attachment's through a buffer of the slot). See `parts`'s
//!   contract.
//! * Frames are announced after their submission completed (the present
//!   waits for it, bounded), so a receiver without timelines is ordered by
//!   the frame message.
//! * Delivery is each receiver's choice (see [`crate::protocol`]):
//!   *lossless* receivers get every frame and hold its slot until they
//!   release it; *latest* receivers get the newest frame when they ask.
//!   The receivers' state machine, their limits and drops are
//!   `peers`'s (its contract): a connection must subscribe within
//!   [`SenderOptions::subscribe_timeout`]; at most
//!   [`SenderOptions::max_receivers`] connections, and
//!   [`SenderOptions::connects_per_second`] per process. A flood of
//!   connections reaches the sender's thread [`ACCEPT_SLACK`] beyond the
//!   limit at most: the accept thread refuses the rest itself, and holds
//!   no fd for them. Each call handles at most [`EVENT_QUEUE`] of the
//!   receivers' events, so peers that keep connecting cannot keep a call
//!   past its bound.
//! * GPU safety: a slot is written only when no receiver holds it and
//!   every "released" value promised for it has been reached (and the
//!   crate's own writes wait for those values on the GPU too; a recorded
//!   write needs no more: a read finished before it).
//! * Never unbounded, and latest receivers never make it wait, their GPU
//!   promises included: when no slot is free, [`Sender::acquire`] waits (up
//!   to its timeout) only if a slot is blocked by lossless receivers alone;
//!   otherwise it returns [`AcquireError::AllSlotsHeld`] at once and counts
//!   the frame as skipped. A present never waits for a receiver. With `L`
//!   latest receivers each holding at most one frame, a ring of `L + 1`
//!   slots always has a free one, unless a promise is outstanding. Frame
//!   messages are sent without blocking: a receiver whose socket is full is
//!   dropped.
//! * A receiver that breaks the protocol, holds a frame (or leaves a
//!   promise unkept) longer than [`SenderOptions::hold_timeout`], or goes
//!   away is dropped, told why; the others are not affected.
//! * Dropping the sender stops its threads (within [`POLL`]), says goodbye
//!   to every receiver, and removes its socket and directory entry (the
//!   listener first, then the entry, whose lock on the name goes last); the
//!   slots' own drops wait for their last GPU use.
//!
//! # Example
//!
//! A sender named `"cam"` on a headless context, filling each frame with
//! one colour, and a latest-mode receiver (in another process) that reads
//! frames by name on the host:
//!
//! ```no_run
//! use std::time::Duration;
//! use cuda_interop_frames::discovery::{list_senders, Directory};
//! use cuda_interop_frames::host_receiver::HostReceiver;
//! use cuda_interop_frames::protocol::Delivery;
//! use cuda_interop_frames::sender::{monotonic_ns, Address, Sender, SenderOptions};
//! use vk_export::markers::HostVisible;
//! use vk_export::{Context, HeadlessOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The sender (its own `Context::from_raw` works the same way).
//! let ctx = Context::headless(&HeadlessOptions::default())?;
//! let address = Address::Named { directory: Directory::from_env()?, name: "cam".into() };
//! let mut sender = Sender::<HostVisible>::new(&ctx, SenderOptions::new(address, 1920, 1080, 4))?;
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
//! let rx = HostReceiver::connect_named("cam", Delivery::Latest, Duration::from_secs(5))?;
//! let frame = rx.next(Duration::from_secs(5))?;
//! let pixels = rx.read(&frame, Duration::from_secs(5))?;
//! println!("frame {} at {} ns: {} bytes", frame.sequence(), frame.timestamp_ns(), pixels.len());
//! rx.release(frame)?;
//! # Ok(())
//! # }
//! ```

mod parts;
mod peers;
mod service;
mod slots;
mod write;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver as EventReceiver, SyncSender as EventSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vk_export::ash::vk;
use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Optimal, Usage};
use vk_export::socket::{Exported, Listener};
use vk_export::{
    Context, ExportableBuffer, ExportableImage, QueueRole, SubmitSync, TimelineSemaphore,
    WaitStrategy,
};

use crate::discovery::{Announcement, Directory, DiscoveryError, SenderInfo};
use crate::protocol::{PacketError, PartLayout, Planar, RingLayout};
use peers::{Blocked, Limits, Receivers, Ring};
use service::{accept_loop, Admission, Event};

pub use parts::{ImagePart, ImageSet, MultiImageSender, PartSource, PartTargets};
pub use peers::LOG_LINES;
pub use service::{ACCEPT_SLACK, EVENT_QUEUE, POLL};
pub use slots::{ImageSender, ImageTarget, SlotResource};
pub use write::{LentSlot, OpenSlot, OpenedFrame, RecordedFrame, WriteSlot};

/// Why a slot is out of the ring with the application's GPU work on it
/// ([`Sender`]'s `outside`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outside {
    /// Recorded into the application's command buffer ([`RecordedFrame`]).
    Recorded,
    /// Opened for the application's own submissions ([`OpenedFrame`]).
    Opened,
}

/// The next sender's [`Sender::id`](Sender).
static NEXT_SENDER_ID: AtomicU64 = AtomicU64::new(1);

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

impl Address {
    /// The name `name` in the default directory ([`Directory::from_env`]).
    pub fn named(name: &str) -> Result<Address, DiscoveryError> {
        Ok(Address::Named {
            directory: Directory::from_env()?,
            name: name.to_owned(),
        })
    }
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
    /// 4) of a buffer ring (a planar one: of either plane, at least `width`
    /// samples); an image ring ignores it (its layout gives the tightly
    /// packed row of its format).
    pub row_pitch: u64,
    /// A buffer ring of planar YUV 4:2:0 frames ([`Planar`]: NV12 or P010,
    /// the layout NVENC takes, the chroma plane right after the luma plane)
    /// instead of RGBA8; `None`, RGBA8. Image rings ignore it. Set with
    /// [`SenderOptions::with_planar`], which sets the row pitch too.
    pub planar: Option<Planar>,
    /// Slots in the ring (2 to [`crate::protocol::MAX_SLOTS`]).
    pub slots: u32,
    /// How long a receiver may hold a slot (or leave a GPU release
    /// promised and unreached) before it is dropped.
    pub hold_timeout: Duration,
    /// How long a connection may take to subscribe before it is closed.
    pub subscribe_timeout: Duration,
    /// Connections served at once (pending ones included); more are
    /// refused with a goodbye that says so.
    pub max_receivers: u32,
    /// Connections one process may open a second; more are refused.
    pub connects_per_second: u32,
    /// The queue the frames' submissions go to: [`QueueRole::Main`] for
    /// commands of any kind (the default), [`QueueRole::Transfer`] for
    /// transfer-only commands (copies, fills), which then run on the
    /// device's transfer-only queue where the context has one (no
    /// graphics-engine switch between the sender's work and CUDA's).
    pub queue: QueueRole,
    /// Share "produced" and "released" timelines (CUDA receivers need them;
    /// lavapipe exports none): without, frames are announced after their
    /// writes completed and a GPU-signalled release is a protocol fault.
    /// [`SenderOptions::new`] sets it where the context can export
    /// semaphores only when made with [`SenderOptions::for_context`].
    pub semaphores: bool,
    /// A multi-image ring's parts ([`MultiImageSender`]: 1 to
    /// [`crate::protocol::MAX_PARTS`] named images a slot, all `width` x
    /// `height`); empty for every other sender, which refuses parts. Set
    /// with [`SenderOptions::with_parts`].
    pub parts: Vec<ImagePart>,
    /// How `present` and `open` wait for their submission:
    /// [`WaitStrategy::Block`] (the default: `vkWaitForFences`, no CPU, the
    /// driver's wake-up latency) or [`WaitStrategy::Poll`] (reads the
    /// fence's status, spinning first: the frame is announced sooner, at
    /// some CPU; `bench` S9 measures both).
    pub host_wait: WaitStrategy,
}

/// [`SenderOptions::max_receivers`]'s default.
pub const DEFAULT_MAX_RECEIVERS: u32 = 16;
/// [`SenderOptions::connects_per_second`]'s default.
pub const DEFAULT_CONNECTS_PER_SECOND: u32 = 100;

impl SenderOptions {
    /// A ring of `slots` RGBA8 frames of `width` x `height` with unpadded
    /// rows, a 5 s hold timeout, a 2 s subscribe timeout, at most
    /// [`DEFAULT_MAX_RECEIVERS`] receivers and
    /// [`DEFAULT_CONNECTS_PER_SECOND`] connections a second per process,
    /// the main queue, with semaphores.
    pub fn new(address: Address, width: u32, height: u32, slots: u32) -> SenderOptions {
        SenderOptions {
            address,
            width,
            height,
            row_pitch: u64::from(width) * 4,
            planar: None,
            slots,
            hold_timeout: Duration::from_secs(5),
            subscribe_timeout: Duration::from_secs(2),
            max_receivers: DEFAULT_MAX_RECEIVERS,
            connects_per_second: DEFAULT_CONNECTS_PER_SECOND,
            queue: QueueRole::Main,
            semaphores: true,
            parts: Vec::new(),
            host_wait: WaitStrategy::Block,
        }
    }

    /// These options for a [`MultiImageSender`] of `parts`, in slot order
    /// (checked when the sender is made: count, unique names).
    pub fn with_parts(self, parts: impl IntoIterator<Item = ImagePart>) -> SenderOptions {
        SenderOptions {
            parts: parts.into_iter().collect(),
            ..self
        }
    }

    /// These options for a ring of `planar` frames, rows tightly packed
    /// (rounded up to a multiple of 4 bytes).
    pub fn with_planar(self, planar: Planar) -> SenderOptions {
        SenderOptions {
            row_pitch: (u64::from(self.width) * planar.sample_bytes()).next_multiple_of(4),
            planar: Some(planar),
            ..self
        }
    }

    /// [`SenderOptions::new`] with what `ctx` offers: semaphores only where
    /// its device exports them (lavapipe does not; CUDA receivers then
    /// refuse the ring, host and Vulkan receivers take it).
    pub fn for_context(
        ctx: &Context,
        address: Address,
        width: u32,
        height: u32,
        slots: u32,
    ) -> SenderOptions {
        SenderOptions {
            semaphores: ctx.supports_semaphore_fds(),
            ..SenderOptions::new(address, width, height, slots)
        }
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
    /// Every slot is held by latest receivers, waits for a GPU release
    /// not worth waiting for, or is out of the ring with the application
    /// (recorded into its command buffers, [`WriteSlot::record_into`];
    /// opened for its submissions, [`WriteSlot::open_detached`]; lent to a
    /// host writer, [`WriteSlot::lend`]): the frame is skipped (counted in
    /// [`SenderStats::skipped`]); try again for the next frame.
    #[error(
        "every slot of the ring is held by a receiver or out of the ring (recorded, opened or \
         lent): frame skipped"
    )]
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
    /// Connections open now (subscribed or not yet).
    pub receivers: usize,
    /// Connections accepted since the start.
    pub connected: u64,
    /// Receivers dropped for a fault (not counting clean departures).
    pub dropped: u64,
    /// Connections refused (over a limit) or that could not be set up.
    pub refused: u64,
    /// Frames presented per second over the last second or so.
    pub fps: f64,
}

/// A frame sender (see the module contract).
pub struct Sender<M: MemoryLocation, R: SlotResource<M> = ExportableBuffer<M>> {
    ctx: Context,
    opts: SenderOptions,
    layout: RingLayout,
    /// A multi-image ring's parts (what the part messages say).
    parts: Vec<PartLayout>,
    slots: Vec<R>,
    _memory: std::marker::PhantomData<M>,
    produced: Option<TimelineSemaphore>,
    /// What [`WriteSlot::open`] signals (local, made on first use), and its
    /// last value. Shared with the [`OpenedFrame`]s handed out (their
    /// `ready`), and leaked at the drop while one is out: the application's
    /// pending submission may wait for it.
    opened: Option<Arc<TimelineSemaphore>>,
    opened_value: u64,
    receivers: Receivers,
    events_tx: EventSender<Event>,
    events: EventReceiver<Event>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    /// Connections the acceptor refused itself (past its cap).
    refused_by_acceptor: Arc<AtomicU64>,
    announcement: Option<Announcement>,
    socket: PathBuf,
    released_to_external: Vec<bool>,
    /// Slots out of the ring that the application's own GPU work may still
    /// write, which this sender cannot wait for: recorded into its command
    /// buffers ([`RecordedFrame`]) or opened for its own submissions
    /// ([`OpenedFrame`]) and not yet presented or abandoned. Not handed
    /// out; leaked, not destroyed, at the drop.
    outside: Vec<Option<Outside>>,
    /// Slots lent to a host writer ([`LentSlot`]): out of the ring while
    /// the [`LentSlot`] lives (its drop gives the slot back), handed the
    /// slot's buffer if the sender is dropped first.
    lent: Vec<Option<write::Custody<R>>>,
    /// Tells this sender's [`RecordedFrame`]s, [`OpenedFrame`]s and
    /// [`LentSlot`]s from another's.
    id: u64,
    /// The newest presented frame: `(slot, frame, timestamp)`.
    newest: Option<(u32, u64, u64)>,
    next_slot: u32,
    stats: SenderStats,
    fps_window: (Instant, u64),
}

impl<M: MemoryLocation, R: SlotResource<M>> Sender<M, R> {
    /// Makes the ring on `ctx`, binds its socket (announcing it by name if
    /// the address is a name) and starts accepting receivers.
    pub fn new(ctx: &Context, opts: SenderOptions) -> Result<Self, SenderError> {
        if opts.slots < 2 {
            return Err(SenderError::Options("at least 2 slots are needed".into()));
        }
        if opts.max_receivers == 0 || opts.connects_per_second == 0 {
            return Err(SenderError::Options(
                "max_receivers and connects_per_second must be at least 1".into(),
            ));
        }
        let layout = R::layout(&opts)?;
        if opts.semaphores && !ctx.supports_semaphore_fds() {
            return Err(SenderError::Options(
                "this Vulkan device exports no semaphores (VK_KHR_external_semaphore_fd, which \
                 lavapipe lacks): make the options with SenderOptions::for_context, or set \
                 SenderOptions::semaphores to false (examples: --no-semaphores); CUDA \
                 receivers then refuse the ring"
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
                    row_pitch: layout.row_pitch,
                    format: R::format_name(&opts),
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
        // A named sender's listener was bound at a temporary name and
        // renamed (see `discovery`): the entry says where it is.
        let socket = match &announcement {
            Some(a) => a.info().socket.clone(),
            None => listener.path().to_owned(),
        };
        let (events_tx, events) = mpsc::sync_channel(EVENT_QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let refused_by_acceptor = Arc::new(AtomicU64::new(0));
        let acceptor = {
            let (tx, stop) = (events_tx.clone(), stop.clone());
            let admission = Admission {
                open: Arc::new(AtomicUsize::new(0)),
                max_receivers: opts.max_receivers,
                refused: refused_by_acceptor.clone(),
            };
            std::thread::Builder::new()
                .name("cif-accept".into())
                .spawn(move || accept_loop(listener, tx, stop, admission))?
        };
        let limits = Limits {
            hold_timeout: opts.hold_timeout,
            subscribe_timeout: opts.subscribe_timeout,
            max_receivers: opts.max_receivers,
            connects_per_second: opts.connects_per_second,
        };
        Ok(Sender {
            ctx: ctx.clone(),
            released_to_external: vec![false; opts.slots as usize],
            outside: vec![None; opts.slots as usize],
            lent: (0..opts.slots).map(|_| None).collect(),
            id: NEXT_SENDER_ID.fetch_add(1, Ordering::Relaxed),
            receivers: Receivers::new(limits, opts.slots as usize),
            parts: opts.parts.iter().map(ImagePart::layout).collect(),
            opts,
            layout,
            slots,
            _memory: std::marker::PhantomData,
            produced,
            opened: None,
            opened_value: 0,
            events_tx,
            events,
            stop,
            acceptor: Some(acceptor),
            refused_by_acceptor,
            announcement,
            socket,
            newest: None,
            next_slot: 0,
            stats: SenderStats::default(),
            fps_window: (Instant::now(), 0),
        })
    }

    /// The socket receivers connect to.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The context it was made on (what the `written` timeline of
    /// [`Sender::present_opened`] must belong to).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The options it was made with.
    pub fn options(&self) -> &SenderOptions {
        &self.opts
    }

    /// The ring's layout (what receivers get).
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// A multi-image ring's parts, in slot order (empty otherwise).
    pub fn parts(&self) -> &[PartLayout] {
        &self.parts
    }

    /// The ring's buffers or images, slot by slot (record into them only in
    /// [`WriteSlot::present_with`]: the crate's own helpers would not know
    /// their ownership).
    pub fn resources(&self) -> &[R] {
        &self.slots
    }

    /// What it has done so far.
    pub fn stats(&self) -> SenderStats {
        let counts = self.receivers.counts;
        SenderStats {
            receivers: self.receivers.len(),
            connected: counts.connected,
            dropped: counts.dropped,
            refused: counts.refused + self.refused_by_acceptor.load(Ordering::Relaxed),
            ..self.stats
        }
    }

    /// Takes the lines it logged since the last call (`receiver N (pid P)
    /// left after F frames (why)`, setup failures); only the last
    /// [`LOG_LINES`] are kept.
    pub fn take_log(&mut self) -> Vec<String> {
        self.receivers.take_log()
    }

    fn note(&mut self, line: String) {
        self.receivers.note(line);
    }

    /// Serves receivers (connections, requests, releases) for up to
    /// `timeout`, returning early after the first event; [`Sender::acquire`]
    /// does this too. Call it while not presenting.
    pub fn serve(&mut self, timeout: Duration) {
        if let Ok(event) = self.events.recv_timeout(timeout) {
            self.handle(event);
        }
        self.pump();
    }

    /// Serves receivers until `count` of them are connected or `timeout`
    /// passes; whether they are. A sender that should not run ahead of its
    /// first receiver calls it before presenting.
    pub fn wait_for_receivers(&mut self, count: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            self.pump();
            if self.receivers.subscribed() >= count {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if let Ok(event) = self.events.recv_timeout(left.min(POLL)) {
                self.handle(event);
            }
        }
    }

    /// Handles the queued events, at most [`EVENT_QUEUE`] of them (peers
    /// that keep posting cannot keep it here: what is left waits for the
    /// next call), and drops receivers past their bounds.
    fn pump(&mut self) {
        for _ in 0..EVENT_QUEUE {
            let Ok(event) = self.events.try_recv() else {
                break;
            };
            self.handle(event);
        }
        self.receivers.expire();
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Connected(conn, counted) => {
                self.receivers
                    .connected(conn, counted, &self.events_tx, &self.stop)
            }
            Event::Message { id, message } => {
                let mut resources: Vec<&dyn Exported> = Vec::new();
                for slot in &self.slots {
                    slot.exported(&mut resources);
                }
                if let Some(produced) = &self.produced {
                    resources.push(produced);
                }
                let ring = Ring {
                    ctx: &self.ctx,
                    layout: self.layout,
                    parts: &self.parts,
                    resources,
                    semaphores: self.produced.is_some(),
                };
                self.receivers.on_message(id, message, self.newest, &ring)
            }
            Event::Garbage { id, error } => {
                let fault = crate::protocol::Fault::BadPacket;
                self.receivers.remove(
                    id,
                    Some(crate::protocol::DropReason::ProtocolFault(fault)),
                    &format!("sent a bad packet: {error}"),
                )
            }
            Event::Gone { id, why } => self.receivers.remove(id, None, &why),
        }
    }

    /// A free slot (preferring the next in turn), or whether waiting could
    /// give one.
    fn pick(&mut self) -> Result<u32, bool> {
        let n = self.opts.slots;
        let mut worth_waiting = false;
        for i in 0..n {
            let s = (self.next_slot + i) % n;
            if self.outside[s as usize].is_some() || self.is_lent(s as usize) {
                continue;
            }
            match self.receivers.blocked(s as usize) {
                None => return Ok(s),
                Some(Blocked::ByLossless) => worth_waiting = true,
                Some(Blocked::Otherwise) => {}
            }
        }
        Err(worth_waiting)
    }

    /// Whether slot `s` is lent out; one whose [`LentSlot`] was dropped
    /// is taken back (owned by the sender's family, not released: the next
    /// acquire of it starts from there).
    fn is_lent(&mut self, s: usize) -> bool {
        match &self.lent[s] {
            Some(custody) if Arc::strong_count(custody) > 1 => true,
            Some(_) => {
                self.lent[s] = None;
                false
            }
            None => false,
        }
    }

    /// A slot free now, without waiting and without counting anything when
    /// there is none: for a writer with somewhere else to put the frame (a
    /// GStreamer pool that hands out a plain buffer instead), where no
    /// frame is skipped. Receivers' messages are handled first, as
    /// [`Sender::acquire`] does.
    pub fn acquire_free(&mut self) -> Option<WriteSlot<'_, M, R>> {
        self.pump();
        let slot = self.pick().ok()?;
        if self.newest.is_some_and(|n| n.0 == slot) {
            self.newest = None;
        }
        Some(WriteSlot { sender: self, slot })
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
                    // A GPU release frees a slot without a message: poll
                    // its counter often while one is pending.
                    let step = if self.receivers.promises_pending() {
                        Duration::from_micros(200)
                    } else {
                        POLL
                    };
                    if let Ok(event) = self.events.recv_timeout(left.min(step)) {
                        self.handle(event);
                    }
                }
            }
        }
    }

    /// A submission's sync that waits on the GPU for the receivers' promised
    /// releases of slot `s` (reached already: the slot is free), with the
    /// sender's bound.
    fn release_waits(&self, s: usize) -> SubmitSync<'_> {
        let mut sync = SubmitSync::new()
            .timeout(self.opts.hold_timeout.max(Duration::from_secs(5)))
            .host_wait(self.opts.host_wait);
        for (semaphore, value) in self.receivers.release_waits(s) {
            sync = sync.wait_timeline(semaphore, value);
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
        let mut sync = self.release_waits(s);
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

    /// Presents a frame recorded into the application's command buffer
    /// ([`WriteSlot::record_into`]): signals "produced" with its sequence
    /// number from the host (where the ring has timelines), announces it
    /// with `timestamp_ns` and puts the slot back into the ring. Returns the
    /// sequence number; frames are numbered in the order they are
    /// presented. A frame of another sender is refused
    /// ([`vk_export::Error::InvalidArgument`]) and spent: this sender is
    /// unchanged, and the other keeps that slot out of its ring. A refused
    /// host signal (a present of this sender that timed out still has its
    /// signal pending on the GPU) puts the slot back into the ring
    /// unannounced: its number is used, and receivers count the gap.
    ///
    /// # Safety
    /// The command buffer `frame` was recorded into was submitted, to a
    /// queue of the context's main family, and has completed execution
    /// (an engine knows it from its frame fences). Receivers read the slot
    /// from the announcement on: presented early, they read a frame the GPU
    /// is still writing.
    pub unsafe fn present_recorded(
        &mut self,
        frame: RecordedFrame,
        timestamp_ns: u64,
    ) -> Result<u64, SenderError> {
        let s = self.check_outside(frame.sender, frame.slot, Outside::Recorded)?;
        let f = self.stats.presented + 1;
        let signalled = match &self.produced {
            Some(produced) => produced.signal(f),
            None => Ok(()),
        };
        // The commands completed (the caller's promise): the slot is
        // released to the external family and free again, `f` used.
        self.outside[s] = None;
        self.submitted(s, f, &Ok(()));
        signalled?;
        self.announce(frame.slot, f, timestamp_ns);
        Ok(f)
    }

    /// Puts a recorded slot back into the ring unpresented: no frame is
    /// numbered. A frame of another sender is refused, as in
    /// [`Sender::present_recorded`].
    ///
    /// # Safety
    /// The command buffer `frame` was recorded into was never submitted and
    /// never will be (reset or freed). (A submitted one is presented once it
    /// completed.)
    pub unsafe fn abandon_recorded(&mut self, frame: RecordedFrame) -> Result<(), SenderError> {
        let s = self.check_outside(frame.sender, frame.slot, Outside::Recorded)?;
        self.outside[s] = None;
        // The acquire and release never ran: the slot's owner is what it
        // was before the recording.
        self.released_to_external[s] = frame.was_released;
        Ok(())
    }

    /// Slot `slot` of a frame of sender `sender` that is out of the ring
    /// as `how`: its index, or refused as another sender's.
    pub(super) fn check_outside(
        &self,
        sender: u64,
        slot: u32,
        how: Outside,
    ) -> Result<usize, SenderError> {
        let s = slot as usize;
        if sender != self.id || self.outside.get(s).copied().flatten() != Some(how) {
            let what = match how {
                Outside::Recorded => "a recorded frame",
                Outside::Opened => "an opened frame",
            };
            return Err(vk_export::Error::InvalidArgument(format!(
                "{what} (slot {slot}) of another sender"
            ))
            .into());
        }
        Ok(s)
    }

    /// After a present-like submission of frame `f` into slot `s`: one that
    /// was submitted (it completed, or timed out and still runs) released
    /// the slot and signals "produced" with `f`, so the slot counts as
    /// released and `f` as used (numbered, never announced after a timeout:
    /// receivers see the gap), and no later frame signals `f` again.
    fn submitted(&mut self, s: usize, f: u64, outcome: &Result<(), vk_export::Error>) {
        if outcome.is_ok() || matches!(outcome, Err(vk_export::Error::Timeout(_))) {
            self.receivers.written(s);
            self.released_to_external[s] = true;
            self.stats.presented = self.stats.presented.max(f);
        }
    }

    /// Opens `slot` for the application's own submissions on a queue of
    /// `role`'s family: the receivers' releases waited for and the acquire
    /// recorded in one submission, waited for (bounded), which signals the
    /// returned value of the sender's "opened" timeline.
    fn open(&mut self, slot: u32, role: QueueRole) -> Result<u64, SenderError> {
        self.open_for(slot, role, false)
    }

    /// [`Sender::open`]; with `host_writes`, the submission also makes
    /// every earlier device access of the slot's memory available to the
    /// host and ordered before host writes (a barrier whose destination is
    /// `HOST_WRITE`), for a write through the slot's mapping.
    pub(super) fn open_for(
        &mut self,
        slot: u32,
        role: QueueRole,
        host_writes: bool,
    ) -> Result<u64, SenderError> {
        let s = slot as usize;
        if self.opened.is_none() {
            self.opened = Some(Arc::new(TimelineSemaphore::new_local(&self.ctx)?));
        }
        let value = self.opened_value + 1;
        let opened = self.opened.as_deref().expect("made above");
        let sync = self.release_waits(s).signal_timeline(opened, value);
        let resource = &self.slots[s];
        let from_external = self.released_to_external[s];
        let opened = self
            .ctx
            .submit_and_wait_on(role, sync, |device, cmd, family| {
                // SAFETY: as in `present`: the sender's command buffer for a
                // queue of `family`, the slot alive beyond the submission.
                unsafe { resource.record_acquire(device, cmd, family, from_external) };
                if host_writes {
                    let barrier = vk::MemoryBarrier::default()
                        .src_access_mask(
                            vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE,
                        )
                        .dst_access_mask(vk::AccessFlags::HOST_WRITE | vk::AccessFlags::HOST_READ);
                    // SAFETY: the sender's command buffer, recording; a
                    // global memory barrier names no resource.
                    unsafe {
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::ALL_COMMANDS,
                            vk::PipelineStageFlags::HOST,
                            vk::DependencyFlags::empty(),
                            &[barrier],
                            &[],
                            &[],
                        )
                    };
                }
            });
        // Submitted (a timeout too: it still runs): the value is used, and
        // the slot is owned by the family now (in GENERAL for an image),
        // not external; a later frame's acquire starts from UNDEFINED.
        if opened.is_ok() || matches!(opened, Err(vk_export::Error::Timeout(_))) {
            self.receivers.written(s);
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
    /// the frame message to each receiver it is due to.
    fn announce(&mut self, slot: u32, f: u64, timestamp_ns: u64) {
        self.stats.presented = f;
        self.newest = Some((slot, f, timestamp_ns));
        self.next_slot = (slot + 1) % self.opts.slots;
        self.receivers.announce(slot, f, timestamp_ns);
        self.update_fps();
    }

    fn update_fps(&mut self) {
        let (since, at) = self.fps_window;
        let elapsed = since.elapsed();
        if elapsed >= Duration::from_secs(1) {
            self.stats.fps = (self.stats.presented - at) as f64 / elapsed.as_secs_f64();
            self.fps_window = (Instant::now(), self.stats.presented);
            self.publish_fps();
        }
    }

    fn publish_fps(&mut self) {
        let fps = self.stats.fps;
        if let Some(a) = &mut self.announcement {
            if let Err(e) = a.set_fps(fps) {
                let line = format!("the directory entry could not be updated: {e}");
                self.note(line);
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

impl<M: MemoryLocation, R: SlotResource<M>> Drop for Sender<M, R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The listener (and its socket file) goes with the accept thread.
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        self.receivers.remove_all();
        // Connections accepted but not yet handled close with the channel.
        while self.events.try_recv().is_ok() {}
        // Last: the entry, and the lock that owns the name.
        self.announcement = None;
        // A recorded or opened slot may still be written by the
        // application's GPU work, which this sender cannot wait for: leaked,
        // not destroyed under it; with an opened one, the "opened" timeline
        // too (the application's submission may wait for it).
        let outside = std::mem::take(&mut self.outside);
        if outside.contains(&Some(Outside::Opened)) {
            std::mem::forget(self.opened.clone());
        }
        let lent = std::mem::take(&mut self.lent);
        let slots = std::mem::take(&mut self.slots);
        for ((slot, outside), lent) in slots.into_iter().zip(outside).zip(lent) {
            if outside.is_some() {
                std::mem::forget(slot);
            } else if let Some(custody) = lent.filter(|c| Arc::strong_count(c) > 1) {
                // A host writer may still write it through its mapping:
                // its `LentSlot` keeps the buffer, destroyed with it.
                *custody.lock().unwrap_or_else(|p| p.into_inner()) = Some(slot);
            }
        }
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
