//! `memory:CUDAMemory` for both elements (out of `cudainteropsrc`, into
//! `cudainteropsink`): GStreamer's CUDA library (`libgstcuda-1.0.so.0`, in gst-plugins-bad's library package),
//! loaded at run time where it is installed, so the plugin neither builds
//! against it nor needs it where it is absent.
//!
//! # Contract
//!
//! * [`GstCuda::get`] loads the library once per process, with the 1.22
//!   API this module calls; where it or the CUDA driver is missing, the
//!   reason, naming the package to install.
//! * [`supports`] names the formats the library's allocator lays out
//!   (RGBA, BGRA, RGB10A2_LE, NV12, P010_10LE); other formats stay in
//!   system memory (the 1.22 allocator aborts on a format it does not
//!   know, so it never sees one).
//! * [`CudaOut::new`] wraps a CUDA device's primary context as a
//!   `GstCudaContext` that keeps the device (and so the context) retained
//!   while any memory made in it lives, also after the element stopped;
//!   [`CudaOut::answer_context_query`] hands it to downstream CUDA
//!   elements.
//! * [`CudaOut::fill`] takes a buffer of `GstCudaMemory` for the caps'
//!   video info from the library's buffer pool (GStreamer's pitch and
//!   plane offsets, in a `GstVideoMeta`; memory is allocated once per
//!   buffer, and buffers come back when downstream drops them), checks
//!   every plane fits it, copies the planes into it device to device on
//!   the given stream, after what is already enqueued there, and waits for
//!   the copy (bounded): the buffer is complete when it is pushed (the
//!   1.22 memory carries no stream downstream could order on). No byte
//!   passes through the host.
//! * [`CudaOut::wrap`] (GStreamer 1.24 and later: [`CudaOut::can_wrap`])
//!   hands out device memory the caller keeps valid as a `GstCudaMemory`
//!   that wraps it, laid out as the caller says (`GstVideoMeta` included),
//!   without a copy; the caller's `keep` runs once, when GStreamer frees
//!   the memory (or at once if wrapping fails). GStreamer's CUDA elements
//!   may drop a buffer before their GPU reads of it ran: `keep` orders
//!   what it gives back after the context's queued work (the caller's).
//! * [`CudaOut::read_into`] copies a buffer of one `GstCudaMemory` made in
//!   this same CUDA context (its `GstVideoMeta`'s plane offsets and strides,
//!   else the memory's own) into device planes, device to device on the
//!   given stream, and waits (bounded), after the stream the memory was
//!   written on drained (1.24 and later, bounded); memory of another
//!   context, or planes past the memory, are refused before anything is
//!   copied.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::time::Duration;

use cuda_interop::sys::{self, CUresult};
use cuda_interop::{CudaDevice, Stream};
use gst::glib;
use gst::glib::translate::{from_glib_full, ToGlibPtr};
use gst::prelude::{BufferPoolExt, BufferPoolExtManual};

/// GStreamer's caps feature for CUDA device memory.
pub(crate) const CUDA_MEMORY: &str = "memory:CUDAMemory";

/// Whether `caps` (negotiated, fixed) are in [`CUDA_MEMORY`].
pub(crate) fn in_cuda_memory(caps: &gst::CapsRef) -> bool {
    caps.features(0).is_some_and(|f| f.contains(CUDA_MEMORY))
}

/// An element's answer to `query` where it is a CUDA context query and
/// `out` (the element's, while started) has a context: whether it
/// answered (else the parent's handler should).
pub(crate) fn answer_context_query(
    out: &std::sync::Mutex<Option<std::sync::Arc<CudaOut>>>,
    element: &gst::Element,
    query: &mut gst::QueryRef,
) -> bool {
    if !matches!(query.view_mut(), gst::QueryViewMut::Context(_)) {
        return false;
    }
    let out = crate::lock(out).clone();
    out.is_some_and(|out| out.answer_context_query(element, query))
}

/// `GST_MAP_CUDA` (`gstcudamemory.h`): map for the device pointer.
const GST_MAP_CUDA: gst::ffi::GstMapFlags = gst::ffi::GST_MAP_FLAG_LAST << 1;

/// `GST_CUDA_MEMORY_TYPE_NAME`: the allocator's registered name.
const CUDA_ALLOCATOR: &str = "gst.cuda.memory";

