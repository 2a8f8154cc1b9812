//! wgpu 30 on a vk-export device: exportable images and buffers as
//! [`wgpu::Texture`]s and [`wgpu::Buffer`]s, and vk-export timeline
//! semaphores waited and signalled in wgpu submissions.
//!
//! # Contract
//!
//! * **One device, two owners.** [`InteropDevice::new`] creates the Vulkan
//!   instance and device itself, with what wgpu needs and what vk-export
//!   needs (`REQUIRED_DEVICE_EXTENSIONS`, `VK_KHR_external_semaphore_fd`
//!   where offered, timeline semaphores), hands the device to wgpu through
//!   wgpu-hal and wraps the same device in a [`vk_export::Context`]. The
//!   device and instance are destroyed when the last of the three users
//!   goes: wgpu's device, wgpu's instance and the vk-export context (with
//!   every resource made from it). No order of drops destroys either under
//!   the other side. The adapter's Drop first waits (bounded:
//!   [`vk_export::DROP_WAIT`]) until wgpu's last submission completed and
//!   drops wgpu's queue and device only then; when it does not complete
//!   (a wait on a timeline nobody signals) everything is leaked and
//!   reported through [`vk_export::drop_errors`], never destroyed under the
//!   pending work.
//! * **Queues.** wgpu gets queue 0 of a graphics family; vk-export gets
//!   other queues only (queue 1 of the same family or a queue of another
//!   compute family, and a transfer-only family's queue where there is
//!   one), so the two never submit to one `VkQueue`. A device with a single
//!   queue (lavapipe) is refused by [`InteropDevice::new`]
//!   ([`Error::OneQueue`]); [`InteropDevice::new_shared_queue`] (`unsafe`)
//!   shares it, every wgpu submission then runs under the context's queue
//!   lock and the bare [`wgpu::Queue`] is not handed out.
//! * **Submissions** go through [`InteropQueue`]: its semaphore waits and
//!   signals are staged on wgpu-hal's queue and submitted with the command
//!   buffers under one lock, so no other submission of this crate takes
//!   them; a submission wgpu refuses leaves none staged and none of its
//!   signals recorded (counted per staged entry). Signal values are
//!   checked and recorded with vk-export's own submitted-signal bookkeeping
//!   ([`vk_export::TimelineSemaphore::reserve_submitted_signals`]), and every
//!   semaphore is kept alive until wgpu reports the submission done (see
//!   [`InteropQueue::submit_with`] for what is refused).
//! * **Lifetimes.** A texture or buffer made from a vk-export resource holds
//!   a keep-alive of it in wgpu-hal's drop callback: the `VkImage` /
//!   `VkBuffer` and its memory live until wgpu has dropped its object, which
//!   wgpu does only after its last submission using it completed while
//!   its queue lives (the adapter's Drop keeps the queue until wgpu is
//!   idle; see [`InteropDevice::new_shared_queue`] for the shared queue).
//! * **Layouts.** wgpu takes an image as uninitialised (its first use
//!   discards the contents) and tracks the layout from there; CUDA can use
//!   the memory in `GENERAL` only, which is where a storage-texture access
//!   (a compute shader) leaves it. See [`InteropDevice::texture_from_image`].
//!
//! # Example
//!
//! wgpu writes a frame and signals an exportable timeline that CUDA imports
//! (the whole loop: `examples/wgpu_to_cuda.rs`).
//!
//! ```no_run
//! use cuda_interop_wgpu::{InteropDevice, Options, TimelinePoint};
//! use vk_export::format::Rgba8Unorm;
//! use vk_export::{ExportableImage, ImageDesc, TimelineSemaphore};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = InteropDevice::new(&Options::default())?;    // refused on a one-queue device
//! let image = ExportableImage::<Rgba8Unorm>::new(device.context(), ImageDesc::new_2d(1920, 1080))?;
//! // SAFETY: only wgpu changes the image's layout while the texture lives.
//! let texture = unsafe { device.texture_from_image(&image) }?;
//! let timeline = TimelineSemaphore::new(device.context())?; // exportable: CUDA imports it
//! let commands = cuda_interop_wgpu::pattern::encode_pattern(&device, &texture, 0);
//! device.queue().submit_with([commands], &[], &[TimelinePoint::new(&timeline, 1)])?;
//! // CUDA: cuda.import_image(&image)?, cuda.import_semaphore(&timeline)?.wait(&stream, 1)?
//! # Ok(())
//! # }
//! ```

use std::ffi::CStr;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};

use ash::vk;
use vk_export::format::Format;
use vk_export::markers::{MemoryLocation, Optimal, Usage};
use vk_export::{
    Context, DeviceUuid, ExportableBuffer, ExportableImage, KeepAlive, QueueChoice, QueueRole,
    Queues, SubmittedSignals, TimelineSemaphore, Validation, ValidationMessenger, DROP_WAIT,
    REQUIRED_DEVICE_EXTENSIONS,
};
use wgpu_hal::api::Vulkan;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Vulkan {
        /// The call.
        call: &'static str,
        /// Its result.
        result: vk::Result,
    },
    /// No device has what the adapter needs.
    #[error("no suitable Vulkan device: {0}")]
    NoDevice(String),
    /// The device has one queue, which wgpu and vk-export would share.
    #[error(
        "the device has one queue ({0}); wgpu and vk-export need one each \
         (InteropDevice::new_shared_queue shares it, with its contract)"
    )]
    OneQueue(String),
    /// A format, usage or shape wgpu cannot take, or a resource of another device.
    #[error("refused: {0}")]
    Refused(String),
    /// wgpu-hal or wgpu refused.
    #[error("wgpu: {0}")]
    Wgpu(String),
    /// vk-export failed.
    #[error(transparent)]
    VkExport(#[from] vk_export::Error),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn vk_err(call: &'static str) -> impl FnOnce(vk::Result) -> Error {
    move |result| Error::Vulkan { call, result }
}

/// Options for [`InteropDevice::new`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Pick the physical device with this `deviceUUID` (for instance a CUDA
    /// device's); otherwise the first suitable one, discrete GPUs first.
    pub device_uuid: Option<DeviceUuid>,
    /// The Khronos validation layer: errors are counted
    /// ([`InteropDevice::validation_errors`]) and written to stderr.
    pub validation: Validation,
}

