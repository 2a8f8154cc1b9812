//! The receiving side of `cudainteropsrc`: one reader over the crate's
//! three receivers, picked from the ring, each frame copied into memory
//! the element owns (bytes, or GStreamer's CUDA memory) and released at
//! once.
//!
//! # Contract
//!
//! * [`Reader::connect`] connects to a sender by name (waiting up to the
//!   timeout for it to appear) or by socket path, refuses a ring GStreamer
//!   has no format for (before importing anything), and imports the ring:
//!   host-visible buffer rings with a [`HostReceiver`] (what lavapipe
//!   gives), image rings with an [`ImageReader`] on a headless Vulkan
//!   context of the records' device, device-local buffer rings with a
//!   [`CudaReceiver`] (NVIDIA GPUs; its error says so where there is no
//!   CUDA driver); a device-local ring's reader also wraps its CUDA
//!   context for GStreamer's CUDA memory where that library loads
//!   ([`Reader::cuda_out`]).
//! * [`Reader::next`] waits at most its timeout and tells a frame, no
//!   frame yet ([`Next::Timeout`]), a sender that stopped cleanly
//!   ([`Next::Goodbye`]) and a fault ([`Next::Fault`], with what to do).
//! * [`Reader::read`] takes the frame by value, copies it out (through the
//!   slot's host mapping for a host-visible ring, into a reused allocation;
//!   an image ring's by a Vulkan copy; for a device-local ring a CUDA
//!   device-to-host copy, or with [`Output::Cuda`] a device-to-device copy
//!   into a `GstCudaMemory`, waited for) and releases it before returning,
//!   whatever the copy's outcome. One exception, with [`Output::Cuda`]
//!   asked to wrap where GStreamer is 1.24 or later: the frame, waited
//!   for, goes
//!   downstream as a `GstCudaMemory` wrapping its slot (no copy), and is
//!   released (on the reader's stream) when GStreamer frees that memory;
//!   the buffer keeps the receiver, and so the imported slots, alive.

use std::time::{Duration, Instant};

use cuda_interop::Stream;
use cuda_interop_frames::cuda_receiver::{cuda_device_for, CudaReceiver};
use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::image_reader::{ImageReader, ImageReaderError};
use cuda_interop_frames::protocol::{Delivery, DropReason, RingLayout};
use cuda_interop_frames::session::{ConnectError, Frame, Session};
use cuda_interop_frames::transport::ConsumerError;
use cuda_interop_frames::vulkan_receiver::VulkanReceiverError;
use vk_export::markers::{HostVisible, MemoryLocation};
use vk_export::wire::Resource;
use vk_export::{Context, HeadlessOptions};

use std::sync::Arc;

use crate::cuda_memory::{CudaOut, DevicePlane, GstCuda};
use crate::formats::{ring_video, FrameBytes, Planes, Recycler, RingVideo};

/// Where the sender is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A name in the default directory.
    Name(String),
    /// A socket path.
    Socket(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Name(name) => write!(f, "the sender named {name:?}"),
            Target::Socket(path) => write!(f, "the sender at {path}"),
        }
    }
}

/// A receiver of one of the three kinds.
#[derive(Debug)]
pub(crate) enum Reader {
    /// A host-visible buffer ring (shared with the buffers that wrap its
    /// slots), and the allocations its frames reuse.
    Host(Arc<HostReceiver>, Recycler),
    /// An image ring.
    Image(ImageReader),
    /// A device-local buffer ring, read through CUDA.
    Cuda {
        /// The receiver (shared with the buffers that wrap its slots).
        rx: Arc<CudaReceiver>,
        /// The stream its copies and releases go on.
        stream: Stream,
        /// GStreamer's CUDA memory around its context, or why there is
        /// none.
        cuda_out: Result<Arc<CudaOut>, String>,
    },
}

/// Where [`Reader::read`] puts a frame.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Output<'a> {
    /// Bytes in system memory; `wrap`: a host-visible ring's slot itself
    /// where its rows are GStreamer's default for `info` and delivery is
    /// lossless, else a copy.
    System {
        /// The caps' video.
        info: &'a gst_video::VideoInfo,
        /// Hand out the slot itself where possible.
        wrap: bool,
    },
    /// A `GstCudaMemory` laid out for this video info (a device-local
    /// ring's reader with [`Reader::cuda_out`] only); `wrap`: the slot
    /// itself where GStreamer can wrap it (1.24 or later), else a copy.
    Cuda {
        /// The caps' video.
        info: &'a gst_video::VideoInfo,
        /// Hand out the slot itself where possible.
        wrap: bool,
    },
}

