//! [`Context`]: the application's (or a headless) Vulkan instance and
//! device, wrapped once, with what every resource needs from them.
//!
//! # Contract
//!
//! * A context made by [`Context::from_raw`] never destroys what the
//!   application owns; one made by [`Context::headless`] destroys its device
//!   and instance when the last clone goes, after every resource (each holds
//!   a clone).
//! * A context submits to its main queue (graphics or compute) and, where
//!   the device has a transfer-only queue family, to a transfer queue
//!   ([`Queues`]): work that needs no other engine (copies, uploads,
//!   readbacks, ownership releases, semaphore-only signals) goes there, and
//!   does not switch the GPU's graphics engine between Vulkan and CUDA.
//! * Every submission of this crate goes through one lock per queue and
//!   signals that queue's private timeline, the completion record resources
//!   wait for (bounded) in `Drop`; submissions on the two queues keep one
//!   order (each waits on the GPU for the other queue's latest).
//! * A headless context enables `VK_KHR_maintenance8` where the device
//!   offers it and its main family has `GRAPHICS` ([`DepthCopy`]): a depth
//!   attachment is then copied into its colour twin by one `vkCmdCopyImage`
//!   on the main queue ([`Context::copies_depth_to_color`]).
//! * Destructor failures and validation messages never panic: they are
//!   counted ([`drop_errors`], the validation error count) and written to
//!   stderr, where a closed stderr is ignored.

use std::ffi::CStr;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ash::vk;

use interop_share::uuid::{DeviceUuid, DriverUuid};

use crate::error::{unsupported, vk_error, Error, Result};
use crate::queues::{QueueChoice, QueueRole, Queues};
use crate::requirements::{
    depth_to_color_copies_offered, device_extensions, DeviceRequirements, Maintenance8Features,
    MAINTENANCE8, REQUIRED_DEVICE_EXTENSIONS,
};
use crate::submit::{wait_lanes, Engine, Lane, LastUse, QueueState, MAX_LANES};
use crate::validation::ValidationMessenger;

thread_local! {
    /// The locks this thread holds, by address: contexts' queue or
    /// submission locks and timeline signal locks. Taking one of them again
    /// on the same thread would wait for itself.
    static HELD: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Removes its lock from this thread's [`HELD`] list when dropped.
pub(crate) struct HeldLock {
    key: usize,
}

impl HeldLock {
    /// Marks the lock at address `key` as held by this thread; `None` if
    /// this thread holds it already.
    pub(crate) fn take(key: usize) -> Option<HeldLock> {
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.contains(&key) {
                return None;
            }
            held.push(key);
            Some(HeldLock { key })
        })
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = HELD.try_with(|held| held.borrow_mut().retain(|&k| k != self.key));
    }
}

/// How long a `Drop` waits for the GPU work that last used a resource before
/// it gives up, leaks the resource (never frees memory the GPU may still
/// use) and reports it ([`drop_errors`]).
pub const DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

static DROP_ERRORS: AtomicU32 = AtomicU32::new(0);

/// `Drop` cannot return errors: a destroy that had to be skipped (the GPU
/// work using the resource did not finish within [`DROP_WAIT`]) is counted
/// here and printed to stderr.
pub fn drop_errors() -> u32 {
    DROP_ERRORS.load(Ordering::Relaxed)
}

/// Reports a destructor that had to leak what it owns (the GPU work using it
/// did not finish in time), as this crate's own `Drop`s do: counted in
/// [`drop_errors`] and written to stderr. For adapters built on this crate.
pub fn report_drop_error(what: std::fmt::Arguments<'_>) {
    record_drop_error(what)
}

pub(crate) fn record_drop_error(what: std::fmt::Arguments<'_>) {
    DROP_ERRORS.fetch_add(1, Ordering::Relaxed);
    // Not `eprintln!`, which panics when stderr is gone (EPIPE): this runs in
    // destructors, where a panic may abort the process.
    let _ = writeln!(std::io::stderr(), "vk-export: {what}");
}

/// Who a physical device is: what an importer compares before it imports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceIdentity {
    /// `VkPhysicalDeviceProperties::deviceName`.
    pub name: String,
    /// `VkPhysicalDeviceIDProperties::deviceUUID`; equals CUDA's `cuDeviceGetUuid_v2`.
    pub device_uuid: DeviceUuid,
    /// `VkPhysicalDeviceIDProperties::driverUUID`; must match too for OPAQUE_FD sharing.
    pub driver_uuid: DriverUuid,
    /// `deviceLUID`, where the driver reports one as valid (in practice: Windows).
    pub device_luid: Option<[u8; 8]>,
    /// `VkPhysicalDeviceDriverProperties::driverID`.
    pub driver_id: vk::DriverId,
    /// `VkPhysicalDeviceProperties::driverVersion` (vendor encoding).
    pub driver_version: u32,
}

