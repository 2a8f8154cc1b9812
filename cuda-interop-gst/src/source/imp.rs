//! `cudainteropsrc`'s implementation (the contract is the parent module's).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use cuda_interop_frames::protocol::Delivery;
use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;

use super::DeliveryMode;
use crate::cuda_memory::{self, CudaOut, CUDA_MEMORY};
use crate::formats::{to_buffer, RingVideo};
use crate::lock;
use crate::receive::{Copied, Next, Output, Pixels, Reader, Target};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "cudainteropsrc",
        gst::DebugColorFlags::empty(),
        Some("cuda-interop frame receiver"),
    )
});

/// How long one wait for a frame lasts before the flushing flag is looked
/// at again: `unlock`'s bound.
const STEP: Duration = Duration::from_millis(50);

/// `timeout`'s default, in milliseconds.
const DEFAULT_TIMEOUT_MS: u32 = 10_000;

#[derive(Clone, Debug)]
struct Settings {
    sender_name: Option<String>,
    socket: Option<String>,
    delivery: DeliveryMode,
    timeout_ms: u32,
    zero_copy: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            sender_name: None,
            socket: None,
            delivery: DeliveryMode::Latest,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            zero_copy: false,
        }
    }
}

impl Settings {
    fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.timeout_ms))
    }
}

#[derive(Debug)]
struct State {
    reader: Reader,
    target: Target,
    video: RingVideo,
    info: gst_video::VideoInfo,
    last_pts: Option<gst::ClockTime>,
}

/// The element's instance data.
#[derive(Debug, Default)]
pub struct CudaInteropSrc {
    settings: Mutex<Settings>,
    state: Mutex<Option<State>>,
    /// The ring's caps while started (apart from `state`, which `create`
    /// holds while it waits).
    caps: Mutex<Option<gst::Caps>>,
    /// GStreamer's CUDA memory for the ring's frames while started, where
    /// it is offered (for context queries, apart from `state` too).
    cuda_out: Mutex<Option<Arc<CudaOut>>>,
    /// The negotiated caps are `memory:CUDAMemory`.
    cuda_output: AtomicBool,
    flushing: AtomicBool,
    /// Downstream accepts a `GstVideoMeta` (its allocation query said so).
    video_meta: AtomicBool,
    received: AtomicU64,
    dropped: AtomicU64,
    device_copies: AtomicU64,
    cuda_buffers: AtomicU64,
    slot_buffers: AtomicU64,
}

#[glib::object_subclass]
impl ObjectSubclass for CudaInteropSrc {
    const NAME: &'static str = "GstCudaInteropSrc";
    type Type = super::CudaInteropSrc;
    type ParentType = gst_base::PushSrc;
}

