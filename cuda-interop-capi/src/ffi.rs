//! The exported functions: contexts, senders, receivers, frames.
//!
//! # Contract
//!
//! * Each function is an `unsafe extern "C" fn` whose `# Safety` names what
//!   only the C caller can promise (pointers valid for their use); handles
//!   are checked by the library (see the crate contract), so a NULL, freed
//!   or wrong-kind handle is an error code, never undefined behaviour.
//! * Out-pointers are written only on `CI_OK`.
//! * `*_free` functions take NULL as a no-op (like `free`) and return
//!   `CI_OK`; any other value is checked like every handle.
//! * The blocking calls (`ci_sender_wait_for_receivers`,
//!   `ci_sender_present_fill`, `ci_receiver_connect_named`,
//!   `ci_receiver_next`, `ci_receiver_read`) wait at most their timeout,
//!   plus the bounded Vulkan waits of `cuda-interop-frames`.

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cuda_interop_frames::discovery::{DiscoveryError, SlotKind};
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::protocol::Delivery;
use cuda_interop_frames::sender::{
    monotonic_ns, AcquireError, Address, Sender, SenderError, SenderOptions,
};
use cuda_interop_frames::session::ConnectError;
use cuda_interop_frames::transport::ConsumerError;
use vk_export::markers::{DeviceLocal, HostVisible, MemoryLocation};
use vk_export::{Context, HeadlessOptions, TransferQueue, Validation};

use crate::handles::{self, AnySender, FrameEntry, Object};
use crate::{ci_frame_info, ci_status, entry, non_null, seconds, CiError};

/// An opaque Vulkan context (a headless one for now).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_context {
    _opaque: [u8; 0],
}

/// An opaque sender of a buffer ring.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_sender {
    _opaque: [u8; 0],
}

/// An opaque host receiver.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_receiver {
    _opaque: [u8; 0],
}

/// An opaque CUDA receiver (`ci_cuda_receiver_connect_named`).
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_cuda_receiver {
    _opaque: [u8; 0],
}

/// An opaque frame a receiver (host or CUDA) handed out.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct ci_frame {
    _opaque: [u8; 0],
}

/// `ci_delivery`: the newest frame when the receiver asks; the sender never
/// waits for it.
pub const CI_DELIVERY_LATEST: u32 = 0;
/// `ci_delivery`: every frame, in order; the sender waits (bounded) for its
/// releases.
pub const CI_DELIVERY_LOSSLESS: u32 = 1;

/// `ci_context_options::validation`: no validation layer.
pub const CI_VALIDATION_OFF: u32 = 0;
/// `ci_context_options::validation`: the layer if installed (the default).
pub const CI_VALIDATION_IF_AVAILABLE: u32 = 1;
/// `ci_context_options::validation`: fail without the layer.
pub const CI_VALIDATION_REQUIRED: u32 = 2;

/// Options of `ci_context_new_headless`; NULL options are the defaults.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_context_options {
    /// `sizeof(ci_context_options)` as the caller compiled it (fields added
    /// later go at the end; a smaller size means they are absent).
    pub struct_size: u32,
    /// `CI_VALIDATION_*` (0 is off).
    pub validation: u32,
    /// Nonzero: pick the device whose `deviceUUID` is `device_uuid`.
    pub has_device_uuid: u32,
    /// Nonzero: no transfer-only queue (everything on the main queue).
    pub no_transfer_queue: u32,
    /// The `deviceUUID` (with `has_device_uuid`).
    pub device_uuid: [u8; 16],
}

/// What a sender has done so far (`ci_sender_stats_get`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ci_sender_stats {
    /// Frames presented.
    pub presented: u64,
    /// Frames skipped (`CI_SKIPPED`: every slot held by latest receivers).
    pub skipped: u64,
    /// Acquires that timed out waiting for lossless receivers.
    pub backpressure_timeouts: u64,
    /// Connections open now.
    pub receivers: u64,
    /// Connections accepted since the start.
    pub connected: u64,
    /// Receivers dropped for a fault.
    pub dropped: u64,
    /// Connections refused.
    pub refused: u64,
    /// Frames per second over the last second or so.
    pub fps: f64,
}

/// Bytes of `ci_sender_info::name`: a name (at most 64 bytes) and its NUL,
/// padded.
pub const CI_NAME_CAPACITY: usize = 72;

/// `ci_sender_info::kind`: a ring of pitched buffers.
pub const CI_SLOTS_BUFFERS: u32 = 0;
/// `ci_sender_info::kind`: a ring of images.
pub const CI_SLOTS_IMAGES: u32 = 1;

