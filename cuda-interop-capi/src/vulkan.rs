//! The application's own Vulkan device: a context over its `VkInstance`,
//! `VkPhysicalDevice`, `VkDevice` and queues (`vk_export::Context::from_raw`),
//! its queues' lock, and image rings that publish the application's own
//! `VkImage` by a GPU copy (`WriteSlot::present_copy` of a
//! `vk_export::SourceImage`). Thin bindings: the checks and the state are
//! vk-export's and the sender's.
//!
//! # Contract
//!
//! * Vulkan handles cross as `void *` (dispatchable: `VkInstance`,
//!   `VkPhysicalDevice`, `VkDevice`, `VkQueue`, `VkCommandBuffer`,
//!   `PFN_vkGetInstanceProcAddr`) or `uint64_t` (non-dispatchable:
//!   `VkImage`), so the header needs no Vulkan header.
//! * What only the application knows (its device was made as `from_raw`
//!   requires; its image is as it describes it) is its promise, stated in
//!   each function's `# Safety` and in the header.
//! * An image ring's `ci_sender*` is a sender handle like a buffer ring's
//!   (wait, serve, stats, free); the buffer rings' presents on it are
//!   `CI_UNSUPPORTED`, as `ci_sender_present_copy` on a buffer ring is.

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_interop_frames::sender::{
    monotonic_ns, ImageSender, RecordedFrame, SenderOptions, SenderStats,
};
use vk_export::ash::{self, vk, vk::Handle};
use vk_export::format::Format;
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Usage};
use vk_export::{Context, QueueChoice, QueueRole, Queues, SourceImage, SourceSharing};

use crate::ffi::{
    acquire, ci_context, ci_sender, key, offers_device_local, sender_error, string, vulkan,
    with_sender,
};
use crate::handles::{self, AnySender, CopySource, ImageRing, Object};
use crate::{ci_status, entry, non_null, seconds, CiError};

/// The application's Vulkan objects (`ci_context_new_from_vulkan`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_vulkan_device {
    /// `sizeof(ci_vulkan_device)` as the caller compiled it.
    pub struct_size: u32,
    /// The main queue's family (one with `GRAPHICS` or `COMPUTE`).
    pub main_queue_family: u32,
    /// The main queue's index in its family.
    pub main_queue_index: u32,
    /// Nonzero: `transfer_queue_*` name a second queue for copies.
    pub has_transfer_queue: u32,
    /// The transfer queue's family.
    pub transfer_queue_family: u32,
    /// The transfer queue's index in its family.
    pub transfer_queue_index: u32,
    /// Nonzero: the device was created with `VK_KHR_external_semaphore_fd`
    /// (senders then share timelines: CUDA receivers need them).
    pub semaphore_fd_enabled: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
    /// The loader's `vkGetInstanceProcAddr` (`PFN_vkGetInstanceProcAddr`,
    /// cast to `void *`).
    pub get_instance_proc_addr: *mut c_void,
    /// The `VkInstance`.
    pub instance: *mut c_void,
    /// The `VkPhysicalDevice` the device was created from.
    pub physical_device: *mut c_void,
    /// The `VkDevice`.
    pub device: *mut c_void,
}

