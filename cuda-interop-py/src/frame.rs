//! `Frame`: one received buffer or ring slot, handed to DLPack and CUDA Array
//! Interface consumers, and released back to the producer.
//!
//! See the crate's contract (`lib.rs`) for the Python-visible behaviour; the
//! capsule destructors and the deleter ownership rules live here.
//!
//! # Contract
//!
//! * A capsule's destructor calls the tensor's deleter only if no consumer
//!   took it; the deleter runs once, with the GIL released where possible.
//! * A ring frame owns the library's `Frame` (`cuda_interop_frames::session`)
//!   until its release takes it: the slot goes back exactly once, through
//!   `ring::SharedRing::release`, by `release()`, leaving `with`, or the
//!   drop. Whether the frame is still held is the session's to say; this
//!   module keeps only what the Python protocols need (handed out, the
//!   consumer's stream).
//! * A frame of a multi-image ring (several named images a slot, one
//!   frame) is handed out whole by `Frame.tensors`: one ordering on the
//!   consumer's stream (one "produced" wait, every part's copy), then a
//!   dict of [`Part`]s, each a DLPack producer of its image handed out
//!   once, on that stream only; the frame's one release covers them all.
//!   The frame itself is no tensor then (`__dlpack__` and
//!   `__cuda_array_interface__` refuse, saying so).
//! * Uses `errors`, `ring` and (feature `test-hooks`) `host` of this crate;
//!   none of them uses this module.

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

use cuda_interop::dlpack::{
    DLDataType, DLDataTypeCode, DLDevice, DLManagedTensor, DLManagedTensorVersioned, ManagedTensor,
    DL_CPU, DL_CUDA,
};
use cuda_interop::ImportedBuffer;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use vk_export::ash::vk;
use vk_export::format::ChannelType;
use vk_export::markers::DeviceLocal;

use cuda_interop_frames::protocol::{Planar, RingLayout};
use cuda_interop_frames::session::Frame as HeldFrame;

use crate::errors::{consumer_error, cuda_error};
#[cfg(feature = "test-hooks")]
use crate::host::HostBytes;
use crate::ring::SharedRing;

const VERSIONED: &CStr = c"dltensor_versioned";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";
const LEGACY: &CStr = c"dltensor";
const USED_LEGACY: &CStr = c"used_dltensor";

/// `__dlpack__`'s `copy` and `dl_device` arguments, for a frame's or a
/// part's memory on DLPack device `device`: never a copy (shared memory),
/// and only the device it is on.
fn check_export(
    what: &str,
    device: (i32, i32),
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<()> {
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "cuda_interop frames are shared memory; they cannot be exported as a copy",
        ));
    }
    if let Some(wanted) = dl_device.filter(|&d| d != device) {
        return Err(PyBufferError::new_err(format!(
            "the {what} is on DLPack device {device:?}, not {wanted:?}"
        )));
    }
    Ok(())
}

/// One image of a multi-image frame (`Frame.tensors`): a DLPack producer
/// handed out once, on the stream the frame was ordered on.
#[pyclass(module = "cuda_interop")]
pub(crate) struct Part {
    name: String,
    /// Taken once (a mutex: a class Python may share across threads), by
    /// its consumer, or emptied by the frame's release.
    tensor: SharedTensor,
    device: (i32, i32),
    /// The handle `Frame.tensors` ordered the frame on (`None`: `-1`).
    ordered_on: Option<usize>,
    shape: Vec<i64>,
}

#[pymethods]
impl Part {
    /// The DLPack protocol: the part's image as a tensor (`(height, width,
    /// channels)` of its format's channel type), handed out once. `stream`
    /// must be the one `Frame.tensors` was given (its ordering is the only
    /// one made).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let stream = stream_arg(stream.as_ref())?;
        check_export("part", self.device, dl_device, copy)?;
        if stream.handle() != self.ordered_on {
            return Err(PyBufferError::new_err(format!(
                "part {} was ordered on stream {:?} by frame.tensors(); its consumer passed \
                 {:?}: pass the consumer's stream to frame.tensors(stream=...)",
                self.name,
                self.ordered_on,
                stream.handle()
            )));
        }
        let taken = self
            .tensor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let tensor = taken.ok_or_else(|| {
            PyBufferError::new_err(format!(
                "part {} was already handed out, or its frame was released",
                self.name
            ))
        })?;
        capsule(py, tensor, max_version)
    }

    /// `(device_type, device_id)`, the frame's.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }

    /// Its name.
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }

    /// The tensor's shape: `(height, width, channels)`.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    fn __repr__(&self) -> String {
        format!(
            "Part({:?}, shape={:?}, {})",
            self.name,
            self.shape,
            if self
                .tensor
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .is_some()
            {
                "available"
            } else {
                "handed out"
            }
        )
    }
}

/// `tensor` in a DLPack capsule a consumer takes once:
/// `"dltensor_versioned"` for `max_version` major >= 1, else `"dltensor"`.
fn capsule<'py>(
    py: Python<'py>,
    tensor: ManagedTensor,
    max_version: Option<(u32, u32)>,
) -> PyResult<Bound<'py, PyCapsule>> {
    if max_version.is_some_and(|(major, _)| major >= 1) {
        let managed = tensor.into_versioned();
        let pointer = NonNull::new(managed.cast::<c_void>()).expect("a Box is not null");
        // SAFETY: `pointer` is a DLManagedTensorVersioned this capsule
        // now owns; its destructor frees it unless a consumer took it.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                pointer,
                VERSIONED,
                Some(delete_versioned_capsule),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took `managed`; its deleter runs once, here.
            unsafe { call_versioned_deleter(managed) };
        }
        capsule
    } else {
        let managed = tensor.into_legacy().map_err(cuda_error)?;
        let pointer = NonNull::new(managed.cast::<c_void>()).expect("a Box is not null");
        // SAFETY: as above, for the legacy structure.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                pointer,
                LEGACY,
                Some(delete_legacy_capsule),
            )
        };
        if capsule.is_err() {
            // SAFETY: no capsule took `managed`; its deleter runs once, here.
            unsafe { call_legacy_deleter(managed) };
        }
        capsule
    }
}

/// `CU_STREAM_LEGACY`: what a `None` stream means for a CUDA frame (the
/// DLPack protocol's default).
const LEGACY_DEFAULT_STREAM: usize = 1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const PER_THREAD_DEFAULT_STREAM: usize = 2;