impl DeviceIdentity {
    /// `deviceUUID` in the 8-4-4-4-12 spelling `nvidia-smi -L` uses (the
    /// [`DeviceUuid`]'s `Display`).
    pub fn device_uuid_string(&self) -> String {
        self.device_uuid.to_string()
    }
}

/// Whether [`Context::headless`] enables the Khronos validation layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Validation {
    /// No layer.
    Off,
    /// The layer if it is installed.
    #[default]
    IfAvailable,
    /// Fail if the layer is not installed (tests).
    Required,
}

/// Options for [`Context::headless`].
#[derive(Clone, Debug, Default)]
pub struct HeadlessOptions {
    /// Pick the physical device with this `deviceUUID` (for instance the one a
    /// CUDA device reports); otherwise the first suitable one, discrete GPUs first.
    pub device_uuid: Option<DeviceUuid>,
    /// Validation layer policy.
    pub validation: Validation,
    /// Whether the context also gets a transfer-only queue.
    pub transfer_queue: TransferQueue,
    /// How a depth attachment is copied into its colour twin.
    pub depth_copy: DepthCopy,
}

/// How [`Context::headless`] sets up copies of a depth attachment into a
/// colour image of the same texel bits ([`crate::DepthSource`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DepthCopy {
    /// Where the device offers `VK_KHR_maintenance8` and the main family
    /// has `GRAPHICS` (NVIDIA's driver 580: yes; lavapipe: no), the context
    /// enables it, and a depth copy is one `vkCmdCopyImage` on the main
    /// queue ([`Context::copies_depth_to_color`]); otherwise it goes
    /// through a buffer. Also through a buffer where the validation layer
    /// is on ([`Validation`]) and older than the extension (built before
    /// header 1.4.305, as Debian bookworm's 1.3.239): it would report the
    /// copies. A layer the loader enables on its own (`VK_INSTANCE_LAYERS`,
    /// vkconfig) with `Validation::Off` is not seen here.
    #[default]
    IfAvailable,
    /// Always through a buffer, on the main queue as every depth copy (to
    /// measure what the direct copy saves).
    ThroughBuffer,
}

/// Whether [`Context::headless`] creates a queue of a transfer-only family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransferQueue {
    /// Where the device has a family with `TRANSFER` but neither `GRAPHICS`
    /// nor `COMPUTE` (NVIDIA: family 1; lavapipe: none), the copy helpers
    /// use a queue of it.
    #[default]
    IfAvailable,
    /// Everything on the main queue (to measure what the transfer queue saves).
    Off,
}

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";
/// The Vulkan header that added `VK_KHR_maintenance8` (1.4.305).
const MAINTENANCE8_HEADER: u32 = vk::make_api_version(0, 1, 4, 305);

/// The application's Vulkan device, as this crate uses it.
///
/// Cheap to clone (an `Arc`); resources keep a clone, so the device outlives
/// everything created from it. A context made by [`Context::headless`]
/// destroys its device and instance when the last clone goes; one made by
/// [`Context::from_raw`] never destroys what the application owns.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) device: ash::Device,
    /// The main queue's lane (0) and, where the context has one, the
    /// transfer queue's (1).
    pub(crate) lanes: Vec<Lane>,
    pub(crate) memory_fd: ash::khr::external_memory_fd::Device,
    pub(crate) semaphore_fd: Option<ash::khr::external_semaphore_fd::Device>,
    pub(crate) identity: DeviceIdentity,
    pub(crate) memory_properties: vk::PhysicalDeviceMemoryProperties,
    pub(crate) max_timeline_difference: u64,
    /// `VK_EXT_memory_budget` is enabled (headless contexts, where offered).
    pub(crate) memory_budget: bool,
    /// `VK_KHR_maintenance8` is enabled and the main family has `GRAPHICS`
    /// (headless contexts, [`DepthCopy::IfAvailable`]).
    pub(crate) depth_to_color: bool,
    /// The main family has `GRAPHICS`: the only families a depth aspect may
    /// be copied on (without `VK_KHR_maintenance10`).
    pub(crate) main_has_graphics: bool,
    owned: bool,
    debug: Option<ValidationMessenger>,
    /// What [`Context::from_raw_with_owner`] was given: dropped after the
    /// context's own objects are destroyed, leaked where they could not be.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.identity.name)
            .field("device_uuid", &self.inner.identity.device_uuid_string())
            .field("queues", &self.queues())
            .field("semaphore_fd", &self.inner.semaphore_fd.is_some())
            .field("depth_to_color", &self.inner.depth_to_color)
            .field("validation", &self.inner.debug.is_some())
            .finish()
    }
}