/// The library's file name (its soname).
const LIBRARY: &str = "libgstcuda-1.0.so.0";

/// The public head of `GstCudaMemory` (`gstcudamemory.h`, 1.22 to 1.26):
/// the memory, its context, and the video info the allocator laid out.
#[repr(C)]
struct GstCudaMemoryHead {
    mem: gst::ffi::GstMemory,
    context: *mut c_void,
    info: gst_video::ffi::GstVideoInfo,
}

type LoadLibrary = unsafe extern "C" fn() -> glib::ffi::gboolean;
type InitOnce = unsafe extern "C" fn();
type NewWrapped = unsafe extern "C" fn(*mut c_void, c_int) -> *mut gst::ffi::GstObject;
type HandleQuery = unsafe extern "C" fn(
    *mut gst::ffi::GstElement,
    *mut gst::ffi::GstQuery,
    *mut gst::ffi::GstObject,
) -> glib::ffi::gboolean;
type IsCudaMemory = unsafe extern "C" fn(*mut gst::ffi::GstMemory) -> glib::ffi::gboolean;
type MemoryGetStream = unsafe extern "C" fn(*mut gst::ffi::GstMemory) -> *mut c_void;
type StreamGetHandle = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type NewPool = unsafe extern "C" fn(*mut gst::ffi::GstObject) -> *mut gst::ffi::GstBufferPool;
type GetHandle = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type AllocWrapped = unsafe extern "C" fn(
    *mut gst::ffi::GstAllocator,
    *mut gst::ffi::GstObject,
    *mut c_void,
    *const gst_video::ffi::GstVideoInfo,
    u64,
    *mut c_void,
    Option<unsafe extern "C" fn(*mut c_void)>,
) -> *mut gst::ffi::GstMemory;

/// GStreamer's CUDA library, loaded.
pub(crate) struct GstCuda {
    new_wrapped: NewWrapped,
    new_pool: NewPool,
    get_handle: GetHandle,
    handle_query: HandleQuery,
    is_cuda_memory: IsCudaMemory,
    /// `gst_cuda_allocator_alloc_wrapped`: GStreamer 1.24 and later.
    alloc_wrapped: Option<AllocWrapped>,
    /// `gst_cuda_memory_get_stream` and `gst_cuda_stream_get_handle`:
    /// GStreamer 1.24 and later.
    memory_stream: Option<(MemoryGetStream, StreamGetHandle)>,
    /// Keeps the functions above loaded (never unloaded: GStreamer keeps
    /// types it registered).
    _library: libloading::Library,
}

impl std::fmt::Debug for GstCuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GstCuda").finish_non_exhaustive()
    }
}