/// What a one-message frame hands out once.
pub(crate) enum Payload {
    Imported(ImportedBuffer<DeviceLocal>),
    /// A frame of a ring read on the host, copied out (this frame's own).
    Copied(Box<[u8]>),
    #[cfg(feature = "test-hooks")]
    Host(HostBytes),
}

/// A frame of a ring: the library's frame, held until the release takes it.
pub(crate) struct RingFrame {
    ring: Arc<SharedRing>,
    /// `None` once released (or given back).
    frame: Option<HeldFrame>,
    slot: u32,
    sequence: u64,
    handed_out: bool,
    /// The consumer stream `__dlpack__` ordered after "produced": the
    /// default stream of `release()`.
    consumer_stream: Option<ConsumerStream>,
    /// The stream `__cuda_array_interface__` named, once "produced" was
    /// waited for on it (an image ring's copy is enqueued once a frame).
    /// Set, the frame has that consumer, and `__dlpack__` refuses (one
    /// protocol per frame, so that the release knows which stream it
    /// cannot name).
    interface_stream: Option<Option<usize>>,
    /// The tensors of the parts `Frame.tensors` handed to Python's `Part`s,
    /// shared with them: the release empties what no consumer took yet, so
    /// that a part is never exported after its frame was given back.
    handed_parts: Vec<SharedTensor>,
}

/// A part's tensor, taken once: by its consumer (`Part.__dlpack__`) or by
/// the frame's release.
type SharedTensor = Arc<std::sync::Mutex<Option<ManagedTensor>>>;

impl RingFrame {
    /// Empties the parts no consumer took (before the frame is given back).
    fn revoke_parts(&mut self) {
        for part in self.handed_parts.drain(..) {
            let unexported = part
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            drop(unexported);
        }
    }
}

/// The stream a ring frame was handed out on, as far as it can be used
/// again after `__dlpack__` returned.
enum ConsumerStream {
    /// `CU_STREAM_LEGACY`, valid for the life of the process.
    Legacy,
    /// A stream object (`torch.cuda.Stream`, `cupy.cuda.Stream`) and its
    /// handle: the frame's reference keeps the object, and so its stream,
    /// alive until the release (for the streams torch and CuPy create; an
    /// `ExternalStream` wraps a stream its owner destroys when it likes).
    ///
    /// The frame does not show this reference to the garbage collector, on
    /// purpose: in a cycle the collector runs every `__del__` first, and
    /// CuPy's stream destroys its CUDA stream there, before the frame's
    /// release could order after it. A cycle through a frame and its stream
    /// object is therefore never collected (its slot stays held until the
    /// cycle is broken or the connection closes).
    Object { _keep: Py<PyAny>, handle: usize },
    /// A bare handle: the DLPack protocol has the consumer keep it alive
    /// only for the `__dlpack__` call; and `2` (the per-thread default
    /// stream, also as CuPy's `Stream.ptds` object) names another stream on
    /// another thread. Never used again.
    Bare(usize),
    /// Read through `__cuda_array_interface__`, which names the producer's
    /// stream to the consumer but not the consumer's: nothing to order on.
    Interface,
}

/// Why a remembered stream cannot be used for a release.
enum Unnamed {
    /// A bare handle, maybe gone.
    Bare(usize),
    /// A `__cuda_array_interface__` consumer: its stream is unknown.
    Interface,
}

impl Unnamed {
    /// How the frame was handed out, for messages.
    fn how(&self) -> String {
        match self {
            Unnamed::Bare(h) => {
                format!("__dlpack__(stream={h:#x}), a bare handle that may be gone")
            }
            Unnamed::Interface => {
                "__cuda_array_interface__, which does not say the consumer's stream".to_string()
            }
        }
    }
}

impl ConsumerStream {
    fn of(py: Python<'_>, stream: &StreamArg) -> Option<ConsumerStream> {
        match stream {
            StreamArg::Unspecified | StreamArg::Handle(LEGACY_DEFAULT_STREAM) => {
                Some(ConsumerStream::Legacy)
            }
            StreamArg::NoSync => None,
            StreamArg::Handle(h) | StreamArg::Object(_, h @ PER_THREAD_DEFAULT_STREAM) => {
                Some(ConsumerStream::Bare(*h))
            }
            StreamArg::Object(object, h) => Some(ConsumerStream::Object {
                _keep: object.clone_ref(py),
                handle: *h,
            }),
        }
    }

    /// The handle to signal on later, unless it cannot be named safely.
    fn reusable(&self) -> Result<usize, Unnamed> {
        match self {
            ConsumerStream::Legacy => Ok(LEGACY_DEFAULT_STREAM),
            ConsumerStream::Object { handle, .. } => Ok(*handle),
            ConsumerStream::Bare(h) => Err(Unnamed::Bare(*h)),
            ConsumerStream::Interface => Err(Unnamed::Interface),
        }
    }
}

enum Source {
    /// One message, one buffer (no semaphores): handed out or released once.
    Single(Option<Payload>),
    /// A slot of a ring.
    Ring(RingFrame),
}

/// A stream argument of the DLPack and release calls.
enum StreamArg {
    /// `None`.
    Unspecified,
    /// `-1`: no ordering.
    NoSync,
    /// A `CUstream` handle given as an int (1 and 2 are the legacy and
    /// per-thread defaults), or a stream object whose handle is 0 (the
    /// legacy default).
    Handle(usize),
    /// A stream object and its (non-zero) handle.
    Object(Py<PyAny>, usize),
}

impl StreamArg {
    /// The `CUstream` handle to order on, if any.
    fn handle(&self) -> Option<usize> {
        match self {
            StreamArg::Unspecified => Some(LEGACY_DEFAULT_STREAM),
            StreamArg::NoSync => None,
            StreamArg::Handle(h) | StreamArg::Object(_, h) => Some(*h),
        }
    }
}

