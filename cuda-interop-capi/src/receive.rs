//! Receivers' layouts and the CUDA receiver: thin bindings over
//! `cuda_interop_frames::cuda_receiver::CudaReceiver` (its state machine,
//! its checks; nothing of it is redone here).
//!
//! # Contract
//!
//! * A `ci_cuda_receiver*` is its own handle kind: a host receiver's handle
//!   passed to a `ci_cuda_receiver_*` function (or the reverse) is
//!   `CI_WRONG_HANDLE`; a frame of another receiver is
//!   `CI_INVALID_ARGUMENT`; a released frame's handle is `CI_WRONG_HANDLE`.
//! * Frames are `ci_frame*` handles as the host receiver's are
//!   (`ci_frame_get_info` describes both); the CUDA receiver releases them
//!   with `ci_cuda_receiver_release_after` (after the reads enqueued on a
//!   stream) or `ci_cuda_receiver_release` (reads already completed).
//! * Raw CUDA objects cross as `void *`: a stream is a `CUstream` /
//!   `cudaStream_t` (NULL: the legacy default stream, as
//!   `CU_STREAM_LEGACY`), an array a `CUarray` / `cudaArray_t`, a device
//!   pointer a `CUdeviceptr` in a `uint64_t`. What the library cannot check
//!   (that a stream is live and of the receiver's device) is the caller's
//!   promise, stated in each function's `# Safety`.
//! * `ci_ring_layout` carries a `struct_size` the caller sets: the library
//!   writes `sizeof(ci_ring_layout)` of its own version (fields added later
//!   go at the end; a larger caller struct keeps its tail untouched).

use std::ffi::{c_char, c_void};
use std::sync::{Arc, PoisonError};

use cuda_interop_frames::cuda_receiver::{CudaReceiver, PitchedPlane};
use cuda_interop_frames::protocol::{Planar, RingLayout, SlotFormat};
use cuda_interop_frames::session::{ConnectError, Frame};

use crate::ffi::{
    ci_cuda_receiver, ci_frame, ci_receiver, consumer, delivery_of, discovery, frame_of, key,
    register_frame, string,
};
use crate::handles::{self, Object};
use crate::{ci_status, entry, name_array, non_null, seconds, CiError, CI_FORMAT_NAME_CAPACITY};

/// `ci_ring_layout::format`: pitched buffers of 8-bit RGBA pixels.
pub const CI_FORMAT_RGBA8_BUFFER: u32 = 0;
/// `ci_ring_layout::format`: pitched buffers of NV12 (8-bit luma plane,
/// then interleaved CbCr at half size, at `chroma_offset`).
pub const CI_FORMAT_NV12: u32 = 1;
/// `ci_ring_layout::format`: pitched buffers of P010 (as NV12 with 16-bit
/// samples, the value in the top 10 bits).
pub const CI_FORMAT_P010: u32 = 2;
/// `ci_ring_layout::format`: OPTIMAL images of `vk_format`.
pub const CI_FORMAT_IMAGE: u32 = 3;

/// `VK_FORMAT_R8G8B8A8_UNORM`: the pixels of an RGBA8 buffer ring.
const VK_FORMAT_R8G8B8A8_UNORM: u32 = 37;

/// A ring's layout (`ci_receiver_get_layout`,
/// `ci_cuda_receiver_get_layout`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_ring_layout {
    /// `sizeof(ci_ring_layout)` as the caller compiled it: set it before
    /// the call (a smaller value is `CI_INVALID_ARGUMENT`).
    pub struct_size: u32,
    /// `CI_FORMAT_*`: what the slots hold.
    pub format: u32,
    /// Pixels per row.
    pub width: u32,
    /// Rows (a planar ring: of the luma plane).
    pub height: u32,
    /// Slots in the ring.
    pub slots: u32,
    /// The pixels' `VkFormat` (raw value): an image ring's images',
    /// `VK_FORMAT_R8G8B8A8_UNORM` (37) for an RGBA8 buffer ring, 0 for a
    /// planar one.
    pub vk_format: u32,
    /// Bytes from one row to the next (both planes of a planar ring; an
    /// image ring: the tightly packed row of its copies).
    pub row_pitch: u64,
    /// Bytes of a frame: what `ci_receiver_read` writes; for a planar ring
    /// up to the end of the chroma plane's last row.
    pub frame_bytes: u64,
    /// Bytes of one texel (a planar ring: of one luma sample).
    pub texel_bytes: u64,
    /// A planar ring's chroma plane's first byte, from the luma plane's
    /// (0 for other rings).
    pub chroma_offset: u64,
    /// The format's lower-case name, NUL-terminated: `r8g8b8a8_unorm`,
    /// `nv12`, `p010`, or an image ring's `VkFormat` without `VK_FORMAT_`.
    pub format_name: [c_char; CI_FORMAT_NAME_CAPACITY],
}