/// The instance and device: destroyed when the last `Arc` goes (wgpu's
/// instance and device hold one each in their drop callbacks, the vk-export
/// context one as its owner).
struct Owner {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: OnceLock<ash::Device>,
    /// vk-export's counting messenger, where validation is on.
    messenger: Option<ValidationMessenger>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        // SAFETY: the last user of the device and instance is gone (wgpu
        // calls its drop callbacks after destroying its own objects; the
        // context drops its owner after destroying its own); children first.
        unsafe {
            if let Some(device) = self.device.get() {
                device.destroy_device(None);
            }
            drop(self.messenger.take());
            self.instance.destroy_instance(None);
        }
    }
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// The wgpu device and the vk-export context on one Vulkan device.
pub struct InteropDevice {
    queue: InteropQueue,
    // ManuallyDrop: dropped in `Drop` once wgpu is idle, leaked otherwise.
    device: ManuallyDrop<wgpu::Device>,
    adapter: ManuallyDrop<wgpu::Adapter>,
    instance: ManuallyDrop<wgpu::Instance>,
    context: Context,
    owner: ManuallyDrop<Arc<Owner>>,
    wgpu_queue: QueueChoice,
}

impl fmt::Debug for InteropDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InteropDevice")
            .field("adapter", &self.adapter.get_info().name)
            .field("wgpu_queue", &self.wgpu_queue)
            .field("context", &self.context)
            .field("shared_queue", &self.queue.shared.is_some())
            .finish()
    }
}

/// How the queues are split.
struct Plan {
    wgpu: QueueChoice,
    vk: Option<Queues>,
    counts: Vec<u32>,
}