/// Reads a stream argument: `None`, an int, or an object with an int
/// `cuda_stream` (torch) or `ptr` (CuPy) attribute.
fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<StreamArg> {
    let Some(obj) = stream.filter(|s| !s.is_none()) else {
        return Ok(StreamArg::Unspecified);
    };
    if let Ok(value) = obj.extract::<i128>() {
        return match value {
            -1 => Ok(StreamArg::NoSync),
            0 => Err(PyValueError::new_err(
                "stream 0 is ambiguous and not allowed (DLPack, CUDA Array Interface): pass 1 \
                 for the legacy default stream, 2 for the per-thread default stream, or a \
                 stream handle",
            )),
            v => Ok(StreamArg::Handle(positive_handle(v)?)),
        };
    }
    let attr = ["cuda_stream", "ptr"].iter().find_map(|name| {
        obj.getattr(*name)
            .ok()
            .and_then(|a| a.extract::<i128>().ok())
    });
    match attr {
        // A stream object's handle 0 is the CUDA runtime's null stream: the
        // legacy default stream (CuPy's and PyTorch's default).
        Some(0) => Ok(StreamArg::Handle(LEGACY_DEFAULT_STREAM)),
        Some(v) => Ok(StreamArg::Object(obj.clone().unbind(), positive_handle(v)?)),
        None => Err(PyTypeError::new_err(format!(
            "stream must be None, -1 or a CUDA stream handle (int), or have an int \
             `cuda_stream` or `ptr` attribute; got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |n| n.to_string())
        ))),
    }
}

/// A stream handle from Python: positive, pointer-sized, and a handle that
/// can be a `CUstream` ([`refuse_non_stream`]).
fn positive_handle(value: i128) -> PyResult<usize> {
    match usize::try_from(value) {
        Ok(h) if h > 0 => refuse_non_stream(h).map(|()| h),
        _ => Err(PyValueError::new_err(format!(
            "stream {value} is not a CUDA stream handle (None, -1, or a positive handle)"
        ))),
    }
}

/// The lowest address a `CUstream` made by the driver can have: the first
/// page is never where the driver allocates (Linux keeps it unmapped).
const LOWEST_STREAM_ADDRESS: usize = 4096;

/// Refuses a handle that cannot be a CUDA stream, without asking the driver
/// (which would read a garbage pointer: undefined behaviour, a SIGSEGV at
/// best). A `CUstream` is `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD`
/// (2), or the address of a stream object the driver made in this process,
/// which is readable memory. So a handle in the first page (other than 1
/// and 2), or at an address this process cannot read, is refused.
///
/// What passes is not proven to be a stream: DLPack makes the consumer vouch
/// for the stream it passes (a freed stream, or any readable address, still
/// reaches the driver).
fn refuse_non_stream(handle: usize) -> PyResult<()> {
    if handle == LEGACY_DEFAULT_STREAM || handle == PER_THREAD_DEFAULT_STREAM {
        return Ok(());
    }
    let why = if handle < LOWEST_STREAM_ADDRESS {
        "it is neither 1 (the legacy default stream), 2 (the per-thread default stream) nor \
         an address"
    } else if !readable(handle) {
        "nothing is mapped readable at that address in this process"
    } else {
        return Ok(());
    };
    Err(PyValueError::new_err(format!(
        "stream {handle:#x} cannot be a CUDA stream handle: {why}. Pass the handle of a live \
         CUDA stream (torch.cuda.current_stream().cuda_stream, cupy.cuda.get_current_stream().\
         ptr), the stream object itself, 1, 2, None or -1; the caller vouches that a handle \
         names a live stream of the frame's device"
    )))
}

/// Whether the 8 bytes at `address` are readable memory of this process,
/// asked of the kernel (`process_vm_readv` on this process), which answers
/// `EFAULT` instead of faulting. Where the kernel does not answer (a seccomp
/// filter, no such call), the address counts as readable: the caller's word
/// stands, as DLPack has it.
fn readable(address: usize) -> bool {
    let mut word = [0u8; 8];
    let local = libc::iovec {
        iov_base: word.as_mut_ptr().cast(),
        iov_len: word.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut c_void,
        iov_len: word.len(),
    };
    // SAFETY: the kernel writes at most `word.len()` bytes into `word`,
    // which lives for the call, and reads `remote` through the page tables
    // (an unmapped or unreadable address is an `EFAULT` answer, not a
    // fault); no memory of this process is changed but `word`.
    let copied = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if copied >= 0 {
        return copied as usize == word.len();
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::EFAULT)
}

/// One received buffer or ring slot: hand it to a DLPack consumer
/// (`torch.from_dlpack(frame)`) or a CUDA Array Interface consumer
/// (`cupy.asarray(frame)`), then `release()` it.
#[pyclass(module = "cuda_interop")]
pub(crate) struct Frame {
    tag: u64,
    size: u64,
    device: (i32, i32),
    /// The elements' type: `uint8`, or an image ring's channel type.
    element: Element,
    shape: Vec<i64>,
    /// In elements.
    strides: Vec<i64>,
    source: Source,
    /// A multi-image ring's parts (empty for any other frame).
    parts: Vec<PartView>,
}

/// One part of a multi-image ring's frames: its name and tensor layout.
#[derive(Clone)]
struct PartView {
    name: String,
    element: Element,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// The tensor layout of an image of `vk_format` (raw), `width` x `height`,
/// tightly packed: `(height, width, channels)` of the format's channel
/// type; `None` for a format outside `vk_export::format::SUPPORTED`.
fn image_view(vk_format: u32, width: u32, height: u32) -> Option<(Element, Vec<i64>, Vec<i64>)> {
    let (_, channels, channel) =
        vk_export::format::describe(vk::Format::from_raw(vk_format as i32))?;
    let (element, channels) = (Element::of_channel(channel), i64::from(channels));
    Some((
        element,
        vec![i64::from(height), i64::from(width), channels],
        vec![i64::from(width) * channels, channels, 1],
    ))
}

/// A frame's element type, for DLPack and the array interfaces.
#[derive(Clone, Copy)]
pub(crate) struct Element {
    dtype: DLDataType,
    typestr: &'static str,
}

impl Element {
    const U8: Element = Element {
        dtype: DLDataType::scalar(DLDataTypeCode::UInt, 8),
        typestr: "|u1",
    };

    /// One channel of an image ring's texels: the bytes as they lie (a
    /// BGRA texel's channel 0 is blue, sRGB bytes stay encoded, a packed
    /// format's one channel is its whole word, `uint32` for A2B10G10R10).
    fn of_channel(channel: ChannelType) -> Element {
        let (code, bits, typestr) = match channel {
            ChannelType::U8 => (DLDataTypeCode::UInt, 8, "|u1"),
            ChannelType::I8 => (DLDataTypeCode::Int, 8, "|i1"),
            ChannelType::U16 => (DLDataTypeCode::UInt, 16, "<u2"),
            ChannelType::I16 => (DLDataTypeCode::Int, 16, "<i2"),
            ChannelType::F16 => (DLDataTypeCode::Float, 16, "<f2"),
            ChannelType::U32 => (DLDataTypeCode::UInt, 32, "<u4"),
            ChannelType::I32 => (DLDataTypeCode::Int, 32, "<i4"),
            ChannelType::F32 => (DLDataTypeCode::Float, 32, "<f4"),
        };
        Element {
            dtype: DLDataType::scalar(code, bits),
            typestr,
        }
    }