/// How [`Context::build`] wraps a device: what the two public constructors
/// differ in.
struct Built {
    /// The context destroys device and instance (headless).
    owned: bool,
    debug: Option<ValidationMessenger>,
    semaphore_fd_enabled: bool,
    /// `VK_KHR_maintenance8` was enabled on a graphics main family.
    depth_to_color: bool,
}

impl Context {
    /// Creates an instance and a device with the interop extensions enabled,
    /// with one queue that supports compute and transfer.
    pub fn headless(options: &HeadlessOptions) -> Result<Context> {
        // SAFETY: loading libvulkan runs its initialisers; it is the system loader.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| Error::Loader(e.to_string()))?;
        // SAFETY: plain enumeration.
        let layers = unsafe { entry.enumerate_instance_layer_properties() }.map_err(vk_error(
            "vkEnumerateInstanceLayerProperties",
            "check the Vulkan loader",
        ))?;
        let has_layer = layers
            .iter()
            .any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER));
        let validation = match (options.validation, has_layer) {
            (Validation::Off, _) => false,
            (Validation::IfAvailable, have) => have,
            (Validation::Required, true) => true,
            (Validation::Required, false) => return Err(unsupported(
                "the Khronos validation layer",
                "VK_LAYER_KHRONOS_validation is not installed (Debian: vulkan-validationlayers; \
                     or set VK_LAYER_PATH)",
            )),
        };
        let app = vk::ApplicationInfo::default()
            .application_name(c"vk-export")
            .api_version(vk::API_VERSION_1_2);
        let layer_names = [VALIDATION_LAYER.as_ptr()];
        // Synchronization validation next to the core checks, where the
        // layer offers VK_EXT_validation_features (thread-safety checks are
        // on by default).
        // SAFETY: plain enumeration of the layer's instance extensions.
        let layer_extensions =
            unsafe { entry.enumerate_instance_extension_properties(Some(VALIDATION_LAYER)) }
                .unwrap_or_default();
        let has_features = layer_extensions
            .iter()
            .any(|e| e.extension_name_as_c_str().ok() == Some(ash::ext::validation_features::NAME));
        let mut extension_names = vec![ash::ext::debug_utils::NAME.as_ptr()];
        if has_features {
            extension_names.push(ash::ext::validation_features::NAME.as_ptr());
        }
        let enables = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut features =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&enables);
        let mut info = vk::InstanceCreateInfo::default().application_info(&app);
        if validation {
            info = info
                .enabled_layer_names(&layer_names)
                .enabled_extension_names(&extension_names);
            if has_features {
                info = info.push_next(&mut features);
            }
        }
        // SAFETY: the create info and everything it points to live across the call.
        let instance = unsafe { entry.create_instance(&info, None) }.map_err(vk_error(
            "vkCreateInstance",
            "is a Vulkan 1.2 driver installed (VK_DRIVER_FILES / VK_ICD_FILENAMES)?",
        ))?;
        let debug = if validation {
            // SAFETY: the instance was made from `entry` with debug utils,
            // and the context destroys it only after the messenger.
            match unsafe { ValidationMessenger::new(&entry, &instance) } {
                Ok(d) => Some(d),
                Err(e) => {
                    // SAFETY: nothing was created from the instance yet.
                    unsafe { instance.destroy_instance(None) };
                    return Err(e);
                }
            }
        } else {
            None
        };
        // A layer older than VK_KHR_maintenance8 (Debian bookworm's is
        // 1.3.239) reports its depth-to-colour copies as errors: a
        // validated context then copies depth through a buffer.
        // The first such layer is the one the loader loads.
        let layer_knows_maintenance8 = layers
            .iter()
            .find(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER))
            .is_some_and(|l| l.spec_version >= MAINTENANCE8_HEADER);
        let layer_allows = !validation || layer_knows_maintenance8;
        let want_depth_to_color = options.depth_copy == DepthCopy::IfAvailable && layer_allows;
        match Self::create_device(&instance, options, want_depth_to_color) {
            Ok((physical, device, queues, depth_to_color)) => {
                // SAFETY: the device and instance were just created here and
                // belong to the context from now on; `depth_to_color` says
                // whether maintenance8 was enabled on a graphics main family.
                unsafe {
                    Self::build(
                        entry,
                        instance,
                        physical,
                        device,
                        queues,
                        Built {
                            owned: true,
                            debug,
                            semaphore_fd_enabled: true,
                            depth_to_color,
                        },
                    )
                }
            }
            Err(e) => {
                // Messenger first, then the instance.
                drop(debug);
                // SAFETY: no device exists and the messenger is gone: nothing
                // made from the instance is left.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    /// The device `options` ask for, with `VK_KHR_maintenance8` where
    /// `want_depth_to_color` and the device offers it on a graphics main
    /// family (the last value says whether it was enabled).
    fn create_device(
        instance: &ash::Instance,
        options: &HeadlessOptions,
        want_depth_to_color: bool,
    ) -> Result<(vk::PhysicalDevice, ash::Device, Queues, bool)> {
        // SAFETY: plain enumeration on a live instance.
        let physicals = unsafe { instance.enumerate_physical_devices() }.map_err(vk_error(
            "vkEnumeratePhysicalDevices",
            "is a Vulkan driver installed?",
        ))?;
        let mut candidates = Vec::new();
        let mut seen = Vec::new();
        for physical in physicals {
            let identity = query_identity(instance, physical);
            let named = format!("{} ({})", identity.name, identity.device_uuid_string());
            if let Some(uuid) = options.device_uuid {
                if identity.device_uuid != uuid {
                    seen.push(named);
                    continue;
                }
            }
            // SAFETY: `instance` is this function's caller's live instance,
            // created with Vulkan 1.2 (`headless`), and `physical` one of its
            // enumerated devices.
            let needs = match unsafe { DeviceRequirements::of(instance, physical) } {
                Ok(needs) => needs,
                Err(why) => {
                    seen.push(format!("{named}: {why}"));
                    continue;
                }
            };
            seen.push(named);
            // SAFETY: plain query.
            let props = unsafe { instance.get_physical_device_properties(physical) };
            let rank = match props.device_type {
                vk::PhysicalDeviceType::DISCRETE_GPU => 0,
                vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
                _ => 2,
            };
            candidates.push((rank, physical, needs));
        }
        candidates.sort_by_key(|c| c.0);
        let Some((_, physical, mut needs)) = candidates.into_iter().next() else {
            return Err(Error::NoDevice(match options.device_uuid {
                Some(uuid) => format!(
                    "none with deviceUUID {} that supports interop (found: {})",
                    uuid,
                    seen.join(", ")
                ),
                None => format!(
                    "none supports Vulkan 1.2, timeline semaphores, {} and a compute queue (found: {})",
                    REQUIRED_DEVICE_EXTENSIONS
                        .iter()
                        .map(|e| e.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if seen.is_empty() { "no devices".to_string() } else { seen.join("; ") }
                ),
            }));
        };
        if options.transfer_queue == TransferQueue::Off {
            needs.queues.transfer = None;
        }
        let priorities = [1.0f32];
        let queue_infos = needs.queue_create_infos(&priorities);
        let mut enabled = needs.extension_names();
        let mut features12 = needs.features12();
        // SAFETY: `instance` is live and of Vulkan 1.2 (`headless`),
        // `physical` one of its devices.
        let depth_to_color = want_depth_to_color
            && unsafe {
                depth_to_color_copies_offered(instance, physical, needs.queues.main.family)
            };
        let mut maintenance8 = Maintenance8Features::new(true);
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .push_next(&mut features12);
        if depth_to_color {
            enabled.push(MAINTENANCE8.as_ptr());
            info = info.push_next(&mut maintenance8);
        }
        let info = info.enabled_extension_names(&enabled);
        // SAFETY: the create info and its chain live across the call; the
        // maintenance8 struct is chained only with its extension enabled.
        let device = unsafe { instance.create_device(physical, &info, None) }.map_err(vk_error(
            "vkCreateDevice",
            "the device must support timeline semaphores",
        ))?;
        Ok((physical, device, needs.queues, depth_to_color))
    }

    /// Wraps the application's own Vulkan objects. The context submits to
    /// the queues named in `queues` (see [`Queues`]: a main queue, and
    /// optionally a transfer queue for copies), and never destroys or idles
    /// anything it did not create: dropping it (and every resource made from
    /// it) waits only for this crate's own submissions, with a bound
    /// ([`DROP_WAIT`]).
    ///
    /// The context keeps `entry` (the loader library stays loaded while it
    /// lives): keep a clone of your own for the calls you make after the
    /// context is gone, such as `vkDestroyDevice`.
    ///
    /// Refused ([`Error::InvalidArgument`], before anything is created): a
    /// queue family the device does not have, a queue index not below the
    /// family's `queueCount`, a main family without `GRAPHICS` or `COMPUTE`,
    /// and the same queue named twice.
    ///
    /// # Safety
    /// * `device` was created from `physical`, which belongs to `instance`,
    ///   with API version 1.2 or later, the `timelineSemaphore` feature, and
    ///   every extension in [`REQUIRED_DEVICE_EXTENSIONS`] enabled
    ///   (`VK_KHR_external_semaphore_fd` too when `semaphore_fd_enabled`):
    ///   [`DeviceRequirements`] lists all of it for a physical device;
    /// * every queue in `queues` was created with `device` (its
    ///   `VkDeviceQueueCreateInfo` asked for at least `index + 1` queues of
    ///   its family), and while the context lives the application submits to
    ///   those queues only from inside [`Context::with_queue`] /
    ///   [`Context::with_queue_of`] (this crate submits under the same
    ///   locks), or not at all (queues it created for this crate alone);
    /// * the instance and device outlive the context and every resource
    ///   created from it;
    /// * work the application submits that uses this crate's resources (via
    ///   their `raw()` handles) has completed before the last handle to such
    ///   a resource is dropped: this crate only tracks its own submissions.
    pub unsafe fn from_raw(
        entry: ash::Entry,
        instance: ash::Instance,
        physical: vk::PhysicalDevice,
        device: ash::Device,
        queues: Queues,
        semaphore_fd_enabled: bool,
    ) -> Result<Context> {
        check_queues(&instance, physical, &queues)?;
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            Self::build(
                entry,
                instance,
                physical,
                device,
                queues,
                Built {
                    owned: false,
                    debug: None,
                    semaphore_fd_enabled,
                    depth_to_color: false,
                },
            )
        }
    }

    /// As [`Context::from_raw`], and the context keeps `owner` until it and
    /// every resource made from it are gone and its own objects (command
    /// pools, progress semaphores) are destroyed; then it drops `owner`. A
    /// wrapper that destroys the device in `owner`'s `Drop` (such as
    /// `cuda-interop-wgpu`'s) so never destroys it under the context. Where
    /// the context's last submissions did not complete within [`DROP_WAIT`]
    /// (a drop error), `owner` is leaked with them.
    ///
    /// # Safety
    /// As [`Context::from_raw`]; the instance and device must outlive the
    /// context either way, and dropping `owner` last is how this guarantees it.
    pub unsafe fn from_raw_with_owner(
        entry: ash::Entry,
        instance: ash::Instance,
        physical: vk::PhysicalDevice,
        device: ash::Device,
        queues: Queues,
        semaphore_fd_enabled: bool,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Context> {
        // SAFETY: forwarded from the caller's contract.
        let mut ctx = unsafe {
            Self::from_raw(
                entry,
                instance,
                physical,
                device,
                queues,
                semaphore_fd_enabled,
            )?
        };
        Arc::get_mut(&mut ctx.inner)
            .expect("a context just made has one handle")
            .owner = Some(owner);
        Ok(ctx)
    }

    /// # Safety
    /// As [`Context::from_raw`]; `how.owned` means the context destroys
    /// device and instance; `how.depth_to_color` that the device was created
    /// with `VK_KHR_maintenance8` and its feature, and the main family has
    /// `GRAPHICS`.
    unsafe fn build(
        entry: ash::Entry,
        instance: ash::Instance,
        physical: vk::PhysicalDevice,
        device: ash::Device,
        queues: Queues,
        how: Built,
    ) -> Result<Context> {
        let Built {
            owned,
            debug,
            semaphore_fd_enabled,
            depth_to_color,
        } = how;
        // SAFETY: plain query on a live physical device.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let main_has_graphics = families
            .get(queues.main.family as usize)
            .is_some_and(|f| f.queue_flags.contains(vk::QueueFlags::GRAPHICS));
        let identity = query_identity(&instance, physical);
        let extensions = device_extensions(&instance, physical);
        let memory_fd = ash::khr::external_memory_fd::Device::new(&instance, &device);
        let semaphore_fd = (semaphore_fd_enabled
            && extensions
                .iter()
                .any(|e| e == ash::khr::external_semaphore_fd::NAME))
        .then(|| ash::khr::external_semaphore_fd::Device::new(&instance, &device));
        // SAFETY: plain queries on a live physical device.
        let (memory_properties, max_timeline_difference) = unsafe {
            let mut timeline = vk::PhysicalDeviceTimelineSemaphoreProperties::default();
            let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut timeline);
            instance.get_physical_device_properties2(physical, &mut props);
            (
                instance.get_physical_device_memory_properties(physical),
                timeline.max_timeline_semaphore_value_difference,
            )
        };
        let mut lanes: Vec<Lane> = Vec::with_capacity(MAX_LANES);
        for choice in std::iter::once(queues.main).chain(queues.transfer) {
            // SAFETY: the queue exists on the device (the callers' contract).
            let queue = unsafe { device.get_device_queue(choice.family, choice.index) };
            let mut progress_type = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk::SemaphoreType::TIMELINE)
                .initial_value(0);
            // SAFETY: plain creation on a live device with timeline semaphores
            // enabled (the callers' contract).
            let progress = unsafe {
                device.create_semaphore(
                    &vk::SemaphoreCreateInfo::default().push_next(&mut progress_type),
                    None,
                )
            };
            let progress = match progress {
                Ok(p) => p,
                Err(e) => {
                    for lane in &lanes {
                        // SAFETY: created above, never used.
                        unsafe { device.destroy_semaphore(lane.progress, None) };
                    }
                    return Err(Error::Vulkan {
                        call: "vkCreateSemaphore (timeline)",
                        result: e,
                        hint: "the device must have the timelineSemaphore feature enabled",
                    });
                }
            };
            lanes.push(Lane {
                family: choice.family,
                index: choice.index,
                queue: Mutex::new(QueueState {
                    queue,
                    last_value: 0,
                }),
                last_submitted: Default::default(),
                progress,
                engine: Mutex::new(Engine::default()),
                handoff: Mutex::new(Engine::default()),
            });
        }
        Ok(Context {
            inner: Arc::new(ContextInner {
                _entry: entry,
                instance,
                physical,
                device,
                lanes,
                memory_fd,
                semaphore_fd,
                identity,
                memory_properties,
                max_timeline_difference,
                memory_budget: owned
                    && extensions
                        .iter()
                        .any(|e| e.as_c_str() == ash::ext::memory_budget::NAME),
                depth_to_color,
                main_has_graphics,
                owned,
                debug,
                owner: None,
            }),
        })
    }

    /// Whether a depth attachment is copied into its colour twin with one
    /// `vkCmdCopyImage` on the main queue: `VK_KHR_maintenance8` is enabled
    /// and the main family has `GRAPHICS` ([`DepthCopy::IfAvailable`] on a
    /// device that offers it). Otherwise, and always for a context of
    /// [`Context::from_raw`] (it cannot see which features the application
    /// enabled), a [`crate::DepthSource`] goes through a buffer.
    pub fn copies_depth_to_color(&self) -> bool {
        self.inner.depth_to_color
    }

    /// Whether the main family has `GRAPHICS`: a depth aspect is copied
    /// only there ([`crate::DepthSource::check_copy`]).
    pub(crate) fn main_has_graphics(&self) -> bool {
        self.inner.main_has_graphics
    }

    /// Who the physical device is.
    pub fn identity(&self) -> &DeviceIdentity {
        &self.inner.identity
    }
    /// The ash device.
    pub fn device(&self) -> &ash::Device {
        &self.inner.device
    }
    /// The ash instance.
    pub fn instance(&self) -> &ash::Instance {
        &self.inner.instance
    }
    /// The physical device.
    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.inner.physical
    }
    /// The main queue's family.
    pub fn queue_family(&self) -> u32 {
        self.inner.lanes[0].family
    }

    /// The queues this context submits to.
    pub fn queues(&self) -> Queues {
        let choice = |lane: &Lane| QueueChoice {
            family: lane.family,
            index: lane.index,
        };
        Queues {
            main: choice(&self.inner.lanes[0]),
            transfer: self.inner.lanes.get(1).map(choice),
        }
    }

    /// The queue family of `role`'s queue: the family a helper of that role
    /// records its queue-family ownership transfers for (e.g. the family to
    /// acquire a resource on after this context's `release_*` helpers).
    pub fn queue_family_of(&self, role: QueueRole) -> u32 {
        self.inner.lanes[self.lane_of(role)].family
    }

    /// The lane index of `role`.
    pub(crate) fn lane_of(&self, role: QueueRole) -> usize {
        match role {
            QueueRole::Main => 0,
            QueueRole::Transfer => self.inner.lanes.len() - 1,
        }
    }
    /// Whether `VK_KHR_external_semaphore_fd` is available (Mesa's lavapipe: no).
    pub fn supports_semaphore_fds(&self) -> bool {
        self.inner.semaphore_fd.is_some()
    }
    /// `(budget, usage)` in bytes of each memory heap, from
    /// `VK_EXT_memory_budget`; `None` where the extension is not enabled (it
    /// is on contexts made by [`Context::headless`] whose driver offers it).
    pub fn memory_budget(&self) -> Option<Vec<(u64, u64)>> {
        if !self.inner.memory_budget {
            return None;
        }
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: plain query; the extension is enabled on this device and the
        // chain lives across the call.
        unsafe {
            self.inner
                .instance
                .get_physical_device_memory_properties2(self.inner.physical, &mut props)
        };
        let heaps = props.memory_properties.memory_heap_count as usize;
        Some(
            (0..heaps)
                .map(|i| (budget.heap_budget[i], budget.heap_usage[i]))
                .collect(),
        )
    }

    /// `maxTimelineSemaphoreValueDifference`.
    pub fn max_timeline_difference(&self) -> u64 {
        self.inner.max_timeline_difference
    }
    /// The message ids (VUIDs) of the validation errors reported so far, in
    /// order: for a test that allows one known false positive by its exact id.
    pub fn validation_error_ids(&self) -> Vec<String> {
        self.inner
            .debug
            .as_ref()
            .map_or_else(Vec::new, ValidationMessenger::error_ids)
    }

    /// Validation errors the layer reported so far (0 without the layer).
    pub fn validation_errors(&self) -> u32 {
        self.inner
            .debug
            .as_ref()
            .map_or(0, ValidationMessenger::errors)
    }
    /// Whether the validation layer is on for this context.
    pub fn validation_enabled(&self) -> bool {
        self.inner.debug.is_some()
    }

    /// Runs `f` with the queue locked. Every submission of the application
    /// to this queue must happen inside `f` (Vulkan requires external
    /// synchronisation per queue, and this crate submits under the same lock).
    /// Calling `with_queue` or a helper of this context from inside `f` is
    /// an [`Error::InvalidArgument`] (it would wait for itself).
    pub fn with_queue<R>(&self, f: impl FnOnce(vk::Queue) -> R) -> Result<R> {
        self.with_queue_of(QueueRole::Main, f)
    }

    /// [`Context::with_queue`] for `role`'s queue (the transfer queue, or
    /// the main queue where the context has none).
    pub fn with_queue_of<R>(&self, role: QueueRole, f: impl FnOnce(vk::Queue) -> R) -> Result<R> {
        let _held = self.hold("with_queue")?;
        let lane = &self.inner.lanes[self.lane_of(role)];
        let state = lane.queue.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(state.queue))
    }

    /// Whether this thread is inside [`Context::with_queue`] (or a
    /// recording closure) of this context now: any call that submits on
    /// it from here is refused (it would wait for the lock its caller
    /// holds). For a caller that must refuse before it spends something
    /// (a token, a frame) rather than after.
    pub fn is_held_by_this_thread(&self) -> bool {
        let key = Arc::as_ptr(&self.inner) as usize;
        HELD.with(|held| held.borrow().contains(&key))
    }

    /// Marks this thread as inside a call that holds this context's queue
    /// or submission lock; a nested call on the same thread is refused
    /// instead of deadlocking.
    pub(crate) fn hold(&self, call: &'static str) -> Result<HeldLock> {
        HeldLock::take(Arc::as_ptr(&self.inner) as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{call} called from inside with_queue or a submit_and_wait recording closure of the same \
                 Context: it would wait for the lock its caller holds"
            ))
        })
    }

    /// Whether `other` is this context (a clone of it), not merely one on
    /// the same device.
    pub fn is_same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A resource of another context is refused by every helper.
    pub(crate) fn check_owns(&self, other: &Context, what: &str) -> Result<()> {
        if self.is_same(other) {
            Ok(())
        } else {
            Err(Error::ForeignResource(format!(
                "{what} belongs to another Context ({}), not this one ({}); use that context's helpers",
                other.identity().name,
                self.identity().name
            )))
        }
    }

    /// Waits (bounded) until the submissions of this crate that used a
    /// resource (`last_use`) have completed.
    pub(crate) fn wait_used(&self, last_use: &LastUse, timeout: std::time::Duration) -> Result<()> {
        wait_lanes(
            &self.inner.device,
            &self.inner.lanes,
            last_use.values(),
            timeout,
        )
    }

    /// The first memory type allowed by `type_bits` with all of `required`
    /// and none of `excluded`.
    pub(crate) fn memory_type(
        &self,
        type_bits: u32,
        required: vk::MemoryPropertyFlags,
        excluded: vk::MemoryPropertyFlags,
    ) -> Option<u32> {
        let props = &self.inner.memory_properties;
        (0..props.memory_type_count).find(|&i| {
            let flags = props.memory_types[i as usize].property_flags;
            type_bits & (1 << i) != 0 && flags.contains(required) && !flags.intersects(excluded)
        })
    }

    pub(crate) fn memory_type_flags(&self, index: u32) -> Option<vk::MemoryPropertyFlags> {
        let props = &self.inner.memory_properties;
        (index < props.memory_type_count).then(|| props.memory_types[index as usize].property_flags)
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Every resource holds a clone of the context, so none is left; wait
        // (bounded) for this crate's own submissions only: never idle a
        // device the application may still be using.
        let mut last = [0; MAX_LANES];
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            last[i] = lane
                .queue
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .last_value;
        }
        let done = wait_lanes(&self.device, &self.lanes, last, DROP_WAIT);
        if let Err(e) = done {
            record_drop_error(format_args!(
                "the context's last submissions ({last:?}) did not complete ({e}); its command buffers{} are leaked",
                if self.owned { ", device and instance" } else { "" }
            ));
            // The owner may destroy the device: never under pending work.
            std::mem::forget(self.owner.take());
            return;
        }
        // SAFETY: every submission of this crate completed (waited above), so
        // no slot, staging buffer or progress semaphore is in use.
        unsafe {
            for lane in self.lanes.drain(..) {
                let engine = lane.engine.into_inner().unwrap_or_else(|p| p.into_inner());
                let handoff = lane.handoff.into_inner().unwrap_or_else(|p| p.into_inner());
                engine.destroy(&self.device);
                handoff.destroy(&self.device);
                self.device.destroy_semaphore(lane.progress, None);
            }
            if self.owned {
                self.device.destroy_device(None);
                drop(self.debug.take());
                self.instance.destroy_instance(None);
            }
        }
    }
}

