//! Exportable binary and timeline semaphores.
//!
//! # Contract
//!
//! * Binary and timeline are distinct types ([`Semaphore<Binary>`],
//!   [`Semaphore<Timeline>`]); the CUDA handle type follows the kind.
//! * Binary signals are tokens ([`crate::BinarySignal`], see [`crate::token`]
//!   rules): a wait needs the token of a submitted signal of the same payload.
//! * Timeline host signals are checked (above the current value, within
//!   `maxTimelineSemaphoreValueDifference`) and the check and the signal are
//!   one atomic step for this process's host signals.
//! * Every host wait takes a timeout and returns [`Error::Timeout`].
//! * With the `tokio` feature, `Semaphore::<Timeline>::wait_async` is a
//!   future that reads the counter between `tokio::time` sleeps of
//!   `ASYNC_POLL_PERIOD` (1 ms): there is no fd to wait on for a timeline value
//!   (SYNC_FD export is for binary semaphores only), and NVIDIA wakes
//!   `vkWaitSemaphores` late ([`WaitStrategy`]). Dropping it leaves nothing
//!   pending but a timer entry, which goes with it.
//! * Imports follow [`crate::memory`]'s fd rules: the driver gets a
//!   duplicate, a failed import gives the caller's fd back.
//! * `Drop` waits (bounded) for this crate's last submission that used the
//!   semaphore; if that does not complete the semaphore is leaked, not
//!   destroyed under a pending operation.

use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ash::vk;

use crate::context::{record_drop_error, Context, HeldLock, DROP_WAIT};
use crate::error::{unsupported, vk_error, Error, Result};
use crate::memory::{check_same_device, import_dup};
use crate::submit::LastUse;
use crate::wait::WaitStrategy;
use interop_share::fd::{check_export_fd, check_sync_file, ImportError, ImportFailure, KeepAlive};
use interop_share::received::ReceivedSemaphore;
use interop_share::record::SemaphoreRecord;
use interop_share::token::{BinaryPayload, BinarySignal};

pub use interop_share::markers::{Binary, SemaphoreKind, Timeline};

/// A held timeline signal lock, marked in this thread's held locks
/// ([`HeldLock`]) while it lives.
pub(crate) struct SignalGuard<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    _held: HeldLock,
}

impl<K> Semaphore<K> {
    /// Takes this semaphore's signal lock (shared by every handle of its
    /// payload), or refuses when this thread already holds it, which would
    /// never return.
    pub(crate) fn lock_signal(&self, call: &str) -> Result<SignalGuard<'_>> {
        let held = HeldLock::take(Arc::as_ptr(&self.signal_lock) as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{call}: this thread already holds the semaphore's signal lock (a host signal from inside \
                 the recording closure of a submission that signals it?): it would wait for itself"
            ))
        })?;
        let guard = self.signal_lock.lock().unwrap_or_else(|p| p.into_inner());
        Ok(SignalGuard {
            _guard: guard,
            _held: held,
        })
    }
}

/// Locks every timeline of `signals` (each payload once: the same payload
/// twice is refused) and checks its value as a submitted signal, so that no
/// other signal of this process can slip between the check and the
/// submission. Keyed by the shared lock, not the handle: two handles of one
/// payload are one semaphore. Taken in address order, so that two
/// submissions (of two contexts, whose signals overlap) cannot each hold one
/// lock and wait for the other.
pub(crate) fn lock_signals<'a>(
    signals: impl Iterator<Item = (&'a Semaphore<Timeline>, u64)>,
) -> Result<Vec<SignalGuard<'a>>> {
    let mut order: Vec<(usize, &'a Semaphore<Timeline>, u64)> = signals
        .map(|(s, value)| (Arc::as_ptr(&s.signal_lock) as usize, s, value))
        .collect();
    order.sort_by_key(|(key, _, _)| *key);
    if order.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidArgument(
            "one timeline semaphore signalled twice by one submission".into(),
        ));
    }
    let mut guards = Vec::with_capacity(order.len());
    for (_, s, value) in order {
        guards.push(s.lock_signal("a submission's timeline signal")?);
        s.check_signal_value(value, false)?;
    }
    Ok(guards)
}