/// Makes a context over the application's own Vulkan device, so that
/// senders made on it (`ci_sender_new`, `ci_image_sender_new`) use the
/// application's device and queues, and stores its handle in `*out`. The
/// context never destroys or idles what it did not create; freeing it (and
/// the senders made on it) waits, bounded, only for the library's own
/// submissions. Refused (`CI_INVALID_ARGUMENT`, before anything is
/// created): a queue family the device lacks, a queue index past the
/// family's count, a main family without graphics or compute, the same
/// queue named twice, a NULL handle.
///
/// Thread safety: any thread.
///
/// # Safety
/// `desc` is NULL or points to a readable `ci_vulkan_device` of at least
/// `desc->struct_size` bytes, and (`vk_export::Context::from_raw`'s
/// contract):
/// * `device` was created from `physical_device`, which belongs to
///   `instance`, with API version 1.2 or later, the `timelineSemaphore`
///   feature and `VK_KHR_external_memory_fd` enabled
///   (`VK_KHR_external_semaphore_fd` too where `semaphore_fd_enabled`);
///   `get_instance_proc_addr` is the loader's, for that instance;
/// * every queue named was created with `device`, and while the context
///   lives the application submits to those queues only inside
///   `ci_context_with_queue` (the library submits under the same locks),
///   or only on the one thread that also makes every call on this context
///   and on every sender and Vulkan receiver made on it (an engine's
///   render thread, where its plugin's events run: the library submits
///   only inside those calls), or not at all;
/// * the instance and device outlive the context and everything made on
///   it: senders, Vulkan receivers and `ci_timeline`s (free those first);
/// * the application's own work that uses the library's resources has
///   completed before they are freed.
///
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_context_new_from_vulkan(
    desc: *const ci_vulkan_device,
    out: *mut *mut ci_context,
) -> ci_status {
    entry(|| {
        non_null(desc, "desc")?;
        non_null(out, "out")?;
        // SAFETY: not NULL, readable (the caller's promise); the first
        // field alone before trusting it.
        let size = unsafe { std::ptr::read_unaligned(desc.cast::<u32>()) };
        let need = std::mem::size_of::<ci_vulkan_device>();
        if (size as usize) < need {
            return Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!("desc->struct_size is {size}: set it to sizeof(ci_vulkan_device) ({need})"),
            ));
        }
        // SAFETY: readable for at least its size (the caller's promise).
        let d = unsafe { std::ptr::read_unaligned(desc) };
        for (p, what) in [
            (d.get_instance_proc_addr, "get_instance_proc_addr"),
            (d.instance, "instance"),
            (d.physical_device, "physical_device"),
            (d.device, "device"),
        ] {
            non_null(p, &format!("desc->{what}"))?;
        }
        // SAFETY: the caller's promise: the loader's vkGetInstanceProcAddr
        // (a non-null function pointer, checked).
        let gipa: vk::PFN_vkGetInstanceProcAddr =
            unsafe { std::mem::transmute::<*mut c_void, _>(d.get_instance_proc_addr) };
        // SAFETY: as above; ash loads the global functions through it.
        let entry = unsafe {
            ash::Entry::from_static_fn(ash::StaticFn {
                get_instance_proc_addr: gipa,
            })
        };
        // SAFETY: a live instance of that loader (the caller's promise).
        let instance = unsafe {
            ash::Instance::load(entry.static_fn(), vk::Instance::from_raw(d.instance as u64))
        };
        // SAFETY: a live device of that instance (the caller's promise).
        let device =
            unsafe { ash::Device::load(instance.fp_v1_0(), vk::Device::from_raw(d.device as u64)) };
        let queues = Queues {
            main: QueueChoice {
                family: d.main_queue_family,
                index: d.main_queue_index,
            },
            transfer: (d.has_transfer_queue != 0).then_some(QueueChoice {
                family: d.transfer_queue_family,
                index: d.transfer_queue_index,
            }),
        };
        let physical = vk::PhysicalDevice::from_raw(d.physical_device as u64);
        // SAFETY: Context::from_raw's contract is this function's, stated
        // above and promised by the caller.
        let ctx = unsafe {
            Context::from_raw(
                entry,
                instance,
                physical,
                device,
                queues,
                d.semaphore_fd_enabled != 0,
            )
        }
        .map_err(vulkan)?;
        let handle = handles::insert(Object::Context(ctx));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_context) };
        Ok(())
    })
}

/// `ci_context_with_queue`'s role: the main queue.
pub const CI_QUEUE_MAIN: u32 = 0;
/// `ci_context_with_queue`'s role: the transfer queue (the main queue where
/// the context has none).
pub const CI_QUEUE_TRANSFER: u32 = 1;