/// A frame's pixels, copied out.
#[derive(Debug)]
pub(crate) enum Pixels {
    /// In system memory, laid out as [`RingVideo::planes`] says.
    Bytes(FrameBytes),
    /// In a buffer of one `GstCudaMemory`, with its `GstVideoMeta`: a copy.
    Cuda(gst::Buffer),
    /// The same, wrapping the ring's slot itself (no copy; the frame held
    /// until GStreamer frees the memory).
    Slot(gst::Buffer),
    /// In a buffer of one system memory that is a host-visible ring's slot
    /// in this receiver's mapping (no copy; the frame held until GStreamer
    /// frees the memory), rows at GStreamer's default strides.
    HostSlot(gst::Buffer),
}

/// What [`Reader::next`] got.
#[derive(Debug)]
pub(crate) enum Next {
    /// A frame.
    Frame(Frame),
    /// None within the timeout.
    Timeout,
    /// The sender stopped and said goodbye: the end of the stream.
    Goodbye,
    /// The connection failed; what happened and what to do.
    Fault(String),
}

/// A frame copied out.
#[derive(Debug)]
pub(crate) struct Copied {
    /// Its pixels.
    pub(crate) pixels: Pixels,
    /// Its sequence number.
    pub(crate) sequence: u64,
    /// Its `CLOCK_MONOTONIC` timestamp.
    pub(crate) timestamp_ns: u64,
    /// Frames presented between the previous one received and this one.
    pub(crate) dropped_before: u64,
    /// Copied from device memory by CUDA.
    pub(crate) device_copy: bool,
    /// When the copy was complete (before the release), or the slot
    /// wrapped: the end of the hand-off.
    pub(crate) ready_at: Instant,
}

/// `e` in the words of the element's error: what happened, what to do.
fn fault(target: &Target, e: &ConsumerError) -> String {
    match e {
        ConsumerError::Closed => format!(
            "{target} closed the connection without a goodbye (it crashed or was killed): \
             restart it, then this pipeline"
        ),
        ConsumerError::Dropped(reason) => format!(
            "{target} dropped this receiver: {reason}; restart the pipeline (a slow pipeline \
             holds frames too long only if a copy stalls: see the debug log)"
        ),
        other => format!("receiving from {target} failed: {other}"),
    }
}

fn classify(target: &Target, e: ConsumerError) -> Next {
    match e {
        ConsumerError::Timeout(_) | ConsumerError::Busy(_) => Next::Timeout,
        ConsumerError::Dropped(DropReason::SenderStopping) => Next::Goodbye,
        other => Next::Fault(fault(target, &other)),
    }
}

fn vulkan_fault(target: &Target, e: VulkanReceiverError) -> Next {
    match e {
        VulkanReceiverError::Consumer(c) => classify(target, c),
        other => Next::Fault(format!("receiving from {target} failed: {other}")),
    }
}

