//! The Vulkan side of the doctor: the loader, the validation layer, and per
//! physical device its identity, queue families, memory types, extensions
//! and external memory and semaphore capabilities. Creates one instance (no
//! layer, no device) and destroys it. Uses no other module of this crate.

use std::ffi::CStr;
use std::fmt;

use ash::vk;

use crate::Finding;

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// The formats the doctor asks about for optimal storage images (the
/// common ones of `vk_export::format`; not the sRGB ones, which drivers
/// rarely give storage usage).
const IMAGE_FORMATS: &[(vk::Format, &str)] = &[
    (vk::Format::R8G8B8A8_UNORM, "Rgba8Unorm"),
    (vk::Format::B8G8R8A8_UNORM, "Bgra8Unorm"),
    (
        vk::Format::A2B10G10R10_UNORM_PACK32,
        "A2b10g10r10UnormPack32",
    ),
    (vk::Format::R16_UNORM, "R16Unorm"),
    (vk::Format::R16G16_UNORM, "Rg16Unorm"),
    (vk::Format::R16G16B16A16_SFLOAT, "Rgba16Sfloat"),
    (vk::Format::R32_SFLOAT, "R32Sfloat"),
];

/// Export and import support of one resource kind and handle type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Support {
    /// The driver can export it.
    pub export: bool,
    /// The driver can import it.
    pub import: bool,
}

impl Support {
    fn of(features: vk::ExternalMemoryFeatureFlags) -> Support {
        Support {
            export: features.contains(vk::ExternalMemoryFeatureFlags::EXPORTABLE),
            import: features.contains(vk::ExternalMemoryFeatureFlags::IMPORTABLE),
        }
    }

    fn of_semaphore(features: vk::ExternalSemaphoreFeatureFlags) -> Support {
        Support {
            export: features.contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE),
            import: features.contains(vk::ExternalSemaphoreFeatureFlags::IMPORTABLE),
        }
    }

    /// Both ways.
    pub fn both(self) -> bool {
        self.export && self.import
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.export, self.import) {
            (true, true) => "export+import",
            (true, false) => "export only",
            (false, true) => "import only",
            (false, false) => "no",
        })
    }
}