/// `ci_queue_fn`: called by `ci_context_with_queue` with the `VkQueue`
/// (cast to `void *`) while the library's lock on it is held.
#[allow(non_camel_case_types)]
pub type ci_queue_fn = Option<unsafe extern "C" fn(user: *mut c_void, queue: *mut c_void)>;

/// Calls `f(user, queue)` with the context's queue of `role`
/// (`CI_QUEUE_MAIN` or `CI_QUEUE_TRANSFER`) while holding the lock the
/// library submits under: the application's `vkQueueSubmit` /
/// `vkQueuePresentKHR` to a queue it gave `ci_context_new_from_vulkan` go
/// inside `f` (Vulkan requires external synchronisation of a queue). A
/// call from inside `f` (or from a `ci_sender_present_record` callback) on
/// the same context is refused (`CI_INVALID_ARGUMENT`) instead of
/// deadlocking.
///
/// Thread safety: any thread; calls on one queue are serialized.
///
/// # Safety
/// `f` is NULL or a function that returns normally (no C++ exception, no
/// `longjmp` out of it) and does not keep the queue past its return;
/// `user` is passed unchanged.
#[no_mangle]
pub unsafe extern "C" fn ci_context_with_queue(
    ctx: *mut ci_context,
    role: u32,
    f: ci_queue_fn,
    user: *mut c_void,
) -> ci_status {
    entry(|| {
        let ctx = handles::context(key(ctx))?;
        let Some(f) = f else {
            return Err(CiError::new(
                ci_status::CI_NULL_POINTER,
                "f is NULL: pass the function that uses the queue",
            ));
        };
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
        ctx.with_queue_of(role, |queue| {
            // SAFETY: the caller's promise on `f`; the queue is live and
            // locked for the call.
            unsafe { f(user, queue.as_raw() as *mut c_void) }
        })
        .map_err(vulkan)
    })
}

impl<F: Format, M: MemoryLocation, U: Usage> ImageRing for ImageSender<F, M, U>
where
    ImageSender<F, M, U>: Send,
{
    fn as_opened(&mut self) -> &mut dyn crate::handles::OpenedRing {
        self
    }

    fn vk_format(&self) -> u32 {
        F::VK.as_raw() as u32
    }

    fn stats(&self) -> SenderStats {
        ImageSender::stats(self)
    }

    fn serve(&mut self, timeout: Duration) {
        ImageSender::serve(self, timeout)
    }

    fn wait_for_receivers(&mut self, count: usize, timeout: Duration) -> bool {
        ImageSender::wait_for_receivers(self, count, timeout)
    }

    unsafe fn present_copy(
        &mut self,
        source: CopySource,
        timestamp_ns: u64,
        timeout: Duration,
    ) -> Result<u64, CiError> {
        // SAFETY: the caller's promise (SourceImage::new's contract, which
        // ci_sender_present_copy states).
        let image = unsafe {
            SourceImage::<F>::new(source.image, source.extent, source.layout, source.sharing)
        }
        .map_err(vulkan)?
        .with_offset(source.offset);
        let slot = acquire(self, timeout)?;
        let timestamp = if timestamp_ns == 0 {
            monotonic_ns()
        } else {
            timestamp_ns
        };
        slot.present_copy(timestamp, &image, None)
            .map_err(sender_error)
    }

    unsafe fn record_copy(
        &mut self,
        cmd: vk::CommandBuffer,
        source: CopySource,
        timeout: Duration,
    ) -> Result<RecordedFrame, CiError> {
        // SAFETY: the caller's promise (SourceImage::new's contract, which
        // ci_sender_record_copy states).
        let image = unsafe {
            SourceImage::<F>::new(source.image, source.extent, source.layout, source.sharing)
        }
        .map_err(vulkan)?
        .with_offset(source.offset);
        let slot = acquire(self, timeout)?;
        // SAFETY: the caller's promise on `cmd` and on what becomes of it
        // (ci_sender_record_copy's contract is record_copy_into's).
        unsafe { slot.record_copy_into(cmd, &image) }.map_err(sender_error)
    }

    unsafe fn record_into(
        &mut self,
        cmd: vk::CommandBuffer,
        record: &mut dyn FnMut(&ash::Device, vk::CommandBuffer, vk::Image),
        timeout: Duration,
    ) -> Result<RecordedFrame, CiError> {
        let slot = acquire(self, timeout)?;
        // SAFETY: the caller's promises on `cmd` and on what `record`
        // records (ci_sender_record_into's contract is record_into's).
        Ok(unsafe {
            slot.record_into(cmd, |device, cmd, target| record(device, cmd, target.image))
        })
    }

    fn extent(&self) -> [u32; 2] {
        let options = self.options();
        [options.width, options.height]
    }

    unsafe fn present_recorded(
        &mut self,
        frame: RecordedFrame,
        timestamp_ns: u64,
    ) -> Result<u64, CiError> {
        let timestamp = if timestamp_ns == 0 {
            monotonic_ns()
        } else {
            timestamp_ns
        };
        // SAFETY: the caller's promise (its command buffer completed).
        unsafe { ImageSender::present_recorded(self, frame, timestamp) }.map_err(sender_error)
    }

    unsafe fn abandon_recorded(&mut self, frame: RecordedFrame) -> Result<(), CiError> {
        // SAFETY: the caller's promise (never submitted).
        unsafe { ImageSender::abandon_recorded(self, frame) }.map_err(sender_error)
    }
}