    fn bytes(self) -> i64 {
        i64::from(self.dtype.bits / 8)
    }
}

/// A buffer ring's frame as one tensor: `(height, width, 4)` `uint8` rows
/// of an RGBA8 ring; a planar ring's luma rows and, from row
/// `chroma_offset / row_pitch` on, its chroma rows, as one `(rows, width)`
/// tensor of its samples (`uint8` NV12, `uint16` P010): the `(height * 3 /
/// 2, width)` view video tools take when the chroma plane follows the luma
/// plane, the padding rows between them included otherwise.
fn buffer_view(layout: &RingLayout) -> (Element, Vec<i64>, Vec<i64>) {
    let (height, width) = (i64::from(layout.height), i64::from(layout.width));
    match layout.planar_format() {
        None => (
            Element::U8,
            vec![height, width, 4],
            vec![layout.row_pitch as i64, 4, 1],
        ),
        Some((planar, chroma_offset)) => {
            let element = match planar {
                Planar::Nv12 => Element::U8,
                Planar::P010 => Element::of_channel(ChannelType::U16),
            };
            // Checked layouts: the offset is a multiple of the pitch, the
            // pitch of the sample size (a multiple of 4).
            let rows = (chroma_offset / layout.row_pitch) as i64 + height / 2;
            let pitch = layout.row_pitch as i64 / element.bytes();
            (element, vec![rows, width], vec![pitch, 1])
        }
    }
}

/// What a host (kDLCPU) frame's tensor is: its size, device, element type
/// and layout, for [`HostTensor::over`].
struct HostTensor<'a> {
    size: u64,
    device: DLDevice,
    dtype: DLDataType,
    shape: &'a [i64],
    strides: &'a [i64],
}

impl HostTensor<'_> {
    /// The tensor over the host bytes at `data`, which `owner` keeps alive.
    ///
    /// # Safety
    ///
    /// `data` is the start of at least `size` bytes that `owner` owns and
    /// that stay where they are while it lives (moving `owner` moves none).
    unsafe fn over(
        &self,
        owner: Box<dyn std::any::Any + Send>,
        data: u64,
    ) -> PyResult<ManagedTensor> {
        // SAFETY: the caller's promise; the layout is checked against `size`
        // by `ManagedTensor::new`.
        unsafe {
            ManagedTensor::new(
                owner,
                data,
                self.size,
                self.device,
                self.dtype,
                self.shape,
                Some(self.strides),
                false,
            )
        }
        .map_err(cuda_error)
    }
}

impl Frame {
    /// A one-message frame: the whole buffer as a 1-D `uint8` tensor.
    pub(crate) fn single(tag: u64, size: u64, device: (i32, i32), payload: Payload) -> Frame {
        Frame {
            tag,
            size,
            device,
            element: Element::U8,
            shape: vec![size as i64],
            strides: vec![1],
            source: Source::Single(Some(payload)),
            parts: Vec::new(),
        }
    }

    /// Frame `frame` of a ring read on the host: `bytes` (laid out as the
    /// layout says), a host (kDLCPU) array with pitched rows shaped as
    /// [`buffer_view`] says; its slot is released already.
    pub(crate) fn host_copy(layout: &RingLayout, frame: u64, bytes: Vec<u8>) -> Frame {
        let (element, shape, strides) = buffer_view(layout);
        Frame {
            tag: frame,
            size: bytes.len() as u64,
            device: (DL_CPU, 0),
            element,
            shape,
            strides,
            source: Source::Single(Some(Payload::Copied(bytes.into_boxed_slice()))),
            parts: Vec::new(),
        }
    }

    /// `frame`, which `ring`'s session handed out, as a `(height, width, 4)`
    /// `uint8` tensor with pitched rows, or for an image ring a `(height,
    /// width, channels)` tensor of the format's channel type over the
    /// slot's tightly packed copy.
    pub(crate) fn of_ring(ring: Arc<SharedRing>, frame: HeldFrame) -> Frame {
        let layout = *ring.layout();
        let device = ring.device();
        // An image ring's layout names a supported format: the receiver
        // imported its slots as arrays of it.
        let described = layout
            .vk_format()
            .and_then(|f| vk_export::format::describe(vk::Format::from_raw(f as i32)));
        let (element, shape, strides) = match described {
            Some((_, channels, channel)) => {
                let (element, channels) = (Element::of_channel(channel), i64::from(channels));
                (
                    element,
                    vec![i64::from(layout.height), i64::from(layout.width), channels],
                    vec![layout.row_pitch as i64 / element.bytes(), channels, 1],
                )
            }
            None => buffer_view(&layout),
        };
        // The session checked every part's format against its image
        // records, and the receiver imported each as an array of it.
        let parts = ring
            .session()
            .parts()
            .iter()
            .filter_map(|part| {
                let (element, shape, strides) =
                    image_view(part.vk_format, layout.width, layout.height)?;
                Some(PartView {
                    name: part.name.to_string(),
                    element,
                    shape,
                    strides,
                })
            })
            .collect();
        Frame {
            tag: frame.sequence(),
            size: ring.slot_len(frame.slot()),
            device,
            element,
            shape,
            strides,
            source: Source::Ring(RingFrame {
                slot: frame.slot(),
                sequence: frame.sequence(),
                ring,
                frame: Some(frame),
                handed_out: false,
                consumer_stream: None,
                interface_stream: None,
                handed_parts: Vec::new(),
            }),
            parts,
        }
    }

    /// A multi-image frame's error for a call that treats it as one tensor.
    fn refuse_whole(&self, what: &str) -> PyResult<()> {
        if self.parts.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = self.parts.iter().map(|p| p.name.as_str()).collect();
        Err(PyBufferError::new_err(format!(
            "a frame of a multi-image ring ({}) is several images, not one tensor: \
             frame.tensors(stream=...) gives them by name ({what} refused)",
            names.join(", ")
        )))
    }

