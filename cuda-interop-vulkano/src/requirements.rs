//! What a vulkano device needs before [`Interop::new`](crate::Interop::new)
//! wraps it: [`device_extensions`], [`device_features`] and
//! [`MIN_API_VERSION`].
//!
//! # Contract
//!
//! * [`device_extensions`] is what vk-export needs of `physical`:
//!   `khr_external_memory_fd`, and `khr_external_semaphore_fd` where the
//!   device offers it (semaphores are shared only with it). Add your own
//!   extensions to it (`union`).
//! * [`device_features`] is `timeline_semaphore`.
//! * The check [`Interop::new`](crate::Interop::new) makes is
//!   [`check_device`]: the first thing missing is [`Error::Missing`] naming
//!   the vulkano field to set.

use vulkano::device::physical::PhysicalDevice;
use vulkano::device::{Device, DeviceExtensions, DeviceFeatures};
use vulkano::Version;

use crate::error::{Error, Result};

/// The Vulkan version the instance and the device must have (timeline
/// semaphores are core in 1.2): vulkano's `InstanceCreateInfo::max_api_version`
/// at least this, and a driver that offers it.
pub const MIN_API_VERSION: Version = Version::V1_2;

/// The device extensions to enable on `physical` for vk-export:
/// `khr_external_memory_fd`, and `khr_external_semaphore_fd` where
/// `physical` supports it.
pub fn device_extensions(physical: &PhysicalDevice) -> DeviceExtensions {
    DeviceExtensions {
        khr_external_memory_fd: true,
        khr_external_semaphore_fd: physical.supported_extensions().khr_external_semaphore_fd,
        ..DeviceExtensions::empty()
    }
}

/// The device features to enable for vk-export: `timeline_semaphore`.
pub fn device_features() -> DeviceFeatures {
    DeviceFeatures {
        timeline_semaphore: true,
        ..DeviceFeatures::empty()
    }
}

/// Checks that `device` was created with what vk-export needs; returns
/// whether `khr_external_semaphore_fd` is enabled (it is required where the
/// physical device offers it).
pub(crate) fn check_device(device: &Device) -> Result<bool> {
    if device.instance().api_version() < MIN_API_VERSION {
        return Err(Error::Missing {
            what: "Vulkan 1.2 on the instance",
            enable: "InstanceCreateInfo { max_api_version: Some(Version::V1_2), .. }",
        });
    }
    if device.api_version() < MIN_API_VERSION {
        return Err(Error::Missing {
            what: "Vulkan 1.2 on the device (the driver offers less: update it)",
            enable: "InstanceCreateInfo { max_api_version: Some(Version::V1_2), .. }",
        });
    }
    let enabled = device.enabled_extensions();
    if !enabled.khr_external_memory_fd {
        return Err(Error::Missing {
            what: "VK_KHR_external_memory_fd",
            enable: "DeviceExtensions { khr_external_memory_fd: true, .. }",
        });
    }
    let offered = device.physical_device().supported_extensions();
    if offered.khr_external_semaphore_fd && !enabled.khr_external_semaphore_fd {
        return Err(Error::Missing {
            what: "VK_KHR_external_semaphore_fd (the device offers it: semaphores are shared only with it)",
            enable: "DeviceExtensions { khr_external_semaphore_fd: true, .. }",
        });
    }
    if !device.enabled_features().timeline_semaphore {
        return Err(Error::Missing {
            what: "the timelineSemaphore feature",
            enable: "DeviceFeatures { timeline_semaphore: true, .. }",
        });
    }
    Ok(enabled.khr_external_semaphore_fd)
}