fn plan_queues(families: &[vk::QueueFamilyProperties]) -> Option<Plan> {
    let has = |f: &vk::QueueFamilyProperties, flags| f.queue_flags.contains(flags);
    let graphics = families
        .iter()
        .position(|f| has(f, vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE))?
        as u32;
    let wgpu = QueueChoice {
        family: graphics,
        index: 0,
    };
    let main = if families[graphics as usize].queue_count >= 2 {
        Some(QueueChoice {
            family: graphics,
            index: 1,
        })
    } else {
        families
            .iter()
            .enumerate()
            .position(|(i, f)| {
                i as u32 != graphics
                    && f.queue_flags
                        .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
            })
            .map(|family| QueueChoice {
                family: family as u32,
                index: 0,
            })
    };
    let transfer = families
        .iter()
        .position(|f| {
            has(f, vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        })
        .map(|family| QueueChoice {
            family: family as u32,
            index: 0,
        });
    let vk = main.map(|main| Queues { main, transfer });
    let mut counts = vec![0u32; families.len()];
    for q in std::iter::once(wgpu).chain(
        vk.iter()
            .flat_map(|q| std::iter::once(q.main).chain(q.transfer)),
    ) {
        counts[q.family as usize] = counts[q.family as usize].max(q.index + 1);
    }
    Some(Plan { wgpu, vk, counts })
}

impl InteropDevice {
    /// Creates the instance and device, wgpu's device and queue on queue 0
    /// of a graphics family, and the vk-export context on other queues.
    /// A device with a single queue is refused ([`Error::OneQueue`]).
    pub fn new(options: &Options) -> Result<InteropDevice> {
        // SAFETY: `false`: a device with one queue is refused, nothing is shared.
        unsafe { Self::create(options, false) }
    }

    /// As [`InteropDevice::new`], but where the device has a single queue
    /// wgpu and the vk-export context share it: every submission of
    /// [`InteropQueue`] runs under the context's lock for that queue, and
    /// [`InteropQueue::wgpu_queue`] is `None`.
    ///
    /// # Safety
    /// wgpu also uses its queue outside submissions this crate can see:
    /// wgpu's queue, when its last reference goes, waits for idle
    /// (`vkQueueWaitIdle`, which needs the queue's lock) on whatever thread
    /// drops that reference, outside the context's lock. The adapter's Drop
    /// drops its own reference under the lock, but wgpu-core hands
    /// references of its queue to work it does on other threads. The
    /// caller makes sure that while the [`InteropDevice`] is being dropped,
    /// no other thread makes any call on a wgpu object of this device
    /// (among them [`wgpu::Device::poll`], [`wgpu::Buffer::map_async`],
    /// [`wgpu::Buffer::destroy`], [`wgpu::Texture::destroy`], dropping a
    /// texture, buffer or command buffer, and creating anything), and that
    /// no clone of [`InteropDevice::device`] outlives the adapter while such
    /// calls can still be made on it.
    pub unsafe fn new_shared_queue(options: &Options) -> Result<InteropDevice> {
        // SAFETY: the caller's contract.
        unsafe { Self::create(options, true) }
    }

    /// # Safety
    /// With `share`, as [`InteropDevice::new_shared_queue`].
    unsafe fn create(options: &Options, share: bool) -> Result<InteropDevice> {
        // SAFETY: loading the system's Vulkan loader runs its initialisers.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| Error::NoDevice(format!("no Vulkan loader: {e}")))?;
        let flags = wgpu::InstanceFlags::empty();
        let mut extensions =
            wgpu_hal::vulkan::Instance::desired_extensions(&entry, vk::API_VERSION_1_2, flags)
                .map_err(|e| Error::Wgpu(e.to_string()))?;
        // SAFETY: plain enumeration.
        let layers = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(vk_err("vkEnumerateInstanceLayerProperties"))?;
        let has_layer = layers
            .iter()
            .any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER));
        let validation = match (options.validation, has_layer) {
            (Validation::Off, _) => false,
            (Validation::IfAvailable, have) => have,
            (Validation::Required, have) => {
                if !have {
                    return Err(Error::NoDevice(
                        "VK_LAYER_KHRONOS_validation is not installed (Debian: vulkan-validationlayers)"
                            .into(),
                    ));
                }
                true
            }
        };
        if validation && !extensions.contains(&ash::ext::debug_utils::NAME) {
            extensions.push(ash::ext::debug_utils::NAME);
        }
        // SAFETY: plain query.
        let api_version = match unsafe { entry.try_enumerate_instance_version() } {
            Ok(Some(v)) => v.min(vk::API_VERSION_1_3),
            _ => vk::API_VERSION_1_0,
        };
        if api_version < vk::API_VERSION_1_2 {
            return Err(Error::NoDevice(
                "the Vulkan loader is older than 1.2".into(),
            ));
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"cuda-interop-wgpu")
            .api_version(api_version);
        let extension_ptrs: Vec<_> = extensions.iter().map(|e| e.as_ptr()).collect();
        let layer_ptrs = [VALIDATION_LAYER.as_ptr()];
        let mut info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_extension_names(&extension_ptrs);
        if validation {
            info = info.enabled_layer_names(&layer_ptrs);
        }
        // SAFETY: the create info and what it points to live across the call.
        let instance =
            unsafe { entry.create_instance(&info, None) }.map_err(vk_err("vkCreateInstance"))?;
        let messenger = if validation {
            // SAFETY: the instance was made from `entry` with debug utils
            // (added above when validating); the owner destroys it only
            // after the messenger.
            match unsafe { ValidationMessenger::new(&entry, &instance) } {
                Ok(m) => Some(m),
                Err(e) => {
                    // SAFETY: nothing was made from the instance.
                    unsafe { instance.destroy_instance(None) };
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        let owner = Arc::new(Owner {
            _entry: entry.clone(),
            instance: instance.clone(),
            device: OnceLock::new(),
            messenger,
        });
        let instance_owner = owner.clone();
        // SAFETY: the instance was made from `entry` with `api_version`, the
        // extensions wgpu-hal desires (and debug utils) and `flags`; it stays
        // valid until the callback (which holds the owner) has run.
        let hal_instance = unsafe {
            wgpu_hal::vulkan::Instance::from_raw(
                entry.clone(),
                instance.clone(),
                api_version,
                0,
                None,
                extensions,
                flags,
                wgpu::MemoryBudgetThresholds::default(),
                false,
                Some(Box::new(move || drop(instance_owner))),
            )
        }
        .map_err(|e| Error::Wgpu(e.to_string()))?;

        // SAFETY: plain enumeration on a live instance.
        let physicals = unsafe { instance.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        let mut seen = Vec::new();
        let mut candidates = Vec::new();
        for physical in physicals {
            // SAFETY: plain queries.
            let (props, offered, families) = unsafe {
                (
                    instance.get_physical_device_properties(physical),
                    instance
                        .enumerate_device_extension_properties(physical)
                        .unwrap_or_default(),
                    instance.get_physical_device_queue_family_properties(physical),
                )
            };
            let mut id = vk::PhysicalDeviceIDProperties::default();
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
            // SAFETY: plain query.
            unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
            let uuid = DeviceUuid::from(id.device_uuid);
            let name = props
                .device_name_as_c_str()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            seen.push(format!("{name} ({uuid})"));
            if options.device_uuid.is_some_and(|want| want != uuid) {
                continue;
            }
            let has = |e: &CStr| {
                offered
                    .iter()
                    .any(|x| x.extension_name_as_c_str().ok() == Some(e))
            };
            let mut features12 = vk::PhysicalDeviceVulkan12Features::default();
            let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut features12);
            // SAFETY: plain query.
            unsafe { instance.get_physical_device_features2(physical, &mut features) };
            if props.api_version < vk::API_VERSION_1_2
                || features12.timeline_semaphore == vk::FALSE
                || !REQUIRED_DEVICE_EXTENSIONS.iter().all(|e| has(e))
            {
                continue;
            }
            let Some(plan) = plan_queues(&families) else {
                continue;
            };
            let rank = match props.device_type {
                vk::PhysicalDeviceType::DISCRETE_GPU => 0,
                vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
                _ => 2,
            };
            let semaphore_fd = has(ash::khr::external_semaphore_fd::NAME);
            candidates.push((rank, physical, plan, semaphore_fd, name));
        }
        candidates.sort_by_key(|c| c.0);
        let Some((_, physical, plan, semaphore_fd, name)) = candidates.into_iter().next() else {
            return Err(Error::NoDevice(format!(
                "none has Vulkan 1.2, timeline semaphores, VK_KHR_external_memory_fd and a \
                 graphics queue (found: {})",
                if seen.is_empty() {
                    "no devices".into()
                } else {
                    seen.join(", ")
                }
            )));
        };
        let queues = match (plan.vk, share) {
            (Some(q), _) => q,
            (None, true) => Queues {
                main: plan.wgpu,
                transfer: None,
            },
            (None, false) => return Err(Error::OneQueue(name)),
        };
        let shared = plan.vk.is_none();
        let exposed = hal_instance
            .expose_adapter(physical)
            .ok_or_else(|| Error::NoDevice(format!("wgpu-hal does not expose {name}")))?;
        // What the vk-export formats need of wgpu where the adapter has it:
        // R16 and R16G16 UNORM textures, BGRA8 storage bindings.
        let wgpu_features = exposed.features & FORMAT_FEATURES;
        let limits = exposed.capabilities.limits.clone();
        let mut device_extensions = exposed.adapter.required_device_extensions(wgpu_features);
        for e in REQUIRED_DEVICE_EXTENSIONS
            .iter()
            .chain(semaphore_fd.then_some(&ash::khr::external_semaphore_fd::NAME))
        {
            if !device_extensions.contains(e) {
                device_extensions.push(e);
            }
        }
        let mut phd_features = exposed
            .adapter
            .physical_device_features(&device_extensions, wgpu_features);
        let priorities = [1.0f32; 2];
        let queue_infos: Vec<_> = plan
            .counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(family, &n)| {
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(family as u32)
                    .queue_priorities(&priorities[..n as usize])
            })
            .collect();
        let extension_ptrs: Vec<_> = device_extensions.iter().map(|e| e.as_ptr()).collect();
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_extension_names(&extension_ptrs);
        let info = phd_features.add_to_device_create(info);
        // SAFETY: the create info and its chain live across the call.
        let device = unsafe { instance.create_device(physical, &info, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        let _ = owner.device.set(device.clone());
        let device_owner = owner.clone();
        // SAFETY: the device was made from this adapter with `family_index`,
        // wgpu-hal's required extensions (and more) and its
        // `physical_device_features`; it stays valid until the callback
        // (which holds the owner) has run.
        let open = unsafe {
            exposed.adapter.device_from_raw(
                device.clone(),
                Some(Box::new(move || drop(device_owner))),
                &device_extensions,
                wgpu_features,
                &limits,
                &wgpu::MemoryHints::default(),
                plan.wgpu.family,
                plan.wgpu.index,
            )
        }
        .map_err(|e| Error::Wgpu(e.to_string()))?;
        // SAFETY: the instance was made by wgpu-hal's `from_raw` above.
        let wgpu_instance = unsafe { wgpu::Instance::from_hal::<Vulkan>(hal_instance) };
        // SAFETY: the adapter was exposed by that instance.
        let adapter = unsafe { wgpu_instance.create_adapter_from_hal(exposed) };
        let desc = wgpu::DeviceDescriptor {
            label: Some("cuda-interop-wgpu"),
            required_features: wgpu_features,
            required_limits: limits,
            ..Default::default()
        };
        // SAFETY: the device was opened from that adapter's hal adapter.
        let (wgpu_device, wgpu_queue) = unsafe { adapter.create_device_from_hal(open, &desc) }
            .map_err(|e| Error::Wgpu(e.to_string()))?;
        // SAFETY: the device was made from `physical` of `instance` with
        // Vulkan 1.2 or later, `timelineSemaphore` (wgpu-hal enables it where
        // offered, checked above), REQUIRED_DEVICE_EXTENSIONS and, with
        // `semaphore_fd`, VK_KHR_external_semaphore_fd; the queues were
        // created with it. Unshared, wgpu never submits to them (it has
        // queue `plan.wgpu`); shared, every wgpu submission runs inside
        // `with_queue_of` (InteropQueue) and the caller of
        // `new_shared_queue` keeps wgpu's other queue uses away from drops.
        // The owner keeps device and instance until the context is gone.
        // Resources used by wgpu are kept alive by wgpu's drop callbacks.
        let context = unsafe {
            Context::from_raw_with_owner(
                entry,
                instance,
                physical,
                device,
                queues,
                semaphore_fd,
                Box::new(owner.clone()),
            )
        }?;
        Ok(InteropDevice {
            queue: InteropQueue {
                queue: Some(wgpu_queue),
                shared: shared.then(|| context.clone()),
                context: context.clone(),
                lock: Mutex::new(()),
            },
            device: ManuallyDrop::new(wgpu_device),
            adapter: ManuallyDrop::new(adapter),
            instance: ManuallyDrop::new(wgpu_instance),
            context,
            owner: ManuallyDrop::new(owner),
            wgpu_queue: plan.wgpu,
        })
    }

    /// The vk-export context on the same device (its queues are not wgpu's,
    /// except on a shared queue).
    pub fn context(&self) -> &Context {
        &self.context
    }
    /// wgpu's device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }
    /// wgpu's adapter.
    pub fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }
    /// wgpu's instance.
    pub fn instance(&self) -> &wgpu::Instance {
        &self.instance
    }
    /// Where wgpu submits, and how.
    pub fn queue(&self) -> &InteropQueue {
        &self.queue
    }
    /// wgpu's queue: its family and index.
    pub fn wgpu_queue_choice(&self) -> QueueChoice {
        self.wgpu_queue
    }
    /// Whether wgpu and the context share one `VkQueue`
    /// ([`InteropDevice::new_shared_queue`] on a one-queue device).
    pub fn shares_queue(&self) -> bool {
        self.queue.shared.is_some()
    }
    /// Validation errors reported so far (0 without the layer).
    pub fn validation_errors(&self) -> u32 {
        self.owner
            .messenger
            .as_ref()
            .map_or(0, ValidationMessenger::errors)
    }
    /// The message ids (VUIDs) of those errors.
    pub fn validation_error_ids(&self) -> Vec<String> {
        self.owner
            .messenger
            .as_ref()
            .map_or_else(Vec::new, ValidationMessenger::error_ids)
    }

    fn check_context(&self, ctx: &Context, what: &str) -> Result<()> {
        if ctx.is_same(&self.context) {
            Ok(())
        } else {
            Err(Error::Refused(format!(
                "{what} belongs to another Vulkan device than this adapter's"
            )))
        }
    }

    /// `image` as a [`wgpu::Texture`] of the same format, extent, levels,
    /// layers and usage. The texture keeps the image alive (a keep-alive in
    /// wgpu-hal's drop callback) until wgpu has dropped it, after its last
    /// use. Refused: an image of another device, a format without a wgpu
    /// equivalent (all of vk-export's have one) or whose wgpu format needs a
    /// feature the adapter lacks (R16 and R16G16 UNORM need
    /// `TEXTURE_FORMAT_16BIT_NORM`, enabled where offered), a cube image.
    ///
    /// wgpu takes the image as uninitialised: its first use discards the
    /// contents (a render pass that clears, a compute shader that writes
    /// every texel). CUDA can use the memory only in `GENERAL`: end wgpu's
    /// use of a frame with a storage-texture access (as the
    /// `wgpu_to_cuda` example does) before CUDA waits for it.
    ///
    /// wgpu uses the image in its queue family and never releases it to
    /// `VK_QUEUE_FAMILY_EXTERNAL` itself. A frame sender's slot gets the
    /// hand-offs the spec asks for around wgpu's use from the sender
    /// (`cuda-interop-frames`' `WriteSlot::open` acquires it for wgpu's
    /// family in `GENERAL`, `OpenSlot::present` releases it after wgpu's
    /// timeline value: the `wgpu_frames` example). A direct hand-off to
    /// CUDA (the `wgpu_to_cuda` example) has no release: it relies on the
    /// driver keeping a `GENERAL` image of the same device coherent
    /// (NVIDIA does).
    ///
    /// # Safety
    /// While the texture lives, nothing but wgpu changes the image's layout
    /// or queue-family ownership, except ownership transfers in `GENERAL`
    /// that give it back to wgpu's family before wgpu's next use (a frame
    /// sender's open and present); no vk-export helper (`clear_image`,
    /// `read_image`, `release_image`, ...) and no other device or process
    /// uses the image in a way that needs a barrier, and the image is not
    /// wrapped a second time (each texture tracks its layout on its own).
    /// Other users (CUDA) access its memory only between semaphore-ordered
    /// hand-offs.
    pub unsafe fn texture_from_image<F: Format, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, Optimal, M, U>,
    ) -> Result<wgpu::Texture> {
        self.check_context(image.context(), "the image")?;
        let info = image.info();
        let format = texture_format(info.format())
            .ok_or_else(|| Error::Refused(format!("{} has no wgpu texture format", F::NAME)))?;
        let missing = format.required_features() - self.device.features();
        if !missing.is_empty() {
            return Err(Error::Refused(format!(
                "{} is wgpu's {format:?}, which needs the wgpu features {missing:?}: the adapter \
                 does not offer them",
                F::NAME
            )));
        }
        if !info.flags().is_empty() {
            return Err(Error::Refused(format!(
                "image flags {:?} (a cube image, or a mutable format): wgpu takes plain images",
                info.flags()
            )));
        }
        let [width, height, depth] = info.extent();
        let dimension = match info.image_type() {
            vk::ImageType::TYPE_1D => wgpu::TextureDimension::D1,
            vk::ImageType::TYPE_3D => wgpu::TextureDimension::D3,
            _ => wgpu::TextureDimension::D2,
        };
        let size = wgpu::Extent3d {
            width,
            height,
            depth_or_array_layers: depth.max(info.array_layers()),
        };
        let usage = texture_usages(info.usage());
        let hal_desc = wgpu_hal::TextureDescriptor {
            label: Some("vk-export image"),
            size,
            mip_level_count: info.mip_levels(),
            sample_count: 1,
            dimension,
            format,
            usage: texture_uses(usage),
            memory_flags: wgpu_hal::MemoryFlags::empty(),
            view_formats: Vec::new(),
        };
        let keep = image.keep_alive();
        // SAFETY: the device is wgpu's Vulkan device (made in `create`).
        let hal_device = unsafe { self.device.as_hal::<Vulkan>() }
            .ok_or_else(|| Error::Wgpu("the device is not a Vulkan device".into()))?;
        // SAFETY: the image was created on this device (checked above) with
        // exactly this format, extent, levels, layers, usage, one sample,
        // OPTIMAL tiling and no MUTABLE_FORMAT (no view formats); the
        // keep-alive in the callback keeps the image and its memory
        // (External: not wgpu's) valid until wgpu-hal calls it.
        let hal_texture = unsafe {
            hal_device.texture_from_raw(
                image.raw(),
                &hal_desc,
                Some(Box::new(move || drop(keep))),
                wgpu_hal::vulkan::TextureMemory::External,
            )
        };
        drop(hal_device);
        let desc = wgpu::TextureDescriptor {
            label: Some("vk-export image"),
            size,
            mip_level_count: info.mip_levels(),
            sample_count: 1,
            dimension,
            format,
            usage,
            view_formats: &[],
        };
        // SAFETY: made from this device's hal device, respecting `desc`;
        // UNINITIALIZED: wgpu discards the contents at its first barrier,
        // whatever layout the image is in (the caller's contract keeps
        // anyone else from changing it later).
        Ok(unsafe {
            self.device.create_texture_from_hal::<Vulkan>(
                hal_texture,
                &desc,
                wgpu::TextureUses::UNINITIALIZED,
            )
        })
    }

    /// `buffer` as a [`wgpu::Buffer`] with `STORAGE | COPY_SRC | COPY_DST`
    /// (vk-export's buffer usage; not mappable by wgpu). The wgpu buffer
    /// keeps the vk-export buffer alive until wgpu has dropped it, after its
    /// last use. Refused: a buffer of another device.
    ///
    /// Buffers have no layout: wgpu, vk-export's helpers and CUDA may take
    /// turns on the memory, ordered by semaphores (or host waits). Two wgpu
    /// buffers of one vk-export buffer alias without wgpu knowing: order
    /// their uses yourself (separate submissions).
    pub fn buffer_from_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
    ) -> Result<wgpu::Buffer> {
        self.check_context(buffer.context(), "the buffer")?;
        let keep = buffer.keep_alive();
        // SAFETY: the keep-alive in the callback keeps the VkBuffer (and its
        // memory) valid until wgpu-hal drops the buffer; wgpu never maps it
        // (no MAP usage below) and never destroys it (externally owned).
        let hal_buffer = unsafe {
            wgpu_hal::vulkan::Buffer::from_raw_externally_owned(
                buffer.raw(),
                Box::new(move || drop(keep)),
            )
        };
        let desc = wgpu::BufferDescriptor {
            label: Some("vk-export buffer"),
            size: buffer.size(),
            usage: buffer_usages(vk_export::BUFFER_USAGE),
            mapped_at_creation: false,
        };
        // SAFETY: a buffer of this device (checked above) created with
        // exactly this size and usage (`BUFFER_USAGE`), bound to its memory.
        Ok(unsafe {
            self.device
                .create_buffer_from_hal::<Vulkan>(hal_buffer, &desc)
        })
    }
}

