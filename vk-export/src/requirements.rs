//! What a Vulkan device needs for this crate, for an application that
//! creates its own device and wraps it with
//! [`Context::from_raw`](crate::Context::from_raw).
//!
//! # Contract
//!
//! * [`DeviceRequirements::of`] (unsafe: it takes raw handles) asks the
//!   physical device (plain queries, nothing created) and answers, or says in one
//!   [`Error::Unsupported`](crate::Error::Unsupported) what the device
//!   lacks: Vulkan 1.2, the `timelineSemaphore` feature, a family with
//!   `COMPUTE`, or an extension of [`REQUIRED_DEVICE_EXTENSIONS`].
//! * Its answer is what [`Context::headless`](crate::Context::headless)
//!   creates: the queues (a compute-capable main family; a transfer-only
//!   family where the device has one), the extensions (the required ones,
//!   and those of [`OPTIONAL_DEVICE_EXTENSIONS`] the device offers) and the
//!   feature; a device created with them (and whatever else the application
//!   enables) meets `from_raw`'s device conditions, with
//!   [`DeviceRequirements::semaphore_fd`] as its `semaphore_fd_enabled`.
//!   (`headless` also enables `VK_KHR_maintenance8` where offered, for
//!   direct depth copies; a `from_raw` context does not use it.)

use std::ffi::{c_char, CStr};

use ash::vk;

use crate::error::{unsupported, Result};
use crate::queues::{QueueChoice, Queues};

/// Device extensions every context needs.
pub const REQUIRED_DEVICE_EXTENSIONS: &[&CStr] = &[ash::khr::external_memory_fd::NAME];
/// Device extensions used when present (semaphore sharing, memory budget).
pub const OPTIONAL_DEVICE_EXTENSIONS: &[&CStr] = &[
    ash::khr::external_semaphore_fd::NAME,
    ash::ext::memory_budget::NAME,
];

/// What to create a device with, so that [`Context::from_raw`] can wrap it:
/// worked out for one physical device by [`DeviceRequirements::of`].
///
/// [`Context::from_raw`]: crate::Context::from_raw
///
/// ```no_run
/// use vk_export::ash::{self, vk};
/// use vk_export::{Context, DeviceRequirements};
///
/// # fn wrap(entry: ash::Entry, instance: ash::Instance, physical: vk::PhysicalDevice)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// // SAFETY: `instance` is alive and of Vulkan 1.2; `physical` is one of
/// // its physical devices.
/// let needs = unsafe { DeviceRequirements::of(&instance, physical) }?;
/// let priorities = [1.0];
/// let queue_infos = needs.queue_create_infos(&priorities);
/// // The application adds its own extensions (a swapchain, ...) to these.
/// let extensions = needs.extension_names();
/// let mut features12 = needs.features12();
/// let info = vk::DeviceCreateInfo::default()
///     .queue_create_infos(&queue_infos)
///     .enabled_extension_names(&extensions)
///     .push_next(&mut features12);
/// // SAFETY: the create info and its chain live across the call.
/// let device = unsafe { instance.create_device(physical, &info, None) }?;
/// // SAFETY: the device has what `needs` lists; the application submits to
/// // its queues only under the context's locks and destroys the device
/// // after the context (and everything made from it) is gone.
/// let ctx = unsafe {
///     Context::from_raw(entry, instance, physical, device, needs.queues, needs.semaphore_fd)
/// }?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRequirements {
    /// The queues to create (queue 0 of each family) and to pass on: the
    /// first family with `COMPUTE` as the main queue, a transfer-only
    /// family's as the transfer queue where the device has one (work there
    /// does not switch the graphics engine between Vulkan and CUDA).
    pub queues: Queues,
    /// The device extensions to enable: [`REQUIRED_DEVICE_EXTENSIONS`], and
    /// those of [`OPTIONAL_DEVICE_EXTENSIONS`] the device offers.
    pub extensions: Vec<&'static CStr>,
    /// Whether `VK_KHR_external_semaphore_fd` is among them: `from_raw`'s
    /// `semaphore_fd_enabled` (semaphores are shared only with it).
    pub semaphore_fd: bool,
}

