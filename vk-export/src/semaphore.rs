use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use ash::vk;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::image::check_same_device;
use crate::record::{SemaphoreInfo, SemaphoreRecord};

mod sealed {
    pub trait Sealed {}
}

/// Binary or timeline (type-level `VkSemaphoreType`). Sealed.
pub trait SemaphoreKind: sealed::Sealed + Send + Sync + 'static {
    /// The Vulkan value.
    const VK: vk::SemaphoreType;
}
/// `VK_SEMAPHORE_TYPE_BINARY`.
#[derive(Debug)]
pub enum Binary {}
/// `VK_SEMAPHORE_TYPE_TIMELINE`.
#[derive(Debug)]
pub enum Timeline {}
impl sealed::Sealed for Binary {}
impl sealed::Sealed for Timeline {}
impl SemaphoreKind for Binary {
    const VK: vk::SemaphoreType = vk::SemaphoreType::BINARY;
}
impl SemaphoreKind for Timeline {
    const VK: vk::SemaphoreType = vk::SemaphoreType::TIMELINE;
}

/// A binary semaphore that can be exported.
pub type BinarySemaphore = Semaphore<Binary>;
/// A timeline semaphore that can be exported.
pub type TimelineSemaphore = Semaphore<Timeline>;

/// A binary semaphore's payload as a SYNC_FD (Vulkan ⇄ Vulkan only: CUDA has
/// no SYNC_FD semaphores).
#[derive(Debug)]
pub enum SyncFd {
    /// A sync file that signals when the semaphore's pending signal completes.
    Fd(OwnedFd),
    /// The driver returned -1: the payload had already signalled.
    AlreadySignaled,
}

/// How a host thread waits for a timeline value.
///
/// NVIDIA's Linux driver was measured (H200, driver 580) to wake a thread
/// blocked in `vkWaitSemaphores` about 10 ms after a CUDA stream signalled the
/// semaphore, while `vkGetSemaphoreCounterValue` saw the new value within a
/// microsecond. [`WaitStrategy::Poll`] therefore reads the counter: it spins
/// first (lowest latency), then yields, then sleeps in short steps, so a long
/// wait costs little CPU and a short one costs almost no latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// `vkWaitSemaphores`: no CPU use, but the driver's wake-up latency.
    Block,
    /// Read `vkGetSemaphoreCounterValue` until the value is reached.
    Poll {
        /// Busy-spin for this long.
        spin: Duration,
        /// Then `yield_now` until this much time has passed in all.
        yield_until: Duration,
        /// Then sleep this long between reads.
        sleep: Duration,
    },
}

impl WaitStrategy {
    /// Spin 50 µs, yield up to 2 ms, then poll every 50 µs.
    pub const ADAPTIVE: WaitStrategy = WaitStrategy::Poll {
        spin: Duration::from_micros(50),
        yield_until: Duration::from_millis(2),
        sleep: Duration::from_micros(50),
    };
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::ADAPTIVE
    }
}

/// An exportable semaphore of kind `K` ([`Binary`] or [`Timeline`]).
pub struct Semaphore<K> {
    ctx: Context,
    semaphore: vk::Semaphore,
    sync_fd_exportable: bool,
    _kind: PhantomData<fn() -> K>,
}

impl<K: SemaphoreKind> fmt::Debug for Semaphore<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore").field("type", &K::VK).finish()
    }
}

impl<K> Drop for Semaphore<K> {
    fn drop(&mut self) {
        // SAFETY: created here; wait for idle so no queued operation uses it.
        unsafe {
            let _ = self.ctx.inner.device.device_wait_idle();
            self.ctx
                .inner
                .device
                .destroy_semaphore(self.semaphore, None);
        }
    }
}

fn semaphore_features(
    ctx: &Context,
    kind: vk::SemaphoreType,
    handle: vk::ExternalSemaphoreHandleTypeFlags,
) -> vk::ExternalSemaphoreFeatureFlags {
    let mut type_info = vk::SemaphoreTypeCreateInfo::default().semaphore_type(kind);
    let info = vk::PhysicalDeviceExternalSemaphoreInfo::default()
        .handle_type(handle)
        .push_next(&mut type_info);
    let mut props = vk::ExternalSemaphoreProperties::default();
    // SAFETY: plain query; the chain lives across the call.
    unsafe {
        ctx.inner
            .instance
            .get_physical_device_external_semaphore_properties(
                ctx.inner.physical,
                &info,
                &mut props,
            )
    };
    props.external_semaphore_features
}