/// One named sender (`ci_list_senders`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug)]
pub struct ci_sender_info {
    /// Its name, NUL-terminated.
    pub name: [c_char; CI_NAME_CAPACITY],
    /// Bytes from one row to the next (buffer rings).
    pub row_pitch: u64,
    /// Frames presented per second over the last second or so (0 before).
    pub fps: f64,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Slots in the ring.
    pub slots: u32,
    /// Its process as it sees itself (for people, not liveness).
    pub pid: u32,
    /// `CI_SLOTS_BUFFERS` or `CI_SLOTS_IMAGES`.
    pub kind: u32,
    /// Zero (padding, for a layout without holes).
    pub reserved: u32,
    /// The pixel format's lower-case name, NUL-terminated:
    /// `r8g8b8a8_unorm` (an RGBA8 buffer ring), `nv12`, `p010`, or an
    /// image ring's `VkFormat` without `VK_FORMAT_` (`b8g8r8a8_srgb`).
    pub format: [c_char; crate::CI_FORMAT_NAME_CAPACITY],
}

/// Lists the live senders of the default directory
/// (`$XDG_RUNTIME_DIR/cuda-interop-frames`): stores how many there are in
/// `*count_out` and the first `min(count, capacity)` of them in `out`
/// (call with capacity 0 to learn the count; senders may come and go
/// between two calls).
///
/// Thread safety: any thread.
///
/// # Safety
/// `out` is NULL (only with `capacity` 0) or valid for writes of
/// `capacity` `ci_sender_info`s; `count_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_list_senders(
    out: *mut ci_sender_info,
    capacity: usize,
    count_out: *mut usize,
) -> ci_status {
    entry(|| {
        non_null(count_out, "count_out")?;
        if capacity > 0 {
            non_null(out, "out (with a capacity above 0)")?;
        }
        let senders = cuda_interop_frames::discovery::list_senders().map_err(discovery)?;
        for (i, s) in senders.iter().take(capacity).enumerate() {
            // Names are at most 64 bytes (validated); the last byte stays NUL.
            let info = ci_sender_info {
                name: crate::name_array(&s.name),
                row_pitch: s.row_pitch,
                fps: s.fps,
                width: s.width,
                height: s.height,
                slots: s.slots,
                pid: s.pid,
                kind: match s.kind {
                    SlotKind::Buffer => CI_SLOTS_BUFFERS,
                    SlotKind::Image => CI_SLOTS_IMAGES,
                },
                reserved: 0,
                format: crate::name_array(&s.format),
            };
            // SAFETY: `i < capacity`, and `out` is valid for `capacity`
            // entries (the caller's promise; not NULL, checked above).
            unsafe { out.add(i).write(info) };
        }
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { count_out.write(senders.len()) };
        Ok(())
    })
}

pub(crate) fn key<T>(handle: *const T) -> usize {
    handle as usize
}

/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn string<'a>(p: *const c_char, what: &str) -> Result<&'a str, CiError> {
    non_null(p, what)?;
    // SAFETY: not NULL, and NUL-terminated by the caller's promise.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| {
        CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!("{what} is not UTF-8: pass ASCII letters, digits, '-', '_' and '.'"),
        )
    })
}

pub(crate) fn vulkan(e: vk_export::Error) -> CiError {
    let status = match &e {
        vk_export::Error::Timeout(_) => ci_status::CI_TIMEOUT,
        vk_export::Error::Unsupported { .. } | vk_export::Error::NoDevice(_) => {
            ci_status::CI_UNSUPPORTED
        }
        vk_export::Error::InvalidArgument(_) => ci_status::CI_INVALID_ARGUMENT,
        vk_export::Error::Socket { .. } => ci_status::CI_IO,
        _ => ci_status::CI_VULKAN,
    };
    CiError::new(status, e.to_string())
}

pub(crate) fn discovery(e: DiscoveryError) -> CiError {
    let status = match &e {
        DiscoveryError::Name { .. } => ci_status::CI_INVALID_ARGUMENT,
        DiscoveryError::NameTaken { .. } | DiscoveryError::NameBusy { .. } => {
            ci_status::CI_NAME_TAKEN
        }
        DiscoveryError::NotFound { .. } => ci_status::CI_NOT_FOUND,
        DiscoveryError::Directory { .. } | DiscoveryError::Io { .. } => ci_status::CI_IO,
        DiscoveryError::Socket(_) => ci_status::CI_IO,
        DiscoveryError::Connect(c) => return consumer(c),
    };
    // The C names of what the Rust messages suggest.
    CiError::new(
        status,
        e.to_string().replace("list_senders()", "ci_list_senders()"),
    )
}