/// Makes an image sender of `F` on `ctx`, of the memory its device offers.
fn image_sender<F: Format, U: Usage>(
    ctx: &Context,
    opts: SenderOptions,
) -> Result<Box<dyn ImageRing>, CiError> {
    Ok(if offers_device_local(ctx) {
        Box::new(ImageSender::<F, DeviceLocal, U>::new(ctx, opts).map_err(sender_error)?)
    } else {
        Box::new(ImageSender::<F, HostVisible, U>::new(ctx, opts).map_err(sender_error)?)
    })
}

/// The `VkFormat`s (raw values) `ci_image_sender_new` takes.
const IMAGE_FORMATS: &str = "VK_FORMAT_R8G8B8A8_UNORM (37), VK_FORMAT_R8G8B8A8_SRGB (43), \
                             VK_FORMAT_B8G8R8A8_UNORM (44), VK_FORMAT_B8G8R8A8_SRGB (50), \
                             VK_FORMAT_R16G16B16A16_SFLOAT (97)";

/// Makes a sender of a ring of `slots` OPTIMAL images of `vk_format` (a
/// raw `VkFormat`: `VK_FORMAT_R8G8B8A8_UNORM` (37), `_SRGB` (43),
/// `VK_FORMAT_B8G8R8A8_UNORM` (44), `_SRGB` (50),
/// `VK_FORMAT_R16G16B16A16_SFLOAT` (97)), `width` x `height`, on `ctx`,
/// announced as `name` (as `ci_sender_new`), and stores its handle in
/// `*out`. Its frames are presented with `ci_sender_present_copy`. The
/// images have storage usage (sampled for the sRGB formats, which no GPU
/// offers as storage); device-local where the device has such memory.
/// Receivers: CUDA (`ci_cuda_receiver_array`) or Vulkan ones; a host
/// receiver refuses image rings.
///
/// Thread safety: any thread.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_image_sender_new(
    ctx: *mut ci_context,
    name: *const c_char,
    width: u32,
    height: u32,
    vk_format: u32,
    slots: u32,
    out: *mut *mut ci_sender,
) -> ci_status {
    entry(|| {
        let ctx = handles::context(key(ctx))?;
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let opts = crate::ffi::ring_options(&ctx, name, width, height, slots)?;
        use vk_export::format::{Bgra8Srgb, Bgra8Unorm, Rgba16Sfloat, Rgba8Srgb, Rgba8Unorm};
        let ring = match vk::Format::from_raw(vk_format as i32) {
            vk::Format::R8G8B8A8_UNORM => image_sender::<Rgba8Unorm, usage::Storage>(&ctx, opts),
            vk::Format::R8G8B8A8_SRGB => image_sender::<Rgba8Srgb, usage::Sampled>(&ctx, opts),
            vk::Format::B8G8R8A8_UNORM => image_sender::<Bgra8Unorm, usage::Storage>(&ctx, opts),
            vk::Format::B8G8R8A8_SRGB => image_sender::<Bgra8Srgb, usage::Sampled>(&ctx, opts),
            vk::Format::R16G16B16A16_SFLOAT => {
                image_sender::<Rgba16Sfloat, usage::Storage>(&ctx, opts)
            }
            _ => Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!("vk_format is {vk_format}: pass one of {IMAGE_FORMATS}"),
            )),
        }?;
        let handle = handles::insert(Object::Sender(Arc::new(Mutex::new(AnySender::Image(
            ring,
            handles::Tokens::default(),
        )))));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_sender) };
        Ok(())
    })
}

