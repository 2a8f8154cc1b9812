//! The Vulkan receiver: thin bindings over
//! `cuda_interop_frames::vulkan_receiver::VulkanReceiver` (its imports,
//! ownership handling and checks; nothing of it is redone here), on a
//! context of the library (`ci_context_new_from_vulkan`: the application's
//! own device; or `ci_context_new_headless`).
//!
//! # Contract
//!
//! * A `ci_vulkan_receiver*` is its own handle kind: a host or CUDA
//!   receiver's handle passed to a `ci_vulkan_receiver_*` function (or the
//!   reverse) is `CI_WRONG_HANDLE`; a frame of another receiver is
//!   `CI_INVALID_ARGUMENT`; a released frame's handle is `CI_WRONG_HANDLE`.
//! * `VulkanReceiver` is generic over the images' format, memory class and
//!   usage: `ci_vulkan_receiver_connect_named` takes the rings of the
//!   formats `ci_image_sender_new` makes and leaves the rest of the choice
//!   to `cuda_interop_frames::image_reader::ImageReader` (the first image
//!   record's memory and usage); other rings are refused with
//!   `CI_UNSUPPORTED` and why.
//! * Frames are `ci_frame*` handles (`ci_frame_get_info` describes them).
//!   `ci_vulkan_receiver_image` gives the frame's image on the context's
//!   device, with the state `VulkanReceiver` leaves it in between reads
//!   (`VK_IMAGE_LAYOUT_GENERAL`, owned by `VK_QUEUE_FAMILY_EXTERNAL`), which
//!   the application's own reads must restore before the frame's release.

use std::ffi::c_char;
use std::sync::{Arc, PoisonError};

use cuda_interop_frames::discovery::Directory;
use cuda_interop_frames::image_reader::{ImageReader, ImageReaderError};
use cuda_interop_frames::session::{ConnectError, Frame, Session};
use cuda_interop_frames::vulkan_receiver::VulkanReceiverError;
use vk_export::ash::vk::{self, Handle};
use vk_export::wire::Received;
use vk_export::Context;

use crate::ffi::{
    ci_context, ci_frame, consumer, delivery_of, discovery, frame_of, key, register_frame, string,
    vulkan,
};
use crate::handles::{self, FrameEntry, Object};
use crate::receive::{ci_ring_layout, write_layout};
use crate::{ci_status, entry, non_null, seconds, CiError};

/// An opaque Vulkan receiver (`ci_vulkan_receiver_connect_named`).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_vulkan_receiver {
    _opaque: [u8; 0],
}

fn receiver_error(e: VulkanReceiverError) -> CiError {
    match e {
        VulkanReceiverError::Ring(why) => CiError::new(ci_status::CI_UNSUPPORTED, why),
        VulkanReceiverError::Consumer(c) => consumer(&c),
        VulkanReceiverError::Vulkan(v) => vulkan(v),
    }
}

/// The reader of `session`'s ring on `ctx` (its format checked against
/// those the C ABI takes already), with the C ABI's words for a usage it
/// does not take.
fn reader(ctx: &Context, session: Session, setup: Received) -> Result<Arc<ImageReader>, CiError> {
    match ImageReader::new(ctx, session, setup) {
        Ok(rx) => Ok(Arc::new(rx)),
        Err(ImageReaderError::Receiver(e)) => Err(receiver_error(e)),
        Err(ImageReaderError::Usage(f)) => Err(CiError::new(
            ci_status::CI_UNSUPPORTED,
            format!(
                "the sender's images have usage {f:?}: a Vulkan receiver of the C ABI takes \
                 images made with storage or sampled usage (what ci_image_sender_new makes)"
            ),
        )),
        Err(e @ (ImageReaderError::NotImages { .. } | ImageReaderError::Format { .. })) => {
            Err(CiError::new(ci_status::CI_UNSUPPORTED, e.to_string()))
        }
    }
}