pub(crate) fn consumer(e: &ConsumerError) -> CiError {
    let status = match e {
        ConsumerError::ConnectTimeout { .. } | ConsumerError::Timeout(_) => ci_status::CI_TIMEOUT,
        ConsumerError::Connect { .. } | ConsumerError::Poll(_) | ConsumerError::Recv(_) => {
            ci_status::CI_IO
        }
        ConsumerError::Busy(_) => ci_status::CI_BUSY,
        ConsumerError::Closed | ConsumerError::GivenUp(_) => ci_status::CI_CLOSED,
        ConsumerError::Dropped(_) => ci_status::CI_DROPPED,
        ConsumerError::NotHeld { .. }
        | ConsumerError::LatestHoldsOne { .. }
        | ConsumerError::NotThisReceiver { .. } => ci_status::CI_INVALID_ARGUMENT,
        ConsumerError::Packet(_) | ConsumerError::Protocol(_) => ci_status::CI_PROTOCOL,
        ConsumerError::Vulkan(v) => match v {
            vk_export::Error::Timeout(_) => ci_status::CI_TIMEOUT,
            _ => ci_status::CI_VULKAN,
        },
        ConsumerError::Cuda(_) => ci_status::CI_CUDA,
        #[allow(unreachable_patterns, reason = "the enum may grow")]
        _ => ci_status::CI_PROTOCOL,
    };
    CiError::new(status, e.to_string())
}

pub(crate) fn sender_error(e: SenderError) -> CiError {
    match e {
        SenderError::Options(why) => CiError::new(ci_status::CI_INVALID_ARGUMENT, why),
        SenderError::Layout(p) => CiError::new(ci_status::CI_INVALID_ARGUMENT, p.to_string()),
        SenderError::Discovery(d) => discovery(d),
        SenderError::Vulkan(v) => vulkan(v),
        SenderError::Io(io) => CiError::new(ci_status::CI_IO, io.to_string()),
    }
}

/// Makes a headless Vulkan context (its own instance and device: the first
/// suitable device, or the one `options->device_uuid` names) and stores its
/// handle in `*out`. Free it with `ci_context_free`; senders made on it
/// keep the device alive until they are freed too.
///
/// Thread safety: any thread.
///
/// # Safety
/// `options` is NULL or points to a readable `ci_context_options` of at
/// least `options->struct_size` bytes; `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_context_new_headless(
    options: *const ci_context_options,
    out: *mut *mut ci_context,
) -> ci_status {
    entry(|| {
        non_null(out, "out")?;
        let mut headless = HeadlessOptions::default();
        if !options.is_null() {
            // SAFETY: not NULL, readable for its struct_size (the caller's
            // promise); the first field is read alone before trusting it.
            let size = unsafe { std::ptr::read_unaligned(options.cast::<u32>()) };
            if (size as usize) < std::mem::size_of::<ci_context_options>() {
                return Err(CiError::new(
                    ci_status::CI_INVALID_ARGUMENT,
                    format!(
                        "options->struct_size is {size}: set it to sizeof(ci_context_options) \
                         ({})",
                        std::mem::size_of::<ci_context_options>()
                    ),
                ));
            }
            // SAFETY: as above, and at least the size of the struct.
            let o = unsafe { std::ptr::read_unaligned(options) };
            headless.validation = match o.validation {
                CI_VALIDATION_OFF => Validation::Off,
                CI_VALIDATION_IF_AVAILABLE => Validation::IfAvailable,
                CI_VALIDATION_REQUIRED => Validation::Required,
                v => {
                    return Err(CiError::new(
                        ci_status::CI_INVALID_ARGUMENT,
                        format!("options->validation is {v}: pass a CI_VALIDATION_* value"),
                    ))
                }
            };
            if o.has_device_uuid != 0 {
                headless.device_uuid = Some(o.device_uuid.into());
            }
            if o.no_transfer_queue != 0 {
                headless.transfer_queue = TransferQueue::Off;
            }
        }
        let ctx = Context::headless(&headless).map_err(vulkan)?;
        let handle = handles::insert(Object::Context(ctx));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_context) };
        Ok(())
    })
}