/// Timeline signals reserved for a submission that this crate does not make
/// (an adapter's, such as cuda-interop-wgpu's): from
/// [`Semaphore::reserve_submitted_signals`] until [`SubmittedSignals::submitted`]
/// or drop, each semaphore's signal lock is held, so no other signal of this
/// process (host or submitted) is checked or made meanwhile.
pub struct SubmittedSignals<'a> {
    _guards: Vec<SignalGuard<'a>>,
    signals: Vec<(&'a Semaphore<Timeline>, u64)>,
}

impl fmt::Debug for SubmittedSignals<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.signals.iter().map(|(_, v)| v))
            .finish()
    }
}

impl SubmittedSignals<'_> {
    /// Records the signals as submitted (the submission was made): later
    /// signals of this process must be above them, and host signals wait
    /// until they completed. Releases the locks.
    pub fn submitted(self) {
        for (s, value) in &self.signals {
            s.last_submitted_signal.fetch_max(*value, Ordering::AcqRel);
        }
    }
}

impl Semaphore<Timeline> {
    /// Reserves `signals` for a submission made outside this crate: takes
    /// each semaphore's signal lock (in a fixed order; this thread must not
    /// hold one already) and checks each value as this crate checks its own
    /// submitted signals: above the current value and every value a
    /// submission already signals, within `maxTimelineSemaphoreValueDifference`
    /// of the current value, and no payload twice. Submit while the
    /// reservation lives, then call [`SubmittedSignals::submitted`]; drop it
    /// unused if the submission was not made.
    pub fn reserve_submitted_signals<'a>(
        signals: &[(&'a Semaphore<Timeline>, u64)],
    ) -> Result<SubmittedSignals<'a>> {
        let guards = lock_signals(signals.iter().copied())?;
        Ok(SubmittedSignals {
            _guards: guards,
            signals: signals.to_vec(),
        })
    }
}

/// A binary semaphore that can be exported.
pub type BinarySemaphore = Semaphore<Binary>;
/// A timeline semaphore that can be exported.
pub type TimelineSemaphore = Semaphore<Timeline>;

/// A timeline value to wait for or to signal in a submission this crate
/// does not make (the wgpu and vulkano adapters' submissions, which reserve
/// their signals with [`Semaphore::reserve_submitted_signals`]).
#[derive(Clone, Copy, Debug)]
pub struct TimelinePoint<'a> {
    /// The timeline.
    pub semaphore: &'a TimelineSemaphore,
    /// The value.
    pub value: u64,
}

impl<'a> TimelinePoint<'a> {
    /// `semaphore` at `value`.
    pub fn new(semaphore: &'a TimelineSemaphore, value: u64) -> Self {
        TimelinePoint { semaphore, value }
    }