/// One physical device.
#[derive(Clone, Debug, Default)]
pub struct VulkanDeviceInfo {
    /// `deviceName`.
    pub name: String,
    /// `deviceUUID`, spelled as `nvidia-smi -L` does.
    pub device_uuid: String,
    /// `driverUUID`.
    pub driver_uuid: String,
    /// `driverName` and `driverInfo`.
    pub driver: String,
    /// `apiVersion`, as `major.minor.patch`.
    pub api_version: String,
    /// Whether it is a CPU (software) implementation such as lavapipe.
    pub cpu: bool,
    /// Each queue family: index, flags, queue count.
    pub queue_families: Vec<(u32, vk::QueueFlags, u32)>,
    /// Whether a family has TRANSFER but neither GRAPHICS nor COMPUTE.
    pub transfer_only_family: bool,
    /// Whether a memory type is device-local and not host-visible (what
    /// `DeviceLocal` resources need).
    pub device_local_only_memory: bool,
    /// Whether a memory type is host-visible (what `HostVisible` needs).
    pub host_visible_memory: bool,
    /// The interop extensions, each present or not.
    pub extensions: Vec<(&'static str, bool)>,
    /// `timelineSemaphore` of the Vulkan 1.2 features.
    pub timeline_semaphores: bool,
    /// Buffers: OPAQUE_FD and DMA_BUF.
    pub buffer_memory: Vec<(&'static str, Support)>,
    /// Optimal storage images per format, OPAQUE_FD.
    pub image_memory: Vec<(&'static str, Support)>,
    /// Semaphores: (kind, handle type, support).
    pub semaphores: Vec<(&'static str, &'static str, Support)>,
}

impl VulkanDeviceInfo {
    fn extension(&self, name: &str) -> bool {
        self.extensions.iter().any(|(n, have)| *n == name && *have)
    }

    /// OPAQUE_FD buffer memory both ways, with the extension.
    pub fn opaque_fd_memory(&self) -> bool {
        self.extension("VK_KHR_external_memory_fd")
            && self
                .buffer_memory
                .iter()
                .any(|(h, s)| *h == "OPAQUE_FD" && s.both())
    }

    /// OPAQUE_FD timeline semaphores both ways, with the extension.
    pub fn opaque_fd_timeline(&self) -> bool {
        self.timeline_semaphores
            && self.extension("VK_KHR_external_semaphore_fd")
            && self
                .semaphores
                .iter()
                .any(|(k, h, s)| *k == "timeline" && *h == "OPAQUE_FD" && s.both())
    }

    /// What is missing on this device, each with its fix.
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        for (name, have) in &self.extensions {
            if !have {
                let fix = match *name {
                    "VK_KHR_external_memory_fd" => {
                        "required for any sharing: use a driver that has it (NVIDIA's, or Mesa's)"
                    }
                    "VK_KHR_external_semaphore_fd" => {
                        "needed to share semaphores (memory alone still works): update the driver"
                    }
                    "VK_EXT_memory_budget" => "optional (memory budget reports only)",
                    _ => "optional (DMA_BUF exports only)",
                };
                out.push(Finding::missing(format!("{name} not offered"), fix));
            }
        }
        if !self.device_local_only_memory {
            out.push(Finding::missing(
                "no device-local memory type that is not host-visible",
                "`DeviceLocal` images and buffers cannot be made here (lavapipe and other CPU \
                 drivers): use `HostVisible` resources, or run on a GPU",
            ));
        }
        if !self.timeline_semaphores {
            out.push(Finding::missing(
                "no timeline semaphores",
                "a Vulkan 1.2 driver is needed for timeline semaphores",
            ));
        }
        if !self.transfer_only_family {
            out.push(Finding {
                ok: true,
                what: "no transfer-only queue family (copies share a compute queue)".into(),
                fix: None,
            });
        }
        out
    }

    pub(crate) fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.cpu { ", CPU implementation" } else { "" };
        writeln!(
            f,
            "  device {} (Vulkan {}{kind})\n    deviceUUID {}  driverUUID {}\n    driver {}",
            self.name, self.api_version, self.device_uuid, self.driver_uuid, self.driver
        )?;
        for (index, flags, count) in &self.queue_families {
            writeln!(f, "    queue family {index}: {flags:?} x{count}")?;
        }
        writeln!(
            f,
            "    transfer-only queue family: {}; device-local-only memory: {}; host-visible \
             memory: {}",
            yes_no(self.transfer_only_family),
            yes_no(self.device_local_only_memory),
            yes_no(self.host_visible_memory)
        )?;
        let extensions: Vec<String> = self
            .extensions
            .iter()
            .map(|(n, have)| format!("{n} {}", yes_no(*have)))
            .collect();
        writeln!(f, "    extensions: {}", extensions.join(", "))?;
        writeln!(
            f,
            "    timeline semaphores: {}",
            yes_no(self.timeline_semaphores)
        )?;
        for (handle, support) in &self.buffer_memory {
            writeln!(f, "    buffer memory {handle}: {support}")?;
        }
        for (format, support) in &self.image_memory {
            writeln!(f, "    optimal storage image {format} OPAQUE_FD: {support}")?;
        }
        for (kind, handle, support) in &self.semaphores {
            writeln!(f, "    {kind} semaphore {handle}: {support}")?;
        }
        for finding in self.findings() {
            crate::write_finding(f, "    ", &finding)?;
        }
        Ok(())
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// What the Vulkan probe found.
#[derive(Debug, Default)]
pub struct VulkanReport {
    /// The loader, the validation layer, the device count; what is missing.
    pub findings: Vec<Finding>,
    /// The physical devices.
    pub devices: Vec<VulkanDeviceInfo>,
}

/// Loads Vulkan, makes an instance and looks at every physical device.
pub(crate) fn probe() -> VulkanReport {
    let mut report = VulkanReport::default();
    // SAFETY: loading libvulkan runs its initialisers; it is the system loader.
    let entry = match unsafe { ash::Entry::load() } {
        Ok(entry) => entry,
        Err(e) => {
            report.findings.push(Finding::missing(
                format!("no Vulkan loader: {e}"),
                "install the Vulkan loader and a driver (Debian/Ubuntu: libvulkan1 and the \
                 NVIDIA driver, or mesa-vulkan-drivers for lavapipe)",
            ));
            return report;
        }
    };
    report
        .findings
        .push(Finding::ok("Vulkan loader (libvulkan.so.1)"));
    // SAFETY: plain enumeration.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
    if layers
        .iter()
        .any(|l| l.layer_name_as_c_str().ok() == Some(VALIDATION_LAYER))
    {
        report
            .findings
            .push(Finding::ok("validation layer VK_LAYER_KHRONOS_validation"));
    } else {
        report.findings.push(Finding::missing(
            "validation layer VK_LAYER_KHRONOS_validation",
            "only the tests need it: Debian/Ubuntu vulkan-validationlayers, or VK_LAYER_PATH \
             pointing at the SDK's layer",
        ));
    }
    let app = vk::ApplicationInfo::default()
        .application_name(c"cuda-interop-doctor")
        .api_version(vk::API_VERSION_1_2);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: the create info and what it points to live across the call.
    let instance = match unsafe { entry.create_instance(&info, None) } {
        Ok(instance) => instance,
        Err(e) => {
            report.findings.push(Finding::missing(
                format!("vkCreateInstance failed: {e}"),
                "no Vulkan 1.2 driver is installed or found: install one (NVIDIA driver, or \
                 mesa-vulkan-drivers) or point VK_DRIVER_FILES at its ICD json",
            ));
            return report;
        }
    };
    // SAFETY: plain enumeration on a live instance.
    let physicals = unsafe { instance.enumerate_physical_devices() }.unwrap_or_default();
    if physicals.is_empty() {
        report.findings.push(Finding::missing(
            "no Vulkan physical device",
            "install the driver's Vulkan ICD (NVIDIA: nvidia_icd.json from the driver; in a \
             container: NVIDIA_DRIVER_CAPABILITIES must include graphics) or check \
             VK_DRIVER_FILES",
        ));
    } else {
        report.findings.push(Finding::ok(format!(
            "{} physical device(s)",
            physicals.len()
        )));
    }
    for physical in physicals {
        report.devices.push(device_info(&instance, physical));
    }
    // SAFETY: nothing made from the instance outlives this point.
    unsafe { instance.destroy_instance(None) };
    report
}

fn device_info(instance: &ash::Instance, physical: vk::PhysicalDevice) -> VulkanDeviceInfo {
    let mut id = vk::PhysicalDeviceIDProperties::default();
    let mut driver = vk::PhysicalDeviceDriverProperties::default();
    let mut props = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut id)
        .push_next(&mut driver);
    // SAFETY: plain query; the chain lives across the call.
    unsafe { instance.get_physical_device_properties2(physical, &mut props) };
    let p = props.properties;
    let text = |s: Result<&CStr, _>| {
        s.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let name = text(p.device_name_as_c_str());
    let driver_text = format!(
        "{} {}",
        text(driver.driver_name_as_c_str()),
        text(driver.driver_info_as_c_str())
    );
    let mut info = VulkanDeviceInfo {
        name,
        device_uuid: vk_export::DeviceUuid::from_bytes(id.device_uuid).to_string(),
        driver_uuid: vk_export::DriverUuid::from_bytes(id.driver_uuid).to_string(),
        driver: driver_text.trim().to_string(),
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(p.api_version),
            vk::api_version_minor(p.api_version),
            vk::api_version_patch(p.api_version)
        ),
        cpu: p.device_type == vk::PhysicalDeviceType::CPU,
        ..VulkanDeviceInfo::default()
    };

    // SAFETY: plain query on a live instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    for (index, family) in families.iter().enumerate() {
        let flags = family.queue_flags;
        info.queue_families
            .push((index as u32, flags, family.queue_count));
        if flags.contains(vk::QueueFlags::TRANSFER)
            && !flags.intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        {
            info.transfer_only_family = true;
        }
    }

    // SAFETY: plain query on a live instance.
    let memory = unsafe { instance.get_physical_device_memory_properties(physical) };
    for t in &memory.memory_types[..memory.memory_type_count as usize] {
        let flags = t.property_flags;
        if flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
            && !flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
        {
            info.device_local_only_memory = true;
        }
        if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            info.host_visible_memory = true;
        }
    }

