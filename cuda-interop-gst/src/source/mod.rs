//! `cudainteropsrc`: a live push source that receives a cuda-interop
//! sender's frames and pushes them as `video/x-raw` buffers in system
//! memory, or in `memory:CUDAMemory` from a device-local ring where
//! GStreamer's CUDA library is installed.
//!
//! # Contract
//!
//! * Where: `sender-name` (a name in `$XDG_RUNTIME_DIR/cuda-interop-frames`,
//!   waited for up to `timeout`), else `socket` (a socket path), else the
//!   element's own name (`cudainteropsrc name=cam` receives `cam`).
//!   Connecting happens in READY -> PAUSED (`start`), so the caps are the
//!   ring's from the first negotiation; a ring GStreamer has no format for
//!   fails there with an element error listing the formats that work.
//! * Each buffer is one frame, copied out and released before the push
//!   (see `crate::receive`): PTS from the frame's `CLOCK_MONOTONIC`
//!   timestamp (`crate::clock`; never earlier than the previous buffer's),
//!   no duration (framerate 0/1), OFFSET the frame's sequence number and
//!   OFFSET_END the next. A gap (frames the sender presented between two
//!   this receiver got: `latest` delivery; none before its first) sets
//!   DISCONT on the buffer after it, adds to `frames-dropped` and posts
//!   a QoS message whose stats are the frames received and dropped so far
//!   (format `buffers`).
//! * Memory: the caps offer `memory:CUDAMemory` first where the reader
//!   has GStreamer's CUDA memory for the ring (`crate::cuda_memory`: a
//!   device-local ring, the library loaded, a format its allocator lays
//!   out); negotiated, every buffer is one `GstCudaMemory` with its
//!   `GstVideoMeta`, complete when pushed (counted in
//!   `cuda-memory-buffers`): a copy in GStreamer's CUDA buffer pool,
//!   released at once; with `zero-copy` on GStreamer 1.24 and later, the
//!   ring's slot itself (counted in `zero-copy-buffers`), the frame held
//!   until downstream drops the buffer (drop it once done with it, GPU
//!   reads included, as with any pooled buffer; holding every slot
//!   starves the source, bounded by `timeout`; a buffer held past the
//!   sender's hold timeout, 5 s by default, gets this receiver dropped,
//!   an element error, and its pixels may then change under it). CUDA context queries are
//!   answered with the receiver's context. The debug log has each frame's
//!   hand-off (received -> copied, or the slot wrapped).
//! * System memory with `zero-copy` and lossless delivery, from a
//!   host-visible ring whose rows are GStreamer's default for the caps:
//!   each buffer is one memory over the slot in the receiver's own mapping
//!   (`HostReceiver::read_in_place`: the device's writes made visible to
//!   the host, no copy), counted in `zero-copy-buffers`, the frame held
//!   until downstream frees the buffer, under the same rules as CUDA slots
//!   above; other rings, or without `zero-copy`, are copied as below.
//! * Rows (system memory): when the ring's strides and plane offsets are
//!   GStreamer's default for the caps, the bytes go downstream as read;
//!   otherwise with a `GstVideoMeta` when downstream's allocation query
//!   accepts one, else copied into the default layout (tight rows,
//!   GStreamer's stride rounding).
//! * Live: no frames in PAUSED, not seekable (seeks fail, the stream goes
//!   on). `unlock` makes a waiting `create` return within 50 ms. Every
//!   wait is bounded by `timeout`: no frame for that long is an element
//!   error. The sender stopping cleanly (its goodbye) is EOS; a sender
//!   that vanished or dropped this receiver is an element error saying
//!   what to do.

use gst::glib;
use gst::prelude::*;

mod imp;

/// How the source asks for frames (`delivery`).
#[derive(Debug, Default, Eq, PartialEq, Hash, Clone, Copy, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstCudaInteropDelivery")]
pub enum DeliveryMode {
    /// The newest frame each time: the sender never waits for this
    /// pipeline; frames in between are dropped (counted).
    #[default]
    #[enum_value(name = "Latest: the newest frame, never waited for", nick = "latest")]
    Latest = 0,
    /// Every frame, in order: the sender waits (bounded) for this pipeline.
    #[enum_value(name = "Lossless: every frame, in order", nick = "lossless")]
    Lossless = 1,
}

glib::wrapper! {
    /// The `cudainteropsrc` element (see the module contract).
    pub struct CudaInteropSrc(ObjectSubclass<imp::CudaInteropSrc>)
        @extends gst_base::PushSrc, gst_base::BaseSrc, gst::Element, gst::Object;
}

/// Registers `cudainteropsrc` with `plugin`.
pub(crate) fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "cudainteropsrc",
        gst::Rank::NONE,
        CudaInteropSrc::static_type(),
    )
}