    /// The first wait of `waits` at or above a signal of the same timeline
    /// (the same payload) in `signals`, as `(wait, signal)` values: one
    /// submission with both would wait for its own signal and never
    /// complete.
    pub fn wait_on_own_signal(
        waits: &[TimelinePoint<'_>],
        signals: &[TimelinePoint<'_>],
    ) -> Option<(u64, u64)> {
        waits.iter().find_map(|w| {
            signals
                .iter()
                .find(|s| s.semaphore.same_payload(w.semaphore) && w.value >= s.value)
                .map(|s| (w.value, s.value))
        })
    }
}

/// A binary semaphore's payload as a SYNC_FD (Vulkan ⇄ Vulkan only: CUDA has
/// no SYNC_FD semaphores).
#[derive(Debug)]
pub enum SyncFd {
    /// A sync file that signals when the semaphore's pending signal completes.
    Fd(OwnedFd),
    /// The driver returned -1: the payload had already signalled.
    AlreadySignaled,
}

/// An exportable semaphore of kind `K` ([`Binary`] or [`Timeline`]).
pub struct Semaphore<K> {
    ctx: Context,
    semaphore: vk::Semaphore,
    exportable: bool,
    sync_fd_exportable: bool,
    /// Per queue, the progress value of this crate's last submission that used it.
    pub(crate) last_use: LastUse,
    /// Binary payload state (unused for timelines).
    payload: BinaryPayload,
    /// Makes a timeline signal's check and signal (host or submitted) one
    /// step; shared by every handle of this payload that this process made
    /// with [`Semaphore::import_from`], so the step is one per semaphore,
    /// not per handle.
    pub(crate) signal_lock: Arc<Mutex<()>>,
    /// The highest timeline value a submission of this crate signals, shared
    /// like `signal_lock`.
    pub(crate) last_submitted_signal: Arc<AtomicU64>,
    /// This semaphore's record (its kind and device).
    record: SemaphoreRecord<K>,
    /// This handle's id among the handles of its payload (nonzero, unique
    /// in the process): a signal only this handle sees is tagged with it.
    pub(crate) handle_id: u64,
    /// Owns the `VkSemaphore`: destroyed when the last of this and the
    /// [`Semaphore::keep_alive`] handles goes.
    owned: Arc<OwnedSemaphore>,
}

/// The `VkSemaphore` and its device: destroyed when the last `Arc` goes
/// (the [`Semaphore`] and every [`KeepAlive`] from
/// [`Semaphore::keep_alive`]).
struct OwnedSemaphore {
    ctx: Context,
    semaphore: vk::Semaphore,
}

impl Drop for OwnedSemaphore {
    fn drop(&mut self) {
        // SAFETY: created by this crate; the `Semaphore`'s Drop waited for
        // this crate's last use (or leaked this value), and every other user
        // that holds a keep-alive (an adapter's pending submission) has let
        // it go: nothing uses the semaphore any more.
        unsafe {
            self.ctx
                .inner
                .device
                .destroy_semaphore(self.semaphore, None)
        };
    }
}

/// The next [`Semaphore::handle_id`].
static NEXT_HANDLE_ID: AtomicU64 = AtomicU64::new(1);

impl<K: SemaphoreKind> fmt::Debug for Semaphore<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("type", &K::VK)
            .field("exportable", &self.exportable)
            .finish()
    }
}