/// The `VkFormat`s a Vulkan receiver takes (those of `ci_image_sender_new`).
const RECEIVED_FORMATS: &str = "VK_FORMAT_R8G8B8A8_UNORM (37), VK_FORMAT_R8G8B8A8_SRGB (43), \
                                VK_FORMAT_B8G8R8A8_UNORM (44), VK_FORMAT_B8G8R8A8_SRGB (50), \
                                VK_FORMAT_R16G16B16A16_SFLOAT (97)";

/// Connects a Vulkan receiver to the sender named `name` in the default
/// directory (`$XDG_RUNTIME_DIR/cuda-interop-frames`), waiting up to
/// `timeout_s` seconds for it to appear, in `delivery`
/// (`CI_DELIVERY_LATEST` or `CI_DELIVERY_LOSSLESS`); imports the ring's
/// images (and its "produced" timeline, where the sender shares one) on
/// `ctx`'s device, and stores the receiver's handle in `*out`. The ring
/// must be an image ring of a format `ci_image_sender_new` makes
/// (`VK_FORMAT_R8G8B8A8_UNORM` (37), `_SRGB` (43),
/// `VK_FORMAT_B8G8R8A8_UNORM` (44), `_SRGB` (50),
/// `VK_FORMAT_R16G16B16A16_SFLOAT` (97)), of storage or sampled usage:
/// another format, a buffer ring (RGBA8, NV12, P010: use
/// `ci_receiver_connect_named` or `ci_cuda_receiver_connect_named`) or an
/// image the device cannot import is `CI_UNSUPPORTED`, saying why. The
/// receiver keeps the context's device alive; on a context from
/// `ci_context_new_from_vulkan`, the application's device must outlive the
/// receiver (that function's contract).
///
/// Thread safety: any thread.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_connect_named(
    ctx: *mut ci_context,
    name: *const c_char,
    delivery: u32,
    timeout_s: f64,
    out: *mut *mut ci_vulkan_receiver,
) -> ci_status {
    entry(|| {
        let ctx = handles::context(key(ctx))?;
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let delivery = delivery_of(delivery)?;
        let directory = Directory::from_env().map_err(discovery)?;
        let (session, setup) = Session::connect_named(&directory, name, delivery, timeout)
            .map_err(|e| match e {
                ConnectError::Discovery(d) => discovery(d),
                ConnectError::Consumer(c) => consumer(&c),
            })?;
        let layout = *session.layout();
        let Some(format) = layout.vk_format() else {
            return Err(CiError::new(
                ci_status::CI_UNSUPPORTED,
                format!(
                    "the sender {name} shares pitched buffers ({}x{}), not images: receive it \
                     with ci_receiver_connect_named (host) or ci_cuda_receiver_connect_named \
                     (CUDA)",
                    layout.width, layout.height
                ),
            ));
        };
        // The formats ci_image_sender_new makes, whatever else the reader
        // takes.
        let rx = match vk::Format::from_raw(format as i32) {
            vk::Format::R8G8B8A8_UNORM
            | vk::Format::R8G8B8A8_SRGB
            | vk::Format::B8G8R8A8_UNORM
            | vk::Format::B8G8R8A8_SRGB
            | vk::Format::R16G16B16A16_SFLOAT => reader(&ctx, session, setup),
            _ => Err(CiError::new(
                ci_status::CI_UNSUPPORTED,
                format!(
                    "the sender {name}'s images are VkFormat {format}: a Vulkan receiver of \
                     the C ABI takes {RECEIVED_FORMATS}"
                ),
            )),
        }?;
        let handle = handles::insert(Object::VulkanReceiver(rx));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_vulkan_receiver) };
        Ok(())
    })
}

/// Stores the layout of Vulkan receiver `receiver`'s ring in `*layout`
/// (set `layout->struct_size = sizeof(ci_ring_layout)` first).
///
/// Thread safety: any thread.
///
/// # Safety
/// As `ci_receiver_get_layout`.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_get_layout(
    receiver: *const ci_vulkan_receiver,
    layout: *mut ci_ring_layout,
) -> ci_status {
    entry(|| {
        let rx = handles::vulkan_receiver(key(receiver))?;
        // SAFETY: the caller's promise, forwarded.
        unsafe { write_layout(layout, rx.session().layout()) }
    })
}

