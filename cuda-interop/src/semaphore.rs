//! Vulkan semaphores imported into CUDA.
//!
//! # Contract
//!
//! * Binary and timeline are distinct types. A binary signal returns a
//!   [`BinarySignal`] token that exactly one wait consumes, so "wait without a
//!   signal" and "wait twice" do not compile.
//! * A timeline signal must be above every value this handle signalled
//!   before. Check, enqueue and update happen under one lock, and the stored
//!   value changes only after the signal was enqueued, so two threads cannot
//!   both pass the check with the same value, and a failed enqueue leaves no
//!   trace. A handle may also carry a largest step between two signals
//!   (`maxTimelineSemaphoreValueDifference`); a signal further above the last
//!   one is refused.
//! * Every signal and wait is recorded as a use of the semaphore; `Drop`
//!   waits for those uses (at most [`DROP_WAIT_LIMIT`](crate::DROP_WAIT_LIMIT),
//!   never `cuCtxSynchronize`) before `cuDestroyExternalSemaphore`, which
//!   requires every outstanding signal and wait to have completed. If they
//!   do not complete in time (a wait nobody signals), the handle is leaked
//!   and the leak reported through [`drop_errors`](crate::drop_errors).

use std::marker::PhantomData;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

use cuda_interop_sys::{self as sys, CUexternalSemaphore, CUexternalSemaphoreHandleType};
use vk_export::semaphore_kinds::{Binary, Timeline};
use vk_export::{SemaphoreKind, SemaphoreRecord};

use crate::device::CudaDevice;
use crate::driver::{cu, record_drop_error};
use crate::error::{Error, ImportError, Result};
use crate::last_use::{report_leak, LastUse, DROP_WAIT_LIMIT};
use crate::stream::Stream;

/// A Vulkan semaphore imported into CUDA.
#[derive(Debug)]
pub struct ExternalSemaphore<K> {
    device: CudaDevice,
    handle: CUexternalSemaphore,
    /// The last value signalled through this handle (timeline only); held
    /// locked across a signal's check, enqueue and update.
    last_signalled: Mutex<u64>,
    /// The largest step from the last signalled value to the next one, if
    /// the Vulkan device bounds it.
    max_difference: Option<u64>,
    last_use: LastUse,
    _kind: PhantomData<fn() -> K>,
}

// SAFETY: the handle is usable from any thread with the context current
// (every use enters it); the counter is behind a mutex and the last-use
// record is Send and Sync.
unsafe impl<K> Send for ExternalSemaphore<K> {}
// SAFETY: signal and wait enqueue on a stream the caller owns; the counter
// and the last-use record are behind mutexes.
unsafe impl<K> Sync for ExternalSemaphore<K> {}

impl<K> Drop for ExternalSemaphore<K> {
    fn drop(&mut self) {
        if let Err(why) = self.last_use.wait_before_release(DROP_WAIT_LIMIT) {
            report_leak("an imported semaphore", &why);
            return;
        }
        if let Ok(_guard) = self.device.enter() {
            // SAFETY: a live semaphore of the current context, destroyed once,
            // after every signal and wait enqueued on it has completed (each
            // was recorded as a use, and all completed above).
            record_drop_error(unsafe { cu!(cuDestroyExternalSemaphore(self.handle)) });
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
        self.import_semaphore_with_max_difference(record, fd, None)
    }

    /// Imports a semaphore whose timeline signals may step at most
    /// `max_difference` above the last value signalled (the Vulkan device's
    /// `maxTimelineSemaphoreValueDifference`), or without a bound (`None`).
    pub(crate) fn import_semaphore_with_max_difference<K: SemaphoreKind>(
        &self,
        record: SemaphoreRecord<K>,
        fd: OwnedFd,
        max_difference: Option<u64>,
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
        // SAFETY: a zeroed descriptor (flags 0) naming an open fd we own, with
        // the handle type of the record's semaphore kind; the device's context
        // is current; writes one handle.
        let result = unsafe { cu!(cuImportExternalSemaphore(&mut handle, &desc)) };
        drop(guard);
        match result {
            Ok(()) => {
                // The driver owns the fd now.
                let _ = fd.into_raw_fd();
                Ok(ExternalSemaphore {
                    device: self.clone(),
                    handle,
                    last_signalled: Mutex::new(0),
                    max_difference,
                    last_use: LastUse::new(self),
                    _kind: PhantomData,
                })
            }
            Err(error) => Err(ImportError { error, fd }),
        }
    }
}

impl<K> ExternalSemaphore<K> {
    /// Enqueues a signal of `value` (0 for binary) on `stream`; records
    /// nothing.
    fn enqueue_signal(&self, stream: &Stream, value: u64) -> Result<()> {
        stream.check_device(&self.device)?;
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        params.params.fence.value = value;
        let _guard = self.device.enter()?;
        // SAFETY: one zeroed parameter block (flags 0) for one live semaphore,
        // on a live stream, both of the current context; the semaphore is
        // destroyed only after this signal completes (recorded by callers).
        unsafe {
            cu!(cuSignalExternalSemaphoresAsync(
                &self.handle,
                &params,
                1,
                stream.raw()
            ))
        }
    }

    /// Enqueues a wait for `value` (0 for binary) on `stream` and records it
    /// as a use.
    fn wait_raw(&self, stream: &Stream, value: u64) -> Result<()> {
        stream.check_device(&self.device)?;
        let mut params = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        params.params.fence.value = value;
        {
            let _guard = self.device.enter()?;
            // SAFETY: one zeroed parameter block (flags 0) for one live
            // semaphore, on a live stream, both of the current context; the
            // semaphore is destroyed only after this wait completes (recorded
            // below).
            unsafe {
                cu!(cuWaitExternalSemaphoresAsync(
                    &self.handle,
                    &params,
                    1,
                    stream.raw()
                ))
            }?;
        }
        self.last_use.record(stream)
    }
}

impl ExternalSemaphore<Binary> {
    /// Enqueues a signal; the token must be consumed by exactly one wait.
    pub fn signal(&self, stream: &Stream) -> Result<BinarySignal<'_>> {
        self.enqueue_signal(stream, 0)?;
        self.last_use.record(stream)?;
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
    /// handle signalled before (and, where the handle has a largest step, at
    /// most that step above the last one); otherwise
    /// [`Error::InvalidArgument`] and nothing is enqueued.
    ///
    /// The check, the enqueue and the update of the last value happen under
    /// one lock, and the last value changes only when the enqueue succeeded.
    pub fn signal(&self, stream: &Stream, value: u64) -> Result<()> {
        let mut last = self
            .last_signalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let previous = *last;
        if value <= previous {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value} is not above the last value signalled ({previous}): values only go up"
            )));
        }
        if let Some(max) = self.max_difference {
            if value - previous > max {
                return Err(Error::InvalidArgument(format!(
                    "timeline signal {value} is {} above the last value signalled ({previous}); \
                     the device allows at most {max} (maxTimelineSemaphoreValueDifference)",
                    value - previous
                )));
            }
        }
        self.enqueue_signal(stream, value)?;
        *last = value;
        drop(last);
        self.last_use.record(stream)
    }

    /// Enqueues a wait until the value is at least `value`.
    pub fn wait(&self, stream: &Stream, value: u64) -> Result<()> {
        self.wait_raw(stream, value)
    }

    /// The highest value this handle has signalled.
    pub fn last_signalled(&self) -> u64 {
        *self
            .last_signalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The largest step from the last signalled value to the next signal, if
    /// this handle has one.
    pub fn max_difference(&self) -> Option<u64> {
        self.max_difference
    }
}
