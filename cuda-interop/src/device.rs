//! Pairing: the CUDA device that *is* a given Vulkan physical device, found
//! by UUID, and what the driver says about it.
//!
//! # Contract
//!
//! * A [`CudaDevice`] is found by UUID only ([`CudaDevice::for_vulkan`],
//!   [`CudaDevice::for_uuid`]), never from an ordinal, and retains the
//!   device's **primary** context (released with the last clone, never
//!   reset; see the `context` module).

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use cuda_interop_sys::{self as sys, CUcontext, CUdevice, CUdevice_attribute, CUuuid};

use crate::context::{CudaDevice, DeviceInner};
use crate::driver::cu;
use crate::error::{Error, Result};
use crate::events::ExternalWaits;
use vk_export::DeviceUuid;

/// A CUDA device as the driver lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceListing {
    /// The ordinal under the current `CUDA_VISIBLE_DEVICES`.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid_v2` (the MIG instance's UUID in MIG mode).
    pub uuid: DeviceUuid,
}

/// Every CUDA device the driver shows this process.
pub fn list_devices() -> Result<Vec<DeviceListing>> {
    let mut count = 0;
    // SAFETY: writes one int; needs no context.
    unsafe { cu!(cuDeviceGetCount(&mut count)) }?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let mut device: CUdevice = 0;
        // SAFETY: writes one device handle; 0 <= ordinal < count.
        unsafe { cu!(cuDeviceGet(&mut device, ordinal)) }?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the driver writes at most the given length (the buffer's
        // 256 chars), NUL-terminated, for a device handle it returned.
        unsafe {
            cu!(cuDeviceGetName(
                name.as_mut_ptr(),
                name.len() as i32,
                device
            ))
        }?;
        let mut uuid = CUuuid::default();
        // SAFETY: writes one 16-byte CUuuid for a device handle it returned.
        unsafe { cu!(cuDeviceGetUuid_v2(&mut uuid, device)) }?;
        out.push(DeviceListing {
            ordinal,
            name: name_from_c_chars(&name),
            uuid: DeviceUuid::from_bytes(uuid.bytes.map(|b| b as u8)),
        });
    }
    Ok(out)
}

/// The text before the first NUL (all of it if there is none).
fn name_from_c_chars(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

impl CudaDevice {
    /// The CUDA device whose UUID equals the Vulkan physical device's `deviceUUID`.
    ///
    /// The device keeps a clone of `vulkan`: records received from other
    /// processes are verified on it before CUDA imports them
    /// ([`CudaDevice::import_received_image`]).
    pub fn for_vulkan(vulkan: &vk_export::Context) -> Result<CudaDevice> {
        CudaDevice::find(vulkan.identity().device_uuid, Some(vulkan.clone()))
    }

    /// The CUDA device with this UUID; the error lists every device seen.
    /// Without a paired Vulkan device it cannot verify received records, so
    /// it imports only resources of this process and, `unsafe`, bare fds.
    pub fn for_uuid(uuid: DeviceUuid) -> Result<CudaDevice> {
        CudaDevice::find(uuid, None)
    }

    /// The Vulkan device this CUDA device was paired with
    /// ([`CudaDevice::for_vulkan`]), if any.
    pub fn vulkan(&self) -> Option<&vk_export::Context> {
        self.inner.vulkan.as_ref()
    }

    /// Runs `verify` on the paired Vulkan device, or says why it cannot.
    pub(crate) fn verify_with_vulkan(
        &self,
        verify: impl FnOnce(&vk_export::Context) -> vk_export::Result<()>,
    ) -> Result<()> {
        let ctx = self.inner.vulkan.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "a received record is verified on the Vulkan device of the same GPU before CUDA sees its fd: \
                 make this CudaDevice with CudaDevice::for_vulkan (or, if the record is known good, use the \
                 unsafe import_*_fd)"
                    .into(),
            )
        })?;
        verify(ctx).map_err(Error::Vulkan)
    }

    fn find(uuid: DeviceUuid, vulkan: Option<vk_export::Context>) -> Result<CudaDevice> {
        let devices = list_devices()?;
        let Some(found) = devices.iter().find(|d| d.uuid == uuid) else {
            let cuda = if devices.is_empty() {
                "none".to_string()
            } else {
                devices
                    .iter()
                    .map(|d| format!("[{}] {} {}", d.ordinal, d.name, d.uuid))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(Error::NoMatchingDevice {
                vulkan: uuid.to_string(),
                cuda,
            });
        };
        let mut device: CUdevice = 0;
        // SAFETY: writes one device handle; the ordinal was listed just now.
        unsafe { cu!(cuDeviceGet(&mut device, found.ordinal)) }?;
        let mut mode = 0;
        // SAFETY: writes one int for a device handle the driver returned.
        unsafe {
            cu!(cuDeviceGetAttribute(
                &mut mode,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE,
                device
            ))
        }?;
        if mode == sys::CUcomputemode::CU_COMPUTEMODE_PROHIBITED.0 as i32 {
            return Err(Error::Unsupported(format!(
                "{} is in compute mode PROHIBITED",
                found.name
            )));
        }
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: a device handle the driver returned; writes one context
        // handle. Balanced by the release in `DeviceInner::drop`.
        unsafe { cu!(cuDevicePrimaryCtxRetain(&mut context, device)) }?;
        Ok(CudaDevice {
            inner: Arc::new(DeviceInner {
                device,
                context,
                ordinal: found.ordinal,
                uuid,
                name: found.name.clone(),
                vulkan,
                external_waits: ExternalWaits::of_context(context),
                copy_kernels: Default::default(),
                convert_kernels: Default::default(),
            }),
        })
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let _guard = self.enter()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the device's context is current; writes two size_t.
        unsafe { cu!(cuMemGetInfo(&mut free, &mut total)) }?;
        Ok((free, total))
    }

    /// A device attribute.
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int for this device's handle, with an attribute
        // of the header's enum (the driver rejects one it does not know).
        unsafe { cu!(cuDeviceGetAttribute(&mut v, attribute, self.inner.device)) }?;
        Ok(v)
    }
}