/// Waits up to `timeout_s` seconds for the next frame (latest: the newest;
/// lossless: every frame in order) and stores its handle in `*out`. The
/// frame holds its slot until `ci_vulkan_receiver_release`; a latest
/// receiver holds one frame at a time (release it before the next call).
///
/// Thread safety: any thread; one thread receives at a time (a second
/// one's call waits within its timeout, then returns `CI_BUSY`).
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_next(
    receiver: *mut ci_vulkan_receiver,
    timeout_s: f64,
    out: *mut *mut ci_frame,
) -> ci_status {
    entry(|| {
        let owner = key(receiver);
        let rx = handles::vulkan_receiver(owner)?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let frame = rx.next(timeout).map_err(receiver_error)?;
        let layout = *rx.session().layout();
        let handle = register_frame(owner, frame, &layout, rx.frame_bytes(), || {
            handles::vulkan_receiver(owner).is_ok()
        })?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_frame) };
        Ok(())
    })
}

/// Runs `f` on Vulkan receiver `receiver`, its frame `frame` (checked:
/// live, of that receiver, not released) and the frame's entry; the
/// frame's lock is held for the call (a release on another thread waits).
fn with_frame<T>(
    receiver: *const ci_vulkan_receiver,
    frame: *const ci_frame,
    f: impl FnOnce(&ImageReader, &FrameEntry, &Frame) -> Result<T, CiError>,
) -> Result<T, CiError> {
    let rx = handles::vulkan_receiver(key(receiver))?;
    let entry = frame_of(key(receiver), key(frame))?;
    let held = entry.frame.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(held_frame) = held.as_ref() else {
        return Err(CiError::new(
            ci_status::CI_WRONG_HANDLE,
            "the frame was released: use a frame between ci_vulkan_receiver_next and \
             ci_vulkan_receiver_release",
        ));
    };
    f(&rx, &entry, held_frame)
}

/// Copies `frame`'s pixels (tightly packed rows of texels: `frame_bytes`
/// of `ci_frame_get_info`, `width * height * texel_bytes`) into `dst` by a
/// GPU copy on the receiver's device, waiting at most `timeout_s` seconds.
/// `CI_OK` means the bytes are the frame's; `CI_DROPPED` or `CI_CLOSED`
/// that the sender dropped this receiver meanwhile (the bytes are not
/// valid). `dst_len` smaller than the frame is `CI_BUFFER_TOO_SMALL`.
/// The library takes the image from `VK_QUEUE_FAMILY_EXTERNAL` in
/// `VK_IMAGE_LAYOUT_GENERAL` and gives it back there before returning (the
/// state `ci_vulkan_receiver_image` describes); it submits on the context's
/// queues under their locks.
///
/// Thread safety: any thread; a release of the same frame on another
/// thread waits for the read. Do not call it while the application's own
/// reads of the frame's image (`ci_vulkan_receiver_image`) may still run.
///
/// # Safety
/// `dst` is NULL or valid for writes of `dst_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_read(
    receiver: *mut ci_vulkan_receiver,
    frame: *const ci_frame,
    dst: *mut std::ffi::c_void,
    dst_len: usize,
    timeout_s: f64,
) -> ci_status {
    entry(|| {
        with_frame(receiver, frame, |rx, entry, frame| {
            non_null(dst, "dst")?;
            let timeout = seconds("timeout_s", timeout_s)?;
            let need = entry.info.frame_bytes;
            if (dst_len as u64) < need {
                return Err(CiError::new(
                    ci_status::CI_BUFFER_TOO_SMALL,
                    format!(
                        "dst_len is {dst_len} bytes; a frame has {need} (ci_frame_info's \
                         frame_bytes): pass a buffer at least that large"
                    ),
                ));
            }
            let pixels = rx.read_pixels(frame, timeout).map_err(receiver_error)?;
            let n = pixels.len().min(dst_len);
            // SAFETY: `dst` is valid for `dst_len` bytes (the caller's
            // promise) and `n <= dst_len`; a Vec the library owns cannot
            // overlap it.
            unsafe { std::ptr::copy_nonoverlapping(pixels.as_ptr(), dst.cast::<u8>(), n) };
            Ok(())
        })
    })
}