impl Drop for InteropDevice {
    fn drop(&mut self) {
        // First wait, bounded, until wgpu's last submission completed: only
        // then may wgpu's queue go (its Drop waits for idle without a bound,
        // and once it is gone wgpu destroys a texture or buffer at once,
        // whoever still uses it).
        let idle = self.device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(DROP_WAIT),
        });
        if let Err(e) = idle {
            vk_export::report_drop_error(format_args!(
                "cuda-interop-wgpu: wgpu's queue, device and instance and the Vulkan device are \
                 leaked: wgpu's last submission did not complete within {DROP_WAIT:?} ({e})"
            ));
            // Never dropped: no wait for idle, nothing destroyed under the
            // pending submission (the owner keeps the Vulkan device).
            std::mem::forget(self.queue.queue.take());
            return;
        }
        let queue = self.queue.queue.take();
        match &self.queue.shared {
            // wgpu's queue waits for idle when it goes (at once: it is
            // idle): under the lock, as vkQueueWaitIdle needs.
            Some(ctx) => {
                let mut queue = queue;
                let _ = ctx.with_queue_of(QueueRole::Main, |_| drop(queue.take()));
                if let Some(q) = queue {
                    // The lock could not be taken (this thread holds it):
                    // never wait for idle outside it.
                    std::mem::forget(q);
                }
            }
            None => drop(queue),
        }
        // SAFETY: each dropped once, here, and never used again.
        unsafe {
            ManuallyDrop::drop(&mut self.device);
            ManuallyDrop::drop(&mut self.adapter);
            ManuallyDrop::drop(&mut self.instance);
            ManuallyDrop::drop(&mut self.owner);
        }
    }
}