    // SAFETY: plain enumeration.
    let offered =
        unsafe { instance.enumerate_device_extension_properties(physical) }.unwrap_or_default();
    let has = |name: &CStr| {
        offered
            .iter()
            .any(|e| e.extension_name_as_c_str().ok() == Some(name))
    };
    for name in [
        ash::khr::external_memory_fd::NAME,
        ash::khr::external_semaphore_fd::NAME,
        ash::ext::external_memory_dma_buf::NAME,
        ash::ext::memory_budget::NAME,
    ] {
        let label: &'static str = match name.to_bytes() {
            b"VK_KHR_external_memory_fd" => "VK_KHR_external_memory_fd",
            b"VK_KHR_external_semaphore_fd" => "VK_KHR_external_semaphore_fd",
            b"VK_EXT_external_memory_dma_buf" => "VK_EXT_external_memory_dma_buf",
            _ => "VK_EXT_memory_budget",
        };
        info.extensions.push((label, has(name)));
    }

    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
    // SAFETY: plain query; the chain lives across the call.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    info.timeline_semaphores = v12.timeline_semaphore == vk::TRUE;

    let memory_handles = [
        (vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD, "OPAQUE_FD"),
        (vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT, "DMA_BUF"),
    ];
    for (handle, label) in memory_handles {
        let query = vk::PhysicalDeviceExternalBufferInfo::default()
            .usage(
                vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::STORAGE_BUFFER,
            )
            .handle_type(handle);
        let mut out = vk::ExternalBufferProperties::default();
        // SAFETY: plain query; `query` and `out` live across the call.
        unsafe {
            instance.get_physical_device_external_buffer_properties(physical, &query, &mut out)
        };
        info.buffer_memory.push((
            label,
            Support::of(out.external_memory_properties.external_memory_features),
        ));
    }

    for (format, label) in IMAGE_FORMATS {
        let mut external = vk::PhysicalDeviceExternalImageFormatInfo::default()
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let query = vk::PhysicalDeviceImageFormatInfo2::default()
            .format(*format)
            .ty(vk::ImageType::TYPE_2D)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(
                vk::ImageUsageFlags::STORAGE
                    | vk::ImageUsageFlags::TRANSFER_SRC
                    | vk::ImageUsageFlags::TRANSFER_DST,
            )
            .push_next(&mut external);
        let mut external_out = vk::ExternalImageFormatProperties::default();
        let mut out = vk::ImageFormatProperties2::default().push_next(&mut external_out);
        // SAFETY: plain query; both chains live across the call.
        let result = unsafe {
            instance.get_physical_device_image_format_properties2(physical, &query, &mut out)
        };
        let support = match result {
            Ok(()) => Support::of(
                external_out
                    .external_memory_properties
                    .external_memory_features,
            ),
            Err(_) => Support::default(),
        };
        info.image_memory.push((label, support));
    }

    let semaphore_handles = [
        (vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD, "OPAQUE_FD"),
        (vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD, "SYNC_FD"),
    ];
    for (kind, label) in [
        (vk::SemaphoreType::BINARY, "binary"),
        (vk::SemaphoreType::TIMELINE, "timeline"),
    ] {
        for (handle, handle_label) in semaphore_handles {
            let mut type_info = vk::SemaphoreTypeCreateInfo::default().semaphore_type(kind);
            let query = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                .handle_type(handle)
                .push_next(&mut type_info);
            let mut out = vk::ExternalSemaphoreProperties::default();
            // SAFETY: plain query; the chain and `out` live across the call.
            unsafe {
                instance
                    .get_physical_device_external_semaphore_properties(physical, &query, &mut out)
            };
            info.semaphores.push((
                label,
                handle_label,
                Support::of_semaphore(out.external_semaphore_features),
            ));
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::IMAGE_FORMATS;

    /// The doctor asks only about formats vk-export exports, and about the
    /// BGRA, packed and 16-bit UNORM ones of issue 31.
    #[test]
    fn the_formats_asked_about_are_vk_export_formats() {
        for (format, label) in IMAGE_FORMATS {
            assert!(
                vk_export::format::describe(*format).is_some(),
                "{label} is not a vk-export format"
            );
        }
        for want in [
            "Bgra8Unorm",
            "A2b10g10r10UnormPack32",
            "R16Unorm",
            "Rg16Unorm",
        ] {
            assert!(IMAGE_FORMATS.iter().any(|(_, l)| *l == want), "{want}");
        }
    }
}