impl Reader {
    /// Connects to `target` in `delivery`, within `timeout`, and imports
    /// its ring (see the module contract); the ring as GStreamer video.
    pub(crate) fn connect(
        target: &Target,
        delivery: Delivery,
        timeout: Duration,
    ) -> Result<(Reader, RingVideo), String> {
        let (session, setup) = match target {
            Target::Name(name) => {
                let directory = Directory::from_env().map_err(|e| e.to_string())?;
                Session::connect_named(&directory, name, delivery, timeout).map_err(|e| {
                    let hint = match &e {
                        ConnectError::Discovery(_) => {
                            " (is the sender running, under this user, with the same \
                             XDG_RUNTIME_DIR? cuda-interop's list_senders() shows the names)"
                        }
                        ConnectError::Consumer(_) => "",
                    };
                    format!("cannot connect to {target} within {timeout:?}: {e}{hint}")
                })?
            }
            Target::Socket(path) => Session::connect(path, delivery, timeout)
                .map_err(|e| format!("cannot connect to {target} within {timeout:?}: {e}"))?,
        };
        let layout: RingLayout = *session.layout();
        let video = ring_video(&layout)?;
        let first = setup.message().resources.first();
        let reader = if layout.is_image_ring() {
            let Some(Resource::Image(info)) = first else {
                return Err(format!(
                    "{target} announced an image ring but shared no image first: a sender bug"
                ));
            };
            let ctx = Context::headless(&HeadlessOptions {
                device_uuid: Some(info.device_uuid()),
                ..HeadlessOptions::default()
            })
            .map_err(|e| {
                format!(
                    "no Vulkan device to read {target}'s images on ({e}): install a Vulkan \
                     driver (mesa-vulkan-drivers, or the GPU vendor's)"
                )
            })?;
            let rx = ImageReader::new(&ctx, session, setup).map_err(|e| match e {
                ImageReaderError::Receiver(e) => format!("cannot import {target}'s images: {e}"),
                other => format!("cannot read {target}'s images: {other}"),
            })?;
            Reader::Image(rx)
        } else {
            let host_visible = match first {
                Some(Resource::Buffer(info)) => HostVisible::admits(info.memory_flags()),
                _ => true,
            };
            if host_visible {
                let rx = HostReceiver::from_session(session, setup)
                    .map_err(|e| format!("cannot import {target}'s buffers: {e}"))?;
                Reader::Host(Arc::new(rx), Recycler::default())
            } else {
                let rx =
                    CudaReceiver::from_session(session, setup, cuda_device_for).map_err(|e| {
                        format!(
                            "{target} shares device-local buffers, which only CUDA reads here, \
                             and that failed: {e}. On a machine with an NVIDIA GPU, install its \
                             driver (libcuda.so.1); or run the sender with host-visible slots \
                             (frame_server --host-visible)"
                        )
                    })?;
                let stream = Stream::new(rx.cuda())
                    .map_err(|e| format!("cannot make a CUDA stream for {target}: {e}"))?;
                let cuda_out = GstCuda::get()
                    .and_then(|lib| CudaOut::new(lib, rx.cuda()))
                    .map(Arc::new);
                Reader::Cuda {
                    rx: Arc::new(rx),
                    stream,
                    cuda_out,
                }
            }
        };
        Ok((reader, video))
    }

    /// The session.
    pub(crate) fn session(&self) -> &Session {
        match self {
            Reader::Host(rx, _) => rx.session(),
            Reader::Image(rx) => rx.session(),
            Reader::Cuda { rx, .. } => rx.session(),
        }
    }

    /// GStreamer's CUDA memory for this reader's frames (a device-local
    /// ring's, where GStreamer's CUDA library loads), or why not.
    pub(crate) fn cuda_out(&self) -> Result<&Arc<CudaOut>, String> {
        match self {
            Reader::Cuda { cuda_out, .. } => cuda_out.as_ref().map_err(Clone::clone),
            Reader::Host(..) | Reader::Image(_) => Err(
                "the ring is not in device-local memory (only CUDA reads those): its frames \
                 arrive in system memory"
                    .into(),
            ),
        }
    }

    /// The next frame within `timeout` (see the module contract).
    pub(crate) fn next(&self, target: &Target, timeout: Duration) -> Next {
        let next = match self {
            Reader::Host(rx, _) => rx.next(timeout),
            Reader::Image(rx) => {
                return rx
                    .next(timeout)
                    .map_or_else(|e| vulkan_fault(target, e), Next::Frame)
            }
            Reader::Cuda { rx, .. } => rx.next(timeout),
        };
        next.map_or_else(|e| classify(target, e), Next::Frame)
    }