/// `ci_source_image::sharing`: `VK_SHARING_MODE_CONCURRENT` over families
/// that include every family of the context (no ownership transfer).
pub const CI_SHARING_CONCURRENT: u32 = 0;
/// `ci_source_image::sharing`: `VK_SHARING_MODE_EXCLUSIVE`, owned now by
/// `queue_family` (the copy runs on the context's queue of that family).
pub const CI_SHARING_EXCLUSIVE: u32 = 1;
/// `ci_source_image::sharing`: exclusive, owned by `queue_family`, which
/// released it to the context's transfer family (whole-image barrier,
/// layouts unchanged); the library records the acquire, the copy and the
/// release back to `queue_family`, whose acquire half the application
/// records before its next use.
pub const CI_SHARING_RELEASED_TO_TRANSFER: u32 = 2;

/// The application's image to copy from (`ci_sender_present_copy`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_source_image {
    /// `sizeof(ci_source_image)` as the caller compiled it.
    pub struct_size: u32,
    /// Its `VkFormat` (raw value): must be the ring's.
    pub vk_format: u32,
    /// The `VkImageLayout` it is in now (raw value; not `UNDEFINED` nor
    /// `PREINITIALIZED`); it is left in it.
    pub layout: u32,
    /// `CI_SHARING_*`.
    pub sharing: u32,
    /// The owning family (`CI_SHARING_EXCLUSIVE`,
    /// `CI_SHARING_RELEASED_TO_TRANSFER`).
    pub queue_family: u32,
    /// Texels of level 0 per row (at least the ring's width plus
    /// `offset_x`).
    pub width: u32,
    /// Rows of level 0.
    pub height: u32,
    /// The copied region's first texel column.
    pub offset_x: u32,
    /// The copied region's first row.
    pub offset_y: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
    /// The `VkImage` (a non-dispatchable handle's 64-bit value).
    pub image: u64,
}

/// Presents one frame of an image ring (`ci_image_sender_new`) by a GPU
/// copy of the application's own `image` (made without external memory: a
/// render target) into a free slot: the extent and region are checked
/// before anything is recorded (`CI_INVALID_ARGUMENT`, the slot left free
/// and no frame numbered); the copy runs on the transfer queue for a
/// concurrent source or one released to it, else on the context's queue of
/// the owning family, between the slot's ownership barriers, and leaves the
/// source in its layout and with its owner. Waits (bounded) for the copy,
/// then announces the frame with `timestamp_ns` (0: now) and stores its
/// sequence number in `*sequence_out` if not NULL. `CI_SKIPPED` and the
/// timeout as in `ci_sender_present_fill`. A buffer ring's sender is
/// `CI_UNSUPPORTED`.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// `source` is NULL or points to a readable `ci_source_image` of at least
/// `source->struct_size` bytes that is true of the image
/// (`vk_export::SourceImage::new`'s contract): `image` is a live 2D image
/// of the context's device, of `vk_format`, one sample, made with
/// `VK_IMAGE_USAGE_TRANSFER_SRC_BIT`, whose level 0 is at least
/// `width` x `height`; it is in `layout` (all its levels and layers) and
/// `sharing` is true of it; every write to it (and a release to transfer)
/// was submitted before this call on the queue the copy runs on (inside
/// `ci_context_with_queue`) or has completed; nothing writes it, changes
/// its layout or destroys it until this call returns (after an error, until
/// the context's queues are idle). `sequence_out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_present_copy(
    sender: *mut ci_sender,
    source: *const ci_source_image,
    timestamp_ns: u64,
    timeout_s: f64,
    sequence_out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        let sequence = with_sender(sender, |s| {
            let AnySender::Image(ring, _) = s else {
                return Err(buffer_ring("ci_sender_present_copy"));
            };
            // SAFETY: the caller's promise on `source`, forwarded.
            let copy = unsafe { copy_source(ring.as_ref(), source) }?;
            // SAFETY: the caller's promise about the image, forwarded.
            unsafe { ring.present_copy(copy, timestamp_ns, timeout) }
        })?;
        if !sequence_out.is_null() {
            // SAFETY: not NULL, valid for a write (the caller's promise).
            unsafe { sequence_out.write(sequence) };
        }
        Ok(())
    })
}

