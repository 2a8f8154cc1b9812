//! `cudainteropsink`'s implementation (the contract is the parent module's).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuda_interop::{CudaDevice, ImportedBuffer, Stream};
use cuda_interop_frames::discovery::{validate_name, DiscoveryError};
use cuda_interop_frames::protocol::RingLayout;
use cuda_interop_frames::sender::{
    AcquireError, Address, Sender, SenderError, SenderOptions, SenderStats, WriteSlot,
};
use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::prelude::*;
use vk_export::markers::{DeviceLocal, HostVisible};
use vk_export::{Context, HeadlessOptions, QueueRole, TimelineSemaphore};

use crate::cuda_memory::{self, CudaOut, DevicePlane, GstCuda, CUDA_MEMORY};
use crate::formats::{sink_planar, Planes};
use crate::lock;

use super::pool::{self, LentCell, SlotPool};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "cudainteropsink",
        gst::DebugColorFlags::empty(),
        Some("cuda-interop frame sender"),
    )
});

/// Slots in the ring: one being written, and three for receivers.
const SLOTS: u32 = 4;

/// `timeout`'s default, in milliseconds.
const DEFAULT_TIMEOUT_MS: u32 = 50;

/// Slots the offered pool never lends: a queue before the sink holds as
/// many pool buffers as it likes, and the buffers it gets once the pool
/// lends no more (plain ones) are copied into these.
const UNLENT: usize = 2;

/// How long one wait for a free slot lasts before the flushing flag is
/// looked at again: `unlock`'s bound.
const STEP: Duration = Duration::from_millis(50);

/// How long a CUDA copy of a buffer into a slot may take (the device
/// busy with other work: not `timeout`, which bounds waiting for a slot).
const COPY_BOUND: Duration = Duration::from_secs(2);

/// `timeout`'s maximum (a minute: a lossless receiver that holds a slot
/// longer is dropped by the sender's hold timeout well before).
const MAX_TIMEOUT_MS: u32 = 60_000;

/// How often the serving thread looks for receivers' messages.
const SERVE_PERIOD: Duration = Duration::from_millis(2);

#[derive(Clone, Debug)]
struct Settings {
    sender_name: Option<String>,
    timeout_ms: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            sender_name: None,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        }
    }
}

/// The sender of the negotiated caps.
#[derive(Debug)]
struct Ring {
    slots: Slots,
    info: gst_video::VideoInfo,
    planes: Planes,
    /// Which ring of this element it is: a pool offered for an earlier
    /// one lends nothing from this one.
    generation: u64,
}

/// The ring's slots, as the caps' memory decides.
#[derive(Debug)]
enum Slots {
    /// System memory: host-visible buffers, written by the host through
    /// their mapping.
    Host {
        sender: Box<Sender<HostVisible>>,
        /// Bytes written per frame: the planes' whole rows.
        bytes: usize,
        /// The slots lent to the offered pool's buffers (`pool`).
        lent: Vec<Weak<LentCell>>,
    },
    /// `memory:CUDAMemory`: device-local buffers, imported into CUDA in
    /// this process and written by CUDA copies (boxed: the larger kind).
    Cuda(Box<CudaSlots>),
}

/// A device-local ring CUDA writes.
#[derive(Debug)]
struct CudaSlots {
    sender: Sender<DeviceLocal>,
    imported: Vec<ImportedBuffer<DeviceLocal>>,
    out: Arc<CudaOut>,
    stream: Stream,
    /// Signalled from the host once CUDA's copy into a slot completed.
    written: TimelineSemaphore,
    value: u64,
}

impl Slots {
    fn serve(&mut self) {
        match self {
            Slots::Host { sender, .. } => sender.serve(Duration::ZERO),
            Slots::Cuda(c) => c.sender.serve(Duration::ZERO),
        }
    }

    fn stats(&self) -> SenderStats {
        match self {
            Slots::Host { sender, .. } => sender.stats(),
            Slots::Cuda(c) => c.sender.stats(),
        }
    }

    fn layout(&self) -> &RingLayout {
        match self {
            Slots::Host { sender, .. } => sender.layout(),
            Slots::Cuda(c) => c.sender.layout(),
        }
    }

    fn in_cuda(&self) -> bool {
        matches!(self, Slots::Cuda(_))
    }
}