impl GstCuda {
    /// The library, loaded once per process (see the module contract).
    pub(crate) fn get() -> Result<&'static GstCuda, String> {
        static LOADED: OnceLock<Result<GstCuda, String>> = OnceLock::new();
        LOADED
            .get_or_init(GstCuda::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load() -> Result<GstCuda, String> {
        let missing = |e: &dyn std::fmt::Display| {
            format!(
                "GStreamer's CUDA library ({LIBRARY}) is not usable ({e}): install \
                 libgstreamer-plugins-bad1.0-0 (Debian, Ubuntu) for memory:CUDAMemory; frames \
                 go through system memory meanwhile"
            )
        };
        // SAFETY: loading runs the library's constructors: GStreamer's own
        // library, with GLib's type registration as its only effect.
        let library = unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| missing(&e))?;
        // SAFETY: each symbol is the 1.22 API's function of that name, with
        // the signature its alias spells (gstcudaloader.h, gstcudamemory.h,
        // gstcudacontext.h, gstcudautils.h); the library stays loaded while
        // they are used (`_library`, kept for the process's life).
        let (
            load_library,
            init_once,
            new_wrapped,
            new_pool,
            get_handle,
            handle_query,
            is_cuda_memory,
        ) = unsafe {
            (
                *library
                    .get::<LoadLibrary>(b"gst_cuda_load_library\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<InitOnce>(b"gst_cuda_memory_init_once\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<NewWrapped>(b"gst_cuda_context_new_wrapped\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<NewPool>(b"gst_cuda_buffer_pool_new\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<GetHandle>(b"gst_cuda_context_get_handle\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<HandleQuery>(b"gst_cuda_handle_context_query\0")
                    .map_err(|e| missing(&e))?,
                *library
                    .get::<IsCudaMemory>(b"gst_is_cuda_memory\0")
                    .map_err(|e| missing(&e))?,
            )
        };
        // SAFETY: the 1.24 API's function of that name, with the signature
        // its alias spells (gstcudamemory.h, 1.24); absent before 1.24.
        let alloc_wrapped = unsafe {
            library
                .get::<AllocWrapped>(b"gst_cuda_allocator_alloc_wrapped\0")
                .ok()
                .map(|f| *f)
        };
        // SAFETY: as above (gstcudamemory.h and gstcudastream.h, 1.24:
        // `GstCudaStream * gst_cuda_memory_get_stream (GstCudaMemory *)`,
        // transfer none; `CUstream gst_cuda_stream_get_handle
        // (GstCudaStream *)`).
        let memory_stream = unsafe {
            library
                .get::<MemoryGetStream>(b"gst_cuda_memory_get_stream\0")
                .ok()
                .map(|f| *f)
                .zip(
                    library
                        .get::<StreamGetHandle>(b"gst_cuda_stream_get_handle\0")
                        .ok()
                        .map(|f| *f),
                )
        };
        // SAFETY: no arguments; loads libcuda into the library's table
        // (idempotent, thread-safe: a GOnce inside).
        if unsafe { load_library() } == glib::ffi::GFALSE {
            return Err(
                "GStreamer's CUDA library cannot load the CUDA driver (libcuda.so.1): install \
                 the NVIDIA driver"
                    .into(),
            );
        }
        // SAFETY: no arguments; registers the CUDA allocator once (a GOnce).
        unsafe { init_once() };
        if gst::Allocator::find(Some(CUDA_ALLOCATOR)).is_none() {
            return Err(format!(
                "{LIBRARY} registered no allocator {CUDA_ALLOCATOR:?}: a broken install"
            ));
        }
        Ok(GstCuda {
            new_wrapped,
            new_pool,
            get_handle,
            handle_query,
            is_cuda_memory,
            alloc_wrapped,
            memory_stream,
            _library: library,
        })
    }

    /// Whether `memory` is a `GstCudaMemory`.
    pub(crate) fn is_cuda_memory(&self, memory: &gst::MemoryRef) -> bool {
        // SAFETY: a live memory for the call; the function only reads its
        // allocator's type.
        unsafe { (self.is_cuda_memory)(memory.as_mut_ptr()) != glib::ffi::GFALSE }
    }
}

/// Whether the CUDA allocator lays out `format` (see the module contract).
pub(crate) fn supports(format: gst_video::VideoFormat) -> bool {
    use gst_video::VideoFormat as V;
    matches!(
        format,
        V::Rgba | V::Bgra | V::Rgb10a2Le | V::Nv12 | V::P01010le
    )
}

/// One plane to copy: device memory, rows `pitch` apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DevicePlane {
    /// The first row's `CUdeviceptr`.
    pub(crate) ptr: u64,
    /// Bytes from one row to the next.
    pub(crate) pitch: u64,
    /// Bytes of a row.
    pub(crate) row_bytes: u64,
    /// Rows.
    pub(crate) rows: u32,
}

/// A `GstCudaContext` around one device's primary context, and the
/// buffer pool of the video info last filled.
pub(crate) struct CudaOut {
    lib: &'static GstCuda,
    /// The `GstCudaContext` (one reference, this value's).
    context: *mut gst::ffi::GstObject,
    device: CudaDevice,
    pool: std::sync::Mutex<Option<(gst_video::VideoInfo, gst::BufferPool)>>,
}

// SAFETY: `context` is a GObject (reference counting and the functions
// called on it are thread-safe); the rest is Send and Sync.
unsafe impl Send for CudaOut {}
// SAFETY: as above: nothing here is mutated through `&self` but GObject
// reference counts.
unsafe impl Sync for CudaOut {}

impl std::fmt::Debug for CudaOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaOut")
            .field("device", &self.device.name())
            .finish_non_exhaustive()
    }
}