impl<K> Drop for Semaphore<K> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.wait_used(&self.last_use, DROP_WAIT) {
            record_drop_error(format_args!(
                "a semaphore is leaked: the submission that last used it did not complete ({e})"
            ));
            // Never destroyed: the owner's last reference is leaked.
            std::mem::forget(self.owned.clone());
        }
        // Otherwise `owned` destroys the semaphore once no keep-alive is left
        // (this crate's last operation on it completed; the application's
        // own submissions are covered by from_raw's contract).
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
            return Err(unsupported(
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
            return Err(unsupported(
                what(),
                format!("the driver reports features {features:?}"),
            ));
        }
        Ok(())
    }

    fn create(ctx: &Context, export: bool, payload: BinaryPayload) -> Result<Self> {
        Self::create_sharing(ctx, export, payload, None)
    }

    /// As `create`; `same_payload` is an existing handle of the payload this
    /// one will import, whose signal bookkeeping it shares.
    fn create_sharing(
        ctx: &Context,
        export: bool,
        payload: BinaryPayload,
        same_payload: Option<&Semaphore<K>>,
    ) -> Result<Self> {
        let sync_fd = export
            && K::VK == vk::SemaphoreType::BINARY
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
            .map_err(vk_error("vkCreateSemaphore", "out of memory"))?;
        Ok(Semaphore {
            ctx: ctx.clone(),
            semaphore,
            exportable: export,
            sync_fd_exportable: sync_fd,
            last_use: LastUse::default(),
            payload,
            signal_lock: same_payload.map_or_else(Default::default, |s| s.signal_lock.clone()),
            last_submitted_signal: same_payload
                .map_or_else(Default::default, |s| s.last_submitted_signal.clone()),
            record: SemaphoreRecord::of_kind(
                ctx.inner.identity.device_uuid,
                ctx.inner.identity.driver_uuid,
            ),
            handle_id: NEXT_HANDLE_ID.fetch_add(1, Ordering::Relaxed),
            owned: Arc::new(OwnedSemaphore {
                ctx: ctx.clone(),
                semaphore,
            }),
        })
    }

    /// Creates an exportable semaphore (a timeline starts at 0).
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::preflight(ctx)?;
        Self::create(ctx, true, BinaryPayload::new())
    }

    /// Creates a semaphore that is never exported: for ordering work inside
    /// Vulkan on any driver (lavapipe has no exportable semaphores).
    pub fn new_local(ctx: &Context) -> Result<Self> {
        Self::create(ctx, false, BinaryPayload::new())
    }

    /// Imports `exporter`'s payload into `ctx` (another device of this
    /// process). A binary semaphore's signal tokens are valid on both.
    pub fn import_from(ctx: &Context, exporter: &Semaphore<K>) -> Result<Self> {
        let fd = exporter.export_fd()?;
        // SAFETY: `fd` is a fresh OPAQUE_FD export of `exporter`, whose record
        // this is.
        unsafe { Self::import_with(ctx, &exporter.record(), fd, Some(exporter)) }
            .map_err(ImportError::into_error)
    }

    /// Imports a semaphore received over a socket (its record and fd arrived
    /// together from a peer). The record is checked against this
    /// device first. A binary semaphore starts with no known pending signal
    /// (see [`Semaphore::assume_signalled`]); one this process sent to itself
    /// is refused ([`ReceivedSemaphore::check_not_own_binary`]).
    pub fn import_received(
        ctx: &Context,
        received: ReceivedSemaphore<K>,
    ) -> Result<Self, ImportError> {
        let own_binary = received.check_not_own_binary();
        let (record, fd, _peer) = received.into_parts();
        if let Err(error) = own_binary {
            return Err(ImportError { error, fd });
        }
        // SAFETY: any process that reaches the socket can pair any record
        // with any fd, so this rests on checks, not on the peer: the fd kind
        // and the device are checked below, the driver's import refuses an
        // fd that is no semaphore of this kind, and a semaphore holds no
        // memory: whatever else a record could misstate only orders (or
        // stalls, within every wait's bound) work on that semaphore.
        unsafe { Self::import_with(ctx, &record, fd, None) }
    }

    /// Imports a semaphore from a record and an fd that did not travel
    /// together through this crate.
    ///
    /// # Safety
    /// `fd` is an OPAQUE_FD export of a semaphore of kind `K` whose own,
    /// unmodified record is `record`. On success the fd is consumed; on
    /// failure it comes back in the error.
    pub unsafe fn import_fd(
        ctx: &Context,
        record: &SemaphoreRecord<K>,
        fd: OwnedFd,
    ) -> Result<Self, ImportError> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::import_with(ctx, record, fd, None) }
    }

    /// `same_payload`: the handle of this process that `fd` was exported
    /// from, if any; the import then shares its payload state and its signal
    /// bookkeeping.
    ///
    /// # Safety
    /// As [`Semaphore::import_fd`].
    unsafe fn import_with(
        ctx: &Context,
        record: &SemaphoreRecord<K>,
        fd: OwnedFd,
        same_payload: Option<&Semaphore<K>>,
    ) -> Result<Self, ImportError> {
        let payload = same_payload.map_or_else(BinaryPayload::new, |s| s.payload.clone());
        let checks = check_same_device(
            ctx,
            &record.info().device_uuid(),
            &record.info().driver_uuid(),
        )
        .and_then(|()| check_export_fd(&fd, "semaphore"))
        .and_then(|()| Self::preflight(ctx))
        .and_then(|()| Self::create_sharing(ctx, false, payload, same_payload));
        let this = match checks {
            Ok(s) => s,
            Err(error) => return Err(ImportError { error, fd }),
        };
        import_dup(ctx, fd, |raw| {
            this.import_raw(
                raw,
                vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD,
                vk::SemaphoreImportFlags::empty(),
            )
            .map_err(ImportFailure::from)
        })?;
        Ok(this)
    }

    /// Imports `raw` (owned by this crate; given to the driver on success).
    fn import_raw(
        &self,
        raw: i32,
        handle: vk::ExternalSemaphoreHandleTypeFlags,
        flags: vk::SemaphoreImportFlags,
    ) -> Result<()> {
        let loader = self.loader()?;
        let info = vk::ImportSemaphoreFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(handle)
            .flags(flags)
            .fd(raw);
        // SAFETY: the semaphore has no pending operations (new, or `&mut
        // self` for temporary imports); on success Vulkan owns the fd.
        unsafe { loader.import_semaphore_fd(&info) }.map_err(|e| Error::Vulkan {
            call: "vkImportSemaphoreFdKHR",
            result: e,
            hint: "the fd is not a semaphore export of this kind from this device",
        })
    }

    fn loader(&self) -> Result<&ash::khr::external_semaphore_fd::Device> {
        self.ctx.inner.semaphore_fd.as_ref().ok_or_else(|| {
            unsupported(
                "semaphore fds",
                "VK_KHR_external_semaphore_fd is not enabled",
            )
        })
    }

    /// Exports the semaphore as a new OPAQUE_FD, owned by the caller.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        if !self.exportable {
            return Err(unsupported(
                "exporting this semaphore",
                "it was created with new_local, or imported: export the original",
            ));
        }
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: created with OPAQUE_FD export info.
        let fd = unsafe { self.loader()?.get_semaphore_fd(&info) }
            .map_err(vk_error("vkGetSemaphoreFdKHR", "too many open files"))?;
        crate::memory::owned_export_fd("vkGetSemaphoreFdKHR", fd)
    }

    /// What an importer needs, typed.
    pub fn record(&self) -> SemaphoreRecord<K> {
        self.record.clone()
    }

    /// The `VkSemaphore`, for the application's own submissions (see
    /// [`Context::from_raw`]'s contract on tracking).
    pub fn raw(&self) -> vk::Semaphore {
        self.semaphore
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// A handle that keeps the `VkSemaphore` (and its device) alive: the
    /// semaphore is destroyed only once this [`Semaphore`] and every
    /// keep-alive are gone. For submissions this crate does not track (an
    /// adapter's): hold one until such a submission completes.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new(self.owned.clone())
    }

    /// Whether `other` is a handle of the same payload made by this process
    /// ([`Semaphore::import_from`]): one semaphore, one signal lock.
    pub fn same_payload(&self, other: &Semaphore<K>) -> bool {
        Arc::ptr_eq(&self.signal_lock, &other.signal_lock)
    }
}

