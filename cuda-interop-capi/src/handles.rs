//! The registry of live handles: what makes every handle the C side passes
//! in checkable.
//!
//! # Contract
//!
//! * A handle (`ci_context*`, `ci_sender*`, `ci_receiver*`,
//!   `ci_cuda_receiver*`, `ci_vulkan_receiver*`, `ci_gl_receiver*`,
//!   `ci_frame*`, `ci_timeline*`) is
//!   an opaque pointer that is never dereferenced: its value is a key into
//!   one global table (`Mutex<HashMap<usize, Object>>`) of the live objects,
//!   each tagged with its kind. Keys come from a counter (a generation):
//!   they are never reused, so a freed handle stays an unknown key forever,
//!   even after other objects are made.
//! * Looking a handle up ([`context`], [`sender`], [`receiver`],
//!   [`cuda_receiver`], [`vulkan_receiver`], [`gl_receiver`], [`frame`],
//!   [`timeline`])
//!   returns a clone of the object's `Arc` (the table's lock is held only
//!   for the lookup), or an error: [`ci_status::CI_NULL_POINTER`] for NULL,
//!   [`ci_status::CI_WRONG_HANDLE`] for an unknown key (freed, or never a handle:
//!   any pointer value is only compared, never read) or a handle of another
//!   kind. A call in flight on one thread keeps its object alive when
//!   another thread frees the handle; the object goes when the last such
//!   call returns.
//! * [`remove`] takes an object out of the table; the caller drops it after
//!   the table's lock is released (a sender's drop joins its threads).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use cuda_interop_frames::cuda_receiver::CudaReceiver;
use cuda_interop_frames::host_receiver::HostReceiver;
use cuda_interop_frames::session::Frame;
use vk_export::markers::{DeviceLocal, HostVisible};
use vk_export::Context;

use crate::{ci_status, CiError};

/// A sender of either memory.
#[derive(Debug)]
pub(crate) enum AnySender {
    /// Host-visible slots (a device without device-local memory), and its
    /// opened frames' tokens.
    Host(cuda_interop_frames::sender::Sender<HostVisible>, Tokens),
    /// Device-local slots, and its opened frames' tokens.
    Device(cuda_interop_frames::sender::Sender<DeviceLocal>, Tokens),
    /// A ring of images (`ci_image_sender_new`), of the format it was made
    /// with, and the frames recorded into the application's command
    /// buffers (`ci_sender_record_copy`) or opened for its submissions
    /// (`ci_sender_open`) not yet presented.
    Image(Box<dyn ImageRing>, Tokens),
}

impl AnySender {
    /// The sender as a ring that opens slots for the application's
    /// submissions, and its tokens.
    pub(crate) fn opened_parts(&mut self) -> (&mut dyn OpenedRing, &mut Tokens) {
        match self {
            AnySender::Host(s, t) => (s, t),
            AnySender::Device(s, t) => (s, t),
            AnySender::Image(s, t) => (s.as_opened(), t),
        }
    }
}

/// The frames a C sender recorded (`ci_sender_record_copy`, an image ring's)
/// or opened (`ci_sender_open`) and has not presented or abandoned, by the
/// token the C side holds: from one counter for the whole process, so a
/// token is never reused and never another sender's (nor a recorded
/// frame's an opened one's).
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    frames: HashMap<u64, cuda_interop_frames::sender::RecordedFrame>,
    opened: HashMap<u64, cuda_interop_frames::sender::OpenedFrame>,
}

/// The last token given out (by any sender).
static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);

fn next_token() -> u64 {
    LAST_TOKEN.fetch_add(1, Ordering::Relaxed) + 1
}

impl Tokens {
    /// Keeps `frame`; its token (never 0).
    pub(crate) fn insert(&mut self, frame: cuda_interop_frames::sender::RecordedFrame) -> u64 {
        let token = next_token();
        self.frames.insert(token, frame);
        token
    }

    /// Keeps opened `frame`; its token (never 0).
    pub(crate) fn insert_opened(&mut self, frame: cuda_interop_frames::sender::OpenedFrame) -> u64 {
        let token = next_token();
        self.opened.insert(token, frame);
        token
    }