/// The thread that serves receivers between frames.
#[derive(Debug)]
struct Server {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

/// The element's instance data.
#[derive(Debug, Default)]
pub struct CudaInteropSink {
    settings: Mutex<Settings>,
    /// The sender's name while started.
    name: Mutex<Option<String>>,
    ctx: Mutex<Option<Context>>,
    /// GStreamer's CUDA memory in the context's CUDA device, where the
    /// library loads and the device is NVIDIA's (while started).
    cuda_out: Mutex<Option<Arc<CudaOut>>>,
    ring: Arc<Mutex<Option<Ring>>>,
    server: Mutex<Option<Server>>,
    presented: AtomicU64,
    /// Of those, frames written into a lent slot upstream (no copy).
    in_place: AtomicU64,
    skipped: AtomicU64,
    /// Set by `unlock`: a waiting `render` gives up its buffer.
    flushing: AtomicBool,
    /// Rings made so far (`Ring::generation`).
    rings_made: AtomicU64,
}

#[glib::object_subclass]
impl ObjectSubclass for CudaInteropSink {
    const NAME: &'static str = "GstCudaInteropSink";
    type Type = super::CudaInteropSink;
    type ParentType = gst_base::BaseSink;
}

impl ObjectImpl for CudaInteropSink {
    fn constructed(&self) {
        self.parent_constructed();
        // A last sample is a second reference to each buffer: the offered
        // pool's buffers would then be copied instead of presented as they
        // are (`pool`). Set it to true again to have one.
        self.obj().set_enable_last_sample(false);
    }

    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecString::builder("sender-name")
                    .nick("Sender name")
                    .blurb(
                        "The name to publish under in $XDG_RUNTIME_DIR/cuda-interop-frames \
                         (unset: this element's name)",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("timeout")
                    .nick("Slot timeout (ms)")
                    .blurb(
                        "How long a buffer may wait for lossless receivers to free a slot \
                         before it is dropped (frames-skipped); a flush or a state change \
                         interrupts the wait within 50 ms",
                    )
                    .default_value(DEFAULT_TIMEOUT_MS)
                    .maximum(MAX_TIMEOUT_MS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt64::builder("frames-presented")
                    .nick("Frames presented")
                    .blurb("Frames published since the start")
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("frames-in-place")
                    .nick("Frames in place")
                    .blurb(
                        "Of frames-presented, those the element before the sink wrote straight \
                         into a slot (the buffer pool this sink offers) and presented without a \
                         copy",
                    )
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("frames-skipped")
                    .nick("Frames skipped")
                    .blurb("Buffers dropped because no slot was free in time")
                    .read_only()
                    .build(),
                glib::ParamSpecUInt::builder("receivers")
                    .nick("Receivers")
                    .blurb("Receivers connected now")
                    .read_only()
                    .build(),
            ]
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut settings = lock(&self.settings);
        match pspec.name() {
            "sender-name" => settings.sender_name = value.get().expect("type checked upstream"),
            "timeout" => settings.timeout_ms = value.get().expect("type checked upstream"),
            other => unreachable!("no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        match pspec.name() {
            "sender-name" => lock(&self.settings).sender_name.to_value(),
            "timeout" => lock(&self.settings).timeout_ms.to_value(),
            "frames-presented" => self.presented.load(Ordering::Relaxed).to_value(),
            "frames-in-place" => self.in_place.load(Ordering::Relaxed).to_value(),
            "frames-skipped" => self.skipped.load(Ordering::Relaxed).to_value(),
            "receivers" => {
                let receivers = lock(&self.ring)
                    .as_ref()
                    .map_or(0, |r| r.slots.stats().receivers);
                (receivers as u32).to_value()
            }
            other => unreachable!("no property {other}"),
        }
    }
}

impl GstObjectImpl for CudaInteropSink {}

impl ElementImpl for CudaInteropSink {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "cuda-interop frame sender",
                "Sink/Video",
                "Publishes a video stream as a named cuda-interop sender (a ring of shared \
                 Vulkan buffers; written by CUDA from memory:CUDAMemory)",
                "cuda-interop developers",
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            use gst_video::VideoFormat as V;
            let formats = [V::Rgba, V::Nv12, V::P01010le];
            let mut caps = gst_video::VideoCapsBuilder::new()
                .features([CUDA_MEMORY])
                .format_list(formats)
                .build();
            caps.merge(
                gst_video::VideoCapsBuilder::new()
                    .format_list(formats)
                    .build(),
            );
            vec![gst::PadTemplate::new(
                "sink",
                gst::PadDirection::Sink,
                gst::PadPresence::Always,
                &caps,
            )
            .expect("a valid template")]
        });
        TEMPLATES.as_ref()
    }
}