/// Drops the `CudaDevice` a `GstCudaContext` keeps (its data's destroy
/// notify).
unsafe extern "C" fn drop_device(data: *mut c_void) {
    // SAFETY: `data` is the `Box<CudaDevice>` `CudaOut::new` leaked into the
    // context's data, given back once, when the context is finalized.
    drop(unsafe { Box::from_raw(data.cast::<CudaDevice>()) });
}

/// Runs and frees the `keep` of [`CudaOut::wrap`] (the wrapped memory's
/// destroy notify).
unsafe extern "C" fn run_keep(data: *mut c_void) {
    // SAFETY: `data` is the `Box<Box<dyn FnOnce() + Send>>` `CudaOut::wrap`
    // leaked into the memory, given back once, when it is freed.
    let keep = unsafe { Box::from_raw(data.cast::<Box<dyn FnOnce() + Send>>()) };
    // A panic must not unwind into GStreamer's C frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(keep));
}

/// `CudaDevice` may be dropped on whichever thread finalizes the context.
const _: () = {
    const fn send<T: Send>() {}
    send::<CudaDevice>();
};

impl CudaOut {
    /// Wraps `device`'s primary context (see the module contract).
    pub(crate) fn new(lib: &'static GstCuda, device: &CudaDevice) -> Result<CudaOut, String> {
        // SAFETY: a primary context and its device, retained by `device`,
        // which the context object keeps (below) for as long as it lives.
        let context =
            unsafe { (lib.new_wrapped)(device.raw_context().cast(), device.raw_device()) };
        if context.is_null() {
            return Err(format!(
                "GStreamer's CUDA library refused to wrap {}'s context",
                device.name()
            ));
        }
        let keep = Box::into_raw(Box::new(device.clone()));
        // SAFETY: a live GObject this value owns a reference to; the key is
        // a NUL-terminated string; `drop_device` frees `keep` exactly once,
        // when the object is finalized (or the key replaced: never).
        unsafe {
            glib::gobject_ffi::g_object_set_data_full(
                context.cast(),
                c"cuda-interop-device".as_ptr(),
                keep.cast(),
                Some(drop_device),
            );
        }
        Ok(CudaOut {
            lib,
            context,
            device: device.clone(),
            pool: std::sync::Mutex::new(None),
        })
    }

    /// Answers `query` with this context if it asks for a CUDA context;
    /// whether it did.
    pub(crate) fn answer_context_query(
        &self,
        element: &gst::Element,
        query: &mut gst::QueryRef,
    ) -> bool {
        // SAFETY: a live element and query (the query writable: a query
        // handler's), and this value's live context; the function reads
        // the query's context type and, on a match, sets a GstContext
        // holding its own reference to the context.
        unsafe {
            (self.lib.handle_query)(element.to_glib_none().0, query.as_mut_ptr(), self.context)
                != glib::ffi::GFALSE
        }
    }

    /// An active pool of buffers for `info` (made anew when the info
    /// changed).
    fn pool_for(&self, info: &gst_video::VideoInfo) -> Result<gst::BufferPool, String> {
        let mut pool = crate::lock(&self.pool);
        if let Some((pooled, p)) = pool.as_ref() {
            if pooled == info {
                return Ok(p.clone());
            }
            let _ = p.set_active(false);
        }
        *pool = None;
        // SAFETY: this value's live context; returns a new pool (full
        // transfer: the library sinks its floating reference) or null.
        let raw = unsafe { (self.lib.new_pool)(self.context) };
        if raw.is_null() {
            return Err("GStreamer's CUDA library made no buffer pool".into());
        }
        // SAFETY: a new pool, owned from here on.
        let made: gst::BufferPool = unsafe { from_glib_full(raw) };
        let caps = info
            .to_caps()
            .map_err(|e| format!("no caps for {info:?}: {e}"))?;
        let mut config = made.config();
        config.set_params(Some(&caps), info.size() as u32, 2, 0);
        config.add_option(gst_video::BUFFER_POOL_OPTION_VIDEO_META.as_ref());
        made.set_config(config)
            .map_err(|e| format!("GStreamer's CUDA buffer pool refused its config: {e}"))?;
        made.set_active(true)
            .map_err(|e| format!("GStreamer's CUDA buffer pool did not start: {e}"))?;
        *pool = Some((info.clone(), made.clone()));
        Ok(made)
    }