impl ObjectImpl for CudaInteropSrc {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                glib::ParamSpecString::builder("sender-name")
                    .nick("Sender name")
                    .blurb(
                        "The sender's name in $XDG_RUNTIME_DIR/cuda-interop-frames, waited for \
                         up to timeout (unset, with socket unset too: this element's name)",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("socket")
                    .nick("Socket path")
                    .blurb("The sender's socket path (when sender-name is unset)")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder::<DeliveryMode>("delivery")
                    .nick("Delivery")
                    .blurb("latest: the newest frame, never waited for; lossless: every frame")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("timeout")
                    .nick("Timeout (ms)")
                    .blurb(
                        "How long connecting, and waiting for each frame, may take before an \
                         error",
                    )
                    .minimum(1)
                    .default_value(DEFAULT_TIMEOUT_MS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("zero-copy")
                    .nick("Zero copy")
                    .blurb(
                        "Hand downstream the ring's slot itself, no copy, with lossless delivery: \
                         in memory:CUDAMemory (GStreamer 1.24 or later; earlier, a copy), and in \
                         system memory from a host-visible ring whose rows are GStreamer's \
                         default for the caps. The frame stays held until downstream drops the \
                         buffer, so a pipeline that keeps buffers holds the sender's slots. Off: \
                         each frame is copied and released at once",
                    )
                    .default_value(false)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt64::builder("frames-received")
                    .nick("Frames received")
                    .blurb("Frames pushed since the start")
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("frames-dropped")
                    .nick("Frames dropped")
                    .blurb("Frames the sender presented between received ones (gaps)")
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("device-copies")
                    .nick("Device copies")
                    .blurb(
                        "Frames copied from device memory to system memory by CUDA \
                         (device-local rings)",
                    )
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("cuda-memory-buffers")
                    .nick("CUDA memory buffers")
                    .blurb(
                        "Frames pushed in memory:CUDAMemory (a device-to-device copy, or the \
                         slot itself with zero-copy: no host copy)",
                    )
                    .read_only()
                    .build(),
                glib::ParamSpecUInt64::builder("zero-copy-buffers")
                    .nick("Zero-copy buffers")
                    .blurb(
                        "Buffers that are the ring's slot itself (zero-copy where it applies: \
                         lossless delivery; CUDA memory on GStreamer 1.24 or later, or system \
                         memory from a host-visible ring in GStreamer's default rows)",
                    )
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
            "socket" => settings.socket = value.get().expect("type checked upstream"),
            "delivery" => settings.delivery = value.get().expect("type checked upstream"),
            "timeout" => settings.timeout_ms = value.get().expect("type checked upstream"),
            "zero-copy" => settings.zero_copy = value.get().expect("type checked upstream"),
            other => unreachable!("no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        let settings = lock(&self.settings);
        match pspec.name() {
            "sender-name" => settings.sender_name.to_value(),
            "socket" => settings.socket.to_value(),
            "delivery" => settings.delivery.to_value(),
            "timeout" => settings.timeout_ms.to_value(),
            "zero-copy" => settings.zero_copy.to_value(),
            "frames-received" => self.received.load(Ordering::Relaxed).to_value(),
            "frames-dropped" => self.dropped.load(Ordering::Relaxed).to_value(),
            "device-copies" => self.device_copies.load(Ordering::Relaxed).to_value(),
            "cuda-memory-buffers" => self.cuda_buffers.load(Ordering::Relaxed).to_value(),
            "zero-copy-buffers" => self.slot_buffers.load(Ordering::Relaxed).to_value(),
            other => unreachable!("no property {other}"),
        }
    }

    fn constructed(&self) {
        self.parent_constructed();
        let obj = self.obj();
        obj.set_live(true);
        obj.set_format(gst::Format::Time);
        obj.set_do_timestamp(false);
    }
}

impl GstObjectImpl for CudaInteropSrc {}

impl ElementImpl for CudaInteropSrc {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "cuda-interop frame receiver",
                "Source/Video",
                "Receives the frames of a cuda-interop sender (by name or socket), copied into \
                 system memory, or into CUDA memory from a device-local ring",
                "cuda-interop developers",
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            use gst_video::VideoFormat as V;
            let system = [
                V::Rgba,
                V::Bgra,
                V::Rgb10a2Le,
                V::Gray16Le,
                V::Nv12,
                V::P01010le,
            ];
            let mut caps = gst_video::VideoCapsBuilder::new()
                .features([CUDA_MEMORY])
                .format_list(system.into_iter().filter(|f| cuda_memory::supports(*f)))
                .framerate(gst::Fraction::new(0, 1))
                .build();
            caps.merge(
                gst_video::VideoCapsBuilder::new()
                    .format_list(system)
                    .framerate(gst::Fraction::new(0, 1))
                    .build(),
            );
            vec![gst::PadTemplate::new(
                "src",
                gst::PadDirection::Src,
                gst::PadPresence::Always,
                &caps,
            )
            .expect("a valid template")]
        });
        TEMPLATES.as_ref()
    }
}

impl CudaInteropSrc {
    fn target(&self, settings: &Settings) -> Target {
        match (&settings.sender_name, &settings.socket) {
            (Some(name), _) => Target::Name(name.clone()),
            (None, Some(socket)) => Target::Socket(socket.clone()),
            (None, None) => Target::Name(self.obj().name().to_string()),
        }
    }

    /// The error for a fault, posted; the flow return to give.
    fn fail(&self, why: &str) -> gst::FlowError {
        gst::element_imp_error!(self, gst::ResourceError::Read, ("{}", why));
        gst::FlowError::Error
    }