impl CudaInteropSink {
    /// Posts `why` as an element error; the error to return from a vfunc.
    fn fail(&self, why: &str) -> gst::LoggableError {
        gst::element_imp_error!(self, gst::ResourceError::OpenWrite, ("{}", why));
        gst::loggable_error!(CAT, "{}", why)
    }

    fn stop_server(&self) {
        if let Some(server) = lock(&self.server).take() {
            let _ = server.stop.send(());
            let _ = server.thread.join();
        }
    }

    /// A sender of `info` under `name` on `ctx`: device-local slots that
    /// CUDA writes where `cuda` is given (the caps are CUDA memory),
    /// host-visible ones otherwise.
    fn make_ring(
        &self,
        ctx: &Context,
        name: &str,
        info: &gst_video::VideoInfo,
        cuda: Option<&Arc<CudaOut>>,
    ) -> Result<Ring, String> {
        let Some(planar) = sink_planar(info.format()) else {
            return Err(format!(
                "{} frames: cudainteropsink publishes RGBA, NV12 and P010_10LE (put videoconvert \
                 before it)",
                info.format()
            ));
        };
        let (width, height) = (info.width(), info.height());
        if planar.is_some() && (width % 2 == 1 || height % 2 == 1) {
            return Err(format!(
                "a {} frame of {width}x{height}: 4:2:0 rings need an even width and height \
                 (videoscale or videocrop before it)",
                info.format()
            ));
        }
        let address = Address::named(name).map_err(|e| e.to_string())?;
        let mut opts = SenderOptions::new(address, width, height, SLOTS);
        if let Some(planar) = planar {
            opts = opts.with_planar(planar);
        }
        // Timelines only where the device exports them (lavapipe does not).
        opts.semaphores = ctx.supports_semaphore_fds();
        let named = |e: SenderError| match e {
            SenderError::Discovery(e @ DiscoveryError::NameTaken { .. }) => format!(
                "cannot publish as {name:?}: {e} (stop that sender, or set sender-name= to \
                 another name)"
            ),
            other => format!("cannot publish as {name:?}: {other}"),
        };
        let (slots, layout) = match cuda {
            None => {
                let sender = Box::new(Sender::<HostVisible>::new(ctx, opts).map_err(named)?);
                let slot_bytes = sender.buffers()[0].size() as usize;
                let bytes = Planes::of_ring(sender.layout()).span();
                if bytes > slot_bytes {
                    return Err(format!(
                        "the ring's slots have {slot_bytes} bytes; a frame's rows need {bytes}"
                    ));
                }
                let layout = *sender.layout();
                (
                    Slots::Host {
                        sender,
                        bytes,
                        lent: Vec::new(),
                    },
                    layout,
                )
            }
            Some(out) => {
                let sender = Sender::<DeviceLocal>::new(ctx, opts).map_err(named)?;
                let device: &CudaDevice = out.device();
                let imported = sender
                    .buffers()
                    .iter()
                    .map(|b| device.import_buffer(b))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("CUDA cannot import the ring's slots: {e}"))?;
                let span = Planes::of_ring(sender.layout()).span() as u64;
                if let Some(small) = imported.iter().find(|b| b.size() < span) {
                    return Err(format!(
                        "the ring's slots have {} bytes; a frame's rows need {span}",
                        small.size()
                    ));
                }
                let stream =
                    Stream::new(device).map_err(|e| format!("cannot make a CUDA stream: {e}"))?;
                let written = TimelineSemaphore::new_local(ctx)
                    .map_err(|e| format!("cannot make a timeline: {e}"))?;
                let layout = *sender.layout();
                (
                    Slots::Cuda(Box::new(CudaSlots {
                        sender,
                        imported,
                        out: Arc::clone(out),
                        stream,
                        written,
                        value: 0,
                    })),
                    layout,
                )
            }
        };
        Ok(Ring {
            slots,
            info: info.clone(),
            planes: Planes::of_ring(&layout),
            generation: self.rings_made.fetch_add(1, Ordering::Relaxed) + 1,
        })
    }

    /// Writes `buffer` (CUDA memory) into a free slot by CUDA copies and
    /// presents it: the frame's sequence number, or `None` when no slot
    /// freed within `timeout`.
    fn render_cuda(
        ring: &mut Ring,
        buffer: &gst::BufferRef,
        timestamp: u64,
        timeout: Duration,
        flushing: &AtomicBool,
    ) -> Result<Option<u64>, String> {
        let Slots::Cuda(cuda) = &mut ring.slots else {
            return Err("a CUDA write into a host-visible ring: a cudainteropsink bug".into());
        };
        let CudaSlots {
            sender,
            imported,
            out,
            stream,
            written,
            value,
        } = &mut **cuda;
        let deadline = Instant::now() + timeout;
        loop {
            match sender.acquire(step_until(deadline)) {
                // The whole write in this arm: the slot borrows the sender.
                Ok(slot) => {
                    return write_by_cuda(
                        slot,
                        CudaWrite {
                            imported,
                            out,
                            stream,
                            written,
                            value,
                        },
                        buffer,
                        &ring.info,
                        &ring.planes,
                        timestamp,
                    )
                    .map(Some)
                }
                Err(AcquireError::Timeout(_)) if keep_waiting(flushing, deadline) => continue,
                Err(_) => return Ok(None),
            }
        }
    }
}