    /// A buffer of `GstCudaMemory` for `info` holding `planes`, copied on
    /// `stream` within `timeout` (see the module contract).
    pub(crate) fn fill(
        &self,
        info: &gst_video::VideoInfo,
        planes: &[DevicePlane],
        stream: &Stream,
        timeout: Duration,
    ) -> Result<gst::Buffer, String> {
        if !supports(info.format()) {
            return Err(format!("no CUDA memory layout for {:?}", info.format()));
        }
        if planes.len() != info.n_planes() as usize {
            return Err(format!(
                "{} planes for {:?}, which has {}",
                planes.len(),
                info.format(),
                info.n_planes()
            ));
        }
        if stream.device().raw_context() != self.device.raw_context() {
            return Err("a stream of another CUDA device".into());
        }
        let buffer = self
            .pool_for(info)?
            .acquire_buffer(None)
            .map_err(|e| format!("no buffer from GStreamer's CUDA buffer pool: {e:?}"))?;
        if buffer.n_memory() != 1 || !self.lib.is_cuda_memory(buffer.peek_memory(0)) {
            return Err(
                "GStreamer's CUDA buffer pool gave a buffer that is not one CUDA memory".into(),
            );
        }
        let raw = buffer.peek_memory(0).as_mut_ptr();
        // SAFETY: a GstCudaMemory (checked just above), whose public head is
        // `GstCudaMemoryHead`; read only, while `buffer` holds the memory.
        let laid_out = unsafe { &(*raw.cast::<GstCudaMemoryHead>()).info };
        let size = buffer.peek_memory(0).size();
        let mut offsets = Vec::with_capacity(planes.len());
        let mut strides = Vec::with_capacity(planes.len());
        for (i, plane) in planes.iter().enumerate() {
            let (offset, stride) = (laid_out.offset[i], laid_out.stride[i]);
            let fits = u64::try_from(stride)
                .ok()
                .filter(|&s| s >= plane.row_bytes)
                .and_then(|s| {
                    let last = u64::from(plane.rows.checked_sub(1)?);
                    (offset as u64)
                        .checked_add(s.checked_mul(last)?)?
                        .checked_add(plane.row_bytes)
                });
            if fits.is_none_or(|end| end > size as u64) {
                return Err(format!(
                    "plane {i} ({} rows of {} bytes) does not fit GStreamer's CUDA memory \
                     ({size} bytes, offset {offset}, stride {stride})",
                    plane.rows, plane.row_bytes
                ));
            }
            offsets.push(offset as u64);
            strides.push(stride as usize);
        }
        let mut map = std::mem::MaybeUninit::<gst::ffi::GstMapInfo>::zeroed();
        // SAFETY: a live memory of a buffer this function owns alone (fresh
        // from the pool); maps it for the device pointer, writable (the
        // allocator then knows a host copy is stale); unmapped below on
        // every path.
        let mapped = unsafe {
            gst::ffi::gst_memory_map(
                raw,
                map.as_mut_ptr(),
                gst::ffi::GST_MAP_WRITE | GST_MAP_CUDA,
            )
        };
        if mapped == glib::ffi::GFALSE {
            return Err("GStreamer's CUDA memory does not map for the device".into());
        }
        // SAFETY: filled by the successful map above.
        let mut map = unsafe { map.assume_init() };
        let base = map.data as u64;
        let copied = (|| {
            let current = self.device.enter().map_err(|e| e.to_string())?;
            for (i, plane) in planes.iter().enumerate() {
                // SAFETY: the source plane is live device memory of this
                // device (the caller's: a held frame's slot, `rows` rows
                // `pitch` apart); the destination rows lie inside the
                // mapped memory (checked above); this device's primary
                // context is current, `stream` one of its streams.
                unsafe {
                    copy_plane(
                        (plane.ptr, plane.pitch),
                        (base + offsets[i], strides[i] as u64),
                        (plane.row_bytes, plane.rows),
                        stream,
                    )
                }
                .map_err(|e| format!("copying a plane into CUDA memory failed: {e}"))?;
            }
            drop(current);
            stream.synchronize(timeout).map_err(|e| e.to_string())
        })();
        // SAFETY: mapped above with this info; unmapped once.
        unsafe { gst::ffi::gst_memory_unmap(raw, &mut map) };
        copied?;
        Ok(buffer)
    }

