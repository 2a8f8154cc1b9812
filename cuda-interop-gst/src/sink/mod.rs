//! `cudainteropsink`: publishes a video stream as a named cuda-interop
//! sender, which any receiver of the frames crate (the host, Vulkan and
//! CUDA receivers, the Python module, `cudainteropsrc`) reads by name.
//!
//! # Contract
//!
//! * Caps: `RGBA`, `NV12` and `P010_10LE` (what buffer rings hold; NV12 and
//!   P010 need an even width and height); put `videoconvert` before it for
//!   anything else (BGRA, I420, ...). Progressive only (a ring's frame
//!   has no fields: interlaced caps are an error saying to put
//!   `deinterlace` before it); a pixel aspect ratio other
//!   than 1/1 is taken with a warning that it is lost. In system memory
//!   everywhere, and in
//!   `memory:CUDAMemory` where the sink takes it: GStreamer's CUDA library
//!   loads and the Vulkan device is an NVIDIA GPU with CUDA (its caps
//!   offer CUDA memory only then; the INFO log says why not).
//! * READY -> PAUSED (`start`) makes a headless Vulkan context (its error
//!   says to install a Vulkan driver) and starts a thread that serves
//!   receivers (connections, requests, releases) between frames. The
//!   sender itself is made at caps: a ring of 4 host-visible buffer slots
//!   of the caps' size and format, rows at the ring's default pitch, with
//!   the "produced" and "released" timelines where the device exports
//!   semaphores (not lavapipe), under `sender-name` (else the element's
//!   name); for CUDA memory, device-local slots imported into CUDA in this
//!   process. A name a live sender holds is an element error naming it. New
//!   caps of another format or size replace the sender: the old one says
//!   goodbye to its receivers (a `cudainteropsrc` gets EOS) and a new one
//!   takes the name.
//! * Each buffer: its rows (at its own strides, a `GstVideoMeta`'s
//!   included; as mapped when already in the ring's layout) are written
//!   into a free slot by the host through the slot's mapping (system
//!   memory: `WriteSlot::present_bytes`), or copied device to
//!   device by CUDA into a slot opened for it, waited for (bounded), and
//!   ordered before the present by a timeline signalled from the host
//!   (CUDA memory: one `GstCudaMemory` of this CUDA context, which CUDA
//!   context queries are answered with; memory of another context is an
//!   element error saying to put `cudadownload` before the sink). The
//!   frame is presented with the
//!   buffer's running time as a `CLOCK_MONOTONIC` timestamp
//!   (`crate::clock`). When no slot frees within `timeout` (latest
//!   receivers holding them all, or lossless ones holding them that long)
//!   the buffer is dropped and counted in `frames-skipped`: a slow
//!   receiver never stalls the pipeline for longer than that; `unlock`
//!   (a flush, a state change) ends the wait within 50 ms, the buffer
//!   dropped likewise.
//! * In system memory the sink offers upstream a buffer pool whose buffers
//!   are the ring's slots (`pool`), for caps whose GStreamer default layout
//!   is the ring's: the element before it (`rtpvrawdepay`, `videotestsrc`,
//!   a decoder that takes downstream pools) writes each frame straight
//!   into a slot, and a buffer of the pool that reaches the sink held by it
//!   alone is presented as it is, with no copy (`frames-in-place` counts
//!   them). Any other buffer (a plain one, a pool buffer shared by a `tee`)
//!   is copied as above. `enable-last-sample` is off by default here: a
//!   last sample is a second reference to each buffer, so setting it makes
//!   every frame a copy. The pool lends while two slots stay unlent (a
//!   `queue` before the sink holds pool buffers; its plain ones are copied
//!   into those), and hands out plain buffers otherwise, no frame skipped
//!   for it. The upstream element's writes are plain stores: a receiver of
//!   the sink's ring in the sink's own process (a `cudainteropsrc` of the
//!   same name in one program) reads the slots with atomic loads, which
//!   such a write would race if that receiver were dropped for a hold
//!   timeout mid-frame; receive in another process, or refuse the pool
//!   (`identity drop-allocation=true` before the sink).
//! * PAUSED -> READY (`stop`) drops the sender: its receivers get a
//!   goodbye, and its name and socket are removed.

use gst::glib;
use gst::prelude::*;

mod imp;
mod pool;

glib::wrapper! {
    /// The `cudainteropsink` element (see the module contract).
    pub struct CudaInteropSink(ObjectSubclass<imp::CudaInteropSink>)
        @extends gst_base::BaseSink, gst::Element, gst::Object;
}

/// Registers `cudainteropsink` with `plugin`.
pub(crate) fn register(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    gst::Element::register(
        Some(plugin),
        "cudainteropsink",
        gst::Rank::NONE,
        CudaInteropSink::static_type(),
    )
}