/// Records one frame of an image ring into the application's own command
/// buffer `command_buffer` (an engine's, still open: the engine submits
/// it): takes a free slot (as `ci_sender_present_copy`: `CI_SKIPPED`, the
/// timeout), records its acquire, a copy of `source` (checked first, as
/// `ci_sender_present_copy`'s, and owned by the context's main family or
/// `CI_SHARING_CONCURRENT`: `CI_INVALID_ARGUMENT` otherwise, the slot left
/// free) and its release, submits nothing, and stores in `*recorded_out` a
/// token (never 0, never another sender's) for
/// `ci_sender_present_recorded`, to call once the command buffer
/// completed. Until then the slot is out of the ring; the sender is free
/// for other frames meanwhile (a ring needs a slot for each frame in
/// flight, each frame receivers may hold, and one more). A sender freed
/// with a frame outstanding leaks that slot, which the command buffer may
/// still write, and keeps the context's device objects alive with it:
/// present or abandon every recorded frame before freeing the sender where
/// the device is to be destroyed.
/// A buffer ring's sender is `CI_UNSUPPORTED`.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// As `ci_sender_present_copy` for `source`, with "before this call"
/// meaning "recorded into `command_buffer` before this call, or submitted
/// before it"; and `command_buffer` is a primary `VkCommandBuffer` of the
/// context's device in the recording state, outside a render pass, for a
/// queue of the context's main family; no submission of this sender that
/// timed out (`CI_TIMEOUT` from a present) may still run; the application
/// submits it at most once, to a
/// queue of that family, and then calls `ci_sender_present_recorded` only
/// after it completed, or `ci_sender_abandon_recorded` if it never submits
/// it. `recorded_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_record_copy(
    sender: *mut ci_sender,
    command_buffer: *mut c_void,
    source: *const ci_source_image,
    timeout_s: f64,
    recorded_out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        non_null(command_buffer, "command_buffer")?;
        non_null(recorded_out, "recorded_out")?;
        let token = with_sender(sender, |s| {
            let AnySender::Image(ring, recorded) = s else {
                return Err(buffer_ring("ci_sender_record_copy"));
            };
            // SAFETY: the caller's promise on `source`, forwarded.
            let copy = unsafe { copy_source(ring.as_ref(), source) }?;
            let cmd = vk::CommandBuffer::from_raw(command_buffer as u64);
            // SAFETY: the caller's promises on the image and the command
            // buffer, forwarded.
            let frame = unsafe { ring.record_copy(cmd, copy, timeout) }?;
            Ok(recorded.insert(frame))
        })?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { recorded_out.write(token) };
        Ok(())
    })
}

