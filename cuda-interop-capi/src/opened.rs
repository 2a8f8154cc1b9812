//! Slots written by the application's own submissions (issue 33): a
//! timeline the application signals (`ci_timeline_*`), and a slot opened
//! for its submission and presented after it (`ci_sender_open`,
//! `ci_sender_present_opened`, `ci_sender_abandon_opened`): thin bindings
//! of `WriteSlot::open_detached`, `Sender::present_opened` and
//! `Sender::abandon_opened`, whose state is the sender's.
//!
//! # Contract
//!
//! * An opened slot crosses as a token of its sender ([`crate::handles`]'s
//!   `Tokens`, one counter with recorded frames): never 0, never reused,
//!   never another sender's; a token this sender did not give, or one
//!   already presented or abandoned, is `CI_INVALID_ARGUMENT` and changes
//!   nothing.
//! * What is checked before the token is spent (so the application can
//!   retry or abandon): the timeline handle, its context (the sender's),
//!   the value (above 0), the calling thread (not inside
//!   `ci_context_with_queue`). After that, the sender's rules: a present
//!   that times out keeps its number; another error keeps the slot out of
//!   the ring (never released under the application's writes).
//! * A `ci_timeline*` is a local timeline semaphore of a context. The
//!   library never signals it; it only waits for it on the GPU
//!   (`ci_sender_present_opened`). vk-export's signal bookkeeping covers
//!   only its own signals, so the application's signals (in its
//!   submissions, or `vkSignalSemaphore`) leave it right.

use std::sync::Arc;
use std::time::Duration;

use cuda_interop_frames::sender::{monotonic_ns, OpenedFrame, Sender, SlotResource};
use vk_export::ash::vk::Handle;
use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Optimal, Usage};
use vk_export::{Context, ExportableBuffer, ExportableImage, QueueRole, TimelineSemaphore};

use crate::ffi::{acquire, ci_context, ci_sender, key, sender_error, vulkan, with_sender};
use crate::handles::{self, Object, OpenedRing, SlotView};
use crate::{ci_status, entry, non_null, seconds, CiError, CI_QUEUE_MAIN, CI_QUEUE_TRANSFER};

/// An opaque timeline semaphore the application signals in its own
/// submissions (`ci_timeline_new`).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_timeline {
    _opaque: [u8; 0],
}

/// A slot opened for the application's own submission (`ci_sender_open`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_opened_slot {
    /// `sizeof(ci_opened_slot)` as the caller compiled it (set by the
    /// caller before the call).
    pub struct_size: u32,
    /// The slot's index in the ring.
    pub slot: u32,
    /// The queue family the slot is acquired for: the application writes
    /// it on a queue of this family only.
    pub queue_family: u32,
    /// `CI_SLOTS_BUFFERS` (`buffer` is set) or `CI_SLOTS_IMAGES` (`image`
    /// is set).
    pub kind: u32,
    /// The token for `ci_sender_present_opened` or
    /// `ci_sender_abandon_opened` (never 0).
    pub token: u64,
    /// The slot's `VkBuffer` (a buffer ring), else 0.
    pub buffer: u64,
    /// Bytes of the buffer (a buffer ring), else 0.
    pub buffer_size: u64,
    /// Bytes from one row to the next (a buffer ring), else 0.
    pub row_pitch: u64,
    /// The slot's `VkImage` (an image ring: in `VK_IMAGE_LAYOUT_GENERAL`,
    /// owned by `queue_family`; leave it in `GENERAL`), else 0.
    pub image: u64,
    /// The `VkSemaphore` (timeline) the application's submission waits for
    /// before it writes the slot; valid until the token is presented or
    /// abandoned.
    pub ready_semaphore: u64,
    /// The value of `ready_semaphore` to wait for (reached already: the
    /// wait orders the library's acquire before the writes on the GPU).
    pub ready_value: u64,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// The slots' `VkFormat` (raw value; `VK_FORMAT_R8G8B8A8_UNORM` for an
    /// RGBA8 buffer ring).
    pub vk_format: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
}

/// A slot's raw Vulkan object, for `ci_opened_slot`.
pub(crate) trait RawSlot {
    fn view(&self) -> SlotView;
}

