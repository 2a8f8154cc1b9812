//! The CUDA device paired with a Vulkan device, and its primary context.
//!
//! # Contract
//!
//! * A [`CudaDevice`] is found by UUID only and retains the device's
//!   **primary** context (released with the last clone, never reset).
//! * Every call makes that context current for its own duration with a
//!   [`ContextGuard`]: pushed on the calling thread's context stack, popped
//!   when the guard drops. The guard is `!Send` and `!Sync`, because the
//!   stack it pops belongs to the thread that pushed.
//! * A guard's pop checks that it removes its own context. Code that pushed
//!   another context inside the guard's scope and left it there is reported
//!   (through [`drop_errors`](crate::drop_errors)); that context is left
//!   current and the guard's own is removed beneath it.

use std::ffi::{c_char, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use cuda_interop_sys::{self as sys, CUcontext, CUdevice, CUdevice_attribute, CUuuid};

use crate::driver::{cu, record_drop_error};
use crate::error::{Error, ImportError, Result};
use crate::last_use::ExternalWaits;
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
    /// The Vulkan device this CUDA device was paired with, if any: received
    /// records are verified on it before CUDA sees their fds.
    pub(crate) vulkan: Option<vk_export::Context>,
    /// External-semaphore waits enqueued through this crate that may still
    /// be pending (see [`ExternalWaits`]).
    pub(crate) external_waits: ExternalWaits,
    /// The array <-> linear copy kernels, loaded on first use.
    pub(crate) copy_kernels: crate::copy::CopyKernels,
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
            uuid: uuid.bytes.map(|b| b as u8),
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
    pub fn for_uuid(uuid: [u8; 16]) -> Result<CudaDevice> {
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

    fn find(uuid: [u8; 16], vulkan: Option<vk_export::Context>) -> Result<CudaDevice> {
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
                external_waits: ExternalWaits::default(),
                copy_kernels: Default::default(),
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

    /// Makes the primary context current on this thread until the guard
    /// drops. The guard stays on this thread (`!Send`).
    pub fn enter(&self) -> Result<ContextGuard<'_>> {
        // SAFETY: a primary context this device retained (alive while `self`
        // is); pushed on the calling thread's stack, popped by the guard.
        unsafe { cu!(cuCtxPushCurrent(self.inner.context)) }?;
        Ok(ContextGuard {
            device: self,
            _stays_on_its_thread: PhantomData,
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

    /// The fd handling every CUDA import shares: refuses fds that are no
    /// export (pipes, sockets, eventfds...), makes the context current, and
    /// gives `import` a duplicate, so that a failed import hands the
    /// caller's fd back open (CUDA keeps the fd with the caller on failure).
    ///
    /// # Safety
    /// `import` gives the raw fd it gets to exactly one CUDA import call
    /// (which owns it on success only) and does nothing else with it.
    pub(crate) unsafe fn import_fd_with(
        &self,
        fd: OwnedFd,
        what: &str,
        import: impl FnOnce(i32) -> Result<()>,
    ) -> Result<(), ImportError> {
        if let Err(e) = vk_export::check_export_fd(&fd, what) {
            return Err(ImportError {
                error: e.into(),
                fd,
            });
        }
        let _guard = match self.enter() {
            Ok(g) => g,
            Err(error) => return Err(ImportError { error, fd }),
        };
        let dup_failed = |e| Error::InvalidArgument(format!("the fd cannot be duplicated: {e}"));
        let import = |raw| import(raw).map_err(vk_export::ImportFailure::from);
        // SAFETY: forwarded from the caller; CUDA never closes the fd of a
        // failed import.
        unsafe { vk_export::import_with_duplicate(fd, false, dup_failed, import) }
            .map_err(|(error, fd)| ImportError { error, fd })
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
            if let (Some(push), Some(pop)) =
                (driver.fns().cuCtxPushCurrent, driver.fns().cuCtxPopCurrent)
            {
                // SAFETY: the retained primary context, pushed and popped
                // around the destruction of this device's own events.
                unsafe {
                    if push(self.context) == cuda_interop_sys::CUresult::CUDA_SUCCESS {
                        self.external_waits.destroy_all();
                        self.copy_kernels.unload();
                        let mut popped: CUcontext = std::ptr::null_mut();
                        pop(&mut popped);
                    }
                }
            }
            if let Some(release) = driver.fns().cuDevicePrimaryCtxRelease {
                // SAFETY: balances the retain in `for_uuid`; no clone of the
                // device is left, so nothing of this crate uses the context.
                let status = unsafe { release(self.device) };
                record_drop_error(crate::driver::check(
                    driver,
                    "cuDevicePrimaryCtxRelease",
                    status,
                ));
            }
        }
    }
}

/// The primary context is current on this thread while this lives; dropping
/// it pops the context, restoring what was current before.
///
/// Neither `Send` nor `Sync`: a context stack belongs to one thread, so the
/// guard must be dropped on the thread that made it.
///
/// If code inside the guard's scope pushed another context and left it on
/// the stack, the drop does not pop that one in place of its own: it takes its
/// own context out from under it, leaves the other one current, and reports
/// the unbalanced stack through [`drop_errors`](crate::drop_errors). If its
/// own context is not found right beneath either, it leaves the stack as it
/// found it and reports that.
#[derive(Debug)]
pub struct ContextGuard<'a> {
    device: &'a CudaDevice,
    /// A raw pointer is neither `Send` nor `Sync`, and so is the guard; the
    /// pointee's name is what the compiler's error shows.
    _stays_on_its_thread: PhantomData<*const ThisThreadsContextStack>,
}

/// Names, in compiler errors, why a [`ContextGuard`] cannot leave its thread.
#[derive(Debug)]
enum ThisThreadsContextStack {}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        // Pops even in a poisoned process: the push happened, and leaving the
        // context on the thread's stack would change what later code (the
        // CUDA runtime, other libraries) finds current.
        let Some(driver) = crate::driver::loaded_for_cleanup() else {
            return;
        };
        let fns = driver.fns();
        let (Some(pop), Some(push)) = (fns.cuCtxPopCurrent, fns.cuCtxPushCurrent) else {
            return;
        };
        let own = self.device.inner.context;
        let pop_one = || -> Result<CUcontext> {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: cuCtxPopCurrent writes one context handle; it pops this
            // thread's stack, on which `enter` pushed (the guard is !Send).
            let status = unsafe { pop(&mut popped) };
            crate::driver::check(driver, "cuCtxPopCurrent", status).map(|()| popped)
        };
        let push_back = |context: CUcontext| {
            // SAFETY: a context this thread's stack held a moment ago, popped
            // by this drop and pushed back unchanged.
            let status = unsafe { push(context) };
            record_drop_error(crate::driver::check(driver, "cuCtxPushCurrent", status));
        };
        let top = match pop_one() {
            Ok(top) if top == own => return,
            Ok(top) if top.is_null() => {
                return record_drop_error(Err(Error::Cleanup(format!(
                    "the context stack was unbalanced: the ContextGuard for {own:?} ({}) found no \
                     context to pop; code inside its scope popped it",
                    self.device.name()
                ))));
            }
            Ok(top) => top,
            Err(error) => return record_drop_error(Err(error)),
        };
        // Another context sits on top of ours: look one deeper.
        match pop_one() {
            Ok(below) if below == own => {
                push_back(top);
                record_drop_error(Err(Error::Cleanup(format!(
                    "the context stack was unbalanced: context {top:?} was pushed inside the scope of \
                     the ContextGuard for {own:?} ({}) and not popped; the guard removed its own \
                     context from under it and left {top:?} current",
                    self.device.name()
                ))));
            }
            below => {
                match below {
                    Ok(below) if !below.is_null() => push_back(below),
                    _ => {}
                }
                push_back(top);
                record_drop_error(Err(Error::Cleanup(format!(
                    "the context stack was unbalanced: the ContextGuard for {own:?} ({}) found \
                     {top:?} on top and not its own context beneath it; it left the stack as it \
                     found it",
                    self.device.name()
                ))));
            }
        }
    }
}