    /// Hands every part of a multi-image frame out once (see the module
    /// contract): the frame ordered on `stream` once, then each part's
    /// tensor over its memory.
    fn part_tensors(
        &mut self,
        py: Python<'_>,
        stream: &StreamArg,
    ) -> PyResult<Vec<(PartView, ManagedTensor)>> {
        let device = DLDevice {
            device_type: self.device.0,
            device_id: self.device.1,
        };
        let parts = self.parts.clone();
        let Source::Ring(rf) = &mut self.source else {
            return Err(PyTypeError::new_err(
                "only frames of a multi-image ring have tensors(): use the frame itself",
            ));
        };
        if parts.is_empty() {
            return Err(PyTypeError::new_err(
                "only frames of a multi-image ring have tensors(): this ring has one image or \
                 buffer a slot; use the frame itself (torch.from_dlpack(frame))",
            ));
        }
        let frame = match &rf.frame {
            Some(frame) if !rf.handed_out && rf.interface_stream.is_none() => frame,
            _ => {
                return Err(PyBufferError::new_err(
                    "the frame was already handed out or released",
                ))
            }
        };
        let handle = stream.handle();
        let ring = &rf.ring;
        let slots = py
            .detach(|| {
                // SAFETY: as in `tensor`: `handle` is 1, 2, or the stream the
                // consumer passed to this very call and vouches for.
                unsafe { ring.make_readable(frame, handle) }?;
                ring.part_slots(frame)
            })
            .map_err(consumer_error)?;
        // Paired by position: a part without a tensor layout (none today:
        // the receiver refuses formats it cannot describe) must not shift
        // the later parts onto the wrong memory.
        if slots.len() != parts.len() {
            return Err(PyBufferError::new_err(format!(
                "the ring has {} parts and this module describes {} of them",
                slots.len(),
                parts.len()
            )));
        }
        rf.consumer_stream = ConsumerStream::of(py, stream);
        rf.handed_out = true;
        let mut out = Vec::with_capacity(parts.len());
        for (part, slot) in parts.into_iter().zip(slots) {
            // SAFETY: `slot.data` is the address of the part's `len` bytes
            // (its packed copy, or host memory for the test hook), which
            // stay mapped while any clone of its SlotMemory lives.
            let tensor = unsafe {
                ManagedTensor::new(
                    Box::new(slot.memory),
                    slot.data,
                    slot.len,
                    device,
                    part.element.dtype,
                    &part.shape,
                    Some(&part.strides),
                    false,
                )
            }
            .map_err(cuda_error)?;
            out.push((part, tensor));
        }
        Ok(out)
    }

    /// Hands the memory out once as a DLPack tensor, ordering `stream` after
    /// the producer's write where the frame has a "produced" timeline.
    fn tensor(&mut self, py: Python<'_>, stream: StreamArg) -> PyResult<ManagedTensor> {
        let dtype = self.element.dtype;
        let (shape, strides) = (self.shape.clone(), self.strides.clone());
        let device = DLDevice {
            device_type: self.device.0,
            device_id: self.device.1,
        };
        let takes_streams = match &self.source {
            Source::Ring(_) => true,
            Source::Single(_) => device.device_type != DL_CPU,
        };
        if !takes_streams && matches!(stream, StreamArg::Handle(_) | StreamArg::Object(..)) {
            return Err(PyValueError::new_err(
                "a host (kDLCPU) frame takes no stream: pass stream=None",
            ));
        }
        let host = HostTensor {
            size: self.size,
            device,
            dtype,
            shape: &shape,
            strides: &strides,
        };
        match &mut self.source {
            Source::Single(payload) => {
                let payload = payload.take().ok_or_else(|| {
                    PyBufferError::new_err("the frame was already handed out or released")
                })?;
                match payload {
                    Payload::Imported(buffer) => py
                        .detach(|| buffer.into_dlpack(dtype, &shape, Some(&strides), false))
                        .map_err(cuda_error),
                    Payload::Copied(bytes) => {
                        let data = bytes.as_ptr() as u64;
                        // SAFETY: `data` is the start of the `size` bytes
                        // `bytes` owns on the heap; moving the box into the
                        // tensor's owner does not move them.
                        unsafe { host.over(Box::new(bytes), data) }
                    }
                    #[cfg(feature = "test-hooks")]
                    Payload::Host(bytes) => {
                        let data = bytes.data();
                        // SAFETY: `data` is the start of the `size` bytes
                        // `bytes` owns on the heap; moving it into the box
                        // does not move them.
                        unsafe { host.over(Box::new(bytes), data) }
                    }
                }
            }
            Source::Ring(rf) => {
                let frame = match &rf.frame {
                    Some(frame) if !rf.handed_out => frame,
                    _ => {
                        return Err(PyBufferError::new_err(
                            "the frame was already handed out or released",
                        ))
                    }
                };
                if rf.interface_stream.is_some() {
                    return Err(PyBufferError::new_err(
                        "the frame was read through __cuda_array_interface__; a frame has one \
                         consumer protocol (its release orders after one consumer's stream)",
                    ));
                }
                let handle = stream.handle();
                let ring = &rf.ring;
                // The session checks that the frame is still held (not
                // taken back by a drop) before its memory is handed out.
                let slot = py
                    .detach(|| {
                        // SAFETY: `handle` is 1, 2, or the handle of the
                        // stream (object or bare handle) the consumer passed
                        // to this very call and vouches for across it, as
                        // DLPack has it (`stream_arg` refused what cannot be
                        // a stream): a live stream for the call.
                        unsafe { ring.make_readable(frame, handle) }?;
                        ring.slot(frame)
                    })
                    .map_err(consumer_error)?;
                rf.consumer_stream = ConsumerStream::of(py, &stream);
                // SAFETY: `slot.data` is the address of the slot's `len`
                // bytes (a CUDA mapping, or host memory for the test hook),
                // which stay mapped while any clone of its SlotMemory lives.
                let tensor = unsafe {
                    ManagedTensor::new(
                        Box::new(slot.memory),
                        slot.data,
                        slot.len,
                        device,
                        dtype,
                        &shape,
                        Some(&strides),
                        false,
                    )
                }
                .map_err(cuda_error)?;
                rf.handed_out = true;
                Ok(tensor)
            }
        }
    }