    /// Copies `frame` out within `timeout` and releases it (see the module
    /// contract).
    pub(crate) fn read(
        &self,
        target: &Target,
        frame: Frame,
        into: Output<'_>,
        timeout: Duration,
    ) -> Result<Copied, Next> {
        let (sequence, timestamp_ns, dropped_before) = (
            frame.sequence(),
            frame.timestamp_ns(),
            frame.dropped_before(),
        );
        let (pixels, device_copy, ready_at) = match (self, into) {
            (
                Reader::Cuda {
                    rx,
                    stream,
                    cuda_out,
                },
                Output::Cuda { info, wrap },
            ) => {
                let out = cuda_out.as_ref().map_err(|why| Next::Fault(why.clone()))?;
                // The slot itself only where the wrapped memory can say it
                // is no larger than the slot and its strides fit an i32;
                // and only for lossless delivery, where a receiver may hold
                // several frames (a latest one holds one at a time).
                let wrapped =
                    (wrap && out.can_wrap() && self.session().delivery() == Delivery::Lossless)
                        .then(|| Planes::of_ring(rx.layout()))
                        .filter(|planes| {
                            rx.slot(&frame)
                                .is_ok_and(|slot| planes.span() as u64 <= slot.len)
                        })
                        .and_then(|planes| {
                            let strides = planes.strides[..planes.n]
                                .iter()
                                .map(|&s| i32::try_from(s).ok())
                                .collect::<Option<Vec<i32>>>()?;
                            Some((planes, strides))
                        });
                if let Some((planes, strides)) = wrapped {
                    // GStreamer 1.24 and later: the slot itself goes
                    // downstream, the frame held until GStreamer frees it.
                    let waited = rx
                        .wait_on(&frame, stream)
                        .and_then(|()| stream.synchronize(timeout).map_err(Into::into))
                        .and_then(|()| rx.pitched(&frame));
                    let slot = match waited {
                        Ok(slot) => slot,
                        Err(e) => {
                            let _ = rx.release_after(frame, stream);
                            return Err(classify_read(target, e));
                        }
                    };
                    let keep_rx = Arc::clone(rx);
                    let keep: Box<dyn FnOnce() + Send> = Box::new(move || {
                        // Released after everything enqueued on the legacy
                        // default stream, which waits for the context's
                        // blocking streams: GStreamer's CUDA elements read
                        // on such streams and may drop a buffer before
                        // their reads ran.
                        // SAFETY: 1 is the legacy default stream.
                        let _ = unsafe { keep_rx.release_after_raw(frame, 1) };
                    });
                    // SAFETY: the slot is device memory of the receiver's
                    // device (its CUDA context is `out`'s: the reader made
                    // `out` from it), laid out as the ring's planes, whose
                    // span is within the slot (checked above); `keep` holds
                    // the receiver, so the imported memory stays allocated
                    // until it runs. The frame in it is complete (the wait
                    // above, synchronized), and a sender keeping to the
                    // protocol writes the slot again only after `keep`
                    // released the frame, or after it dropped this receiver
                    // for holding the frame past its hold timeout (the
                    // documented limit of zero-copy: the pixels then change
                    // under the buffer).
                    let buffer = unsafe {
                        out.wrap(
                            info,
                            slot.ptr,
                            planes.span(),
                            (&planes.offsets[..planes.n], &strides),
                            keep,
                        )
                    }
                    .map_err(|why| Next::Fault(format!("a frame from {target}: {why}")))?;
                    (Pixels::Slot(buffer), false, Instant::now())
                } else {
                    let filled = rx
                        .wait_on(&frame, stream)
                        .map_err(|e| classify_read(target, e))
                        .and_then(|()| {
                            let luma = rx.pitched(&frame).map_err(|e| classify_read(target, e))?;
                            let chroma = rx.chroma(&frame).map_err(|e| classify_read(target, e))?;
                            let planes: Vec<DevicePlane> = std::iter::once(luma)
                                .chain(chroma)
                                .map(|p| DevicePlane {
                                    ptr: p.ptr,
                                    pitch: p.pitch,
                                    row_bytes: p.row_bytes,
                                    rows: p.rows,
                                })
                                .collect();
                            out.fill(info, &planes, stream, timeout)
                                .map_err(|why| Next::Fault(format!("a frame from {target}: {why}")))
                        })
                        .map(|buffer| (buffer, Instant::now()));
                    // After the copy, on the same stream: the sender writes
                    // the slot only after it.
                    let released = rx.release_after(frame, stream);
                    let (filled, ready_at) = filled?;
                    released.map_err(|e| classify_read(target, e))?;
                    (Pixels::Cuda(filled), false, ready_at)
                }
            }
            (_, Output::Cuda { .. }) => {
                return Err(Next::Fault(
                    "CUDA memory asked of a ring in host memory: a cudainteropsrc bug".into(),
                ))
            }
            (Reader::Host(rx, _), Output::System { info, wrap: true })
                if self.session().delivery() == Delivery::Lossless
                    && Planes::of_ring(rx.session().layout()).is_default_of(info)
                    // GStreamer maps a video buffer only if it holds the
                    // caps' whole size, the last row's padding included,
                    // which a frame need not (NV12 at a width of 2 mod 4).
                    && rx.frame_bytes() >= info.size() as u64 =>
            {
                let start = match rx.read_in_place(&frame, timeout) {
                    Ok(start) => start,
                    Err(e) => {
                        let _ = rx.release(frame);
                        return Err(classify_read(target, e));
                    }
                };
                let held = HeldSlot {
                    len: rx.frame_bytes() as usize,
                    start,
                    frame: Some(frame),
                    rx: Arc::clone(rx),
                };
                let mut buffer = gst::Buffer::new();
                buffer
                    .get_mut()
                    .expect("a buffer just made is writable")
                    .append_memory(gst::Memory::from_slice(held));
                (Pixels::HostSlot(buffer), false, Instant::now())
            }
            (Reader::Host(rx, recycler), Output::System { .. }) => {
                let mut bytes = recycler.take(rx.frame_bytes() as usize);
                let read = rx.read_into(&frame, &mut bytes, timeout);
                let released = rx.release(frame);
                read.map_err(|e| classify_read(target, e))?;
                released.map_err(|e| classify_read(target, e))?;
                (Pixels::Bytes(bytes), false, Instant::now())
            }
            (Reader::Image(rx), Output::System { .. }) => {
                let read = rx.read_pixels(&frame, timeout);
                let released = rx.release(frame);
                let bytes = read.map_err(|e| read_fault(vulkan_fault(target, e)))?;
                released.map_err(|e| read_fault(vulkan_fault(target, e)))?;
                (Pixels::Bytes(FrameBytes::new(bytes)), false, Instant::now())
            }
            (Reader::Cuda { rx, stream, .. }, Output::System { .. }) => {
                let mut bytes = vec![0u8; rx.layout().frame_bytes().unwrap_or(0) as usize];
                let copied = rx
                    .wait_on(&frame, stream)
                    .and_then(|()| rx.copy_to_host(&frame, stream, 0, &mut bytes, timeout));
                let ready_at = Instant::now();
                // After the copy, on the same stream: the sender writes the
                // slot only after it.
                let released = rx.release_after(frame, stream);
                copied.map_err(|e| classify_read(target, e))?;
                released.map_err(|e| classify_read(target, e))?;
                (Pixels::Bytes(FrameBytes::new(bytes)), true, ready_at)
            }
        };
        Ok(Copied {
            pixels,
            sequence,
            timestamp_ns,
            dropped_before,
            device_copy,
            ready_at,
        })
    }
}