    /// Whether `token` is an opened frame of this sender's, or why not.
    pub(crate) fn check_opened(&self, token: u64) -> Result<(), CiError> {
        if self.opened.contains_key(&token) {
            Ok(())
        } else {
            Err(CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!(
                    "opened is {token}: not a slot this sender opened (ci_sender_open), or one \
                     already presented or abandoned"
                ),
            ))
        }
    }

    /// Takes the opened frame of `token` out, or says why there is none.
    pub(crate) fn take_opened(
        &mut self,
        token: u64,
    ) -> Result<cuda_interop_frames::sender::OpenedFrame, CiError> {
        self.check_opened(token)?;
        Ok(self.opened.remove(&token).expect("checked above"))
    }

    /// Takes the frame of `token` out, or says why there is none.
    pub(crate) fn take(
        &mut self,
        token: u64,
    ) -> Result<cuda_interop_frames::sender::RecordedFrame, CiError> {
        self.frames.remove(&token).ok_or_else(|| {
            CiError::new(
                ci_status::CI_INVALID_ARGUMENT,
                format!(
                    "recorded is {token}: not a frame this sender recorded \
                     (ci_sender_record_copy, ci_sender_record_into), or one already presented or \
                     abandoned"
                ),
            )
        })
    }
}

/// The application's image as a copy source (`ci_sender_present_copy`,
/// parsed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopySource {
    pub(crate) image: vk_export::ash::vk::Image,
    pub(crate) extent: [u32; 2],
    pub(crate) offset: [u32; 2],
    pub(crate) layout: vk_export::ash::vk::ImageLayout,
    pub(crate) sharing: vk_export::SourceSharing,
}

/// What an image ring's sender does, whatever its format (the C side
/// picks the format at run time; implemented in `vulkan`).
pub(crate) trait ImageRing: Send + std::fmt::Debug {
    /// The ring as one that opens slots for the application's submissions.
    fn as_opened(&mut self) -> &mut dyn OpenedRing;
    /// The images' raw `VkFormat`.
    fn vk_format(&self) -> u32;
    fn stats(&self) -> cuda_interop_frames::sender::SenderStats;
    fn serve(&mut self, timeout: std::time::Duration);
    fn wait_for_receivers(&mut self, count: usize, timeout: std::time::Duration) -> bool;
    /// Presents a copy of `source` (as `WriteSlot::present_copy`).
    ///
    /// # Safety
    /// `source` is true of the caller's image (`SourceImage::new`'s
    /// contract).
    unsafe fn present_copy(
        &mut self,
        source: CopySource,
        timestamp_ns: u64,
        timeout: std::time::Duration,
    ) -> Result<u64, CiError>;
    /// Records a copy of `source` into `cmd` (as
    /// `WriteSlot::record_copy_into`).
    ///
    /// # Safety
    /// `record_copy_into`'s contract, and `source` is true of the image.
    unsafe fn record_copy(
        &mut self,
        cmd: vk_export::ash::vk::CommandBuffer,
        source: CopySource,
        timeout: std::time::Duration,
    ) -> Result<cuda_interop_frames::sender::RecordedFrame, CiError>;
    /// Records the application's own commands into `cmd` (as
    /// `WriteSlot::record_into`): `record` gets the device, `cmd` and the
    /// slot's image (in `GENERAL`, owned by the main family).
    ///
    /// # Safety
    /// `record_into`'s contract for `cmd` and what `record` records.
    unsafe fn record_into(
        &mut self,
        cmd: vk_export::ash::vk::CommandBuffer,
        record: &mut dyn FnMut(
            &vk_export::ash::Device,
            vk_export::ash::vk::CommandBuffer,
            vk_export::ash::vk::Image,
        ),
        timeout: std::time::Duration,
    ) -> Result<cuda_interop_frames::sender::RecordedFrame, CiError>;
    /// The images' extent.
    fn extent(&self) -> [u32; 2];
    /// `Sender::present_recorded`.
    ///
    /// # Safety
    /// Its contract.
    unsafe fn present_recorded(
        &mut self,
        frame: cuda_interop_frames::sender::RecordedFrame,
        timestamp_ns: u64,
    ) -> Result<u64, CiError>;
    /// `Sender::abandon_recorded`.
    ///
    /// # Safety
    /// Its contract.
    unsafe fn abandon_recorded(
        &mut self,
        frame: cuda_interop_frames::sender::RecordedFrame,
    ) -> Result<(), CiError>;
}