/// A timeline value to wait for or to signal in a wgpu submission (a
/// timeline of the adapter's context).
pub use vk_export::TimelinePoint;

/// wgpu's queue, with the semaphores of vk-export in its submissions.
pub struct InteropQueue {
    queue: Option<wgpu::Queue>,
    /// The context whose main queue wgpu shares, if it does.
    shared: Option<Context>,
    context: Context,
    lock: Mutex<()>,
}

impl fmt::Debug for InteropQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InteropQueue")
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

impl InteropQueue {
    fn queue(&self) -> &wgpu::Queue {
        self.queue
            .as_ref()
            .expect("the queue is taken only in InteropDevice's Drop")
    }

    /// wgpu's own queue, where it is not shared with the context: `None` on
    /// a shared queue, where every submission must go through this type.
    ///
    /// # Safety
    /// [`InteropQueue::submit_with`] stages its semaphores on wgpu-hal's
    /// queue and submits under its lock, which a submission made on this
    /// queue directly does not take: one made from another thread at that
    /// moment would carry the staged semaphores (a signal before its command
    /// buffers ran, a wait or signal on a semaphore that is then destroyed
    /// while still in use). The caller makes sure that no submission is made
    /// on the returned queue (or a clone of it) while any thread may be
    /// inside `submit_with`, and that the queue (and its clones) are dropped
    /// before the [`InteropDevice`]: its Drop waits, bounded, for wgpu to go
    /// idle before the queue goes, which a clone kept elsewhere defeats.
    pub unsafe fn wgpu_queue(&self) -> Option<&wgpu::Queue> {
        match self.shared {
            Some(_) => None,
            None => self.queue.as_ref(),
        }
    }