/// A frame's image on the receiver's device
/// (`ci_vulkan_receiver_image`): what the application needs to read it
/// itself.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_vulkan_image {
    /// `sizeof(ci_vulkan_image)` as the caller compiled it: set it before
    /// the call (a smaller value is `CI_INVALID_ARGUMENT`).
    pub struct_size: u32,
    /// The image's `VkFormat` (raw value): the ring's.
    pub vk_format: u32,
    /// The `VkImageLayout` it is in (raw value): always
    /// `VK_IMAGE_LAYOUT_GENERAL` (1).
    pub layout: u32,
    /// The queue family that owns it: always `VK_QUEUE_FAMILY_EXTERNAL`
    /// (`~1U`, 0xFFFFFFFE).
    pub queue_family: u32,
    /// Texels per row (level 0; the image has one level, one layer).
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Its `VkImageUsageFlags` (raw value: storage or sampled, with transfer
    /// source and destination).
    pub usage: u32,
    /// The frame's slot: the same slot is always the same image.
    pub slot: u32,
    /// The `VkImage` (a non-dispatchable handle's 64-bit value) of the
    /// receiver's context's device: 2D, optimal tiling, one sample,
    /// `VK_SHARING_MODE_EXCLUSIVE`, imported external memory. Valid while the
    /// receiver lives; never destroy it.
    pub image: u64,
}