/// `ci_record_image_fn`: records the application's commands that write an
/// image ring's slot, for `ci_sender_record_into`. `device` is the
/// context's `VkDevice`, `command_buffer` the application's own command
/// buffer (recording), `image` the slot's `VkImage` (`width` x `height`,
/// `vk_format`, in `VK_IMAGE_LAYOUT_GENERAL`, owned by the context's main
/// queue family; leave it in `GENERAL`), `user` the pointer given to
/// `ci_sender_record_into`.
#[allow(non_camel_case_types)]
pub type ci_record_image_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        device: *mut c_void,
        command_buffer: *mut c_void,
        image: u64,
        width: u32,
        height: u32,
        vk_format: u32,
    ),
>;

/// Records one frame of an image ring written by the application's own
/// commands into its own command buffer `command_buffer` (recording: the
/// application submits it): takes a free slot (as
/// `ci_sender_present_copy`: `CI_SKIPPED`, the timeout), records the slot's
/// acquire, calls `record` once (on this thread, before returning) to
/// record the application's writes of the slot's image, records the
/// release, and stores a token for `ci_sender_present_recorded` in
/// `*recorded_out`, as `ci_sender_record_copy` does (the same rules after).
/// A buffer ring's sender is `CI_UNSUPPORTED`.
///
/// Thread safety: any thread; calls on one sender are serialized; a call
/// on the same sender from inside `record` is refused
/// (`CI_INVALID_ARGUMENT`); `record` must not call into another sender
/// whose own callback, on another thread, may call into this one (the two
/// would wait for each other).
///
/// # Safety
/// As `ci_sender_record_copy` for `command_buffer` and what becomes of it;
/// `record` is NULL or a function that records only valid Vulkan commands
/// for the given device into the given command buffer (it must not begin,
/// end, submit or free it) that leave the image in `GENERAL`, and returns
/// normally (no C++ exception, no `longjmp`); `user` is passed to it
/// unchanged; `recorded_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_record_into(
    sender: *mut ci_sender,
    command_buffer: *mut c_void,
    record: ci_record_image_fn,
    user: *mut c_void,
    timeout_s: f64,
    recorded_out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        non_null(command_buffer, "command_buffer")?;
        non_null(recorded_out, "recorded_out")?;
        let Some(record) = record else {
            return Err(CiError::new(
                ci_status::CI_NULL_POINTER,
                "record is NULL: pass a function that records the frame's commands",
            ));
        };
        let token = with_sender(sender, |s| {
            let AnySender::Image(ring, recorded) = s else {
                return Err(buffer_ring("ci_sender_record_into"));
            };
            let ([width, height], format) = (ring.extent(), ring.vk_format());
            let cmd = vk::CommandBuffer::from_raw(command_buffer as u64);
            let mut call = |device: &ash::Device, cmd: vk::CommandBuffer, image: vk::Image| {
                // SAFETY: the caller's promise on `record`; the handles are
                // live for the call, the image in GENERAL owned by the
                // main family between the library's barriers.
                unsafe {
                    record(
                        user,
                        device.handle().as_raw() as *mut c_void,
                        cmd.as_raw() as *mut c_void,
                        image.as_raw(),
                        width,
                        height,
                        format,
                    )
                }
            };
            // SAFETY: the caller's promises on the command buffer and on
            // `record`, forwarded.
            let frame = unsafe { ring.record_into(cmd, &mut call, timeout) }?;
            Ok(recorded.insert(frame))
        })?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { recorded_out.write(token) };
        Ok(())
    })
}