impl<M: MemoryLocation> RawSlot for ExportableBuffer<M> {
    fn view(&self) -> SlotView {
        SlotView {
            kind: crate::CI_SLOTS_BUFFERS,
            buffer: self.raw().as_raw(),
            buffer_size: self.size(),
            image: 0,
            vk_format: vk_export::ash::vk::Format::R8G8B8A8_UNORM.as_raw() as u32,
        }
    }
}

impl<F: Format, M: MemoryLocation, U: Usage> RawSlot for ExportableImage<F, Optimal, M, U> {
    fn view(&self) -> SlotView {
        SlotView {
            kind: crate::CI_SLOTS_IMAGES,
            buffer: 0,
            buffer_size: 0,
            image: self.raw().as_raw(),
            vk_format: F::VK.as_raw() as u32,
        }
    }
}

impl<M: MemoryLocation, R: SlotResource<M> + RawSlot> OpenedRing for Sender<M, R> {
    fn context(&self) -> &Context {
        Sender::context(self)
    }

    fn open(
        &mut self,
        role: QueueRole,
        timeout: Duration,
    ) -> Result<(OpenedFrame, SlotView, [u32; 2], u64), CiError> {
        let frame = acquire(self, timeout)?
            .open_detached(role)
            .map_err(sender_error)?;
        let view = self.resources()[frame.index() as usize].view();
        let options = self.options();
        let pitch = if view.kind == crate::CI_SLOTS_BUFFERS {
            self.layout().row_pitch
        } else {
            0
        };
        Ok((frame, view, [options.width, options.height], pitch))
    }

    fn present_opened(
        &mut self,
        frame: OpenedFrame,
        written: (&TimelineSemaphore, u64),
        timestamp_ns: u64,
    ) -> Result<u64, CiError> {
        let timestamp = if timestamp_ns == 0 {
            monotonic_ns()
        } else {
            timestamp_ns
        };
        Sender::present_opened(self, frame, timestamp, written).map_err(sender_error)
    }

    unsafe fn abandon_opened(&mut self, frame: OpenedFrame) -> Result<(), CiError> {
        // SAFETY: the caller's promise (no write of the application's is
        // pending).
        unsafe { Sender::abandon_opened(self, frame) }.map_err(sender_error)
    }
}

/// Makes a timeline semaphore on `ctx` (local: never exported; it starts
/// at 0) for the application to signal in its own submissions, and stores
/// its handle in `*out`. `ci_sender_present_opened` waits for one of its
/// values on the GPU. Rules (the library never signals it, only waits for
/// it, so its own bookkeeping of signals stays right whatever the
/// application signals):
/// * the application signals it in its submissions
///   (`VkTimelineSemaphoreSubmitInfo`) or from the host
///   (`vkSignalSemaphore`), each value above the current one and every
///   value already signalled or pending (Vulkan's rules), on queues it
///   submits to as `ci_context_new_from_vulkan`'s contract says;
/// * it is used only with senders of the same context
///   (`ci_sender_present_opened` refuses another's);
/// * the application's submissions that wait for or signal it complete
///   before `ci_timeline_free` (which waits only for the library's own
///   use of it).
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_timeline_new(
    ctx: *mut ci_context,
    out: *mut *mut ci_timeline,
) -> ci_status {
    entry(|| {
        let ctx = handles::context(key(ctx))?;
        non_null(out, "out")?;
        let timeline = TimelineSemaphore::new_local(&ctx).map_err(vulkan)?;
        let handle = handles::insert(Object::Timeline(Arc::new(timeline)));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_timeline) };
        Ok(())
    })
}

/// Stores the timeline's `VkSemaphore` (a non-dispatchable handle's 64-bit
/// value, valid until `ci_timeline_free`) in `*out`, to name in the
/// application's submissions (`ci_timeline_new`'s rules).
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_timeline_vk_semaphore(
    timeline: *const ci_timeline,
    out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeline = handles::timeline(key(timeline))?;
        non_null(out, "out")?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(timeline.raw().as_raw()) };
        Ok(())
    })
}

