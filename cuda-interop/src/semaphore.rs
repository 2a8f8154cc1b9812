//! Vulkan semaphores imported into CUDA.
//!
//! Binary and timeline are distinct types. A binary signal returns a
//! [`BinarySignal`] token that exactly one wait consumes, so "wait without a
//! signal" and "wait twice" do not compile. A timeline signal must be above
//! every value this handle signalled before (checked before enqueueing).

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use cuda_interop_sys::{self as sys, CUexternalSemaphore, CUexternalSemaphoreHandleType};
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::{SemaphoreKind, SemaphoreRecord};

use crate::device::CudaDevice;
use crate::driver::cu;
use crate::error::{Error, ImportError, Result};
use crate::stream::Stream;

/// A Vulkan semaphore imported into CUDA.
#[derive(Debug)]
pub struct ExternalSemaphore<K> {
    device: CudaDevice,
    handle: CUexternalSemaphore,
    last_signalled: AtomicU64,
    _kind: PhantomData<fn() -> K>,
}

// SAFETY: usable from any thread with the context current.
unsafe impl<K> Send for ExternalSemaphore<K> {}
// SAFETY: signal/wait enqueue on a stream the caller owns; the counter is atomic.
unsafe impl<K> Sync for ExternalSemaphore<K> {}

impl<K> Drop for ExternalSemaphore<K> {
    fn drop(&mut self) {
        if let Ok(_guard) = self.device.enter() {
            // Outstanding signals and waits must complete before the semaphore
            // is destroyed: wait for the context's work first.
            crate::driver::record_drop_error((|| -> Result<()> {
                // SAFETY: the context is current.
                cu!(cuCtxSynchronize())?;
                // SAFETY: destroyed once, after its operations completed.
                cu!(cuDestroyExternalSemaphore(self.handle))
            })());
        }
    }
}

/// A pending binary signal; a wait (CUDA's or Vulkan's) must consume it.
#[must_use = "a binary signal must be waited on exactly once"]
#[derive(Debug)]
pub struct BinarySignal<'s> {
    _semaphore: PhantomData<&'s ExternalSemaphore<Binary>>,
}

impl BinarySignal<'_> {
    /// Says that a Vulkan queue submission waits for this signal (submitted
    /// after the CUDA signal was enqueued).
    pub fn waited_by_vulkan(self) {}
}

fn cuda_handle_type(kind: vk_export::ash::vk::SemaphoreType) -> CUexternalSemaphoreHandleType {
    if kind == vk_export::ash::vk::SemaphoreType::TIMELINE {
        CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
    } else {
        CUexternalSemaphoreHandleType::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD
    }
}

impl CudaDevice {
    /// Imports a semaphore of this process (the CUDA handle type follows the
    /// semaphore's kind).
    pub fn import_semaphore<K: SemaphoreKind>(
        &self,
        semaphore: &vk_export::Semaphore<K>,
    ) -> Result<ExternalSemaphore<K>> {
        let fd = semaphore.export_fd()?;
        self.import_semaphore_fd(semaphore.record(), fd)
            .map_err(ImportError::into_error)
    }

    /// Imports a semaphore from a received record and fd; on failure the fd
    /// comes back in the error.
    pub fn import_semaphore_fd<K: SemaphoreKind>(
        &self,
        record: SemaphoreRecord<K>,
        fd: OwnedFd,
    ) -> Result<ExternalSemaphore<K>, ImportError> {
        if let Err(error) = self.check_resource_device(&record.info().device_uuid()) {
            return Err(ImportError { error, fd });
        }
        let guard = match self.enter() {
            Ok(g) => g,
            Err(error) => return Err(ImportError { error, fd }),
        };
        let mut desc = sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
            type_: cuda_handle_type(K::VK),
            ..Default::default()
        };
        desc.handle.fd = fd.as_raw_fd();
        let mut handle: CUexternalSemaphore = std::ptr::null_mut();
        let result = (|| -> Result<()> {
            // SAFETY: a zeroed descriptor with an fd we own; the context is current.
            cu!(cuImportExternalSemaphore(&mut handle, &desc))
        })();
        drop(guard);
        match result {
            Ok(()) => {
                // The driver owns the fd now.
                let _ = fd.into_raw_fd();
                Ok(ExternalSemaphore {
                    device: self.clone(),
                    handle,
                    last_signalled: AtomicU64::new(0),
                    _kind: PhantomData,
                })
            }
            Err(error) => Err(ImportError { error, fd }),
        }
    }
}

impl<K> ExternalSemaphore<K> {
    fn signal_raw(&self, stream: &Stream, value: u64) -> Result<()> {
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        params.params.fence.value = value;
        let _guard = self.device.enter()?;
        // SAFETY: one zeroed parameter block for one live semaphore, on a
        // stream of this context.
        cu!(cuSignalExternalSemaphoresAsync(
            &self.handle,
            &params,
            1,
            stream.raw()
        ))
    }

    fn wait_raw(&self, stream: &Stream, value: u64) -> Result<()> {
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        params.params.fence.value = value;
        let _guard = self.device.enter()?;
        // SAFETY: as in signal_raw.
        cu!(cuWaitExternalSemaphoresAsync(
            &self.handle,
            &params,
            1,
            stream.raw()
        ))
    }
}

impl ExternalSemaphore<Binary> {
    /// Enqueues a signal; the token must be consumed by exactly one wait.
    pub fn signal(&self, stream: &Stream) -> Result<BinarySignal<'_>> {
        self.signal_raw(stream, 0)?;
        Ok(BinarySignal {
            _semaphore: PhantomData,
        })
    }

    /// Enqueues a wait for a signal (consumes its token).
    pub fn wait(&self, stream: &Stream, signal: BinarySignal<'_>) -> Result<()> {
        let _ = signal;
        self.wait_raw(stream, 0)
    }

    /// The token for a signal that a Vulkan queue submission already made
    /// (submitted before the CUDA wait is enqueued, as Vulkan and CUDA require).
    pub fn signalled_by_vulkan(&self) -> BinarySignal<'_> {
        BinarySignal {
            _semaphore: PhantomData,
        }
    }
}

impl ExternalSemaphore<Timeline> {
    /// Enqueues a signal of `value`, which must be above every value this
    /// handle signalled before.
    pub fn signal(&self, stream: &Stream, value: u64) -> Result<()> {
        let previous = self.last_signalled.fetch_max(value, Ordering::AcqRel);
        if value <= previous {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value} is not above the last value signalled ({previous}): values only go up"
            )));
        }
        self.signal_raw(stream, value)
    }

    /// Enqueues a wait until the value is at least `value`.
    pub fn wait(&self, stream: &Stream, value: u64) -> Result<()> {
        self.wait_raw(stream, value)
    }

    /// The highest value this handle has signalled.
    pub fn last_signalled(&self) -> u64 {
        self.last_signalled.load(Ordering::Acquire)
    }
}