    /// The CUDA Array Interface (or, with `stream` `None`, the array
    /// interface) dictionary of this frame; `stream` is the value of its
    /// `stream` key.
    pub(crate) fn interface<'py>(
        &self,
        py: Python<'py>,
        data: u64,
        stream: Option<Option<usize>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let typestr = self.element.typestr;
        let byte_strides: Vec<i64> = self
            .strides
            .iter()
            .map(|s| s * self.element.bytes())
            .collect();
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("descr", vec![("", typestr)])?;
        d.set_item("data", (data, false))?;
        d.set_item("strides", PyTuple::new(py, &byte_strides)?)?;
        d.set_item("version", 3)?;
        if let Some(stream) = stream {
            d.set_item("stream", stream)?;
        }
        Ok(d)
    }

    /// The address of a ring frame's memory, if the frame is still held.
    pub(crate) fn ring_data(&self, py: Python<'_>) -> PyResult<u64> {
        match &self.source {
            Source::Ring(RingFrame {
                ring,
                frame: Some(frame),
                ..
            }) => py
                .detach(|| ring.slot(frame))
                .map(|slot| slot.data)
                .map_err(consumer_error),
            Source::Ring(_) => Err(PyBufferError::new_err("the frame was released")),
            Source::Single(_) => Err(PyAttributeError::new_err(
                "only frames of a frame ring (frame_server's protocol) have a \
                 __cuda_array_interface__; use __dlpack__ for this one",
            )),
        }
    }

    /// Releases a ring frame: signals its "released" timeline on `stream`
    /// (when it is a CUDA stream and the ring has semaphores), then tells
    /// the producer. Idempotent; a one-message frame just drops its payload.
    fn release_with(&mut self, py: Python<'_>, stream: StreamArg) -> PyResult<()> {
        match &mut self.source {
            Source::Single(payload) => {
                if let Some(payload) = payload.take() {
                    // Dropping an import may wait (bounded) for the GPU's last use.
                    py.detach(move || drop(payload));
                }
                Ok(())
            }
            Source::Ring(rf) => {
                rf.revoke_parts();
                if rf.frame.is_none() {
                    return Ok(());
                }
                let handle = match (&stream, &rf.consumer_stream) {
                    (StreamArg::Unspecified, None) => None,
                    (StreamArg::Unspecified, Some(remembered)) => match remembered.reusable() {
                        Ok(h) => Some(h),
                        Err(unnamed) => {
                            return Err(PyValueError::new_err(format!(
                                "frame {} was handed out through {}: name the stream whose \
                                 work reads the frame, release(stream=torch.cuda.\
                                 current_stream()), release(stream=cupy.cuda.\
                                 get_current_stream()) or release(stream=s), or \
                                 release(stream=-1) once those reads have completed",
                                rf.sequence,
                                unnamed.how()
                            )))
                        }
                    },
                    (explicit, _) => explicit.handle(),
                };
                let (ring, frame) = (rf.ring.clone(), rf.frame.take());
                let released = py.detach(move || match frame {
                    // SAFETY: `handle` is 1 (the legacy default stream), the
                    // handle of a stream object this frame keeps referenced
                    // (its remembered stream) or the caller holds across
                    // this call (an explicit argument), or a bare handle the
                    // consumer passed to this very call: a live stream for
                    // the call.
                    Some(frame) => unsafe { ring.release(frame, handle) },
                    None => Ok(()),
                });
                // Released either way (a failed release means the
                // connection is over); the stream object is not needed.
                rf.consumer_stream = None;
                released.map_err(consumer_error)
            }
        }
    }

    /// Gives the frame back now, as its `Drop` would, without raising: a
    /// ring slot's release (after the remembered stream where it can be
    /// named; unordered, with a warning, otherwise), a one-message frame's
    /// import. The frame stays a released frame.
    ///
    /// A frame may be given back while an exception propagates (a temporary
    /// whose `release()` raised, dropped on the way out): a warning or an
    /// error of our own would replace it, so it is set aside and restored.
    fn give_back(&mut self, py: Python<'_>) {
        let pending = PendingException::take(py);
        match &mut self.source {
            Source::Single(payload) => {
                let payload = payload.take();
                py.detach(move || drop(payload));
            }
            Source::Ring(rf) => give_back_ring(py, rf),
        }
        pending.restore(py);
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        Python::attach(|py| {
            self.give_back(py);
            // What is left (the ring, the slot memory) goes without the GIL:
            // the ring's last drop waits (bounded) for the GPU.
            let source = std::mem::replace(&mut self.source, Source::Single(None));
            py.detach(move || drop(source));
        });
    }
}

/// The exception set in the interpreter, if any, held aside (raw, so that
/// not even a `PanicException` is resumed or normalized on the way).
struct PendingException {
    kind: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
    traceback: *mut ffi::PyObject,
}

impl PendingException {
    fn take(_py: Python<'_>) -> PendingException {
        let mut pending = PendingException {
            kind: std::ptr::null_mut(),
            value: std::ptr::null_mut(),
            traceback: std::ptr::null_mut(),
        };
        // SAFETY: the GIL is held (`_py`); PyErr_Fetch moves the error
        // indicator (possibly empty: three nulls) into the three pointers,
        // with their references, and clears it.
        unsafe {
            ffi::PyErr_Fetch(
                &mut pending.kind,
                &mut pending.value,
                &mut pending.traceback,
            )
        };
        pending
    }

    fn restore(self, _py: Python<'_>) {
        if self.kind.is_null() {
            return;
        }
        // SAFETY: the GIL is held; the three references PyErr_Fetch gave
        // are handed back to the error indicator (which steals them), which
        // replaces whatever was set meanwhile (nothing: every error of the
        // release is handled before this).
        unsafe { ffi::PyErr_Restore(self.kind, self.value, self.traceback) };
    }
}