/// Frees a context handle (NULL: nothing). The context's own objects go
/// when everything made on it (senders, receivers, `ci_timeline`s) is
/// freed too: a context made on the application's device
/// (`ci_context_new_from_vulkan`) needs all of those freed before the
/// application destroys its device.
///
/// Thread safety: any thread; the handle is invalid for every thread after.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_context_free(ctx: *mut ci_context) -> ci_status {
    entry(|| {
        if ctx.is_null() {
            return Ok(());
        }
        let object = handles::remove(key(ctx), "ci_context*", |o| matches!(o, Object::Context(_)))?;
        drop(object);
        Ok(())
    })
}

/// Makes a sender of a ring of `slots` RGBA8 buffers of `width` x `height`
/// (rows `width * 4` bytes apart) on `ctx`, announced as `name` in the
/// default directory (`$XDG_RUNTIME_DIR/cuda-interop-frames`), and stores
/// its handle in `*out`. The slots are device-local where the device has
/// device-local memory that is not host-visible, else host-visible (what
/// host receivers read, on lavapipe); the timelines are shared where the
/// device exports semaphores (CUDA receivers need them).
///
/// Thread safety: any thread.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_new(
    ctx: *mut ci_context,
    name: *const c_char,
    width: u32,
    height: u32,
    slots: u32,
    out: *mut *mut ci_sender,
) -> ci_status {
    entry(|| {
        let ctx = handles::context(key(ctx))?;
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let opts = ring_options(&ctx, name, width, height, slots)?;
        let sender = if offers_device_local(&ctx) {
            AnySender::Device(
                Sender::<DeviceLocal>::new(&ctx, opts).map_err(sender_error)?,
                handles::Tokens::default(),
            )
        } else {
            AnySender::Host(
                Sender::<HostVisible>::new(&ctx, opts).map_err(sender_error)?,
                handles::Tokens::default(),
            )
        };
        let handle = handles::insert(Object::Sender(Arc::new(Mutex::new(sender))));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_sender) };
        Ok(())
    })
}

/// Whether `ctx`'s device has device-local memory that is not host-visible
/// (the frames examples' choice, `demo::choose`).
pub(crate) fn offers_device_local(ctx: &Context) -> bool {
    // SAFETY: the context's live instance and one of its physical devices.
    let memory = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    let types = &memory.memory_types[..(memory.memory_type_count as usize).min(32)];
    types.iter().any(|t| DeviceLocal::admits(t.property_flags))
}

std::thread_local! {
    /// The senders whose lock this thread holds (inside `with_sender`): a
    /// callback of a call on a sender (`ci_record_fn`, `ci_record_image_fn`)
    /// that calls the library on the same sender is refused instead of
    /// waiting for itself forever.
    static SENDERS_HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes `key` out of [`SENDERS_HELD`] when dropped.
struct SenderHeld(usize);

impl Drop for SenderHeld {
    fn drop(&mut self) {
        SENDERS_HELD.with(|held| held.borrow_mut().retain(|&k| k != self.0));
    }
}

pub(crate) fn with_sender<T>(
    sender: *mut ci_sender,
    f: impl FnOnce(&mut AnySender) -> Result<T, CiError>,
) -> Result<T, CiError> {
    let key = key(sender);
    let sender = handles::sender(key)?;
    if SENDERS_HELD.with(|held| held.borrow().contains(&key)) {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            "a call on a sender from inside a callback of a call on the same sender (a \
             ci_record_fn or ci_record_image_fn): it would wait for itself; make the call after \
             the outer one returned",
        ));
    }
    // A panic in an earlier call left the sender in an unknown state: it is
    // still memory-safe to use (its own invariants hold between calls), and
    // its next error says what is wrong.
    let mut guard = sender.lock().unwrap_or_else(PoisonError::into_inner);
    SENDERS_HELD.with(|held| held.borrow_mut().push(key));
    let _held = SenderHeld(key);
    f(&mut guard)
}

/// Serves receivers until `count` of them are subscribed (`CI_OK`) or
/// `timeout_s` seconds pass (`CI_TIMEOUT`).
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_wait_for_receivers(
    sender: *mut ci_sender,
    count: u32,
    timeout_s: f64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        let ok = with_sender(sender, |s| {
            Ok(match s {
                AnySender::Host(s, _) => s.wait_for_receivers(count as usize, timeout),
                AnySender::Device(s, _) => s.wait_for_receivers(count as usize, timeout),
                AnySender::Image(s, _) => s.wait_for_receivers(count as usize, timeout),
            })
        })?;
        if ok {
            Ok(())
        } else {
            Err(CiError::new(
                ci_status::CI_TIMEOUT,
                format!(
                    "fewer than {count} receivers subscribed within {timeout:?}: start them, or \
                     wait longer"
                ),
            ))
        }
    })
}