impl CudaInteropSink {
    /// Offers upstream a pool whose buffers are the ring's slots (`pool`'s
    /// contract), where the caps are the host-visible ring's and
    /// GStreamer's default layout of them is the ring's: the element before
    /// the sink then writes each frame into a slot, and `render` presents
    /// it without a copy.
    fn offer_slot_pool(&self, query: &mut gst::query::Allocation) {
        let (Some(caps), true) = query.get() else {
            return;
        };
        if cuda_memory::in_cuda_memory(caps) {
            return;
        }
        let Ok(info) = gst_video::VideoInfo::from_caps(caps) else {
            return;
        };
        let generation = {
            let guard = lock(&self.ring);
            let Some(ring) = guard.as_ref() else {
                return;
            };
            let same_video = (ring.info.format(), ring.info.width(), ring.info.height())
                == (info.format(), info.width(), info.height());
            if !matches!(ring.slots, Slots::Host { .. })
                || !same_video
                || !ring.planes.is_default_of(&info)
            {
                return;
            }
            ring.generation
        };
        let ring = Arc::downgrade(&self.ring);
        let pool = SlotPool::new(Box::new(move |size| {
            let ring = ring.upgrade()?;
            let mut guard = lock(&ring);
            let r = guard.as_mut().filter(|r| r.generation == generation)?;
            let Slots::Host { sender, lent, .. } = &mut r.slots else {
                return None;
            };
            lent.retain(|c| c.strong_count() > 0);
            let out = lent
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|c| lock(c).is_some())
                .count();
            if out + UNLENT >= SLOTS as usize {
                return None;
            }
            // A slot free now, or a plain buffer (no frame skipped: none
            // counted): the wait for a slot is `render`'s, bounded by
            // `timeout`.
            let slot = sender.acquire_free()?;
            let slot = match slot.lend() {
                Ok(slot) => slot,
                Err(e) => {
                    gst::warning!(CAT, "lending a slot failed ({e}): a plain buffer instead");
                    return None;
                }
            };
            let (buffer, cell) = pool::lent_buffer(slot, size)?;
            lent.push(cell);
            Some(buffer)
        }));
        gst::debug!(
            CAT,
            imp = self,
            "offering a pool of the ring's slots for {caps}"
        );
        query.add_allocation_pool(Some(&pool), info.size() as u32, 0, 0);
    }

    /// What a present's outcome is for the pipeline.
    fn presented(
        &self,
        outcome: Result<u64, SenderError>,
        timestamp: u64,
        how: &str,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        match outcome {
            Ok(sequence) => {
                self.presented.fetch_add(1, Ordering::Relaxed);
                gst::trace!(
                    CAT,
                    imp = self,
                    "frame {sequence} presented at {timestamp} ns ({how})"
                );
                Ok(gst::FlowSuccess::Ok)
            }
            Err(e) => {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::Write,
                    ("presenting a frame failed: {}", e)
                );
                Err(gst::FlowError::Error)
            }
        }
    }
}