/// What `ci_opened_slot` says of a slot's resource.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotView {
    pub(crate) kind: u32,
    pub(crate) buffer: u64,
    pub(crate) buffer_size: u64,
    pub(crate) image: u64,
    pub(crate) vk_format: u32,
}

/// A sender of either slot kind, as the opened-slot calls use it.
pub(crate) trait OpenedRing {
    /// The context the sender was made on.
    fn context(&self) -> &vk_export::Context;
    /// Takes a free slot (within `timeout`) and opens it for `role`'s
    /// family: the frame, what the slot is, and the ring's extent and row
    /// pitch.
    fn open(
        &mut self,
        role: vk_export::QueueRole,
        timeout: std::time::Duration,
    ) -> Result<
        (
            cuda_interop_frames::sender::OpenedFrame,
            SlotView,
            [u32; 2],
            u64,
        ),
        CiError,
    >;
    /// `Sender::present_opened`.
    fn present_opened(
        &mut self,
        frame: cuda_interop_frames::sender::OpenedFrame,
        written: (&vk_export::TimelineSemaphore, u64),
        timestamp_ns: u64,
    ) -> Result<u64, CiError>;
    /// `Sender::abandon_opened`.
    ///
    /// # Safety
    /// Its contract.
    unsafe fn abandon_opened(
        &mut self,
        frame: cuda_interop_frames::sender::OpenedFrame,
    ) -> Result<(), CiError>;
}

/// A frame handed out, with what `ci_frame_info` reports.
#[derive(Debug)]
pub(crate) struct FrameEntry {
    /// The receiver handle it came from.
    pub(crate) owner: usize,
    /// Its description.
    pub(crate) info: crate::ci_frame_info,
    /// The frame (taken out when released).
    pub(crate) frame: Mutex<Option<Frame>>,
}

/// One live object.
#[derive(Debug)]
pub(crate) enum Object {
    Context(Context),
    Sender(Arc<Mutex<AnySender>>),
    Receiver(Arc<HostReceiver>),
    CudaReceiver(Arc<CudaReceiver>),
    VulkanReceiver(Arc<cuda_interop_frames::image_reader::ImageReader>),
    GlReceiver(Arc<crate::thread_bound::ThreadBound>),
    Frame(Arc<FrameEntry>),
    Timeline(Arc<vk_export::TimelineSemaphore>),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Context(_) => "ci_context*",
            Object::Sender(_) => "ci_sender*",
            Object::Receiver(_) => "ci_receiver*",
            Object::CudaReceiver(_) => "ci_cuda_receiver*",
            Object::VulkanReceiver(_) => "ci_vulkan_receiver*",
            Object::GlReceiver(_) => "ci_gl_receiver*",
            Object::Frame(_) => "ci_frame*",
            Object::Timeline(_) => "ci_timeline*",
        }
    }
}

static TABLE: LazyLock<Mutex<HashMap<usize, Object>>> = LazyLock::new(Default::default);
/// The next key's generation (keys are `generation * 16`: non-null, never
/// reused, aligned like a pointer to a struct would be).
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn table() -> std::sync::MutexGuard<'static, HashMap<usize, Object>> {
    // The table is consistent between statements: a panic elsewhere while
    // it was locked leaves it usable.
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Registers `object`; its handle's value.
pub(crate) fn insert(object: Object) -> usize {
    let key = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(16);
    table().insert(key, object);
    key
}

fn unknown(key: usize, expected: &str) -> CiError {
    CiError::new(
        ci_status::CI_WRONG_HANDLE,
        format!(
            "{key:#x} is not a live {expected} handle (freed already, or never one): pass a \
             handle the library returned and has not freed"
        ),
    )
}

fn lookup<T>(
    key: usize,
    expected: &'static str,
    pick: impl FnOnce(&Object) -> Option<T>,
) -> Result<T, CiError> {
    if key == 0 {
        return Err(CiError::new(
            ci_status::CI_NULL_POINTER,
            format!("the {expected} handle is NULL: pass one the library returned"),
        ));
    }
    let table = table();
    let object = table.get(&key).ok_or_else(|| unknown(key, expected))?;
    pick(object).ok_or_else(|| {
        CiError::new(
            ci_status::CI_WRONG_HANDLE,
            format!(
                "{key:#x} is a {}, not a {expected}: pass a handle of the kind the function \
                 takes",
                object.kind()
            ),
        )
    })
}