/// Releases a ring frame that nobody can be told about (a drop, or leaving
/// `with` while the block's exception propagates), the GIL held: after its
/// remembered stream where that can be named, else unordered with a
/// warning. The release itself runs with the GIL released; if it fails,
/// the connection is given up (the producer takes the slots back) and the
/// next call on the receiver raises `ConnectionError` with the reason. The
/// frame is released afterwards either way.
fn give_back_ring(py: Python<'_>, rf: &mut RingFrame) {
    rf.revoke_parts();
    // The stream object stays referenced until the release that may order
    // after its stream is done, and is let go with the GIL.
    let remembered = rf.consumer_stream.take();
    let Some(frame) = rf.frame.take() else {
        return;
    };
    let ring = rf.ring.clone();
    let stream = match remembered.as_ref().map(ConsumerStream::reusable) {
        None => None,
        Some(Ok(h)) => Some(h),
        Some(Err(unnamed)) => {
            if !ring.is_closed() && ring.session().ended().is_none() {
                warn_unordered_release(py, rf.sequence, &unnamed);
            }
            None
        }
    };
    let sequence = rf.sequence;
    py.detach(move || {
        // SAFETY: `stream` is the remembered stream where it can still be
        // named: 1 (the legacy default stream) or the handle of the stream
        // object `remembered` keeps referenced until after this call.
        if let Err(error) = unsafe { ring.release(frame, stream) } {
            // Nobody to tell now: the next call on the receiver says why
            // (the first reason the session kept, if it ended already).
            ring.session().close(&format!(
                "the release of dropped frame {sequence} failed: {error}"
            ));
        }
    });
    drop(remembered);
}

/// Warns that a frame handed out on a stream that cannot be named again
/// was given back unreleased: its slot goes back to the producer without
/// waiting for work on that stream. A warning filter that makes it an error
/// has nobody to raise to: the error goes to `sys.unraisablehook`.
fn warn_unordered_release(py: Python<'_>, frame: u64, unnamed: &Unnamed) {
    let message = format!(
        "cuda_interop: frame {frame} was given back unreleased after it was handed out through \
         {}; the producer may overwrite the slot while work on the consumer's stream still \
         reads it. Name the stream: frame.release(stream=s) before the frame goes (inside \
         `with frame:`, before the block ends), or hand the frame out with \
         __dlpack__(stream=s) on the stream object",
        unnamed.how()
    );
    if let Ok(message) = std::ffi::CString::new(message) {
        let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
        if let Err(error) = PyErr::warn(py, &category, &message, 1) {
            error.write_unraisable(py, None);
        }
    }
}