/// The lower-case name of a raw `VkFormat` among those vk-export maps, or
/// `vk_format_N`.
fn image_format_name(vk_format: u32) -> String {
    vk_export::format::SUPPORTED
        .iter()
        .find(|f| f.0.as_raw() as u32 == vk_format)
        .map(|f| f.1.to_ascii_lowercase())
        .unwrap_or_else(|| format!("vk_format_{vk_format}"))
}

fn layout_of(layout: &RingLayout) -> ci_ring_layout {
    let (format, vk_format, chroma_offset, name) = match layout.format {
        SlotFormat::Rgba8Buffer => (
            CI_FORMAT_RGBA8_BUFFER,
            VK_FORMAT_R8G8B8A8_UNORM,
            0,
            "r8g8b8a8_unorm".to_string(),
        ),
        SlotFormat::PlanarBuffer {
            planar,
            chroma_offset,
        } => (
            match planar {
                Planar::Nv12 => CI_FORMAT_NV12,
                Planar::P010 => CI_FORMAT_P010,
            },
            0,
            chroma_offset,
            planar.name().to_string(),
        ),
        SlotFormat::Image { vk_format } => {
            (CI_FORMAT_IMAGE, vk_format, 0, image_format_name(vk_format))
        }
    };
    ci_ring_layout {
        struct_size: std::mem::size_of::<ci_ring_layout>() as u32,
        format,
        width: layout.width,
        height: layout.height,
        slots: layout.slots,
        vk_format,
        row_pitch: layout.row_pitch,
        // Checked when the session began: never None for a live ring.
        frame_bytes: layout.frame_bytes().unwrap_or(0),
        texel_bytes: layout.texel_bytes(),
        chroma_offset,
        format_name: name_array(&name),
    }
}

/// Writes `layout` to `out` after checking its `struct_size`.
///
/// # Safety
/// `out` is NULL or valid for reads of 4 bytes and writes of its
/// `struct_size` bytes.
pub(crate) unsafe fn write_layout(
    out: *mut ci_ring_layout,
    layout: &RingLayout,
) -> Result<(), CiError> {
    non_null(out, "layout")?;
    // SAFETY: not NULL, readable (the caller's promise); the first field
    // alone, before trusting it.
    let size = unsafe { std::ptr::read_unaligned(out.cast::<u32>()) };
    let need = std::mem::size_of::<ci_ring_layout>();
    if (size as usize) < need {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!(
                "layout->struct_size is {size}: set it to sizeof(ci_ring_layout) ({need}) before \
                 the call"
            ),
        ));
    }
    // SAFETY: valid for writes of struct_size >= need bytes (the caller's
    // promise); unaligned-safe.
    unsafe { std::ptr::write_unaligned(out, layout_of(layout)) };
    Ok(())
}

/// Stores the layout of host receiver `receiver`'s ring in `*layout`
/// (set `layout->struct_size = sizeof(ci_ring_layout)` first).
///
/// Thread safety: any thread.
///
/// # Safety
/// `layout` is NULL or points to a `ci_ring_layout` whose `struct_size` is
/// set, valid for writes of that many bytes.
#[no_mangle]
pub unsafe extern "C" fn ci_receiver_get_layout(
    receiver: *const ci_receiver,
    layout: *mut ci_ring_layout,
) -> ci_status {
    entry(|| {
        let rx = handles::receiver(key(receiver))?;
        // SAFETY: the caller's promise, forwarded.
        unsafe { write_layout(layout, rx.session().layout()) }
    })
}

/// Stores the layout of CUDA receiver `receiver`'s ring in `*layout`
/// (set `layout->struct_size = sizeof(ci_ring_layout)` first).
///
/// Thread safety: any thread.
///
/// # Safety
/// As `ci_receiver_get_layout`.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_get_layout(
    receiver: *const ci_cuda_receiver,
    layout: *mut ci_ring_layout,
) -> ci_status {
    entry(|| {
        let rx = handles::cuda_receiver(key(receiver))?;
        // SAFETY: the caller's promise, forwarded.
        unsafe { write_layout(layout, rx.layout()) }
    })
}