/// Serves receivers (connections, requests, releases) for up to
/// `timeout_s` seconds, returning after the first event. A sender that
/// presents nothing for a while calls it so that connecting receivers are
/// answered (presenting serves them too).
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_serve(sender: *mut ci_sender, timeout_s: f64) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        with_sender(sender, |s| {
            match s {
                AnySender::Host(s, _) => s.serve(timeout),
                AnySender::Device(s, _) => s.serve(timeout),
                AnySender::Image(s, _) => s.serve(timeout),
            }
            Ok(())
        })
    })
}

/// `what` called on an image ring's sender.
fn image_ring(what: &str) -> CiError {
    CiError::new(
        ci_status::CI_UNSUPPORTED,
        format!(
            "{what} presents into a buffer ring; this sender's slots are images \
             (ci_image_sender_new): present with ci_sender_present_copy"
        ),
    )
}

pub(crate) fn acquire<M: MemoryLocation, R: cuda_interop_frames::sender::SlotResource<M>>(
    s: &mut Sender<M, R>,
    timeout: Duration,
) -> Result<cuda_interop_frames::sender::WriteSlot<'_, M, R>, CiError> {
    s.acquire(timeout).map_err(|e| match e {
        AcquireError::AllSlotsHeld => CiError::new(ci_status::CI_SKIPPED, e.to_string()),
        AcquireError::Timeout(_) => CiError::new(
            ci_status::CI_TIMEOUT,
            format!("{e}: they release within the hold timeout or are dropped; try again"),
        ),
    })
}

fn fill<M: MemoryLocation>(
    s: &mut Sender<M>,
    value: u32,
    timestamp_ns: u64,
    timeout: Duration,
) -> Result<u64, CiError> {
    let slot = acquire(s, timeout)?;
    let size = slot.buffer().size();
    let timestamp = if timestamp_ns == 0 {
        monotonic_ns()
    } else {
        timestamp_ns
    };
    slot.present_with(timestamp, |device, cmd, buffer| {
        // SAFETY: the sender's recording command buffer and the slot's
        // buffer of `size` bytes (transfer usage), alive until the
        // submission completes; `size` is a multiple of 4 (RGBA8 rows).
        unsafe { device.cmd_fill_buffer(cmd, buffer, 0, size, value) };
    })
    .map_err(sender_error)
}

/// Presents one frame whose every 32-bit word is `value` (little-endian
/// bytes in memory): takes a free slot (waiting up to `timeout_s` only for
/// lossless receivers' releases), fills it on the GPU, waits for the fill
/// (bounded) and announces it with `timestamp_ns` (0: now, on
/// `CLOCK_MONOTONIC`). Stores the frame's sequence number in
/// `*sequence_out` if that is not NULL. `CI_SKIPPED`: every slot is held by
/// latest receivers, nothing was presented; try again for the next frame.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// `sequence_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_present_fill(
    sender: *mut ci_sender,
    value: u32,
    timestamp_ns: u64,
    timeout_s: f64,
    sequence_out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        let sequence = with_sender(sender, |s| match s {
            AnySender::Host(s, _) => fill(s, value, timestamp_ns, timeout),
            AnySender::Device(s, _) => fill(s, value, timestamp_ns, timeout),
            AnySender::Image(..) => Err(image_ring("ci_sender_present_fill")),
        })?;
        if !sequence_out.is_null() {
            // SAFETY: not NULL, valid for a write (the caller's promise).
            unsafe { sequence_out.write(sequence) };
        }
        Ok(())
    })
}

/// `ci_record_fn`: records a frame's commands for
/// `ci_sender_present_record`. `device` is the context's `VkDevice`,
/// `command_buffer` a `VkCommandBuffer` in the recording state, `buffer`
/// the slot's `VkBuffer` (`size` bytes, `TRANSFER_SRC | TRANSFER_DST |
/// STORAGE` usage), `user` the pointer given to `ci_sender_present_record`.
#[allow(non_camel_case_types)]
pub type ci_record_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        device: *mut c_void,
        command_buffer: *mut c_void,
        buffer: u64,
        size: u64,
    ),
>;