#[pymethods]
impl Frame {
    /// The DLPack protocol: the frame as a tensor (`(height, width, 4)`
    /// `uint8` with pitched rows for a buffer ring's frame; `(height, width,
    /// channels)` of the format's channel type for an image ring's, over
    /// this module's tightly packed copy of the image; 1-D `uint8`
    /// otherwise) in a capsule a consumer takes once. `stream` (a CUDA
    /// stream handle; `1` legacy default, `2` per-thread default, `None`
    /// legacy default, `-1` none) is made to wait for the producer's write
    /// (and an image ring's copy); with `-1`, an image ring's copy is waited
    /// for before this returns.
    ///
    /// As DLPack has it, the caller vouches that `stream` is a live CUDA
    /// stream of the frame's device for the call: the driver cannot be asked
    /// without risking a crash. What cannot be a stream is refused with
    /// `ValueError` before any driver call: `0`, negative ints other than
    /// `-1`, other ints below 4096, and addresses nothing readable is mapped
    /// at.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let stream = stream_arg(stream.as_ref())?;
        check_export("frame", self.device, dl_device, copy)?;
        self.refuse_whole("__dlpack__")?;
        let tensor = self.tensor(py, stream)?;
        capsule(py, tensor, max_version)
    }

    /// `(device_type, device_id)`: `(2, ordinal)` (kDLCUDA, the CUDA device's
    /// ordinal) for a CUDA frame, `(1, 0)` (kDLCPU) for a host frame (a ring
    /// read on the host, for NumPy).
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }

    /// The CUDA Array Interface (version 3) of a ring frame: `data`,
    /// `shape` `(height, width, 4)`, `strides` in bytes `(row_pitch, 4, 1)`,
    /// `typestr` `"|u1"` (an image ring's frame: `(height, width,
    /// channels)` of its channel type, e.g. `"<f2"`, over this module's
    /// copy of the image), and `stream`: a stream of this module on which
    /// the producer's write (and an image ring's copy) is waited for; the
    /// consumer must order its work after it (CuPy does).
    #[getter]
    fn __cuda_array_interface__<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.refuse_whole("__cuda_array_interface__")?;
        let ring_frame = matches!(&self.source, Source::Ring(_));
        if self.device.0 != DL_CUDA && !ring_frame {
            return Err(PyAttributeError::new_err(
                "a host (kDLCPU) frame has no __cuda_array_interface__: use numpy.from_dlpack(frame)",
            ));
        }
        let data = self.ring_data(py)?;
        let Source::Ring(rf) = &mut self.source else {
            unreachable!("ring_data refuses other frames")
        };
        if rf.handed_out {
            return Err(PyBufferError::new_err(
                "the frame was handed out through __dlpack__; a frame has one consumer \
                 protocol (its release orders after one consumer's stream)",
            ));
        }
        let stream = match rf.interface_stream {
            Some(stream) => stream,
            None => {
                let (ring, frame) = (&rf.ring, rf.frame.as_ref());
                let frame =
                    frame.ok_or_else(|| PyBufferError::new_err("the frame was released"))?;
                let stream = py
                    .detach(|| ring.interface_stream(frame))
                    .map_err(consumer_error)?;
                rf.interface_stream = Some(stream);
                stream
            }
        };
        // The consumer's stream is not known: a release must name it.
        rf.consumer_stream = Some(ConsumerStream::Interface);
        self.interface(py, data, Some(stream))
    }

    /// A multi-image ring's frame as its images by name (see the module
    /// contract): a dict of `Part`s, each handed to a DLPack consumer once
    /// (`torch.from_dlpack(parts["depth"])`), after the frame was ordered
    /// on `stream` (as `__dlpack__` takes it: the sender's write waited
    /// for, every part copied) once for all of them; a part's consumer must
    /// pass the same stream. `release()` orders after that stream.
    #[pyo3(signature = (stream=None))]
    fn tensors<'py>(
        &mut self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let stream = stream_arg(stream.as_ref())?;
        let parts = self.part_tensors(py, &stream)?;
        let dict = PyDict::new(py);
        for (view, tensor) in parts {
            let tensor: SharedTensor = Arc::new(std::sync::Mutex::new(Some(tensor)));
            if let Source::Ring(rf) = &mut self.source {
                rf.handed_parts.push(tensor.clone());
            }
            let part = Part {
                name: view.name.clone(),
                tensor,
                device: self.device,
                ordered_on: stream.handle(),
                shape: view.shape,
            };
            dict.set_item(view.name, Py::new(py, part)?)?;
        }
        Ok(dict)
    }

    /// The names of a multi-image ring's parts, in slot order (empty for
    /// any other frame).
    #[getter]
    fn part_names(&self) -> Vec<String> {
        self.parts.iter().map(|p| p.name.clone()).collect()
    }

    /// The producer's tag: the frame number for a ring frame.
    #[getter]
    fn tag(&self) -> u64 {
        self.tag
    }

    /// The ring slot of a ring frame, else `None`.
    #[getter]
    fn slot(&self) -> Option<u32> {
        match &self.source {
            Source::Ring(rf) => Some(rf.slot),
            Source::Single(_) => None,
        }
    }

    /// The tensor's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// The tensor's strides in elements, as in DLPack (bytes for `uint8`
    /// frames; an image ring's frames count channels of their type).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.strides)
    }

    /// Bytes the frame's memory spans.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.size
    }

    /// Whether the frame can still be handed out.
    #[getter]
    fn available(&self) -> bool {
        match &self.source {
            Source::Single(payload) => payload.is_some(),
            Source::Ring(rf) => {
                rf.frame.is_some() && !rf.handed_out && rf.interface_stream.is_none()
            }
        }
    }

    /// Gives the frame back (idempotent). A ring frame's slot goes back to
    /// the producer: with a CUDA `stream` (`-1`: none) the producer's next
    /// write to the slot waits for the work enqueued on it so far; without
    /// one, the caller's reads must have completed. The default is the
    /// stream passed to `__dlpack__` if it was the legacy default or a
    /// stream object; after a bare handle (which may be gone by now) or
    /// `__cuda_array_interface__` (which does not say the consumer's
    /// stream) the stream must be named, else `ValueError`. After
    /// `Receiver.close()` it does nothing: the producer took the slot back.
    /// If the sender dropped the receiver while it held the frame, it
    /// raises `ConnectionError` saying why: what was read from the frame
    /// since the drop may be a later frame's. A release that raises leaves
    /// the frame released. Tensors already handed out keep the memory
    /// mapped, but its contents belong to the producer again. `stream` is
    /// checked as `__dlpack__`'s is (the caller vouches for a live stream;
    /// what cannot be one raises `ValueError`).
    #[pyo3(signature = (stream=None))]
    fn release(&mut self, py: Python<'_>, stream: Option<Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = stream_arg(stream.as_ref())?;
        self.release_with(py, stream)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases the frame as `release()` does. If the block raised, its
    /// exception wins: a release that fails then gives the frame back as
    /// its drop would (unordered after a bare handle, with a warning) and
    /// raises nothing of its own.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc_value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        match self.release_with(py, StreamArg::Unspecified) {
            Ok(()) => Ok(()),
            Err(_) if exc_type.is_some_and(|t| !t.is_none()) => {
                self.give_back(py);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn __repr__(&self) -> String {
        let state = if self.available() {
            ""
        } else {
            " (handed out or released)"
        };
        match self.slot() {
            Some(slot) => format!(
                "<cuda_interop.Frame {} slot={slot} shape={:?} device={:?}{state}>",
                self.tag, self.shape, self.device
            ),
            None => format!(
                "<cuda_interop.Frame tag={} nbytes={} device={:?}{state}>",
                self.tag, self.size, self.device
            ),
        }
    }
}

/// # Safety
/// `managed` came from `ManagedTensor::into_versioned` and its deleter has
/// not run.
unsafe fn call_versioned_deleter(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: the caller's guarantee: a live tensor whose deleter runs once.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
}

/// # Safety
/// `managed` came from `ManagedTensor::into_legacy` and its deleter has not run.
unsafe fn call_legacy_deleter(managed: *mut DLManagedTensor) {
    // SAFETY: the caller's guarantee: a live tensor whose deleter runs once.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
}

/// A tensor of this module whose deleter runs with the GIL released.
struct Unconsumed<T>(*mut T);

// SAFETY: the tensors this module makes own only `Send` values (the owner
// `ManagedTensor::new` takes is `Box<dyn Any + Send>`; shape and strides are
// boxed slices), and the pointer goes to exactly one thread, which calls
// the deleter once.
unsafe impl Send for Unconsumed<DLManagedTensorVersioned> {}
// SAFETY: as above, for the legacy structure.
unsafe impl Send for Unconsumed<DLManagedTensor> {}

impl<T> Unconsumed<T> {
    fn into_raw(self) -> *mut T {
        self.0
    }
}

/// Runs `delete` on `tensor` with the GIL released where that is possible;
/// while the interpreter shuts down (a capsule left in a global), where
/// nothing may attach, in place.
fn delete_unconsumed<T>(tensor: Unconsumed<T>, delete: fn(Unconsumed<T>))
where
    Unconsumed<T>: Send,
{
    let mut tensor = Some(tensor);
    Python::try_attach(|py| {
        if let Some(tensor) = tensor.take() {
            py.detach(move || delete(tensor));
        }
    });
    if let Some(tensor) = tensor {
        delete(tensor);
    }
}

/// The capsule destructor: frees the tensor unless a consumer renamed the
/// capsule (took ownership, and calls the deleter itself). The deleter runs
/// with the GIL released: dropping an import waits (bounded) for the GPU.
unsafe extern "C" fn delete_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed, holding the
    // GIL. `PyCapsule_IsValid` sets no exception; when the name is still
    // ours, nobody took the pointer, which is the tensor `__dlpack__` put
    // there, and this is its only destructor call.
    let managed = unsafe {
        if ffi::PyCapsule_IsValid(capsule, USED_VERSIONED.as_ptr()) == 0
            && ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1
        {
            ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr())
        } else {
            return;
        }
    };
    delete_unconsumed(Unconsumed(managed.cast()), |tensor| {
        // SAFETY: the tensor `__dlpack__` made, whose deleter has not run
        // (nobody took the capsule); it runs once, here.
        unsafe { call_versioned_deleter(tensor.into_raw()) }
    });
}

/// As [`delete_versioned_capsule`], for the legacy `"dltensor"` capsule.
unsafe extern "C" fn delete_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `delete_versioned_capsule`.
    let managed = unsafe {
        if ffi::PyCapsule_IsValid(capsule, USED_LEGACY.as_ptr()) == 0
            && ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1
        {
            ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr())
        } else {
            return;
        }
    };
    delete_unconsumed(Unconsumed(managed.cast()), |tensor| {
        // SAFETY: as in `delete_versioned_capsule`.
        unsafe { call_legacy_deleter(tensor.into_raw()) }
    });
}