/// Connects a CUDA receiver to the sender named `name` in the default
/// directory (`$XDG_RUNTIME_DIR/cuda-interop-frames`), waiting up to
/// `timeout_s` seconds for it to appear, in `delivery`
/// (`CI_DELIVERY_LATEST` or `CI_DELIVERY_LOSSLESS`), imports its ring into
/// CUDA on the device whose UUID the ring names (its primary context: what
/// the CUDA runtime uses) and stores the receiver's handle in `*out`. A
/// ring shared without timelines (a driver without
/// `VK_KHR_external_semaphore_fd`, such as lavapipe) is refused
/// (`CI_PROTOCOL`, saying what to use instead); no CUDA driver is
/// `CI_CUDA`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_connect_named(
    name: *const c_char,
    delivery: u32,
    timeout_s: f64,
    out: *mut *mut ci_cuda_receiver,
) -> ci_status {
    entry(|| {
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let delivery = delivery_of(delivery)?;
        let receiver =
            CudaReceiver::connect_named(name, delivery, timeout).map_err(|e| match e {
                ConnectError::Discovery(d) => discovery(d),
                ConnectError::Consumer(c) => consumer(&c),
            })?;
        let handle = handles::insert(Object::CudaReceiver(Arc::new(receiver)));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_cuda_receiver) };
        Ok(())
    })
}

/// Stores the ordinal of the CUDA device the ring is imported on (its
/// primary context is the one to use: `cuDevicePrimaryCtxRetain`, or the
/// runtime's `cudaSetDevice`) in `*ordinal_out`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `ordinal_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_device(
    receiver: *const ci_cuda_receiver,
    ordinal_out: *mut i32,
) -> ci_status {
    entry(|| {
        let rx = handles::cuda_receiver(key(receiver))?;
        non_null(ordinal_out, "ordinal_out")?;
        let ordinal = rx.cuda().ordinal();
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { ordinal_out.write(ordinal) };
        Ok(())
    })
}

/// Waits up to `timeout_s` seconds for the next frame (as
/// `ci_receiver_next`) and stores its handle in `*out`. Its memory is
/// readable only after `ci_cuda_receiver_wait_on` (on the GPU), and until
/// `ci_cuda_receiver_release_after` / `ci_cuda_receiver_release`.
///
/// Thread safety: any thread; one thread receives at a time (a second
/// one's call waits within its timeout, then returns `CI_BUSY`).
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_next(
    receiver: *mut ci_cuda_receiver,
    timeout_s: f64,
    out: *mut *mut ci_frame,
) -> ci_status {
    entry(|| {
        let owner = key(receiver);
        let rx = handles::cuda_receiver(owner)?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let frame = rx.next(timeout).map_err(|e| consumer(&e))?;
        let layout = *rx.layout();
        let bytes = layout.frame_bytes().unwrap_or(0);
        let handle = register_frame(owner, frame, &layout, bytes, || {
            handles::cuda_receiver(owner).is_ok()
        })?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_frame) };
        Ok(())
    })
}

/// Runs `f` on CUDA receiver `receiver` and its frame `frame` (checked:
/// live, of that receiver, not released); the frame's lock is held for
/// the call (a release on another thread waits).
fn with_frame<T>(
    receiver: *const ci_cuda_receiver,
    frame: *const ci_frame,
    f: impl FnOnce(&CudaReceiver, &Frame) -> Result<T, CiError>,
) -> Result<T, CiError> {
    let rx = handles::cuda_receiver(key(receiver))?;
    let entry = frame_of(key(receiver), key(frame))?;
    let held = entry.frame.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(frame) = held.as_ref() else {
        return Err(released());
    };
    f(&rx, frame)
}

fn released() -> CiError {
    CiError::new(
        ci_status::CI_WRONG_HANDLE,
        "the frame was released: use a frame between ci_cuda_receiver_next and its release",
    )
}

/// The raw stream value the Rust side takes: NULL is the legacy default
/// stream (`CU_STREAM_LEGACY`, 1), as the driver API reads a NULL stream.
fn raw_stream(stream: *mut c_void) -> usize {
    if stream.is_null() {
        1
    } else {
        stream as usize
    }
}