/// A host-visible slot's frame as the bytes of a `GstMemory`: held until
/// GStreamer frees the memory, then released; keeps the receiver, and so
/// its mapping of the slot, alive.
struct HeldSlot {
    rx: Arc<HostReceiver>,
    frame: Option<Frame>,
    start: *const u8,
    len: usize,
}

// SAFETY: `start` points into the mapping `rx` owns (a receiver is shared
// between threads already, as `Arc<HostReceiver>` in `Reader`); the slice
// over it is taken once, when GStreamer makes the memory, and the frame is
// released from whichever thread frees it (`Session::release` is
// thread-safe).
unsafe impl Send for HeldSlot {}

impl AsRef<[u8]> for HeldSlot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start` is the frame's first byte in the receiver's
        // mapping of its slot (`read_in_place`, which made the device's
        // writes visible to the host), `len` of them (`frame_bytes`, within
        // the slot), mapped while `rx` lives; the frame is held until this
        // drops, so a sender keeping to the protocol does not write them
        // meanwhile, and this process writes no receiver's mapping. A
        // sender that drops this receiver for holding the frame past its
        // hold timeout may write the slot from its own process: the
        // documented limit of zero-copy (the pixels change under the
        // buffer), as for CUDA slots.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if let Some(frame) = self.frame.take() {
            // No GPU work of this receiver is left on the slot: a plain
            // release (an error means the session is gone already).
            let _ = self.rx.release(frame);
        }
    }
}

/// A failed read's outcome: a timeout of the copy is a fault too (the
/// frame is gone).
fn read_fault(next: Next) -> Next {
    match next {
        Next::Timeout => Next::Fault(
            "copying a frame out did not finish in time: the device is stalled or far too slow \
             for the frame size (raise timeout=)"
                .into(),
        ),
        other => other,
    }
}

fn classify_read(target: &Target, e: ConsumerError) -> Next {
    read_fault(classify(target, e))
}