/// Stores the timeline's current value (`vkGetSemaphoreCounterValue`) in
/// `*out`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_timeline_value(
    timeline: *const ci_timeline,
    out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeline = handles::timeline(key(timeline))?;
        non_null(out, "out")?;
        let value = timeline.value().map_err(vulkan)?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(value) };
        Ok(())
    })
}

/// Frees a timeline (NULL: nothing). The semaphore is destroyed once the
/// library's last use of it completed (a present waiting for it that
/// timed out keeps it until then).
///
/// Thread safety: any thread; the handle is invalid for every thread after.
///
/// # Safety
/// The application's submissions that wait for or signal the timeline have
/// completed (`ci_timeline_new`'s rules), and the device it was made on
/// still exists (a context made on the application's device: free the
/// timeline before destroying the device).
#[no_mangle]
pub unsafe extern "C" fn ci_timeline_free(timeline: *mut ci_timeline) -> ci_status {
    entry(|| {
        if timeline.is_null() {
            return Ok(());
        }
        let object = handles::remove(key(timeline), "ci_timeline*", |o| {
            matches!(o, Object::Timeline(_))
        })?;
        drop(object);
        Ok(())
    })
}

/// Opens a free slot of `sender` (a buffer or an image ring) for the
/// application's own submission and describes it in `*out` (the caller
/// sets `out->struct_size`): takes a free slot (as `ci_sender_present_fill`:
/// `CI_SKIPPED` when latest receivers hold every slot, waiting up to
/// `timeout_s` only for lossless receivers), then one submission on the
/// context's queue of `role` (`CI_QUEUE_MAIN` or `CI_QUEUE_TRANSFER`) waits
/// on the GPU for the receivers' releases of the slot, acquires it for that
/// queue's family (an image in `GENERAL`) and signals `ready_value`; it is
/// waited for (bounded). The application's submission then, on a queue of
/// `out->queue_family`: waits for `ready_semaphore` = `ready_value`, writes
/// the slot (`buffer`, or `image` leaving it in `GENERAL`), and signals a
/// `ci_timeline` of the same context; `ci_sender_present_opened` publishes
/// the frame after it, or `ci_sender_abandon_opened` gives the slot back.
/// Until then the slot is out of the ring, and the sender is free for
/// other calls (other frames, serving). A sender freed with a slot opened
/// leaks that slot (which the application's submission may still write)
/// and its ready semaphore, and keeps the context's device objects alive
/// with them: present or abandon every opened slot before freeing the
/// sender where the device is to be destroyed.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// `out` is NULL or points to a `ci_opened_slot` whose `struct_size` is
/// set, readable, and valid for writes of `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_open(
    sender: *mut ci_sender,
    role: u32,
    timeout_s: f64,
    out: *mut ci_opened_slot,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        non_null(out, "out")?;
        // SAFETY: not NULL, readable (the caller's promise); the first
        // field alone.
        let size = unsafe { std::ptr::read_unaligned(out.cast::<u32>()) };
        let need = std::mem::size_of::<ci_opened_slot>();
        if (size as usize) < need {
            return Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!("out->struct_size is {size}: set it to sizeof(ci_opened_slot) ({need})"),
            ));
        }
        let role = match role {
            CI_QUEUE_MAIN => QueueRole::Main,
            CI_QUEUE_TRANSFER => QueueRole::Transfer,
            r => {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    format!("role is {r}: pass CI_QUEUE_MAIN (0) or CI_QUEUE_TRANSFER (1)"),
                ))
            }
        };
        let opened = with_sender(sender, |s| {
            let (ring, tokens) = s.opened_parts();
            let (frame, view, [width, height], row_pitch) = ring.open(role, timeout)?;
            let (ready, ready_value) = frame.ready();
            let described = ci_opened_slot {
                struct_size: need as u32,
                slot: frame.index(),
                queue_family: frame.queue_family(),
                kind: view.kind,
                token: 0,
                buffer: view.buffer,
                buffer_size: view.buffer_size,
                row_pitch,
                image: view.image,
                ready_semaphore: ready.raw().as_raw(),
                ready_value,
                width,
                height,
                vk_format: view.vk_format,
                reserved: 0,
            };
            Ok(ci_opened_slot {
                token: tokens.insert_opened(frame),
                ..described
            })
        })?;
        // SAFETY: not NULL, valid for writes of at least our size (the
        // caller's promise, its size checked above).
        unsafe { out.write_unaligned(opened) };
        Ok(())
    })
}

