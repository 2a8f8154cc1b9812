//! The CUDA device handle and its primary context: what a [`CudaDevice`]
//! holds, the [`ContextGuard`] that makes its context current, and the
//! per-device state that lives and dies with it (the external waits of
//! [`ExternalWaits`], the slot the copy kernels are loaded into).
//!
//! Finding the device (pairing by UUID) is the `device` module's; loading
//! the copy kernels into the slot is the `copy` module's.
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

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cuda_interop_sys::{CUcontext, CUdevice, CUfunction, CUmodule, CUstream};

use crate::driver::{cu, record_drop_error};
use crate::error::{Error, Result};
use crate::events::{ExternalWaits, DROP_WAIT_LIMIT};
use vk_export::DeviceUuid;

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
    pub(crate) uuid: DeviceUuid,
    pub(crate) name: String,
    /// The Vulkan device this CUDA device was paired with, if any: received
    /// records are verified on it before CUDA sees their fds.
    pub(crate) vulkan: Option<vk_export::Context>,
    /// External-semaphore waits enqueued through this crate that may still
    /// be pending (see [`ExternalWaits`]): one list per primary context,
    /// shared by every `CudaDevice` of that GPU in the process
    /// ([`ExternalWaits::of_context`]), so a destroy made through one sees
    /// the waits enqueued through another.
    pub(crate) external_waits: Arc<ExternalWaits>,
    /// The array <-> linear copy kernels, loaded on first use.
    pub(crate) copy_kernels: CopyKernels,
    /// The colour conversion kernels, loaded on first use.
    pub(crate) convert_kernels: ConvertKernels,
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
            .field("uuid", &self.inner.uuid.to_string())
            .finish()
    }
}