fn record_with<M: MemoryLocation>(
    s: &mut Sender<M>,
    record: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, u64, u64),
    user: *mut c_void,
    timestamp_ns: u64,
    timeout: Duration,
) -> Result<u64, CiError> {
    use vk_export::ash::vk::Handle;
    let slot = acquire(s, timeout)?;
    let size = slot.buffer().size();
    let timestamp = if timestamp_ns == 0 {
        monotonic_ns()
    } else {
        timestamp_ns
    };
    slot.present_with(timestamp, |device, cmd, buffer| {
        // SAFETY: the caller of ci_sender_present_record promised that
        // `record` records only valid commands into this recording
        // command buffer (for this buffer of `size` bytes), does not
        // submit, end or free it, and returns normally (no unwinding or
        // longjmp across the library); the handles are live for the call.
        unsafe {
            record(
                user,
                device.handle().as_raw() as *mut c_void,
                cmd.as_raw() as *mut c_void,
                buffer.as_raw(),
                size,
            )
        };
    })
    .map_err(sender_error)
}

/// Presents one frame whose commands `record` records (called once, on
/// this thread, before this function returns) between the library's
/// ownership barriers for the slot; otherwise as `ci_sender_present_fill`
/// (slot, timeout, `CI_SKIPPED`, timestamp, sequence). The commands run
/// on the context's main queue (graphics, compute and transfer).
///
/// Thread safety: any thread; calls on one sender are serialized; a call
/// on the same sender from inside `record` is refused
/// (`CI_INVALID_ARGUMENT`); `record` must not call into another sender
/// whose own callback, on another thread, may call into this one (the two
/// would wait for each other).
///
/// # Safety
/// `record` is NULL or a function that records only valid Vulkan commands
/// for the given device into the given command buffer (it must not begin,
/// end, submit or free it, nor use the slot's buffer beyond `size` bytes)
/// and returns normally: no C++ exception and no `longjmp` may leave it;
/// `user` is passed to it unchanged; `sequence_out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_present_record(
    sender: *mut ci_sender,
    record: ci_record_fn,
    user: *mut c_void,
    timestamp_ns: u64,
    timeout_s: f64,
    sequence_out: *mut u64,
) -> ci_status {
    entry(|| {
        let timeout = seconds("timeout_s", timeout_s)?;
        let Some(record) = record else {
            return Err(CiError::new(
                ci_status::CI_NULL_POINTER,
                "record is NULL: pass a function that records the frame's commands",
            ));
        };
        let sequence = with_sender(sender, |s| match s {
            AnySender::Host(s, _) => record_with(s, record, user, timestamp_ns, timeout),
            AnySender::Device(s, _) => record_with(s, record, user, timestamp_ns, timeout),
            AnySender::Image(..) => Err(image_ring("ci_sender_present_record")),
        })?;
        if !sequence_out.is_null() {
            // SAFETY: not NULL, valid for a write (the caller's promise).
            unsafe { sequence_out.write(sequence) };
        }
        Ok(())
    })
}

/// Stores what the sender has done so far in `*stats`.
///
/// Thread safety: any thread; calls on one sender are serialized.
///
/// # Safety
/// `stats` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_stats_get(
    sender: *mut ci_sender,
    stats: *mut ci_sender_stats,
) -> ci_status {
    entry(|| {
        let s = with_sender(sender, |s| {
            Ok(match s {
                AnySender::Host(s, _) => s.stats(),
                AnySender::Device(s, _) => s.stats(),
                AnySender::Image(s, _) => s.stats(),
            })
        })?;
        non_null(stats, "stats")?;
        let out = ci_sender_stats {
            presented: s.presented,
            skipped: s.skipped,
            backpressure_timeouts: s.backpressure_timeouts,
            receivers: s.receivers as u64,
            connected: s.connected,
            dropped: s.dropped,
            refused: s.refused,
            fps: s.fps,
        };
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { stats.write(out) };
        Ok(())
    })
}

/// The options of a sender named `name` on `ctx` of `slots` frames of
/// `width` x `height` (both at least 1).
pub(crate) fn ring_options(
    ctx: &Context,
    name: &str,
    width: u32,
    height: u32,
    slots: u32,
) -> Result<SenderOptions, CiError> {
    if width == 0 || height == 0 {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!("the ring is {width}x{height}: pass a width and a height of at least 1"),
        ));
    }
    let address = Address::named(name).map_err(discovery)?;
    Ok(SenderOptions::for_context(
        ctx, address, width, height, slots,
    ))
}

/// Frees a sender (NULL: nothing): says goodbye to its receivers, removes
/// its name, and waits (bounded) for its slots' last GPU use. A call on it
/// in flight on another thread finishes first.
///
/// Thread safety: any thread; the handle is invalid for every thread after.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_sender_free(sender: *mut ci_sender) -> ci_status {
    entry(|| {
        if sender.is_null() {
            return Ok(());
        }
        let object = handles::remove(key(sender), "ci_sender*", |o| {
            matches!(o, Object::Sender(_))
        })?;
        drop(object);
        Ok(())
    })
}