    /// The next frame, copied (into CUDA memory where the caps say so),
    /// within the timeout, and its hand-off (frame received -> its copy
    /// complete, before the release); or the flow return that ends the
    /// wait.
    fn wait_frame(
        &self,
        state: &State,
        timeout: Duration,
        zero_copy: bool,
    ) -> Result<(Copied, Duration), gst::FlowError> {
        let deadline = Instant::now() + timeout;
        let (frame, received) = loop {
            if self.flushing.load(Ordering::SeqCst) {
                return Err(gst::FlowError::Flushing);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.fail(&format!(
                    "no frame from {} within {timeout:?}: it stopped presenting (or is \
                     paused); raise timeout= if that is expected",
                    state.target
                )));
            }
            match state.reader.next(&state.target, left.min(STEP)) {
                Next::Frame(frame) => break (frame, Instant::now()),
                Next::Timeout => continue,
                Next::Goodbye => {
                    gst::info!(CAT, imp = self, "{} stopped: end of stream", state.target);
                    return Err(gst::FlowError::Eos);
                }
                Next::Fault(why) => return Err(self.fail(&why)),
            }
        };
        let into = if self.cuda_output.load(Ordering::SeqCst) {
            Output::Cuda {
                info: &state.info,
                wrap: zero_copy,
            }
        } else {
            Output::System {
                info: &state.info,
                wrap: zero_copy,
            }
        };
        state
            .reader
            .read(&state.target, frame, into, timeout)
            .map(|copied| {
                let handoff = copied.ready_at.saturating_duration_since(received);
                (copied, handoff)
            })
            .map_err(|next| match next {
                Next::Goodbye => gst::FlowError::Eos,
                Next::Fault(why) => self.fail(&why),
                Next::Timeout | Next::Frame(_) => self.fail("a frame's copy failed"),
            })
    }
}