fn query_identity(instance: &ash::Instance, physical: vk::PhysicalDevice) -> DeviceIdentity {
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut id)
        .push_next(&mut driver);
    // SAFETY: plain query; the chain lives across the call.
    unsafe { instance.get_physical_device_properties2(physical, &mut props) };
    let name = props
        .properties
        .device_name_as_c_str()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let driver_version = props.properties.driver_version;
    DeviceIdentity {
        name,
        device_uuid: DeviceUuid::from_bytes(id.device_uuid),
        driver_uuid: DriverUuid::from_bytes(id.driver_uuid),
        device_luid: (id.device_luid_valid == vk::TRUE).then_some(id.device_luid),
        driver_id: driver.driver_id,
        driver_version,
    }
}

/// What [`Context::from_raw`] can check of the application's queue choices.
fn check_queues(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    queues: &Queues,
) -> Result<()> {
    // SAFETY: plain query.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    let check = |what: &str, choice: QueueChoice, needs: vk::QueueFlags| -> Result<()> {
        let Some(family) = families.get(choice.family as usize) else {
            return Err(Error::InvalidArgument(format!(
                "the {what} queue's family {} does not exist: the device has {} queue families",
                choice.family,
                families.len()
            )));
        };
        if choice.index >= family.queue_count {
            return Err(Error::InvalidArgument(format!(
                "the {what} queue's index {} is not below family {}'s queueCount {}",
                choice.index, choice.family, family.queue_count
            )));
        }
        // GRAPHICS and COMPUTE families support transfers implicitly.
        if !family.queue_flags.intersects(needs) {
            return Err(Error::InvalidArgument(format!(
                "the {what} queue's family {} has {:?}, not one of {needs:?}",
                choice.family, family.queue_flags
            )));
        }
        Ok(())
    };
    check(
        "main",
        queues.main,
        vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE,
    )?;
    if let Some(transfer) = queues.transfer {
        check(
            "transfer",
            transfer,
            vk::QueueFlags::TRANSFER | vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE,
        )?;
        if transfer == queues.main {
            return Err(Error::InvalidArgument(format!(
                "queue {} of family {} is named as both the main and the transfer queue: \
                 leave `transfer` None to do everything on the main queue",
                transfer.index, transfer.family
            )));
        }
    }
    Ok(())
}