/// Publishes the slot opened as `opened` (`ci_sender_open`'s token) once
/// the application's submission that writes it signals `value` on
/// `timeline`: one submission on the opening queue waits on the GPU for
/// that value, releases the slot to the external family, signals the
/// ring's "produced" timeline, and is waited for (bounded); then the frame
/// is announced with `timestamp_ns` (0: now) and its sequence number
/// stored in `*sequence_out` if not NULL. Frames are numbered in the order
/// they are presented.
///
/// Refused, nothing changed and the token still valid: a token this sender
/// did not give or already spent (`CI_INVALID_ARGUMENT`), a NULL, freed or
/// wrong-kind timeline (`CI_NULL_POINTER`, `CI_WRONG_HANDLE`), a timeline
/// of another context, a `value` of 0, or a call from inside
/// `ci_context_with_queue` of the sender's context (`CI_INVALID_ARGUMENT`).
/// After that the token is spent: `CI_TIMEOUT` when `value` was not
/// reached within the bound (the frame keeps its number and is not
/// announced: receivers count the gap; the release runs once the value
/// arrives); another error (nothing was submitted, so nothing waited for
/// the application's writes) keeps the slot out of the ring for the
/// sender's life rather than release it under those writes.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// The application's submission that writes the slot waits for the slot's
/// ready value before its writes, runs on a queue of the slot's
/// `queue_family` (submitted as `ci_context_new_from_vulkan`'s contract
/// says: inside `ci_context_with_queue`), writes only the slot's buffer
/// (within `buffer_size`) or image (left in `GENERAL`), and signals `value`
/// after its last write; that signal is submitted before this call (or
/// made within the bound), and nothing of the application's writes the
/// slot after it. `sequence_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_present_opened(
    sender: *mut ci_sender,
    opened: u64,
    timeline: *const ci_timeline,
    value: u64,
    timestamp_ns: u64,
    sequence_out: *mut u64,
) -> ci_status {
    entry(|| {
        let sequence = with_sender(sender, |s| {
            let (ring, tokens) = s.opened_parts();
            tokens.check_opened(opened)?;
            let timeline = handles::timeline(key(timeline))?;
            if !ring.context().is_same(timeline.context()) {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    "the timeline belongs to another context than the sender's: signal a \
                     ci_timeline made on the sender's context (the token is still valid)",
                ));
            }
            if value == 0 {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    "value is 0: pass the value the submission that writes the slot signals \
                     (above 0; the token is still valid)",
                ));
            }
            if ring.context().is_held_by_this_thread() {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    "ci_sender_present_opened called from inside ci_context_with_queue of the \
                     sender's context: it would wait for the queue lock its caller holds; call \
                     it after that returns (the token is still valid)",
                ));
            }
            let frame = tokens.take_opened(opened)?;
            ring.present_opened(frame, (&timeline, value), timestamp_ns)
        })?;
        if !sequence_out.is_null() {
            // SAFETY: not NULL, valid for a write (the caller's promise).
            unsafe { sequence_out.write(sequence) };
        }
        Ok(())
    })
}

/// Gives the slot opened as `opened` back to the ring unpresented (the
/// application's submission failed, or it dropped the frame): a release to
/// the external family on the opening queue, waited for (bounded); no
/// frame is numbered. Tokens as in `ci_sender_present_opened` (another
/// sender's, unknown or spent: `CI_INVALID_ARGUMENT`, nothing changed).
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// No submission of the application that writes the slot is pending: none
/// was submitted, or every one has completed (its fence, or its timeline's
/// value, says so). The release does not wait for the application's work.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_abandon_opened(
    sender: *mut ci_sender,
    opened: u64,
) -> ci_status {
    entry(|| {
        with_sender(sender, |s| {
            let (ring, tokens) = s.opened_parts();
            let frame = tokens.take_opened(opened)?;
            // SAFETY: the caller's promise (nothing of its writes pending).
            unsafe { ring.abandon_opened(frame) }
        })
    })
}