impl DeviceRequirements {
    /// Asks `physical` (of `instance`) what a device for this crate needs;
    /// [`Error::Unsupported`](crate::Error::Unsupported) naming the first
    /// thing it lacks.
    ///
    /// # Safety
    ///
    /// `instance` is alive (not destroyed) and was created with an
    /// `apiVersion` of 1.2 or later (the queries include Vulkan 1.1's
    /// `vkGetPhysicalDeviceFeatures2`, and the device it describes is a 1.2
    /// one), and `physical` is one of its physical devices
    /// (`vkEnumeratePhysicalDevices`): raw handles the crate cannot check.
    pub unsafe fn of(instance: &ash::Instance, physical: vk::PhysicalDevice) -> Result<Self> {
        // SAFETY: the caller's promise: a live instance and one of its
        // physical devices.
        let props = unsafe { instance.get_physical_device_properties(physical) };
        if props.api_version < vk::API_VERSION_1_2 {
            return Err(unsupported(
                "Vulkan 1.2",
                format!(
                    "the device offers Vulkan {}.{}; timeline semaphores need 1.2 (update the driver)",
                    vk::api_version_major(props.api_version),
                    vk::api_version_minor(props.api_version)
                ),
            ));
        }
        let mut features12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut features12);
        // SAFETY: the caller's promise (an instance of Vulkan 1.2 or later,
        // so vkGetPhysicalDeviceFeatures2 is core); the chain lives across
        // the call.
        unsafe { instance.get_physical_device_features2(physical, &mut features) };
        if features12.timeline_semaphore != vk::TRUE {
            return Err(unsupported(
                "the timelineSemaphore feature",
                "the driver does not offer it (every Vulkan 1.2 driver should: update it)",
            ));
        }
        let main = compute_queue_family(instance, physical).ok_or_else(|| {
            unsupported(
                "a queue family with COMPUTE",
                "the device has none (graphics families usually have it)",
            )
        })?;
        let offered = device_extensions(instance, physical);
        let has = |name: &CStr| offered.iter().any(|e| e.as_c_str() == name);
        if let Some(missing) = REQUIRED_DEVICE_EXTENSIONS.iter().find(|e| !has(e)) {
            return Err(unsupported(
                missing.to_string_lossy(),
                "the device does not offer it: memory cannot be exported (another driver or device)",
            ));
        }
        let extensions: Vec<&'static CStr> = REQUIRED_DEVICE_EXTENSIONS
            .iter()
            .chain(OPTIONAL_DEVICE_EXTENSIONS.iter().filter(|e| has(e)))
            .copied()
            .collect();
        let semaphore_fd = extensions.contains(&ash::khr::external_semaphore_fd::NAME);
        Ok(DeviceRequirements {
            queues: Queues {
                main: QueueChoice {
                    family: main,
                    index: 0,
                },
                transfer: transfer_only_family(instance, physical)
                    .map(|family| QueueChoice { family, index: 0 }),
            },
            extensions,
            semaphore_fd,
        })
    }

    /// One `VkDeviceQueueCreateInfo` per family of [`Self::queues`], each
    /// asking for `priorities.len()` queues (queue 0 is the one passed on).
    ///
    /// Panics if `priorities` is empty (a family with no queue).
    pub fn queue_create_infos<'a>(
        &self,
        priorities: &'a [f32],
    ) -> Vec<vk::DeviceQueueCreateInfo<'a>> {
        assert!(
            !priorities.is_empty(),
            "queue_create_infos needs one priority per queue, at least one"
        );
        std::iter::once(self.queues.main.family)
            .chain(self.queues.transfer.map(|t| t.family))
            .map(|family| {
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(family)
                    .queue_priorities(priorities)
            })
            .collect()
    }

    /// [`Self::extensions`] as `ppEnabledExtensionNames` wants them (the
    /// names are `'static`).
    pub fn extension_names(&self) -> Vec<*const c_char> {
        self.extensions.iter().map(|e| e.as_ptr()).collect()
    }

    /// The Vulkan 1.2 features to enable: `timelineSemaphore` (chain it
    /// into `VkDeviceCreateInfo`, or set the field in the application's
    /// own `VkPhysicalDeviceVulkan12Features`).
    pub fn features12(&self) -> vk::PhysicalDeviceVulkan12Features<'static> {
        vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true)
    }
}