impl Context {
    /// Checks a semaphore record against this device as an import would:
    /// both UUIDs, and that this device can import such semaphores.
    pub fn verify_semaphore<K: SemaphoreKind>(&self, record: &SemaphoreRecord<K>) -> Result<()> {
        let info = record.info();
        check_same_device(self, &info.device_uuid(), &info.driver_uuid())?;
        Semaphore::<K>::preflight(self)
    }
}

impl Semaphore<Binary> {
    /// This semaphore's payload state, shared with its imports (CUDA's too).
    pub fn payload(&self) -> &BinaryPayload {
        &self.payload
    }

    /// The replacement token of a pending signal whose token was dropped
    /// unused (a helper that failed before submitting); see
    /// [`BinaryPayload::reclaim`].
    pub fn reclaim_signal(&self) -> Option<BinarySignal> {
        self.payload.reclaim()
    }

    /// The token of a signal that this crate did not see submitted: one the
    /// peer process submitted, or the application's own `vkQueueSubmit`.
    /// `Err` if a signal is already pending here.
    ///
    /// # Safety
    /// A signal operation on this semaphore's payload has been submitted
    /// (and not yet waited for), before any wait that uses the token.
    pub unsafe fn assume_signalled(&self) -> Result<BinarySignal> {
        let reservation = self.payload.reserve_signal()?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { reservation.submitted() })
    }

    /// Exports the payload as a SYNC_FD (copy transference). The export
    /// acts as the wait for the pending signal, so it consumes that signal's
    /// token; on failure the token comes back with the error.
    pub fn export_sync_fd(&self, signal: BinarySignal) -> Result<SyncFd, (Error, BinarySignal)> {
        if let Err(e) = self.payload.check_on(&signal, self.handle_id) {
            return Err((e, signal));
        }
        if !self.sync_fd_exportable {
            return Err((
                unsupported(
                    "SYNC_FD export",
                    "the driver cannot export this semaphore as a SYNC_FD",
                ),
                signal,
            ));
        }
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.semaphore)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD);
        let loader = match self.loader() {
            Ok(l) => l,
            Err(e) => return Err((e, signal)),
        };
        // SAFETY: created with SYNC_FD export info; the token shows a signal
        // was submitted and no wait consumed it.
        let fd = match unsafe { loader.get_semaphore_fd(&info) } {
            Ok(fd) => fd,
            Err(e) => {
                return Err((
                    Error::Vulkan {
                        call: "vkGetSemaphoreFdKHR (SYNC_FD)",
                        result: e,
                        hint: "a SYNC_FD export needs a submitted signal and no pending wait",
                    },
                    signal,
                ))
            }
        };
        // SAFETY: the copy-transference export unsignalled the payload (it is
        // the wait for this signal).
        let _ = unsafe { self.payload.consume(signal) };
        if fd < 0 {
            return Ok(SyncFd::AlreadySignaled);
        }
        // SAFETY: a new fd owned by the caller.
        Ok(SyncFd::Fd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Imports a SYNC_FD temporarily (the only permanence SYNC_FD allows):
    /// the semaphore is then signalled, and the returned token pays for the
    /// wait. `&mut self`: no other thread can have an operation of this crate
    /// pending on it meanwhile. A signal already pending, or a failed import,
    /// gives the sync fd back with the error, open.
    ///
    /// Refused before the driver sees anything: an fd that is not a sync
    /// file, and a semaphore that a submission of this crate still uses (a
    /// helper that returned [`Error::Timeout`] with its wait queued: `&mut`
    /// proves no borrow, not that the GPU is done with it).
    pub fn import_sync_fd(&mut self, fd: SyncFd) -> Result<BinarySignal, (Error, SyncFd)> {
        if let SyncFd::Fd(f) = &fd {
            if let Err(e) = check_sync_file(f) {
                return Err((e, fd));
            }
        }
        let last = self.last_use.values();
        if let Err(e) = self.ctx.wait_used(&self.last_use, Duration::ZERO) {
            let e = match e {
                Error::Timeout(_) => Error::InvalidArgument(format!(
                    "a submission of this crate that uses the semaphore (progress {last:?}) has not \
                     completed: wait for it before a temporary SYNC_FD import"
                )),
                e => e,
            };
            return Err((e, fd));
        }
        let reservation = match self.payload.reserve_signal() {
            Ok(r) => r,
            Err(e) => return Err((e, fd)),
        };
        let (handle, flags) = (
            vk::ExternalSemaphoreHandleTypeFlags::SYNC_FD,
            vk::SemaphoreImportFlags::TEMPORARY,
        );
        let ctx = self.ctx.clone();
        let imported = match fd {
            // -1 is SYNC_FD's "already signalled"; no fd changes hands.
            SyncFd::AlreadySignaled => self
                .import_raw(-1, handle, flags)
                .map_err(|e| (e, SyncFd::AlreadySignaled)),
            SyncFd::Fd(fd) => import_dup(&ctx, fd, |raw| {
                self.import_raw(raw, handle, flags)
                    .map_err(ImportFailure::from)
            })
            .map_err(|e| (e.error, SyncFd::Fd(e.fd))),
        };
        imported?;
        // SAFETY: the imported payload is a signal (a sync file or "already
        // signalled"), pending for the next wait on this semaphore. Only
        // this handle sees it (a temporary import replaces this handle's
        // payload, not the one its other handles and CUDA's share): the
        // token is tagged with it.
        Ok(unsafe { reservation.submitted_on(self.handle_id) })
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
        .map_err(vk_error(
            "vkGetSemaphoreCounterValue",
            "the device was lost",
        ))
    }

    /// Signals `value` from the host; it must be above the current value and
    /// within `maxTimelineSemaphoreValueDifference` of it. The check and the
    /// signal are one step for this process's host signals; a GPU signal of a
    /// higher value racing with it is the application's to order.
    pub fn signal(&self, value: u64) -> Result<()> {
        let _one_at_a_time = self.lock_signal("Semaphore::signal")?;
        self.check_signal_value(value, true)?;
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.semaphore)
            .value(value);
        // SAFETY: value checked above, under the lock.
        unsafe { self.ctx.inner.device.signal_semaphore(&info) }
            .map_err(vk_error("vkSignalSemaphore", "the device was lost"))
    }

    /// Checks a new signal value: above the current value and within
    /// `maxTimelineSemaphoreValueDifference` of it; a submitted one also
    /// above every value a submission of this crate signals (VUID 03242),
    /// and a host one only while no such submitted signal is pending (a host
    /// value must stay below every pending signal, VUID 03259, and this
    /// crate knows only the highest it submitted). The caller holds
    /// `signal_lock`.
    pub(crate) fn check_signal_value(&self, value: u64, host: bool) -> Result<()> {
        let current = self.value()?;
        let submitted = self.last_submitted_signal.load(Ordering::Acquire);
        let max = self.ctx.max_timeline_difference();
        if host && submitted > current {
            return Err(Error::InvalidArgument(format!(
                "timeline host signal {value}: a submitted signal of {submitted} is still pending (the \
                 value is {current}); wait for it first"
            )));
        }
        if value <= current.max(submitted) || value - current > max {
            return Err(Error::InvalidArgument(format!(
                "timeline signal {value}: must be above the current value {current} and every value already \
                 submitted ({submitted}), and at most {max} above the current value"
            )));
        }
        Ok(())
    }

    /// Waits on the host until the value is at least `value`, or `timeout`.
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