/// Stores `frame`'s image on the receiver's device in `*out` (set
/// `out->struct_size = sizeof(ci_vulkan_image)` first), for the
/// application to read it itself on the context's device
/// (`ci_context_new_from_vulkan`'s; the device of a headless context is
/// the library's own). When this call returns `CI_OK`, the sender's writes
/// of the frame have completed and the image is in
/// `VK_IMAGE_LAYOUT_GENERAL`, owned by `VK_QUEUE_FAMILY_EXTERNAL` (as
/// `VulkanReceiver` leaves it between reads). On a ring with a "produced"
/// timeline (a sender with `VK_KHR_external_semaphore_fd`), the call first
/// waits on the host, within `timeout_s` seconds, for that timeline to
/// reach the frame's number (`VulkanReceiver::wait_produced`: no copy); on
/// a ring without one (lavapipe), the frame was announced after its writes
/// completed and nothing is waited for.
///
/// To read the image, the application, on a queue of family `F` of the
/// context's device, inside `ci_context_with_queue` where the queue is one
/// it gave the context:
/// 1. records an acquire: an image memory barrier with
///    `srcQueueFamilyIndex = VK_QUEUE_FAMILY_EXTERNAL`,
///    `dstQueueFamilyIndex = F`, `oldLayout = VK_IMAGE_LAYOUT_GENERAL`, the
///    layout it reads in as `newLayout`, the whole image (colour aspect,
///    level 0, layer 0);
/// 2. records its reads only (never writes: the image is the sender's
///    slot);
/// 3. records the release back: `srcQueueFamilyIndex = F`,
///    `dstQueueFamilyIndex = VK_QUEUE_FAMILY_EXTERNAL`, `newLayout =
///    VK_IMAGE_LAYOUT_GENERAL`, after its reads;
/// 4. waits for that submission to complete (a fence) before
///    `ci_vulkan_receiver_release` of the frame, `ci_vulkan_receiver_read`
///    of it, or `ci_vulkan_receiver_free`: the release sends the sender no
///    GPU signal, so the sender may write the slot as soon as it is given
///    back.
///
/// Thread safety: any thread; a release of the same frame on another
/// thread waits for this call (not for the application's reads).
///
/// # Safety
/// `out` is NULL or points to a `ci_vulkan_image` whose `struct_size` is
/// set, valid for writes of that many bytes.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_image(
    receiver: *mut ci_vulkan_receiver,
    frame: *const ci_frame,
    timeout_s: f64,
    out: *mut ci_vulkan_image,
) -> ci_status {
    entry(|| {
        with_frame(receiver, frame, |rx, entry, frame| {
            non_null(out, "out")?;
            let timeout = seconds("timeout_s", timeout_s)?;
            // SAFETY: not NULL, readable (the caller's promise); the first
            // field alone, before trusting it.
            let size = unsafe { std::ptr::read_unaligned(out.cast::<u32>()) };
            let need = std::mem::size_of::<ci_vulkan_image>();
            if (size as usize) < need {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    format!(
                        "out->struct_size is {size}: set it to sizeof(ci_vulkan_image) ({need}) \
                         before the call"
                    ),
                ));
            }
            let image = rx.image(frame.slot()).ok_or_else(|| {
                CiError::new(
                    ci_status::CI_PROTOCOL,
                    format!(
                        "frame {} names slot {}, past the ring",
                        frame.sequence(),
                        frame.slot()
                    ),
                )
            })?;
            // The sender's writes of the frame completed ("produced", where
            // the ring shares it), before the image is handed out.
            rx.wait_produced(frame, timeout).map_err(receiver_error)?;
            let layout = rx.session().layout();
            let info = ci_vulkan_image {
                struct_size: need as u32,
                vk_format: layout.vk_format().unwrap_or(0),
                layout: vk::ImageLayout::GENERAL.as_raw() as u32,
                queue_family: vk::QUEUE_FAMILY_EXTERNAL,
                width: layout.width,
                height: layout.height,
                usage: rx.usage().as_raw(),
                slot: entry.info.slot,
                image: image.as_raw(),
            };
            // SAFETY: valid for writes of struct_size >= need bytes (the
            // caller's promise); unaligned-safe.
            unsafe { std::ptr::write_unaligned(out, info) };
            Ok(())
        })
    })
}

/// Gives `frame` back to the sender (no GPU signal: the library's reads
/// have completed, and so must the application's, see
/// `ci_vulkan_receiver_image`); the frame handle is consumed whatever the
/// status, unless the status is `CI_NULL_POINTER`, `CI_WRONG_HANDLE` or
/// `CI_INVALID_ARGUMENT` (a frame of another receiver), which change
/// nothing. An error after the handle is consumed says the connection is
/// over (`CI_DROPPED`, `CI_CLOSED`).
///
/// Thread safety: any thread.
///
/// # Safety
/// None beyond the ABI: the handles are checked. (Releasing a frame whose
/// image the application still reads, or left acquired, lets the sender
/// overwrite it under those reads: wrong pixels, and a wrong owner for the
/// next read.)
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_release(
    receiver: *mut ci_vulkan_receiver,
    frame: *mut ci_frame,
) -> ci_status {
    entry(|| {
        let rx = handles::vulkan_receiver(key(receiver))?;
        frame_of(key(receiver), key(frame))?;
        match handles::take_frame(key(frame))? {
            Some(frame) => rx.release(frame).map_err(receiver_error),
            None => Ok(()),
        }
    })
}

/// Frees a Vulkan receiver (NULL: nothing), releasing every frame it
/// handed out that is not released yet (their handles become invalid; the
/// application's reads of their images must have completed) and the
/// imported images (waiting, bounded, for the library's own copies).
///
/// Thread safety: any thread; the handle and its frames' handles are
/// invalid for every thread after.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_vulkan_receiver_free(receiver: *mut ci_vulkan_receiver) -> ci_status {
    entry(|| {
        handles::free_receiver(key(receiver), "ci_vulkan_receiver*", |o| {
            matches!(o, Object::VulkanReceiver(_))
        })
    })
}