    /// Whether [`CudaOut::wrap`] is available (GStreamer 1.24 or later).
    pub(crate) fn can_wrap(&self) -> bool {
        self.lib.alloc_wrapped.is_some()
    }

    /// A buffer of one `GstCudaMemory` wrapping `span` bytes at `ptr`,
    /// video of `info` with its planes at `offsets` and `strides`, and
    /// `keep` run once when GStreamer frees the memory (see the module
    /// contract).
    ///
    /// # Safety
    ///
    /// `ptr` is device memory of this value's device, `span` bytes long,
    /// holding the frame's planes at `offsets` and `strides` (each plane's
    /// rows inside the span), allocated and readable by CUDA work enqueued
    /// on any stream of its primary context from now until `keep` runs.
    /// (Whatever writes it in that time changes the pixels GStreamer reads,
    /// never memory GStreamer does not own.)
    pub(crate) unsafe fn wrap(
        &self,
        info: &gst_video::VideoInfo,
        ptr: u64,
        span: usize,
        (offsets, strides): (&[usize], &[i32]),
        keep: Box<dyn FnOnce() + Send>,
    ) -> Result<gst::Buffer, String> {
        let Some(alloc_wrapped) = self.lib.alloc_wrapped else {
            keep();
            return Err("wrapping device memory needs GStreamer 1.24 or later".into());
        };
        let n = info.n_planes() as usize;
        if offsets.len() != n || strides.len() != n {
            keep();
            return Err(format!("{} planes described for {n}", offsets.len()));
        }
        let info_ptr: *const gst_video::ffi::GstVideoInfo = info.to_glib_none().0;
        // SAFETY: a valid video info, copied: a plain C struct.
        let mut laid_out = unsafe { *info_ptr };
        laid_out.size = span;
        laid_out.offset[..n].copy_from_slice(offsets);
        laid_out.stride[..n].copy_from_slice(strides);
        let user_data = Box::into_raw(Box::new(keep));
        // SAFETY: the default CUDA allocator (null), this value's live
        // context, no stream (the memory is complete now: the caller's),
        // an info that describes `ptr`'s layout (the caller's), and
        // `run_keep` with the boxed `keep` it frees once; GStreamer does
        // not free `ptr` itself when a notify is given.
        let raw = unsafe {
            alloc_wrapped(
                std::ptr::null_mut(),
                self.context,
                std::ptr::null_mut(),
                &laid_out,
                ptr,
                user_data.cast(),
                Some(run_keep),
            )
        };
        if raw.is_null() {
            // SAFETY: not handed to GStreamer: still this function's.
            let keep = unsafe { Box::from_raw(user_data) };
            keep();
            return Err("GStreamer's CUDA allocator would not wrap the frame".into());
        }
        // SAFETY: a new memory, owned from here on.
        let memory: gst::Memory = unsafe { from_glib_full(raw) };
        let mut buffer = gst::Buffer::new();
        {
            let b = buffer.get_mut().expect("a new buffer is writable");
            b.append_memory(memory);
            gst_video::VideoMeta::add_full(
                b,
                gst_video::VideoFrameFlags::empty(),
                info.format(),
                info.width(),
                info.height(),
                offsets,
                strides,
            )
            .map_err(|e| format!("cannot add a GstVideoMeta: {e}"))?;
        }
        Ok(buffer)
    }