    /// Submits `commands` (on a shared queue, under the context's lock).
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        commands: I,
    ) -> Result<wgpu::SubmissionIndex> {
        self.submit_with(commands, &[], &[])
    }

    /// Writes `data` into `buffer` at `offset` (staged; done before the next
    /// submission's commands), as [`wgpu::Queue::write_buffer`].
    pub fn write_buffer(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        self.queue().write_buffer(buffer, offset, data)
    }

    /// Submits `commands`, waiting on the GPU for each of `waits` before
    /// they run and signalling each of `signals` when they complete.
    /// Refused before anything is staged: a semaphore of another device; a
    /// signal value not above the timeline's current value and every signal
    /// already submitted (by this crate or vk-export), or more than
    /// `maxTimelineSemaphoreValueDifference` above the current value; one
    /// timeline signalled twice; a wait for a value at or above a signal of
    /// the same timeline in the same call; a wait more than
    /// `maxTimelineSemaphoreValueDifference` above the current value; a call
    /// from inside a submission of this queue on the same thread (a wgpu
    /// error handler that submits again). The signals are checked and
    /// recorded under each timeline's signal lock, as vk-export's own
    /// submissions are, so a host signal of the timeline is refused
    /// ([`vk_export::TimelineSemaphore::signal`]) while they are pending:
    /// gate a submission on another timeline than the one it signals.
    ///
    /// Waits on one timeline at several values are staged as one wait for
    /// the highest of them.
    ///
    /// Every semaphore is kept alive (a keep-alive) until wgpu reports the
    /// submission done. A submission that wgpu refuses (an invalid command
    /// buffer, with an error handler that returns) returns
    /// [`Error::Wgpu`], its semaphores are taken off wgpu-hal's queue
    /// again, so the next submission does not carry them, and none of its
    /// signals is recorded as pending (whether a timeline is named once or
    /// more, waited and signalled), so every timeline it named takes host
    /// signals and submissions again.
    ///
    /// Note: wgpu (`Queue::submit`) may flush its own pending writes in a
    /// submission of its own before `commands`; the waits gate the whole
    /// submission of `commands` (`ALL_COMMANDS`).
    pub fn submit_with<I: IntoIterator<Item = wgpu::CommandBuffer>>(
        &self,
        commands: I,
        waits: &[TimelinePoint<'_>],
        signals: &[TimelinePoint<'_>],
    ) -> Result<wgpu::SubmissionIndex> {
        for point in waits.iter().chain(signals) {
            if !point.semaphore.context().is_same(&self.context) {
                return Err(Error::Refused(
                    "a semaphore of another Vulkan device than this adapter's".into(),
                ));
            }
        }
        if let Some((wait, signal)) = TimelinePoint::wait_on_own_signal(waits, signals) {
            return Err(Error::Refused(format!(
                "a wait for {wait} and a signal of {signal} on one timeline in one submission: \
                 it would wait for its own signal and never complete"
            )));
        }
        for w in waits {
            let current = w.semaphore.value()?;
            let max = self.context.max_timeline_difference();
            if w.value > current && w.value - current > max {
                return Err(Error::Refused(format!(
                    "a wait for {} on a timeline at {current}: more than \
                     maxTimelineSemaphoreValueDifference ({max}) above it",
                    w.value
                )));
            }
        }
        // A wgpu error handler (user code, run inside `queue.submit`) that
        // submits again on this thread would wait for the lock held here.
        let _held = HeldLock::take(&self.lock as *const Mutex<()> as usize).ok_or_else(|| {
            Error::Refused(
                "this thread is already inside a submission of this queue (a wgpu error \
                 handler that submits again?): it would wait for itself"
                    .into(),
            )
        })?;
        // Checked and reserved under each timeline's signal lock (held
        // until the submission is recorded: no other signal of this process
        // slips in between), taken before the queue locks, in vk-export's
        // order (signal locks, then the context's queue lock, which a shared
        // queue's submission holds): the other order deadlocks against a
        // vk-export submission signalling the same timeline.
        let reservation = if waits.is_empty() && signals.is_empty() {
            None
        } else {
            let pairs: Vec<_> = signals.iter().map(|p| (p.semaphore, p.value)).collect();
            Some(
                TimelineSemaphore::reserve_submitted_signals(&pairs).map_err(|e| match e {
                    vk_export::Error::InvalidArgument(m) => Error::Refused(m),
                    e => Error::VkExport(e),
                })?,
            )
        };
        let run = move || -> Result<wgpu::SubmissionIndex> {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let queue = self.queue();
            let Some(reservation) = reservation else {
                return Ok(queue.submit(commands));
            };
            // SAFETY: wgpu's queue is a Vulkan queue (made in `create`);
            // nothing is destroyed through the guard.
            let hal = unsafe { queue.as_hal::<Vulkan>() }
                .ok_or_else(|| Error::Wgpu("the queue is not a Vulkan queue".into()))?;
            // One wait per timeline (the highest value): wgpu-hal takes every
            // entry of a semaphore off its list at once, so one entry each
            // keeps the count of what is left exact.
            let merged = merged_waits(waits.iter().map(|p| (p.semaphore.raw(), p.value)));
            let mut staged = Staged {
                hal: &hal,
                reservation: Some(reservation),
                waits: merged.iter().map(|&(s, _)| s).collect(),
                signals: signals.iter().map(|p| p.semaphore.raw()).collect(),
                keep: waits
                    .iter()
                    .chain(signals)
                    .map(|p| p.semaphore.keep_alive())
                    .collect(),
                armed: true,
            };
            for &(semaphore, value) in &merged {
                hal.add_wait_semaphore(
                    semaphore,
                    Some(value),
                    vk::PipelineStageFlags::ALL_COMMANDS,
                );
            }
            for point in signals {
                hal.add_signal_semaphore(point.semaphore.raw(), Some(point.value));
            }
            let index = queue.submit(commands);
            staged.armed = false;
            let left = staged.unstage();
            let keep = std::mem::take(&mut staged.keep);
            if left == staged.waits.len() + staged.signals.len() {
                // Nothing of it reached Vulkan: wgpu refused the submission.
                drop(keep);
                drop(staged.reservation.take());
                return Err(Error::Wgpu(
                    "wgpu refused the submission (see its error handler): nothing was \
                     submitted, its semaphores were taken off wgpu-hal's queue again"
                        .into(),
                ));
            }
            if let Some(reservation) = staged.reservation.take() {
                reservation.submitted();
            }
            // The semaphores live until wgpu saw this submission complete.
            queue.on_submitted_work_done(move || drop(keep));
            if left > 0 {
                return Err(Error::Wgpu(
                    "wgpu submitted only some of the staged semaphores".into(),
                ));
            }
            Ok(index)
        };
        match &self.shared {
            Some(ctx) => ctx.with_queue_of(QueueRole::Main, |_| run())?,
            None => run(),
        }
    }
}

/// The semaphores one `submit_with` staged on wgpu-hal's queue: taken off it
/// again after the submission (and on unwind), so that a submission wgpu
/// refused leaves nothing for the next one.
struct Staged<'h, 's> {
    hal: &'h wgpu_hal::vulkan::Queue,
    /// The signals' reservation: recorded once (any of) the submission
    /// reached Vulkan.
    reservation: Option<SubmittedSignals<'s>>,
    waits: Vec<vk::Semaphore>,
    signals: Vec<vk::Semaphore>,
    keep: Vec<KeepAlive>,
    /// Still to unstage on drop (the submission unwound).
    armed: bool,
}

impl Staged<'_, '_> {
    /// Takes the staged semaphores off wgpu-hal's queue: how many of the
    /// staged entries were still there (not submitted).
    fn unstage(&self) -> usize {
        unstage_each(&self.waits, |s| self.hal.remove_wait_semaphore(s))
            + unstage_each(&self.signals, |s| self.hal.remove_signal_semaphore(s))
    }
}

/// The waits of one submission with one entry per semaphore, at the highest
/// value asked of it (waiting for that one is waiting for them all), in the
/// order of first appearance.
fn merged_waits(
    waits: impl IntoIterator<Item = (vk::Semaphore, u64)>,
) -> Vec<(vk::Semaphore, u64)> {
    let mut merged: Vec<(vk::Semaphore, u64)> = Vec::new();
    for (semaphore, value) in waits {
        match merged.iter_mut().find(|(s, _)| *s == semaphore) {
            Some((_, v)) => *v = (*v).max(value),
            None => merged.push((semaphore, value)),
        }
    }
    merged
}

/// Takes `staged` (one list's entries) off wgpu-hal's queue through
/// `remove`, which takes every entry of a semaphore at once and says whether
/// there was any: asked once per semaphore, and each of its entries counted
/// as left when there was. Returns how many entries were left (not
/// submitted).
fn unstage_each(staged: &[vk::Semaphore], mut remove: impl FnMut(vk::Semaphore) -> bool) -> usize {
    let mut left = 0;
    for (i, s) in staged.iter().enumerate() {
        if staged[..i].contains(s) {
            continue; // taken off with its first entry
        }
        if remove(*s) {
            left += staged.iter().filter(|&x| x == s).count();
        }
    }
    left
}

impl Drop for Staged<'_, '_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let left = self.unstage();
        if left != self.waits.len() + self.signals.len() {
            // Some reached Vulkan before the unwind: nothing says when that
            // submission completes, so the semaphores are never destroyed,
            // and its signals are recorded as submitted.
            std::mem::forget(std::mem::take(&mut self.keep));
            if let Some(reservation) = self.reservation.take() {
                reservation.submitted();
            }
        }
    }
}