impl<K: SemaphoreKind> Semaphore<K> {
    /// Whether this device can export and import such semaphores as OPAQUE_FD,
    /// creating nothing. `Err(Unsupported)` says why not.
    pub fn preflight(ctx: &Context) -> Result<()> {
        let what = || format!("exporting a {:?} semaphore as an OPAQUE_FD", K::VK);
        if ctx.inner.semaphore_fd.is_none() {
            return Err(Error::unsupported(
                what(),
                format!(
                    "{} does not offer VK_KHR_external_semaphore_fd",
                    ctx.identity().name
                ),
            ));
        }
        let need = vk::ExternalSemaphoreFeatureFlags::EXPORTABLE
            | vk::ExternalSemaphoreFeatureFlags::IMPORTABLE;
        let features =
            semaphore_features(ctx, K::VK, vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        if !features.contains(need) {
            return Err(Error::unsupported(
                what(),
                format!("the driver reports features {features:?}"),
            ));
        }
        Ok(())
    }

    fn create(ctx: &Context, export: bool) -> Result<(vk::Semaphore, bool)> {
        Self::preflight(ctx)?;
        let sync_fd = K::VK == vk::SemaphoreType::BINARY
            && semaphore_features(ctx, K::VK, vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD)
                .contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE);
        let mut handles = vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD;
        if sync_fd {
            handles |= vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD;
        }
        let mut export_info = vk::ExportSemaphoreCreateInfo::default().handle_types(handles);
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(K::VK)
            .initial_value(0);
        let mut info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        if export {
            info = info.push_next(&mut export_info);
        }
        // SAFETY: the chain lives across the call.
        let semaphore = unsafe { ctx.inner.device.create_semaphore(&info, None) }
            .map_err(Error::vk("vkCreateSemaphore", "out of memory"))?;
        Ok((semaphore, sync_fd && export))
    }

    /// Creates an exportable semaphore (a timeline starts at 0).
    pub fn new(ctx: &Context) -> Result<Self> {
        let (semaphore, sync_fd_exportable) = Self::create(ctx, true)?;
        Ok(Semaphore {
            ctx: ctx.clone(),
            semaphore,
            sync_fd_exportable,
            _kind: PhantomData,
        })
    }

    /// Imports an exported semaphore permanently (as a timeline's OPAQUE_FD
    /// must be). `fd` is consumed on success and closed on failure.
    pub fn import(ctx: &Context, record: &SemaphoreRecord<K>, fd: OwnedFd) -> Result<Self> {
        check_same_device(ctx, &record.info.device_uuid, &record.info.driver_uuid)?;
        let (semaphore, _) = Self::create(ctx, false)?;
        let this = Semaphore {
            ctx: ctx.clone(),
            semaphore,
            sync_fd_exportable: false,
            _kind: PhantomData,
        };
        this.import_fd(
            Some(fd),
            vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD,
            vk::SemaphoreImportFlags::empty(),
        )?;
        Ok(this)
    }

    fn import_fd(
        &self,
        fd: Option<OwnedFd>,
        handle: vk::ExternalSemaphoreHandleTypeFlags,
        flags: vk::SemaphoreImportFlags,
    ) -> Result<()> {
        let loader = self.loader()?;
        // -1 is SYNC_FD's "already signalled"; it is never wrapped in an OwnedFd.
        let raw = fd.map_or(-1, IntoRawFd::into_raw_fd);
        let info = vk::ImportSemaphoreFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(handle)
            .flags(flags)
            .fd(raw);
        // SAFETY: the semaphore has no pending operations (new, or the caller's
        // contract for temporary imports); on success Vulkan owns the fd.
        match unsafe { loader.import_semaphore_fd(&info) } {
            Ok(()) => Ok(()),
            Err(e) => {
                if raw >= 0 {
                    // SAFETY: a failed import leaves the fd with us.
                    drop(unsafe { OwnedFd::from_raw_fd(raw) });
                }
                Err(Error::Vulkan {
                    call: "vkImportSemaphoreFdKHR",
                    result: e,
                    hint: "the fd is not a semaphore export of this kind from this device",
                })
            }
        }
    }

    fn loader(&self) -> Result<&ash::khr::external_semaphore_fd::Device> {
        self.ctx.inner.semaphore_fd.as_ref().ok_or_else(|| {
            Error::unsupported(
                "semaphore fds",
                "VK_KHR_external_semaphore_fd is not enabled",
            )
        })
    }