/// `VK_KHR_maintenance8`, which ash 0.38 does not name.
pub(crate) const MAINTENANCE8: &CStr = c"VK_KHR_maintenance8";

/// `VkPhysicalDeviceMaintenance8FeaturesKHR` (ash 0.38 has no binding):
/// its `maintenance8` feature allows `vkCmdCopyImage` between a depth
/// aspect and a colour image of the same texel bits (`D32_SFLOAT` into
/// `R32_SFLOAT`), on a queue family with `GRAPHICS` (other families also
/// need `maintenance10`).
#[repr(C)]
pub(crate) struct Maintenance8Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    pub(crate) maintenance8: vk::Bool32,
}

impl Maintenance8Features {
    /// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_8_FEATURES_KHR`.
    const S_TYPE: vk::StructureType = vk::StructureType::from_raw(1_000_574_000);

    pub(crate) fn new(enabled: bool) -> Self {
        Maintenance8Features {
            s_type: Self::S_TYPE,
            p_next: std::ptr::null_mut(),
            maintenance8: enabled.into(),
        }
    }
}

// SAFETY: the struct is the C layout of VkPhysicalDeviceMaintenance8FeaturesKHR
// (sType, pNext, one VkBool32), which the specification lets extend both
// VkPhysicalDeviceFeatures2 and VkDeviceCreateInfo.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Maintenance8Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Maintenance8Features {}

/// Whether `physical` offers `VK_KHR_maintenance8` with its feature, and
/// `family` has `GRAPHICS`: then a device created with both copies a depth
/// aspect into its colour twin with one `vkCmdCopyImage` on that family.
///
/// # Safety
/// As [`DeviceRequirements::of`].
pub(crate) unsafe fn depth_to_color_copies_offered(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    family: u32,
) -> bool {
    let offered = device_extensions(instance, physical)
        .iter()
        .any(|e| e.as_c_str() == MAINTENANCE8);
    // SAFETY: plain query.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    let graphics = families
        .get(family as usize)
        .is_some_and(|f| f.queue_flags.contains(vk::QueueFlags::GRAPHICS));
    if !offered || !graphics {
        return false;
    }
    let mut m8 = Maintenance8Features::new(false);
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut m8);
    // SAFETY: the caller's promise (a live instance of Vulkan 1.2 or
    // later); the chain lives across the call; the extension that defines
    // the chained struct is offered.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    m8.maintenance8 == vk::TRUE
}

pub(crate) fn device_extensions(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
) -> Vec<std::ffi::CString> {
    // SAFETY: plain enumeration.
    unsafe { instance.enumerate_device_extension_properties(physical) }
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.extension_name_as_c_str().ok().map(CStr::to_owned))
        .collect()
}

/// A family with `TRANSFER` but neither `GRAPHICS` nor `COMPUTE`.
fn transfer_only_family(instance: &ash::Instance, physical: vk::PhysicalDevice) -> Option<u32> {
    // SAFETY: plain query.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    families
        .iter()
        .position(|f| {
            f.queue_count > 0
                && f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        })
        .map(|i| i as u32)
}

/// The first family with `COMPUTE`.
fn compute_queue_family(instance: &ash::Instance, physical: vk::PhysicalDevice) -> Option<u32> {
    // SAFETY: plain query.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    families
        .iter()
        .position(|f| f.queue_count > 0 && f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .map(|i| i as u32)
}