/// Connects a host receiver to the sender named `name` (waiting up to
/// `timeout_s` seconds for it to appear), in `delivery`
/// (`CI_DELIVERY_LATEST` or `CI_DELIVERY_LOSSLESS`), imports its ring on a
/// Vulkan device of its own (any driver: lavapipe too; the ring must be
/// host-visible buffers) and stores the receiver's handle in `*out`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn ci_receiver_connect_named(
    name: *const c_char,
    delivery: u32,
    timeout_s: f64,
    out: *mut *mut ci_receiver,
) -> ci_status {
    entry(|| {
        // SAFETY: NULL or NUL-terminated (the caller's promise).
        let name = unsafe { string(name, "name") }?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let delivery = delivery_of(delivery)?;
        let receiver =
            HostReceiver::connect_named(name, delivery, timeout).map_err(|e| match e {
                ConnectError::Discovery(d) => discovery(d),
                ConnectError::Consumer(c) => consumer(&c),
            })?;
        let handle = handles::insert(Object::Receiver(Arc::new(receiver)));
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_receiver) };
        Ok(())
    })
}

/// A `CI_DELIVERY_*` value, checked.
pub(crate) fn delivery_of(delivery: u32) -> Result<Delivery, CiError> {
    match delivery {
        CI_DELIVERY_LATEST => Ok(Delivery::Latest),
        CI_DELIVERY_LOSSLESS => Ok(Delivery::Lossless),
        d => Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!("delivery is {d}: pass CI_DELIVERY_LATEST (0) or CI_DELIVERY_LOSSLESS (1)"),
        )),
    }
}

/// Waits up to `timeout_s` seconds for the next frame (latest: the newest;
/// lossless: every frame in order) and stores its handle in `*out`. The
/// frame holds its slot until `ci_frame_release`; a latest receiver holds
/// one frame at a time (release it before the next call).
///
/// Thread safety: any thread; one thread receives at a time (a second
/// one's call waits within its timeout, then returns `CI_BUSY`).
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_receiver_next(
    receiver: *mut ci_receiver,
    timeout_s: f64,
    out: *mut *mut ci_frame,
) -> ci_status {
    entry(|| {
        let owner = key(receiver);
        let rx = handles::receiver(owner)?;
        non_null(out, "out")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let frame = rx.next(timeout).map_err(|e| consumer(&e))?;
        let handle = register_frame(
            owner,
            frame,
            rx.session().layout(),
            rx.frame_bytes(),
            || handles::receiver(owner).is_ok(),
        )?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { out.write(handle as *mut ci_frame) };
        Ok(())
    })
}

/// Registers `frame` of receiver `owner` (whose ring has `layout` and
/// frames of `frame_bytes`); its handle's value. `owner_live` says whether
/// the receiver's handle is still live after the registration.
pub(crate) fn register_frame(
    owner: usize,
    frame: cuda_interop_frames::session::Frame,
    layout: &cuda_interop_frames::protocol::RingLayout,
    frame_bytes: u64,
    owner_live: impl FnOnce() -> bool,
) -> Result<usize, CiError> {
    let info = ci_frame_info {
        sequence: frame.sequence(),
        timestamp_ns: frame.timestamp_ns(),
        dropped_before: frame.dropped_before(),
        row_pitch: layout.row_pitch,
        frame_bytes,
        slot: frame.slot(),
        width: layout.width,
        height: layout.height,
        reserved: 0,
    };
    let entry = FrameEntry {
        owner,
        info,
        frame: Mutex::new(Some(frame)),
    };
    let handle = handles::insert(Object::Frame(Arc::new(entry)));
    // A receiver freed on another thread during this call takes out the
    // frames registered before its sweep; one registered after it is taken
    // out here (the receiver is gone from the table by then), so no frame
    // outlives its receiver's handle.
    if !owner_live() {
        let orphan = handles::remove(handle, "ci_frame*", |o| matches!(o, Object::Frame(_)));
        drop(orphan);
        return Err(CiError::new(
            ci_status::CI_WRONG_HANDLE,
            "the receiver was freed (on another thread) while it received: its frame was \
             released; free a receiver only after its last call",
        ));
    }
    Ok(handle)
}

/// Stores `frame`'s description in `*info`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `info` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ci_frame_get_info(
    frame: *const ci_frame,
    info: *mut ci_frame_info,
) -> ci_status {
    entry(|| {
        let f = handles::frame(key(frame))?;
        non_null(info, "info")?;
        // SAFETY: not NULL, valid for a write (the caller's promise).
        unsafe { info.write(f.info) };
        Ok(())
    })
}