/// How long [`Semaphore::<Timeline>::wait_async`](Semaphore::wait_async)
/// sleeps (on tokio's timer, whose resolution is 1 ms) between reads of the
/// counter.
#[cfg(feature = "tokio")]
pub const ASYNC_POLL_PERIOD: Duration = Duration::from_millis(1);

#[cfg(feature = "tokio")]
impl Semaphore<Timeline> {
    /// As [`Semaphore::wait`], as a future on tokio's timer: ready once the
    /// value is at least `value`, or [`Error::Timeout`] (with `timeout`)
    /// when it is not reached within `timeout`.
    ///
    /// It reads the counter (`vkGetSemaphoreCounterValue`, which never
    /// blocks) when first polled, then after each sleep of
    /// [`ASYNC_POLL_PERIOD`] (`tokio::time::sleep`), so it completes within
    /// about a millisecond of the signal and never blocks the executor's
    /// thread. Why a poll: a timeline value has no fd to register with the
    /// reactor (`VK_KHR_external_semaphore_fd`'s SYNC_FD export is for binary
    /// semaphores only), and a `vkWaitSemaphores` on a blocking thread could
    /// not be cancelled and wakes about 10 ms late on NVIDIA
    /// ([`WaitStrategy`]).
    ///
    /// Cancellation-safe: dropping the future drops its timer entry;
    /// nothing else is pending. Needs a tokio runtime with time enabled
    /// (`Builder::enable_time` or `enable_all`; tokio panics otherwise).
    ///
    /// ```no_run
    /// # async fn example(ctx: &vk_export::Context) -> Result<(), vk_export::Error> {
    /// use std::time::Duration;
    /// use vk_export::TimelineSemaphore;
    /// let timeline = TimelineSemaphore::new_local(ctx)?;
    /// // ... a GPU submission or CUDA stream signals 1 ...
    /// timeline.wait_async(1, Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn wait_async(&self, value: u64, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        loop {
            if self.value()? >= value {
                return Ok(());
            }
            let step = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(Error::Timeout(timeout));
                    }
                    left.min(ASYNC_POLL_PERIOD)
                }
                // A bound too far to add to now: only the value ends it.
                None => ASYNC_POLL_PERIOD,
            };
            tokio::time::sleep(step).await;
        }
    }
}