/// Makes `stream` wait (on the GPU, the host does not block) until
/// `frame` is written and, for an image ring, copied into its pitched
/// memory: work the caller enqueues on `stream` afterwards reads the frame
/// (`ci_cuda_receiver_pitched`, `ci_cuda_receiver_chroma`,
/// `ci_cuda_receiver_array`). Enqueue it once per frame.
///
/// Thread safety: any thread.
///
/// # Safety
/// `stream` is NULL (the legacy default stream), `CU_STREAM_LEGACY`
/// (`(void *)1`), `CU_STREAM_PER_THREAD` (`(void *)2`), or a `CUstream` /
/// `cudaStream_t` of the receiver's CUDA device (`ci_cuda_receiver_device`;
/// any context of it) that stays alive for the call. The library cannot
/// check this: a destroyed stream or one of another device is undefined
/// behaviour in the CUDA driver.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_wait_on(
    receiver: *mut ci_cuda_receiver,
    frame: *const ci_frame,
    stream: *mut c_void,
) -> ci_status {
    entry(|| {
        with_frame(receiver, frame, |rx, frame| {
            // SAFETY: the caller's promise on `stream`, forwarded.
            unsafe { rx.wait_on_raw(frame, raw_stream(stream)) }.map_err(|e| consumer(&e))
        })
    })
}

/// Makes `stream` wait (on the GPU, the host does not block) until
/// `frame` is written, and nothing more: an image ring's array
/// (`ci_cuda_receiver_array`, the image itself) and a buffer ring's memory
/// are readable by work the caller enqueues on `stream` afterwards; an
/// image ring's pitched copy is not made (that is `ci_cuda_receiver_wait_on`,
/// one copy of the frame on the GPU). The zero-copy way to read an image
/// ring. Enqueue it once per frame.
///
/// Thread safety: any thread.
///
/// # Safety
/// As `ci_cuda_receiver_wait_on` for `stream`.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_wait_produced(
    receiver: *mut ci_cuda_receiver,
    frame: *const ci_frame,
    stream: *mut c_void,
) -> ci_status {
    entry(|| {
        with_frame(receiver, frame, |rx, frame| {
            // SAFETY: the caller's promise on `stream`, forwarded.
            unsafe { rx.wait_produced_raw(frame, raw_stream(stream)) }.map_err(|e| consumer(&e))
        })
    })
}

/// A frame's memory as pitched device memory (`ci_cuda_receiver_pitched`,
/// `ci_cuda_receiver_chroma`): `rows` rows of `row_bytes` bytes, the first
/// at `ptr`, each `pitch` bytes after the one before (what `cuMemcpy2D`,
/// `cudaMemcpy2D` and NVENC take).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ci_pitched_plane {
    /// The first row's address: a `CUdeviceptr` of the receiver's device
    /// (a `void *` for the runtime API), valid while the receiver lives.
    pub ptr: u64,
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes of pixels in a row (at most `pitch`).
    pub row_bytes: u64,
    /// Rows.
    pub rows: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
}

fn plane(p: PitchedPlane) -> ci_pitched_plane {
    ci_pitched_plane {
        ptr: p.ptr,
        pitch: p.pitch,
        row_bytes: p.row_bytes,
        rows: p.rows,
        reserved: 0,
    }
}

/// Stores `frame`'s memory as pitched device memory in `*out`: a buffer
/// ring's slot (a planar ring's luma plane: see `ci_cuda_receiver_chroma`),
/// or an image ring's tightly packed copy of the image. Read it on a stream
/// after `ci_cuda_receiver_wait_on`, before the frame's release.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_pitched(
    receiver: *mut ci_cuda_receiver,
    frame: *const ci_frame,
    out: *mut ci_pitched_plane,
) -> ci_status {
    entry(|| {
        let p = with_frame(receiver, frame, |rx, frame| {
            rx.pitched(frame).map_err(|e| consumer(&e))
        })?;
        non_null(out, "out")?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(plane(p)) };
        Ok(())
    })
}

/// Stores a planar (NV12, P010) ring's chroma plane of `frame` in `*out`
/// (`height / 2` rows of `width / 2` interleaved Cb, Cr pairs); on the same
/// terms as `ci_cuda_receiver_pitched`. Another ring is `CI_UNSUPPORTED`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_chroma(
    receiver: *mut ci_cuda_receiver,
    frame: *const ci_frame,
    out: *mut ci_pitched_plane,
) -> ci_status {
    entry(|| {
        let p = with_frame(receiver, frame, |rx, frame| {
            rx.chroma(frame).map_err(|e| consumer(&e))
        })?;
        non_null(out, "out")?;
        let Some(p) = p else {
            return Err(CiError::new(
                ci_status::CI_UNSUPPORTED,
                "the ring is not planar (NV12 or P010): it has no chroma plane; read the frame \
                 with ci_cuda_receiver_pitched",
            ));
        };
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(plane(p)) };
        Ok(())
    })
}