/// The context of handle `key`.
pub(crate) fn context(key: usize) -> Result<Context, CiError> {
    lookup(key, "ci_context*", |o| match o {
        Object::Context(c) => Some(c.clone()),
        _ => None,
    })
}

/// The sender of handle `key`.
pub(crate) fn sender(key: usize) -> Result<Arc<Mutex<AnySender>>, CiError> {
    lookup(key, "ci_sender*", |o| match o {
        Object::Sender(s) => Some(s.clone()),
        _ => None,
    })
}

/// The receiver of handle `key`.
pub(crate) fn receiver(key: usize) -> Result<Arc<HostReceiver>, CiError> {
    lookup(key, "ci_receiver*", |o| match o {
        Object::Receiver(r) => Some(r.clone()),
        _ => None,
    })
}

/// The CUDA receiver of handle `key`.
pub(crate) fn cuda_receiver(key: usize) -> Result<Arc<CudaReceiver>, CiError> {
    lookup(key, "ci_cuda_receiver*", |o| match o {
        Object::CudaReceiver(r) => Some(r.clone()),
        _ => None,
    })
}

/// The Vulkan receiver of handle `key`.
pub(crate) fn vulkan_receiver(
    key: usize,
) -> Result<Arc<cuda_interop_frames::image_reader::ImageReader>, CiError> {
    lookup(key, "ci_vulkan_receiver*", |o| match o {
        Object::VulkanReceiver(r) => Some(r.clone()),
        _ => None,
    })
}

/// The OpenGL receiver of handle `key`.
pub(crate) fn gl_receiver(key: usize) -> Result<Arc<crate::thread_bound::ThreadBound>, CiError> {
    lookup(key, "ci_gl_receiver*", |o| match o {
        Object::GlReceiver(r) => Some(r.clone()),
        _ => None,
    })
}

/// The frame of handle `key`.
pub(crate) fn frame(key: usize) -> Result<Arc<FrameEntry>, CiError> {
    lookup(key, "ci_frame*", |o| match o {
        Object::Frame(f) => Some(f.clone()),
        _ => None,
    })
}

/// The timeline of handle `key`.
pub(crate) fn timeline(key: usize) -> Result<Arc<vk_export::TimelineSemaphore>, CiError> {
    lookup(key, "ci_timeline*", |o| match o {
        Object::Timeline(t) => Some(t.clone()),
        _ => None,
    })
}

/// Takes handle `key` out of the table if it is a live handle that `is`
/// accepts (checked as the lookups check); the caller drops it.
pub(crate) fn remove(
    key: usize,
    expected: &'static str,
    is: impl FnOnce(&Object) -> bool,
) -> Result<Object, CiError> {
    lookup(key, expected, |o| is(o).then_some(()))?;
    // Between the check and here another thread may have removed it.
    table().remove(&key).ok_or_else(|| unknown(key, expected))
}

/// Takes frame handle `key` out of the table, and the frame out of it
/// (`None`: it was given back already, by a free racing this call).
pub(crate) fn take_frame(key: usize) -> Result<Option<Frame>, CiError> {
    let Object::Frame(f) = remove(key, "ci_frame*", |o| matches!(o, Object::Frame(_)))? else {
        unreachable!("remove checked the kind");
    };
    let taken = f
        .frame
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    Ok(taken)
}

/// Frees receiver handle `key` (0, a NULL handle: nothing) if it is a live
/// handle that `is` accepts: every frame it handed out is taken out of the
/// table and dropped (released) first, then the receiver.
pub(crate) fn free_receiver(
    key: usize,
    expected: &'static str,
    is: impl FnOnce(&Object) -> bool,
) -> Result<(), CiError> {
    if key == 0 {
        return Ok(());
    }
    let receiver = remove(key, expected, is)?;
    drop(remove_frames_of(key));
    drop(receiver);
    Ok(())
}

/// Takes every frame that receiver `owner` handed out out of the table.
fn remove_frames_of(owner: usize) -> Vec<Object> {
    let mut table = table();
    let keys: Vec<usize> = table
        .iter()
        .filter(|(_, o)| matches!(o, Object::Frame(f) if f.owner == owner))
        .map(|(k, _)| *k)
        .collect();
    keys.into_iter().filter_map(|k| table.remove(&k)).collect()
}