/// One step of a wait for a slot that ends at `deadline`.
fn step_until(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).min(STEP)
}

/// Whether a wait for a slot goes on after a step that found none.
fn keep_waiting(flushing: &AtomicBool, deadline: Instant) -> bool {
    !flushing.load(Ordering::SeqCst) && Instant::now() < deadline
}

/// What a CUDA write into a slot uses besides the slot.
struct CudaWrite<'a> {
    imported: &'a mut [ImportedBuffer<DeviceLocal>],
    out: &'a CudaOut,
    stream: &'a Stream,
    written: &'a TimelineSemaphore,
    value: &'a mut u64,
}

/// Copies `buffer` (CUDA memory of `info`) into `slot` by CUDA and
/// presents it after a host-signalled timeline; its sequence number.
fn write_by_cuda(
    slot: WriteSlot<'_, DeviceLocal>,
    w: CudaWrite<'_>,
    buffer: &gst::BufferRef,
    info: &gst_video::VideoInfo,
    planes: &Planes,
    timestamp: u64,
) -> Result<u64, String> {
    let index = slot.index() as usize;
    // Acquired for the main queue's family, already reached on return:
    // CUDA may write the slot from here on.
    let slot = slot
        .open(QueueRole::Main)
        .map_err(|e| format!("opening a slot failed: {e}"))?;
    let mapped = w.imported[index]
        .map()
        .map_err(|e| format!("mapping a slot into CUDA failed: {e}"))?;
    let dst: Vec<DevicePlane> = (0..planes.n)
        .map(|i| DevicePlane {
            ptr: mapped.device_ptr() + planes.offsets[i] as u64,
            pitch: planes.strides[i] as u64,
            row_bytes: planes.row_bytes[i] as u64,
            rows: planes.rows[i] as u32,
        })
        .collect();
    // On an error the open slot's drop releases it unpresented; the
    // mapping is leaked, not freed, since a copy that timed out may still
    // be writing through it.
    if let Err(e) = w.out.read_into(buffer, info, &dst, w.stream, COPY_BOUND) {
        std::mem::forget(mapped);
        return Err(e);
    }
    drop(mapped);
    *w.value += 1;
    w.written
        .signal(*w.value)
        .map_err(|e| format!("signalling the copy's timeline failed: {e}"))?;
    slot.present(timestamp, (w.written, *w.value))
        .map_err(|e| format!("presenting a frame failed: {e}"))
}