/// Stores an image ring's frame as the slot's CUDA array in `*array_out`:
/// a `CUarray` of the device's primary context, also usable as a
/// `cudaArray_t` (level 0 of the image itself, zero copy; cast the
/// `void *`), valid while the receiver lives. Read it on a stream after
/// `ci_cuda_receiver_wait_produced` (or `ci_cuda_receiver_wait_on`) and before the frame's release; never write
/// it, nor free it. A buffer ring is `CI_UNSUPPORTED` (use
/// `ci_cuda_receiver_pitched`).
///
/// Thread safety: any thread.
///
/// # Safety
/// `array_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_array(
    receiver: *mut ci_cuda_receiver,
    frame: *const ci_frame,
    array_out: *mut *mut c_void,
) -> ci_status {
    entry(|| {
        let array = with_frame(receiver, frame, |rx, frame| {
            rx.array(frame).map_err(|e| consumer(&e))
        })?;
        non_null(array_out, "array_out")?;
        let Some(array) = array else {
            return Err(CiError::new(
                ci_status::CI_UNSUPPORTED,
                "the ring's slots are buffers, not images: read the frame with \
                 ci_cuda_receiver_pitched",
            ));
        };
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { array_out.write(array.cast::<c_void>()) };
        Ok(())
    })
}

/// Takes frame `frame` of `receiver` out of the table (checked as
/// `with_frame` checks) and gives it to `release`. The handle is consumed
/// once the checks pass, whatever `release` returns.
fn consume(
    receiver: *mut ci_cuda_receiver,
    frame: *mut ci_frame,
    release: impl FnOnce(&CudaReceiver, Frame) -> Result<(), CiError>,
) -> Result<(), CiError> {
    let rx = handles::cuda_receiver(key(receiver))?;
    frame_of(key(receiver), key(frame))?;
    match handles::take_frame(key(frame))? {
        Some(frame) => release(&rx, frame),
        None => Err(released()),
    }
}

/// Gives `frame` back once the work enqueued on `stream` so far has
/// completed (on the GPU: the slot's "released" timeline is signalled on
/// `stream`; the host does not wait). The frame handle is consumed whatever
/// the status, unless the status is `CI_NULL_POINTER`, `CI_WRONG_HANDLE`
/// or `CI_INVALID_ARGUMENT` (a frame of another receiver), which change
/// nothing. `CI_CUDA`: the signal could not be enqueued; the connection is
/// closed (the reads may still run, so the slot is not given back).
///
/// Thread safety: any thread.
///
/// # Safety
/// As `ci_cuda_receiver_wait_on` for `stream`.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_release_after(
    receiver: *mut ci_cuda_receiver,
    frame: *mut ci_frame,
    stream: *mut c_void,
) -> ci_status {
    entry(|| {
        consume(receiver, frame, |rx, frame| {
            // SAFETY: the caller's promise on `stream`, forwarded.
            unsafe { rx.release_after_raw(frame, raw_stream(stream)) }.map_err(|e| consumer(&e))
        })
    })
}

/// Gives `frame` back now, as if every read of it had completed: call it
/// only after they have (a stream synchronised, an event waited for), or
/// for a frame never read. The handle is consumed as by
/// `ci_cuda_receiver_release_after`.
///
/// Thread safety: any thread.
///
/// # Safety
/// None beyond the ABI: the handles are checked. (Releasing a frame whose
/// reads still run lets the sender overwrite it under them: wrong pixels,
/// not undefined behaviour of this library.)
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_release(
    receiver: *mut ci_cuda_receiver,
    frame: *mut ci_frame,
) -> ci_status {
    entry(|| {
        consume(receiver, frame, |_, frame| {
            drop(frame);
            Ok(())
        })
    })
}

/// Frees a CUDA receiver (NULL: nothing), releasing every frame it handed
/// out that is not released yet (as `ci_cuda_receiver_release`: their
/// reads must have completed) and unmapping the ring (waiting, bounded,
/// for the receiver's own copies).
///
/// Thread safety: any thread; the handle and its frames' handles are
/// invalid for every thread after.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_cuda_receiver_free(receiver: *mut ci_cuda_receiver) -> ci_status {
    entry(|| {
        handles::free_receiver(key(receiver), "ci_cuda_receiver*", |o| {
            matches!(o, Object::CudaReceiver(_))
        })
    })
}