    /// Exports the semaphore as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: created with OPAQUE_FD export info.
        let fd = unsafe { self.loader()?.get_semaphore_fd(&info) }
            .map_err(Error::vk("vkGetSemaphoreFdKHR", "too many open files"))?;
        // SAFETY: a new fd owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> SemaphoreRecord<K> {
        let id = &self.ctx.inner.identity;
        SemaphoreRecord {
            info: SemaphoreInfo {
                semaphore_type: K::VK,
                device_uuid: id.device_uuid,
                driver_uuid: id.driver_uuid,
            },
            _kind: PhantomData,
        }
    }

    /// The `VkSemaphore`.
    pub fn raw(&self) -> vk::Semaphore {
        self.semaphore
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Semaphore<Binary> {
    /// Exports the payload as a SYNC_FD (copy transference). A signal must
    /// have been submitted and no wait on it be pending (Vulkan's rules for
    /// copy-transference exports); the driver reports a violation as an error.
    pub fn export_sync_fd(&self) -> Result<SyncFd> {
        if !self.sync_fd_exportable {
            return Err(Error::unsupported(
                "SYNC_FD export",
                "the driver cannot export this semaphore as a SYNC_FD",
            ));
        }
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD);
        // SAFETY: created with SYNC_FD export info.
        let fd = unsafe { self.loader()?.get_semaphore_fd(&info) }.map_err(Error::vk(
            "vkGetSemaphoreFdKHR (SYNC_FD)",
            "a SYNC_FD export needs a submitted signal and no pending wait",
        ))?;
        if fd < 0 {
            return Ok(SyncFd::AlreadySignaled);
        }
        // SAFETY: a new fd owned by the caller.
        Ok(SyncFd::Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Imports a SYNC_FD temporarily (the only permanence SYNC_FD allows):
    /// the next wait on this semaphore waits for it.
    pub fn import_sync_fd(&self, fd: SyncFd) -> Result<()> {
        let fd = match fd {
            SyncFd::Fd(fd) => Some(fd),
            SyncFd::AlreadySignaled => None,
        };
        self.import_fd(
            fd,
            vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD,
            vk::SemaphoreImportFlags::TEMPORARY,
        )
    }
}

impl Semaphore<Timeline> {
    /// The current value (`vkGetSemaphoreCounterValue`).
    pub fn value(&self) -> Result<u64> {
        // SAFETY: a live timeline semaphore of this device.
        unsafe {
            self.ctx
                .inner
                .device
                .get_semaphore_counter_value(self.semaphore)
        }
        .map_err(Error::vk(
            "vkGetSemaphoreCounterValue",
            "the device was lost",
        ))
    }

    /// Signals `value` from the host; it must be above the current value and
    /// within `maxTimelineSemaphoreValueDifference` of it.
    pub fn signal(&self, value: u64) -> Result<()> {
        let current = self.value()?;
        if value <= current || value - current > self.ctx.max_timeline_difference() {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value}: must be above the current value {current} and at most {} above it",
                self.ctx.max_timeline_difference()
            )));
        }
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.semaphore)
            .value(value);
        // SAFETY: value checked above.
        unsafe { self.ctx.inner.device.signal_semaphore(&info) }
            .map_err(Error::vk("vkSignalSemaphore", "the device was lost"))
    }

    /// Waits on the host until the value is at least `value`.
    pub fn wait(&self, value: u64, timeout: Duration, strategy: WaitStrategy) -> Result<()> {
        let start = Instant::now();
        match strategy {
            WaitStrategy::Block => {
                let semaphores = [self.semaphore];
                let values = [value];
                let info = vk::SemaphoreWaitInfo::default()
                    .semaphores(&semaphores)
                    .values(&values);
                let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
                // SAFETY: a live timeline semaphore; arrays live across the call.
                match unsafe { self.ctx.inner.device.wait_semaphores(&info, ns) } {
                    Ok(()) => Ok(()),
                    Err(vk::Result::TIMEOUT) => Err(Error::Timeout(timeout)),
                    Err(e) => Err(Error::Vulkan {
                        call: "vkWaitSemaphores",
                        result: e,
                        hint: "the device was lost",
                    }),
                }
            }
            WaitStrategy::Poll {
                spin,
                yield_until,
                sleep,
            } => loop {
                if self.value()? >= value {
                    return Ok(());
                }
                let elapsed = start.elapsed();
                if elapsed >= timeout {
                    return Err(Error::Timeout(timeout));
                }
                if elapsed < spin {
                    std::hint::spin_loop();
                } else if elapsed < yield_until {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(sleep.min(timeout - elapsed));
                }
            },
        }
    }
}