impl BaseSrcImpl for CudaInteropSrc {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = lock(&self.settings).clone();
        let target = self.target(&settings);
        let delivery = match settings.delivery {
            DeliveryMode::Latest => Delivery::Latest,
            DeliveryMode::Lossless => Delivery::Lossless,
        };
        gst::debug!(CAT, imp = self, "connecting to {target} ({delivery:?})");
        let (reader, video) = Reader::connect(&target, delivery, settings.timeout())
            .map_err(|e| gst::error_msg!(gst::ResourceError::OpenRead, ("{}", e)))?;
        let info = video
            .info()
            .map_err(|e| gst::error_msg!(gst::CoreError::Negotiation, ("{}", e)))?;
        let system = info.to_caps().map_err(|e| {
            gst::error_msg!(
                gst::CoreError::Negotiation,
                ("no caps for {:?}: {}", video, e)
            )
        })?;
        // CUDA memory first, where it is offered: negotiation takes it
        // where downstream takes it.
        let cuda_out = match reader.cuda_out() {
            Ok(out) if cuda_memory::supports(info.format()) => Some(Arc::clone(out)),
            Ok(_) => {
                gst::info!(
                    CAT,
                    imp = self,
                    "{:?} frames arrive in system memory (GStreamer's CUDA memory has no layout \
                     for the format)",
                    info.format()
                );
                None
            }
            Err(why) => {
                gst::info!(CAT, imp = self, "{why}");
                None
            }
        };
        let caps = match &cuda_out {
            Some(_) => {
                let mut cuda = system.clone();
                cuda.make_mut()
                    .set_features_simple(Some(gst::CapsFeatures::new([CUDA_MEMORY])));
                cuda.merge(system);
                cuda
            }
            None => system,
        };
        gst::info!(
            CAT,
            imp = self,
            "connected to {target}: {:?}, caps {caps}",
            reader.session().layout()
        );
        self.received.store(0, Ordering::Relaxed);
        self.dropped.store(0, Ordering::Relaxed);
        self.device_copies.store(0, Ordering::Relaxed);
        self.cuda_buffers.store(0, Ordering::Relaxed);
        self.slot_buffers.store(0, Ordering::Relaxed);
        self.cuda_output.store(false, Ordering::SeqCst);
        *lock(&self.cuda_out) = cuda_out;
        *lock(&self.state) = Some(State {
            reader,
            target,
            video,
            info,
            last_pts: None,
        });
        *lock(&self.caps) = Some(caps);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        gst::info!(
            CAT,
            imp = self,
            "stopping: {} frames received ({} the slot itself)",
            self.received.load(Ordering::Relaxed),
            self.slot_buffers.load(Ordering::Relaxed)
        );
        // The receiver's drop closes the connection (the sender takes its
        // slots back).
        *lock(&self.state) = None;
        *lock(&self.caps) = None;
        *lock(&self.cuda_out) = None;
        Ok(())
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let cuda = cuda_memory::in_cuda_memory(caps);
        if cuda && lock(&self.cuda_out).is_none() {
            return Err(gst::loggable_error!(
                CAT,
                "{CUDA_MEMORY} negotiated, but this ring's frames are not offered in it"
            ));
        }
        gst::info!(
            CAT,
            imp = self,
            "frames go downstream in {}",
            if cuda { CUDA_MEMORY } else { "system memory" }
        );
        self.cuda_output.store(cuda, Ordering::SeqCst);
        Ok(())
    }

    fn query(&self, query: &mut gst::QueryRef) -> bool {
        cuda_memory::answer_context_query(&self.cuda_out, self.obj().upcast_ref(), query)
            || BaseSrcImplExt::parent_query(self, query)
    }

    fn is_seekable(&self) -> bool {
        false
    }

    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let caps = lock(&self.caps)
            .clone()
            .unwrap_or_else(|| self.obj().src_pad().pad_template_caps());
        Some(match filter {
            Some(filter) => filter.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    fn decide_allocation(
        &self,
        query: &mut gst::query::Allocation,
    ) -> Result<(), gst::LoggableError> {
        let meta = query
            .find_allocation_meta::<gst_video::VideoMeta>()
            .is_some();
        gst::debug!(CAT, imp = self, "downstream takes GstVideoMeta: {meta}");
        self.video_meta.store(meta, Ordering::SeqCst);
        self.parent_decide_allocation(query)
    }

    fn unlock(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl PushSrcImpl for CudaInteropSrc {
    fn create(
        &self,
        _buffer: Option<&mut gst::BufferRef>,
    ) -> Result<CreateSuccess, gst::FlowError> {
        let (timeout, zero_copy) = {
            let settings = lock(&self.settings);
            (settings.timeout(), settings.zero_copy)
        };
        let mut guard = lock(&self.state);
        let Some(state) = guard.as_mut() else {
            return Err(self.fail("cudainteropsrc produced a buffer before it started"));
        };
        let (copied, handoff) = self.wait_frame(state, timeout, zero_copy)?;
        let meta = self.video_meta.load(Ordering::SeqCst);
        let in_cuda = matches!(copied.pixels, Pixels::Cuda(_) | Pixels::Slot(_));
        let in_slot = matches!(copied.pixels, Pixels::Slot(_) | Pixels::HostSlot(_));
        let mut buffer = match copied.pixels {
            Pixels::Bytes(bytes) => {
                let (buffer, repacked) = to_buffer(bytes, &state.video.planes, &state.info, meta)
                    .map_err(|e| self.fail(&e))?;
                if repacked {
                    gst::trace!(
                        CAT,
                        imp = self,
                        "frame {} copied into GStreamer's default rows",
                        copied.sequence
                    );
                }
                buffer
            }
            Pixels::Cuda(buffer) | Pixels::Slot(buffer) | Pixels::HostSlot(buffer) => buffer,
        };
        gst::debug!(
            CAT,
            imp = self,
            "frame {} hand-off {:.1} us (received -> {})",
            copied.sequence,
            handoff.as_secs_f64() * 1e6,
            if in_slot && in_cuda {
                "its slot wrapped in CUDA memory"
            } else if in_slot {
                "its slot wrapped in system memory"
            } else if in_cuda {
                "copied into CUDA memory"
            } else {
                "copied into system memory"
            }
        );
        let element = self.obj();
        let pts = crate::clock::running_time_of(element.upcast_ref(), copied.timestamp_ns)
            .map(|pts| state.last_pts.map_or(pts, |last| pts.max(last)));
        state.last_pts = pts.or(state.last_pts);
        {
            let b = buffer.get_mut().expect("a new buffer is writable");
            b.set_pts(pts);
            b.set_offset(copied.sequence);
            b.set_offset_end(copied.sequence.saturating_add(1));
            if copied.dropped_before > 0 {
                b.set_flags(gst::BufferFlags::DISCONT);
            }
        }
        let received = self.received.fetch_add(1, Ordering::Relaxed) + 1;
        if in_cuda {
            self.cuda_buffers.fetch_add(1, Ordering::Relaxed);
        }
        if in_slot {
            self.slot_buffers.fetch_add(1, Ordering::Relaxed);
        }
        if copied.device_copy {
            let n = self.device_copies.fetch_add(1, Ordering::Relaxed) + 1;
            gst::debug!(
                CAT,
                imp = self,
                "frame {} copied from device memory by CUDA ({} device copies)",
                copied.sequence,
                n
            );
        }
        if copied.dropped_before > 0 {
            let dropped = self
                .dropped
                .fetch_add(copied.dropped_before, Ordering::Relaxed)
                + copied.dropped_before;
            gst::debug!(
                CAT,
                imp = self,
                "{} frames before frame {} were not received",
                copied.dropped_before,
                copied.sequence
            );
            let qos = gst::message::Qos::builder(true)
                .running_time(pts)
                .stream_time(pts)
                .timestamp(pts)
                .values(0, 1.0, 1_000_000)
                .stats(
                    gst::format::Buffers::from_u64(received),
                    gst::format::Buffers::from_u64(dropped),
                )
                .src(&*element)
                .build();
            let _ = element.post_message(qos);
        }
        Ok(CreateSuccess::NewBuffer(buffer))
    }
}