thread_local! {
    /// The `InteropQueue` locks this thread holds, by address.
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a lock as held by this thread while it lives.
struct HeldLock(usize);

impl HeldLock {
    /// `None` if this thread holds the lock at `key` already.
    fn take(key: usize) -> Option<HeldLock> {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.contains(&key) {
                return None;
            }
            held.push(key);
            Some(HeldLock(key))
        })
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = HELD.try_with(|held| held.borrow_mut().retain(|&k| k != self.0));
    }
}

/// The wgpu features [`InteropDevice`] enables where the adapter offers
/// them, for textures of vk-export formats: `R16Unorm` and `Rg16Unorm`
/// (`TEXTURE_FORMAT_16BIT_NORM`), `Bgra8Unorm` storage bindings.
const FORMAT_FEATURES: wgpu::Features =
    wgpu::Features::TEXTURE_FORMAT_16BIT_NORM.union(wgpu::Features::BGRA8UNORM_STORAGE);

/// The wgpu format of a vk-export format (every format of
/// `vk_export::format::SUPPORTED` has one; wgpu's `Rgb10a2Unorm` is
/// `A2B10G10R10_UNORM_PACK32`, red in the low bits).
pub fn texture_format(format: vk::Format) -> Option<wgpu::TextureFormat> {
    use wgpu::TextureFormat as T;
    Some(match format {
        vk::Format::R8_UNORM => T::R8Unorm,
        vk::Format::R8G8_UNORM => T::Rg8Unorm,
        vk::Format::R8G8B8A8_UNORM => T::Rgba8Unorm,
        vk::Format::R8G8B8A8_UINT => T::Rgba8Uint,
        vk::Format::R8G8B8A8_SRGB => T::Rgba8UnormSrgb,
        vk::Format::B8G8R8A8_UNORM => T::Bgra8Unorm,
        vk::Format::B8G8R8A8_SRGB => T::Bgra8UnormSrgb,
        vk::Format::A2B10G10R10_UNORM_PACK32 => T::Rgb10a2Unorm,
        vk::Format::R16_UNORM => T::R16Unorm,
        vk::Format::R16G16_UNORM => T::Rg16Unorm,
        vk::Format::R16_SFLOAT => T::R16Float,
        vk::Format::R16G16B16A16_SFLOAT => T::Rgba16Float,
        vk::Format::R16G16B16A16_UINT => T::Rgba16Uint,
        vk::Format::R32_UINT => T::R32Uint,
        vk::Format::R32_SFLOAT => T::R32Float,
        vk::Format::R32G32_SFLOAT => T::Rg32Float,
        vk::Format::R32G32B32A32_SFLOAT => T::Rgba32Float,
        _ => return None,
    })
}

