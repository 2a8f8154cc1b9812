use std::ffi::{c_char, CStr};
use std::fmt;
use std::sync::Arc;

use cuda_interop_sys::{self as sys, CUcontext, CUdevice, CUdevice_attribute, CUuuid};

use crate::driver::cu;
use crate::error::{Error, Result};
use vk_export::format_uuid;

/// The CUDA device that *is* a given Vulkan physical device, with its primary
/// context retained.
///
/// It can only be made by matching UUIDs ([`CudaDevice::for_vulkan`],
/// [`CudaDevice::for_uuid`]), never from an ordinal, so it stays right when
/// `CUDA_VISIBLE_DEVICES` reorders devices. It uses the **primary** context, the
/// one the CUDA runtime, cudarc and PyTorch use, so memory and streams are
/// shared with them; it is released when the last clone is dropped.
///
/// `Send + Sync`: every call pushes the primary context on the calling
/// thread's stack and pops it afterwards (restoring whatever was current),
/// so any thread may use or drop it.
#[derive(Clone)]
pub struct CudaDevice {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    pub(crate) device: CUdevice,
    pub(crate) context: CUcontext,
    pub(crate) ordinal: i32,
    pub(crate) uuid: [u8; 16],
    pub(crate) name: String,
}

// SAFETY: CUdevice is an integer; the primary context is a process-wide
// handle valid on every thread; the driver API is thread-safe, and every use
// makes the context current on the calling thread first (ContextGuard).
unsafe impl Send for DeviceInner {}
// SAFETY: as above; nothing in DeviceInner is mutated after construction.
unsafe impl Sync for DeviceInner {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("uuid", &format_uuid(&self.inner.uuid))
            .finish()
    }
}

/// A CUDA device as the driver lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceListing {
    /// The ordinal under the current `CUDA_VISIBLE_DEVICES`.
    pub ordinal: i32,
    /// `cuDeviceGetName`.
    pub name: String,
    /// `cuDeviceGetUuid_v2` (the MIG instance's UUID in MIG mode).
    pub uuid: [u8; 16],
}

/// Every CUDA device the driver shows this process.
pub fn list_devices() -> Result<Vec<DeviceListing>> {
    let mut count = 0;
    // SAFETY: writes one int.
    cu!(cuDeviceGetCount(&mut count))?;
    let mut out = Vec::new();
    for ordinal in 0..count {
        let mut device: CUdevice = 0;
        // SAFETY: ordinal < count.
        cu!(cuDeviceGet(&mut device, ordinal))?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 chars; the driver NUL-terminates.
        cu!(cuDeviceGetName(
            name.as_mut_ptr(),
            name.len() as i32,
            device
        ))?;
        let mut uuid = CUuuid::default();
        // SAFETY: writes 16 bytes.
        cu!(cuDeviceGetUuid_v2(&mut uuid, device))?;
        out.push(DeviceListing {
            ordinal,
            // SAFETY: NUL-terminated by the driver.
            name: unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
            uuid: uuid.bytes.map(|b| b as u8),
        });
    }
    Ok(out)
}

impl CudaDevice {
    /// The CUDA device whose UUID equals the Vulkan physical device's `deviceUUID`.
    pub fn for_vulkan(vulkan: &vk_export::Context) -> Result<CudaDevice> {
        CudaDevice::for_uuid(vulkan.identity().device_uuid)
    }

    /// The CUDA device with this UUID; the error lists every device seen.
    pub fn for_uuid(uuid: [u8; 16]) -> Result<CudaDevice> {
        let devices = list_devices()?;
        let Some(found) = devices.iter().find(|d| d.uuid == uuid) else {
            let cuda = if devices.is_empty() {
                "none".to_string()
            } else {
                devices
                    .iter()
                    .map(|d| format!("[{}] {} {}", d.ordinal, d.name, format_uuid(&d.uuid)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(Error::NoMatchingDevice {
                vulkan: format_uuid(&uuid),
                cuda,
            });
        };
        let mut device: CUdevice = 0;
        // SAFETY: the ordinal was listed just now.
        cu!(cuDeviceGet(&mut device, found.ordinal))?;
        let mut mode = 0;
        // SAFETY: writes one int.
        cu!(cuDeviceGetAttribute(
            &mut mode,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE,
            device
        ))?;
        if mode == sys::CUcomputemode::CU_COMPUTEMODE_PROHIBITED.0 as i32 {
            return Err(Error::Unsupported(format!(
                "{} is in compute mode PROHIBITED",
                found.name
            )));
        }
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid device; writes the primary context handle.
        cu!(cuDevicePrimaryCtxRetain(&mut context, device))?;
        Ok(CudaDevice {
            inner: Arc::new(DeviceInner {
                device,
                context,
                ordinal: found.ordinal,
                uuid,
                name: found.name.clone(),
            }),
        })
    }

    /// The device's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }
    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The ordinal under this process's `CUDA_VISIBLE_DEVICES` (for display only).
    pub fn ordinal(&self) -> i32 {
        self.inner.ordinal
    }
    /// The primary context handle (for interoperating with other CUDA code).
    pub fn raw_context(&self) -> CUcontext {
        self.inner.context
    }
    /// The `CUdevice`.
    pub fn raw_device(&self) -> CUdevice {
        self.inner.device
    }

    /// Makes the primary context current on this thread until the guard drops.
    pub fn enter(&self) -> Result<ContextGuard<'_>> {
        // SAFETY: a retained primary context.
        cu!(cuCtxPushCurrent(self.inner.context))?;
        Ok(ContextGuard { _device: self })
    }

    /// Waits until all work in the primary context is done.
    pub fn synchronize(&self) -> Result<()> {
        let _guard = self.enter()?;
        // SAFETY: the context is current.
        cu!(cuCtxSynchronize())
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let _guard = self.enter()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t; the context is current.
        cu!(cuMemGetInfo(&mut free, &mut total))?;
        Ok((free, total))
    }

    /// A device attribute.
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        cu!(cuDeviceGetAttribute(&mut v, attribute, self.inner.device))?;
        Ok(v)
    }

    pub(crate) fn check_resource_device(&self, resource_uuid: &[u8; 16]) -> Result<()> {
        if resource_uuid != &self.inner.uuid {
            return Err(Error::DeviceMismatch {
                resource: format_uuid(resource_uuid),
                device: format_uuid(&self.inner.uuid),
            });
        }
        Ok(())
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Never cuDevicePrimaryCtxReset: other users of the primary context
        // (the runtime, PyTorch) keep their allocations.
        if let Ok(driver) = crate::driver::api() {
            if let Some(release) = driver.fns().cuDevicePrimaryCtxRelease {
                // SAFETY: balances the retain in for_uuid.
                unsafe { release(self.device) };
            }
        }
    }
}

/// The primary context is current on this thread while this lives; dropping
/// it pops the context, restoring what was current before.
#[derive(Debug)]
pub struct ContextGuard<'a> {
    _device: &'a CudaDevice,
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if let Ok(driver) = crate::driver::api() {
            if let Some(pop) = driver.fns().cuCtxPopCurrent {
                let mut popped: CUcontext = std::ptr::null_mut();
                // SAFETY: balances the push in `enter`.
                unsafe { pop(&mut popped) };
            }
        }
    }
}