    /// Polls `stream` (a live stream of this context) until its work ran,
    /// within `timeout`.
    fn wait_for_stream(&self, stream: sys::CUstream, timeout: Duration) -> Result<(), String> {
        let query = sys::Driver::global()
            .map_err(|e| e.to_string())?
            .fns()
            .cuStreamQuery
            .ok_or("the CUDA driver lacks cuStreamQuery")?;
        let current = self.device.enter().map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        loop {
            // SAFETY: the caller's: a live stream of this context, current.
            match unsafe { query(stream) } {
                CUresult::CUDA_SUCCESS => break,
                CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_micros(20));
                }
                CUresult::CUDA_ERROR_NOT_READY => {
                    return Err(format!(
                        "the element upstream's CUDA work did not finish within {timeout:?}"
                    ))
                }
                other => return Err(format!("cuStreamQuery upstream's stream: {other:?}")),
            }
        }
        drop(current);
        Ok(())
    }

    /// The device whose primary context this wraps.
    pub(crate) fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Copies `buffer` (video of `info`, one `GstCudaMemory`) into `dst`,
    /// one device plane per video plane, on `stream` within `timeout` (see
    /// the module contract).
    pub(crate) fn read_into(
        &self,
        buffer: &gst::BufferRef,
        info: &gst_video::VideoInfo,
        dst: &[DevicePlane],
        stream: &Stream,
        timeout: Duration,
    ) -> Result<(), String> {
        if buffer.n_memory() != 1 || !self.lib.is_cuda_memory(buffer.peek_memory(0)) {
            return Err(
                "a buffer that is not one CUDA memory under memory:CUDAMemory caps: the element \
                 upstream mislabels its memory (put cudaupload before the sink, or let it \
                 negotiate video/x-raw)"
                    .into(),
            );
        }
        if dst.len() != info.n_planes() as usize {
            return Err(format!(
                "{} planes for {:?}, which has {}",
                dst.len(),
                info.format(),
                info.n_planes()
            ));
        }
        if stream.device().raw_context() != self.device.raw_context() {
            return Err("a stream of another CUDA device".into());
        }
        let memory = buffer.peek_memory(0);
        let raw = memory.as_mut_ptr();
        // SAFETY: a GstCudaMemory (checked above), whose public head is
        // `GstCudaMemoryHead`; read only, while `buffer` holds the memory.
        let head = unsafe { &*raw.cast::<GstCudaMemoryHead>() };
        // SAFETY: the memory's context, a live GstCudaContext it holds a
        // reference to; the function returns its CUcontext.
        let context = unsafe { (self.lib.get_handle)(head.context) };
        if context != self.device.raw_context().cast() {
            return Err(format!(
                "CUDA memory of another CUDA context than {}'s primary one (the element \
                 upstream made its own: give it this pipeline's, or put cudadownload before \
                 cudainteropsink)",
                self.device.name()
            ));
        }
        // Offsets from the start of the memory's mapping (which begins at
        // its offset into the allocation, where the allocator's info
        // counts from).
        let (offsets, strides): (Vec<usize>, Vec<i32>) = match buffer.meta::<gst_video::VideoMeta>()
        {
            Some(meta) if meta.n_planes() as usize != dst.len() => {
                return Err(format!(
                    "a video meta of {} planes for {:?}, which has {}",
                    meta.n_planes(),
                    info.format(),
                    dst.len()
                ))
            }
            Some(meta) => (
                meta.offset()[..dst.len()].to_vec(),
                meta.stride()[..dst.len()].to_vec(),
            ),
            None => {
                let skipped = memory.offset();
                let offsets = head.info.offset[..dst.len()]
                    .iter()
                    .map(|o| o.checked_sub(skipped))
                    .collect::<Option<Vec<_>>>()
                    .ok_or("a CUDA memory resized past its planes")?;
                (offsets, head.info.stride[..dst.len()].to_vec())
            }
        };
        let size = memory.size() as u64;
        let mut planes = Vec::with_capacity(dst.len());
        for (i, d) in dst.iter().enumerate() {
            let (offset, stride) = (offsets[i] as u64, strides[i]);
            let fits = u64::try_from(stride)
                .ok()
                .filter(|&s| s >= d.row_bytes)
                .and_then(|s| {
                    let last = u64::from(d.rows.checked_sub(1)?);
                    offset
                        .checked_add(s.checked_mul(last)?)?
                        .checked_add(d.row_bytes)
                });
            if fits.is_none_or(|end| end > size) {
                return Err(format!(
                    "plane {i} ({} rows of {} bytes at offset {offset}, stride {stride}) lies \
                     past the CUDA memory's {size} bytes",
                    d.rows, d.row_bytes
                ));
            }
            planes.push((offset, stride as u64));
        }
        // 1.24 and later: the element upstream may push before its work on
        // its stream ran; wait (bounded) for that stream to drain.
        if let Some((get_stream, get_handle)) = self.lib.memory_stream {
            // SAFETY: a live GstCudaMemory `buffer` holds; the stream (if
            // any) is the memory's, alive while it is.
            let upstream = unsafe {
                let s = get_stream(raw);
                if s.is_null() {
                    std::ptr::null_mut()
                } else {
                    get_handle(s)
                }
            };
            if !upstream.is_null() {
                self.wait_for_stream(upstream.cast(), timeout)?;
            }
        }
        let mut map = std::mem::MaybeUninit::<gst::ffi::GstMapInfo>::zeroed();
        // SAFETY: a live memory `buffer` holds; mapped readable for the
        // device pointer, unmapped below on every path.
        let mapped = unsafe {
            gst::ffi::gst_memory_map(raw, map.as_mut_ptr(), gst::ffi::GST_MAP_READ | GST_MAP_CUDA)
        };
        if mapped == glib::ffi::GFALSE {
            return Err("the CUDA memory does not map for the device".into());
        }
        // SAFETY: filled by the successful map above.
        let mut map = unsafe { map.assume_init() };
        let base = map.data as u64;
        let copied = (|| {
            let current = self.device.enter().map_err(|e| e.to_string())?;
            for (d, (offset, stride)) in dst.iter().zip(&planes) {
                // SAFETY: the source rows lie inside the mapped memory
                // (checked above), of this device's primary context (the
                // memory's context's handle, checked above), current here;
                // the destination plane is the caller's live device memory
                // of `rows` rows `pitch` apart; `stream` is a live stream
                // of this context.
                unsafe {
                    copy_plane(
                        (base + offset, *stride),
                        (d.ptr, d.pitch),
                        (d.row_bytes, d.rows),
                        stream,
                    )
                }
                .map_err(|e| format!("copying a plane out of CUDA memory failed: {e}"))?;
            }
            drop(current);
            stream.synchronize(timeout).map_err(|e| e.to_string())
        })();
        // SAFETY: mapped above with this info; unmapped once.
        unsafe { gst::ffi::gst_memory_unmap(raw, &mut map) };
        copied
    }
}