impl BaseSinkImpl for CudaInteropSink {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = lock(&self.settings).clone();
        let name = settings
            .sender_name
            .unwrap_or_else(|| self.obj().name().to_string());
        validate_name(&name).map_err(|e| {
            gst::error_msg!(
                gst::ResourceError::Settings,
                ("{} (set sender-name= to the name receivers connect to)", e)
            )
        })?;
        let ctx = Context::headless(&HeadlessOptions::default()).map_err(|e| {
            gst::error_msg!(
                gst::ResourceError::OpenWrite,
                (
                    "no Vulkan device to publish frames from ({}): install a Vulkan driver (on \
                     Debian or Ubuntu without a GPU: apt-get install mesa-vulkan-drivers)",
                    e
                )
            )
        })?;
        gst::info!(
            CAT,
            imp = self,
            "publishing as {name:?} from {}",
            ctx.identity().name
        );
        // CUDA memory in: the library and an NVIDIA device for this context.
        let cuda_out = GstCuda::get()
            .and_then(|lib| {
                let device = CudaDevice::for_vulkan(&ctx)
                    .map_err(|e| format!("{} has no CUDA device ({e})", ctx.identity().name))?;
                CudaOut::new(lib, &device)
            })
            .map(Arc::new);
        match &cuda_out {
            Ok(_) => gst::info!(
                CAT,
                imp = self,
                "{CUDA_MEMORY} taken (written by CUDA copies)"
            ),
            Err(why) => gst::info!(CAT, imp = self, "{CUDA_MEMORY} not taken: {why}"),
        }
        *lock(&self.cuda_out) = cuda_out.ok();
        *lock(&self.ctx) = Some(ctx);
        *lock(&self.name) = Some(name);
        self.presented.store(0, Ordering::Relaxed);
        self.in_place.store(0, Ordering::Relaxed);
        self.skipped.store(0, Ordering::Relaxed);
        let ring = self.ring.clone();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cudainteropsink-serve".into())
            .spawn(move || {
                // Until told to stop (or the element is gone).
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(SERVE_PERIOD) {
                    if let Some(r) = lock(&ring).as_mut() {
                        r.slots.serve();
                    }
                }
            })
            .map_err(|e| {
                gst::error_msg!(
                    gst::CoreError::Thread,
                    ("cannot start the thread that serves receivers: {}", e)
                )
            })?;
        *lock(&self.server) = Some(Server { stop, thread });
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        gst::info!(
            CAT,
            imp = self,
            "stopping: {} frames presented ({} in place), {} skipped",
            self.presented.load(Ordering::Relaxed),
            self.in_place.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed)
        );
        self.stop_server();
        // The sender's drop says goodbye and removes the name.
        *lock(&self.ring) = None;
        *lock(&self.cuda_out) = None;
        *lock(&self.ctx) = None;
        *lock(&self.name) = None;
        Ok(())
    }

    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let template = self.obj().sink_pad().pad_template_caps();
        // CUDA memory only where it is taken; before `start` that is not
        // known yet, and the template lets a pipeline description link
        // (negotiation comes after `start`).
        let started = lock(&self.ctx).is_some();
        let caps = if !started || lock(&self.cuda_out).is_some() {
            template
        } else {
            let mut system = gst::Caps::new_empty();
            for (s, f) in template.iter_with_features() {
                if !f.contains(CUDA_MEMORY) {
                    system.merge_structure_full(s.to_owned(), Some(f.to_owned()));
                }
            }
            system
        };
        Some(match filter {
            Some(filter) => filter.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    fn propose_allocation(
        &self,
        query: &mut gst::query::Allocation,
    ) -> Result<(), gst::LoggableError> {
        self.offer_slot_pool(query);
        self.parent_propose_allocation(query)
    }

    fn query(&self, query: &mut gst::QueryRef) -> bool {
        cuda_memory::answer_context_query(&self.cuda_out, self.obj().upcast_ref(), query)
            || BaseSinkImplExt::parent_query(self, query)
    }

    fn unlock(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let info = gst_video::VideoInfo::from_caps(caps)
            .map_err(|e| self.fail(&format!("caps {caps} are not video: {e}")))?;
        let cuda = cuda_memory::in_cuda_memory(caps);
        // A ring's frame has no fields (caps without interlace-mode are
        // progressive, so the template does not restrict it: that would
        // refuse them).
        if info.interlace_mode() != gst_video::VideoInterlaceMode::Progressive {
            return Err(self.fail(&format!(
                "{:?} video: a ring's frame has no fields (put deinterlace before \
                 cudainteropsink)",
                info.interlace_mode()
            )));
        }
        // A ring carries square pixels and no colorimetry: say what is lost.
        if info.par() != gst::Fraction::new(1, 1) {
            gst::warning!(
                CAT,
                imp = self,
                "pixel-aspect-ratio {} is not carried (receivers see square pixels): put \
                 videoscale and a caps filter with pixel-aspect-ratio=1/1 before the sink to \
                 keep the picture's shape",
                info.par()
            );
        }
        let cuda_out = lock(&self.cuda_out).clone();
        if cuda && cuda_out.is_none() {
            return Err(self.fail(&format!(
                "{CUDA_MEMORY} caps, but this sink takes no CUDA memory here (it needs an NVIDIA \
                 GPU and libgstreamer-plugins-bad1.0-0): put cudadownload before it"
            )));
        }
        let mut ring = lock(&self.ring);
        if let Some(r) = ring.as_mut() {
            if (
                r.info.format(),
                r.info.width(),
                r.info.height(),
                r.slots.in_cuda(),
            ) == (info.format(), info.width(), info.height(), cuda)
            {
                r.info.clone_from(&info);
                return Ok(());
            }
            gst::info!(
                CAT,
                imp = self,
                "caps changed to {caps}: the sender is made anew"
            );
        }
        // The old sender goes first: its name is the new one's.
        *ring = None;
        let ctx = lock(&self.ctx).clone();
        let name = lock(&self.name).clone();
        let (Some(ctx), Some(name)) = (ctx, name) else {
            return Err(self.fail("caps before the element started"));
        };
        let made = self
            .make_ring(&ctx, &name, &info, cuda_out.as_ref().filter(|_| cuda))
            .map_err(|e| self.fail(&e))?;
        gst::info!(
            CAT,
            imp = self,
            "sender {name:?}: {:?}{}",
            made.slots.layout(),
            if cuda { ", written by CUDA" } else { "" }
        );
        *ring = Some(made);
        Ok(())
    }

    fn render(&self, buffer: &gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
        let timeout = Duration::from_millis(u64::from(lock(&self.settings).timeout_ms));
        let element = self.obj();
        let running = element
            .segment()
            .downcast_ref::<gst::ClockTime>()
            .and_then(|s| s.to_running_time(buffer.pts()));
        let timestamp = crate::clock::timestamp_of(element.upcast_ref(), running);
        let mut guard = lock(&self.ring);
        let Some(ring) = guard.as_mut() else {
            gst::element_imp_error!(self, gst::CoreError::Negotiation, ("a buffer before caps"));
            return Err(gst::FlowError::NotNegotiated);
        };
        if ring.slots.in_cuda() {
            return match Self::render_cuda(
                ring,
                buffer.as_ref(),
                timestamp,
                timeout,
                &self.flushing,
            ) {
                Ok(Some(sequence)) => {
                    self.presented.fetch_add(1, Ordering::Relaxed);
                    gst::trace!(CAT, imp = self, "frame {sequence} presented by CUDA");
                    Ok(gst::FlowSuccess::Ok)
                }
                Ok(None) => {
                    let n = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
                    gst::debug!(CAT, imp = self, "buffer dropped ({n} so far): no free slot");
                    Ok(gst::FlowSuccess::Ok)
                }
                Err(e) => {
                    gst::element_imp_error!(self, gst::ResourceError::Write, ("{}", e));
                    Err(gst::FlowError::Error)
                }
            };
        }
        let Slots::Host {
            sender,
            bytes,
            lent,
        } = &mut ring.slots
        else {
            gst::element_imp_error!(self, gst::CoreError::Failed, ("a ring of neither kind"));
            return Err(gst::FlowError::Error);
        };
        ring.planes.check_meta(buffer.as_ref()).map_err(|e| {
            gst::element_imp_error!(self, gst::StreamError::Format, ("{}", e));
            gst::FlowError::Error
        })?;
        let in_layout = ring.planes.same_layout(buffer.as_ref(), &ring.info, *bytes);
        // A buffer of the offered pool, written into a lent slot in the
        // ring's layout and now the sink's alone: presented as it is.
        if let Some(slot) = in_layout.then(|| pool::take_lent(buffer, lent)).flatten() {
            let presented = sender.present_lent(slot, timestamp);
            if presented.is_ok() {
                self.in_place.fetch_add(1, Ordering::Relaxed);
            }
            return self.presented(presented, timestamp, "in place");
        }
        // A buffer already in the ring's layout goes in as it is; any other
        // is packed into it first.
        let mapped;
        let packed;
        let bytes: &[u8] = if in_layout {
            mapped = buffer.map_readable().map_err(|e| {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Format,
                    ("a buffer that does not map: {}", e)
                );
                gst::FlowError::Error
            })?;
            &mapped.as_slice()[..*bytes]
        } else {
            let frame =
                gst_video::VideoFrameRef::from_buffer_ref_readable(buffer.as_ref(), &ring.info)
                    .map_err(|e| {
                        gst::element_imp_error!(
                            self,
                            gst::StreamError::Format,
                            ("a buffer that does not map as its caps' video: {}", e)
                        );
                        gst::FlowError::Error
                    })?;
            packed = ring.planes.pack(&frame, *bytes).map_err(|e| {
                gst::element_imp_error!(self, gst::StreamError::Format, ("{}", e));
                gst::FlowError::Error
            })?;
            &packed
        };
        let deadline = Instant::now() + timeout;
        let presented = loop {
            match sender.acquire(step_until(deadline)) {
                // The whole write in this arm: the slot borrows the sender.
                // Copied in by the host through the slot's mapping.
                Ok(slot) => break slot.present_bytes(timestamp, bytes),
                Err(AcquireError::Timeout(_)) if keep_waiting(&self.flushing, deadline) => continue,
                Err(e) => {
                    let n = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
                    gst::debug!(CAT, imp = self, "buffer dropped ({n} so far): {e}");
                    return Ok(gst::FlowSuccess::Ok);
                }
            }
        };

        self.presented(presented, timestamp, "copied")
    }
}