pub(crate) fn owned_frame(receiver: usize, frame: usize) -> Result<Arc<FrameEntry>, CiError> {
    handles::receiver(receiver)?;
    frame_of(receiver, frame)
}

/// Frame `frame`, checked to be one receiver `receiver` handed out (the
/// receiver's own kind checked by the caller).
pub(crate) fn frame_of(receiver: usize, frame: usize) -> Result<Arc<FrameEntry>, CiError> {
    let f = handles::frame(frame)?;
    if f.owner != receiver {
        return Err(CiError::new(
            ci_status::CI_INVALID_ARGUMENT,
            format!(
                "frame {} was handed out by another receiver: pass the receiver it came from",
                f.info.sequence
            ),
        ));
    }
    Ok(f)
}

/// Copies `frame`'s bytes (rows `row_pitch` apart, `frame_bytes` in all:
/// see `ci_frame_get_info`) into `dst`, waiting at most `timeout_s` seconds.
/// `CI_OK` means the bytes are the frame's; `CI_DROPPED` or `CI_CLOSED`
/// that the sender dropped this receiver meanwhile (the bytes are not
/// valid). `dst_len` smaller than the frame is `CI_BUFFER_TOO_SMALL`.
///
/// Thread safety: any thread; a release of the same frame on another
/// thread waits for the read.
///
/// # Safety
/// `dst` is NULL or valid for writes of `dst_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ci_receiver_read(
    receiver: *mut ci_receiver,
    frame: *const ci_frame,
    dst: *mut c_void,
    dst_len: usize,
    timeout_s: f64,
) -> ci_status {
    entry(|| {
        let f = owned_frame(key(receiver), key(frame))?;
        let rx = handles::receiver(key(receiver))?;
        non_null(dst, "dst")?;
        let timeout = seconds("timeout_s", timeout_s)?;
        let need = f.info.frame_bytes;
        if (dst_len as u64) < need {
            return Err(CiError::new(
                ci_status::CI_BUFFER_TOO_SMALL,
                format!(
                    "dst_len is {dst_len} bytes; a frame has {need} (ci_frame_info's \
                     frame_bytes): pass a buffer at least that large"
                ),
            ));
        }
        let held = f.frame.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(frame) = held.as_ref() else {
            return Err(CiError::new(
                ci_status::CI_WRONG_HANDLE,
                "the frame was released: read frames before ci_frame_release",
            ));
        };
        let bytes = rx.read(frame, timeout).map_err(|e| consumer(&e))?;
        let n = bytes.len().min(dst_len);
        // SAFETY: `dst` is valid for `dst_len` bytes (the caller's promise)
        // and `n <= dst_len`; a Vec the library owns cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>(), n) };
        Ok(())
    })
}

/// Gives `frame` back to the sender; the frame handle is consumed whatever
/// the status, unless the status is `CI_NULL_POINTER`, `CI_WRONG_HANDLE`
/// or `CI_INVALID_ARGUMENT` (a frame of another receiver), which change
/// nothing. An error after the handle is consumed says the connection is
/// over (`CI_DROPPED`, `CI_CLOSED`).
///
/// Thread safety: any thread.
///
/// # Safety
/// None beyond the ABI: the handles are checked.
#[no_mangle]
pub unsafe extern "C" fn ci_frame_release(
    receiver: *mut ci_receiver,
    frame: *mut ci_frame,
) -> ci_status {
    entry(|| {
        owned_frame(key(receiver), key(frame))?;
        let rx = handles::receiver(key(receiver))?;
        match handles::take_frame(key(frame))? {
            Some(frame) => rx.release(frame).map_err(|e| consumer(&e)),
            None => Ok(()),
        }
    })
}

/// Frees a receiver (NULL: nothing), releasing every frame it handed out
/// that is not released yet (their handles become invalid).
///
/// Thread safety: any thread; the handle and its frames' handles are
/// invalid for every thread after.
///
/// # Safety
/// None beyond the ABI: the handle is checked.
#[no_mangle]
pub unsafe extern "C" fn ci_receiver_free(receiver: *mut ci_receiver) -> ci_status {
    entry(|| {
        handles::free_receiver(key(receiver), "ci_receiver*", |o| {
            matches!(o, Object::Receiver(_))
        })
    })
}

/// Nanoseconds of `CLOCK_MONOTONIC` now: the clock of frame timestamps.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn ci_monotonic_ns() -> u64 {
    monotonic_ns()
}