/// Enqueues a copy of `rows` rows of `row_bytes` from `src` to `dst`
/// (each `(address, pitch)`) on `stream`: one linear copy of the span
/// where the pitches are equal (the driver's device-to-device copy runs
/// near the memory's bandwidth; its 2D copy at a fraction, the copy-kernel
/// exploration in `docs/evidence.md`), else a 2D copy.
///
/// # Safety
///
/// Both ranges are live device memory of the current context's device,
/// `rows` rows `pitch` apart each with `row_bytes <= pitch`, and stay so
/// until the copy completes; `stream` is a live stream of the current
/// context.
unsafe fn copy_plane(
    src: (u64, u64),
    dst: (u64, u64),
    (row_bytes, rows): (u64, u32),
    stream: &Stream,
) -> Result<(), String> {
    if rows == 0 {
        return Ok(());
    }
    let fns = sys::Driver::global().map_err(|e| e.to_string())?.fns();
    let status = if src.1 == dst.1 {
        let copy = fns
            .cuMemcpyDtoDAsync
            .ok_or("the CUDA driver lacks cuMemcpyDtoDAsync")?;
        let span = src.1 * u64::from(rows - 1) + row_bytes;
        // SAFETY: the caller's: both spans live device memory of the
        // current context's device, `stream` its stream.
        unsafe { copy(dst.0, src.0, span as usize, stream.raw()) }
    } else {
        let copy = fns
            .cuMemcpy2DAsync
            .ok_or("the CUDA driver lacks cuMemcpy2DAsync")?;
        let params = sys::CUDA_MEMCPY2D {
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcDevice: src.0,
            srcPitch: src.1 as usize,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstDevice: dst.0,
            dstPitch: dst.1 as usize,
            WidthInBytes: row_bytes as usize,
            Height: rows as usize,
            // SAFETY: the rest (offsets, host and array fields) zero:
            // unused for device-to-device copies.
            ..unsafe { std::mem::zeroed() }
        };
        // SAFETY: the caller's, row by row.
        unsafe { copy(&params, stream.raw()) }
    };
    if status == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{status:?}"))
    }
}

impl Drop for CudaOut {
    fn drop(&mut self) {
        // Buffers downstream still holds are freed as they come back.
        if let Some((_, pool)) = crate::lock(&self.pool).take() {
            let _ = pool.set_active(false);
        }
        // SAFETY: this value's reference, given back once.
        unsafe { gst::ffi::gst_object_unref(self.context.cast()) };
    }
}