/// Presents a frame recorded by `ci_sender_record_copy` or
/// `ci_sender_record_into` (its token `recorded`) once its command buffer
/// completed: signals the ring's
/// "produced" timeline from the host (where the ring has timelines),
/// announces the frame with `timestamp_ns` (0: now), puts the slot back
/// into the ring and stores its sequence number in `*sequence_out` if not
/// NULL. A token this sender did not give, or one already used, is
/// `CI_INVALID_ARGUMENT` (nothing changes). A refused host signal (a present
/// of this sender that timed out still has its signal pending on the GPU)
/// is an error, with the slot back in the ring and the frame unannounced
/// (its number used: receivers count the gap); the token is spent.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// The command buffer the frame was recorded into was submitted (to a
/// queue of the context's main family) and has completed execution (the
/// engine's fence for it is signalled). `sequence_out` is NULL or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_present_recorded(
    sender: *mut ci_sender,
    recorded: u64,
    timestamp_ns: u64,
    sequence_out: *mut u64,
) -> ci_status {
    entry(|| {
        let sequence = with_sender(sender, |s| {
            let AnySender::Image(ring, tokens) = s else {
                return Err(buffer_ring("ci_sender_present_recorded"));
            };
            let frame = tokens.take(recorded)?;
            // SAFETY: the caller's promise (its command buffer completed).
            unsafe { ring.present_recorded(frame, timestamp_ns) }
        })?;
        if !sequence_out.is_null() {
            // SAFETY: not NULL, valid for a write (the caller's promise).
            unsafe { sequence_out.write(sequence) };
        }
        Ok(())
    })
}

/// Puts the slot of a recorded frame (token `recorded`) back into the ring
/// unpresented, when its command buffer will never be submitted (the
/// engine dropped the frame): no frame is numbered. Tokens as in
/// `ci_sender_present_recorded`.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// The command buffer the frame was recorded into was never submitted and
/// never will be (reset or freed).
#[no_mangle]
pub unsafe extern "C" fn ci_sender_abandon_recorded(
    sender: *mut ci_sender,
    recorded: u64,
) -> ci_status {
    entry(|| {
        with_sender(sender, |s| {
            let AnySender::Image(ring, tokens) = s else {
                return Err(buffer_ring("ci_sender_abandon_recorded"));
            };
            let frame = tokens.take(recorded)?;
            // SAFETY: the caller's promise (never submitted).
            unsafe { ring.abandon_recorded(frame) }
        })
    })
}

/// `CI_UNSUPPORTED` for `call` on a buffer ring's sender.
fn buffer_ring(call: &str) -> CiError {
    CiError::new(
        ci_status::CI_UNSUPPORTED,
        format!(
            "{call} works on an image ring; this sender's slots are buffers (ci_sender_new): \
             make it with ci_image_sender_new"
        ),
    )
}

/// `source`, checked against `ring` and parsed.
///
/// # Safety
/// `source` is NULL or points to a readable `ci_source_image` of at least
/// `source->struct_size` bytes.
unsafe fn copy_source(
    ring: &dyn ImageRing,
    source: *const ci_source_image,
) -> Result<CopySource, CiError> {
    non_null(source, "source")?;
    // SAFETY: not NULL, readable (the caller's promise); the first
    // field alone before trusting it.
    let size = unsafe { std::ptr::read_unaligned(source.cast::<u32>()) };
    let need = std::mem::size_of::<ci_source_image>();
    if (size as usize) < need {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!("source->struct_size is {size}: set it to sizeof(ci_source_image) ({need})"),
        ));
    }
    // SAFETY: readable for its size (the caller's promise).
    let src = unsafe { std::ptr::read_unaligned(source) };
    if src.vk_format != ring.vk_format() {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!(
                "source->vk_format is {}, the ring's images are VkFormat {}: a copy \
                     keeps the format; render into an image of the ring's format",
                src.vk_format,
                ring.vk_format()
            ),
        ));
    }
    let sharing = match src.sharing {
        CI_SHARING_CONCURRENT => SourceSharing::Concurrent,
        CI_SHARING_EXCLUSIVE => SourceSharing::Exclusive(src.queue_family),
        CI_SHARING_RELEASED_TO_TRANSFER => SourceSharing::ReleasedToTransfer {
            from: src.queue_family,
        },
        other => {
            return Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!("source->sharing is {other}: pass a CI_SHARING_* value"),
            ))
        }
    };
    let copy = CopySource {
        image: vk::Image::from_raw(src.image),
        extent: [src.width, src.height],
        offset: [src.offset_x, src.offset_y],
        layout: vk::ImageLayout::from_raw(src.layout as i32),
        sharing,
    };
    Ok(copy)
}