impl CudaDevice {
    /// The device's UUID.
    pub fn uuid(&self) -> DeviceUuid {
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

    /// For the per-frame calls: `None` when the primary context is current
    /// on this thread already (a CUDA runtime's, PyTorch's or CuPy's
    /// thread, or inside a guard), so nothing is pushed or popped; else
    /// [`CudaDevice::enter`]'s guard.
    pub(crate) fn enter_unless_current(&self) -> Result<Option<ContextGuard<'_>>> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle (this thread's current one).
        unsafe { cu!(cuCtxGetCurrent(&mut current)) }?;
        match current == self.inner.context {
            true => Ok(None),
            false => self.enter().map(Some),
        }
    }

    /// Whether `stream` belongs to this device's primary context (the
    /// runtime's streams, PyTorch's and CuPy's do; the default stream
    /// handles count as the primary context's, which this call makes
    /// current): work of this crate may then be enqueued on it directly.
    ///
    /// # Safety
    /// `stream` is null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a live
    /// stream (of any context), alive for the duration of the call.
    pub(crate) unsafe fn is_primary_context_stream(&self, stream: CUstream) -> Result<bool> {
        let _guard = self.enter()?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: the caller vouches for `stream`; writes one context handle.
        unsafe { cu!(cuStreamGetCtx(stream, &mut context)) }?;
        Ok(context == self.inner.context)
    }

    pub(crate) fn check_resource_device(&self, resource_uuid: &DeviceUuid) -> Result<()> {
        if resource_uuid != &self.inner.uuid {
            return Err(Error::DeviceMismatch {
                resource: resource_uuid.to_string(),
                device: self.inner.uuid.to_string(),
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
                        // The last device of this GPU destroys the list's
                        // events (the others still use them).
                        let waits = std::mem::take(&mut self.external_waits);
                        if let Some(waits) = Arc::into_inner(waits) {
                            waits.destroy_all();
                        }
                        self.copy_kernels.unload();
                        self.convert_kernels.unload();
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

/// `Ok` when a destroy that may wait for the whole device (`cuMemFree`,
/// `cuDestroyExternalMemory`, `cuMipmappedArrayDestroy`) cannot block on a
/// stream stuck behind an external-semaphore wait of this crate.
pub(crate) fn device_settled(device: &CudaDevice) -> Result<()> {
    device
        .inner
        .external_waits
        .settled(|| device.enter(), DROP_WAIT_LIMIT)
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

/// The copy kernels of one device: raw handles of a module loaded in its
/// primary context.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernels {
    pub(crate) module: CUmodule,
    /// `[direction][texel size]`: out of the level, then into it; 4, 8, 16 bytes.
    pub(crate) functions: [[CUfunction; 3]; 2],
}

#[derive(Debug)]
pub(crate) enum Loaded {
    NotYet,
    Ready(Kernels),
    /// Loading failed once (a driver that cannot JIT the PTX): not retried.
    Failed(String),
}

/// Per-device storage of the copy kernels (in the device's shared state):
/// loaded on first use, unloaded when the device's last clone drops.
#[derive(Debug)]
pub(crate) struct CopyKernels {
    pub(crate) loaded: Mutex<Loaded>,
    /// Set when a kernel copy may still run when the device drops (an
    /// import's wait for its uses gave up): the module is never unloaded.
    keep_loaded: AtomicBool,
}

impl Default for CopyKernels {
    fn default() -> CopyKernels {
        CopyKernels {
            loaded: Mutex::new(Loaded::NotYet),
            keep_loaded: AtomicBool::new(false),
        }
    }
}

impl CopyKernels {
    /// A kernel copy may outlive the device: never unload the module.
    pub(crate) fn keep_loaded(&self) {
        self.keep_loaded.store(true, Ordering::Release);
    }

    /// Unloads the module, if loaded and not kept. For the device's drop, with
    /// its context current.
    pub(crate) fn unload(&self) {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Loaded::Ready(kernels) = std::mem::replace(&mut *loaded, Loaded::NotYet) {
            if self.keep_loaded.load(Ordering::Acquire) {
                return;
            }
            // SAFETY: the module `get` loaded in this context (current, the
            // caller's contract), unloaded once. Every kernel of it was
            // launched by a copy recorded as a use of an import, and every
            // import (each holds a clone of the device) has been dropped
            // after waiting for its uses, or marked the module kept.
            record_drop_error(unsafe { cu!(cuModuleUnload(kernels.module)) });
        }
    }
}

/// Per-device storage of the colour conversion kernels (`kernels/convert.cu`):
/// the module loaded on first use, its functions looked up by name once
/// each; unloaded when the device's last clone drops, unless a conversion
/// may still run then.
#[derive(Debug, Default)]
pub(crate) struct ConvertKernels {
    pub(crate) loaded: Mutex<ConvertLoaded>,
    keep_loaded: AtomicBool,
}

#[derive(Debug, Default)]
pub(crate) enum ConvertLoaded {
    #[default]
    NotYet,
    /// The module, and the functions looked up so far.
    Ready(CUmodule, Vec<(String, CUfunction)>),
    /// Loading failed once (a driver that cannot JIT the PTX): not retried.
    Failed(String),
}

impl ConvertKernels {
    /// A conversion may outlive the device: never unload the module.
    pub(crate) fn keep_loaded(&self) {
        self.keep_loaded.store(true, Ordering::Release);
    }

    /// Unloads the module, if loaded and not kept. For the device's drop, with
    /// its context current.
    pub(crate) fn unload(&self) {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let ConvertLoaded::Ready(module, _) = std::mem::take(&mut *loaded) {
            if self.keep_loaded.load(Ordering::Acquire) {
                return;
            }
            // SAFETY: the module `crate::convert` loaded in this context
            // (current, the caller's contract), unloaded once. Every launch
            // of its kernels was recorded as a use of tracked memory, which
            // was dropped (each holds a clone of the device) after waiting for
            // it, or marked the module kept; foreign memory's conversions are
            // the caller's to complete before the device drops.
            record_drop_error(unsafe { cu!(cuModuleUnload(module)) });
        }
    }
}