/// wgpu's usages for an image's Vulkan usage flags.
pub fn texture_usages(flags: vk::ImageUsageFlags) -> wgpu::TextureUsages {
    use vk::ImageUsageFlags as V;
    use wgpu::TextureUsages as W;
    let mut usages = W::empty();
    for (v, w) in [
        (V::TRANSFER_SRC, W::COPY_SRC),
        (V::TRANSFER_DST, W::COPY_DST),
        (V::SAMPLED, W::TEXTURE_BINDING),
        (V::STORAGE, W::STORAGE_BINDING),
        (V::COLOR_ATTACHMENT, W::RENDER_ATTACHMENT),
    ] {
        if flags.contains(v) {
            usages |= w;
        }
    }
    usages
}

fn texture_uses(usages: wgpu::TextureUsages) -> wgpu::TextureUses {
    use wgpu::TextureUsages as W;
    use wgpu::TextureUses as U;
    let mut uses = U::empty();
    for (w, u) in [
        (W::COPY_SRC, U::COPY_SRC),
        (W::COPY_DST, U::COPY_DST),
        (W::TEXTURE_BINDING, U::RESOURCE),
        (
            W::STORAGE_BINDING,
            U::STORAGE_READ_ONLY | U::STORAGE_WRITE_ONLY | U::STORAGE_READ_WRITE,
        ),
        (W::RENDER_ATTACHMENT, U::COLOR_TARGET),
    ] {
        if usages.contains(w) {
            uses |= u;
        }
    }
    uses
}

fn buffer_usages(flags: vk::BufferUsageFlags) -> wgpu::BufferUsages {
    use vk::BufferUsageFlags as V;
    use wgpu::BufferUsages as W;
    let mut usages = W::empty();
    for (v, w) in [
        (V::TRANSFER_SRC, W::COPY_SRC),
        (V::TRANSFER_DST, W::COPY_DST),
        (V::STORAGE_BUFFER, W::STORAGE),
    ] {
        if flags.contains(v) {
            usages |= w;
        }
    }
    usages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sem(raw: u64) -> vk::Semaphore {
        use ash::vk::Handle;
        vk::Semaphore::from_raw(raw)
    }

    #[test]
    fn waits_on_one_semaphore_are_merged_at_the_highest_value() {
        let (a, b) = (sem(1), sem(2));
        assert_eq!(
            merged_waits([(a, 1), (b, 5), (a, 3), (a, 2)]),
            vec![(a, 3), (b, 5)]
        );
        assert_eq!(merged_waits([]), vec![]);
    }

    /// As wgpu-hal's `SemaphoreList::remove`: every entry of `s` at once.
    fn remove_all(list: &mut Vec<vk::Semaphore>, s: vk::Semaphore) -> bool {
        let before = list.len();
        list.retain(|&x| x != s);
        list.len() != before
    }

    #[test]
    fn every_staged_entry_is_counted_duplicates_included() {
        let (a, b) = (sem(1), sem(2));
        let staged = [a, a, b];
        // Refused: all three entries still on the queue.
        let mut hal = staged.to_vec();
        assert_eq!(unstage_each(&staged, |s| remove_all(&mut hal, s)), 3);
        assert!(hal.is_empty());
        // Submitted: none left.
        let mut hal = Vec::new();
        assert_eq!(unstage_each(&staged, |s| remove_all(&mut hal, s)), 0);
        // Partly: only `b`'s entry left.
        let mut hal = vec![b];
        assert_eq!(unstage_each(&staged, |s| remove_all(&mut hal, s)), 1);
    }

    #[test]
    fn every_vk_export_format_has_a_wgpu_format() {
        for (format, name, _, _) in vk_export::format::SUPPORTED {
            assert!(texture_format(*format).is_some(), "{name}");
        }
        assert_eq!(texture_format(vk::Format::R8G8B8_UNORM), None);
        assert_eq!(
            texture_format(vk::Format::B8G8R8A8_UNORM),
            Some(wgpu::TextureFormat::Bgra8Unorm)
        );
        assert_eq!(
            texture_format(vk::Format::A2B10G10R10_UNORM_PACK32),
            Some(wgpu::TextureFormat::Rgb10a2Unorm)
        );
        assert!(FORMAT_FEATURES.contains(
            wgpu::TextureFormat::R16Unorm.required_features()
                | wgpu::TextureFormat::Rg16Unorm.required_features()
        ));
    }

    #[test]
    fn usages_follow_the_vulkan_flags() {
        use vk_export::markers::usage;
        assert_eq!(
            texture_usages(usage::Storage::VK),
            wgpu::TextureUsages::COPY_SRC
                | wgpu::TextureUsages::COPY_DST
                | wgpu::TextureUsages::TEXTURE_BINDING
                | wgpu::TextureUsages::STORAGE_BINDING
        );
        assert!(texture_usages(usage::ColorAttachment::VK)
            .contains(wgpu::TextureUsages::RENDER_ATTACHMENT));
        assert!(!texture_usages(usage::Sampled::VK).contains(wgpu::TextureUsages::STORAGE_BINDING));
        assert_eq!(
            buffer_usages(vk_export::BUFFER_USAGE),
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
        );
    }

    #[test]
    fn queues_are_split_or_none() {
        let family = |flags, n| vk::QueueFamilyProperties {
            queue_flags: flags,
            queue_count: n,
            ..Default::default()
        };
        let gct = vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER;
        // NVIDIA: family 0 with 16 queues, family 1 transfer-only.
        let p = plan_queues(&[family(gct, 16), family(vk::QueueFlags::TRANSFER, 2)]).unwrap();
        assert_eq!(
            p.wgpu,
            QueueChoice {
                family: 0,
                index: 0
            }
        );
        let vk = p.vk.unwrap();
        assert_eq!(
            vk.main,
            QueueChoice {
                family: 0,
                index: 1
            }
        );
        assert_eq!(
            vk.transfer,
            Some(QueueChoice {
                family: 1,
                index: 0
            })
        );
        assert_eq!(p.counts, vec![2, 1]);
        // lavapipe: one queue.
        let p = plan_queues(&[family(gct, 1)]).unwrap();
        assert!(p.vk.is_none());
        assert_eq!(p.counts, vec![1]);
        // One graphics queue and a compute family.
        let p = plan_queues(&[family(gct, 1), family(vk::QueueFlags::COMPUTE, 1)]).unwrap();
        assert_eq!(
            p.vk.unwrap().main,
            QueueChoice {
                family: 1,
                index: 0
            }
        );
        assert!(plan_queues(&[family(vk::QueueFlags::TRANSFER, 1)]).is_none());
    }
}

pub mod pattern;
