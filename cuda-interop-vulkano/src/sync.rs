//! vk-export timelines in vulkano's sync: [`Interop::submit`] (vulkano
//! command buffers submitted with timeline waits and signals) and
//! [`Interop::semaphore`] (a timeline's payload as a vulkano
//! [`Semaphore`]).
//!
//! # Contract
//!
//! * [`Interop::submit`] submits vulkano command buffers to the main queue
//!   under both locks (the context's and vulkano's), waiting on the GPU for
//!   each wait point and signalling each signal point. The signals are
//!   checked and recorded with vk-export's own bookkeeping
//!   ([`TimelineSemaphore::reserve_submitted_signals`]), so a host signal
//!   of vk-export never goes under a pending one. The command buffers and
//!   semaphores live until the submission's fence signals
//!   ([`Submission`]: its drop waits, bounded by [`vk_export::DROP_WAIT`],
//!   and leaks them, reported, if it does not come).
//! * [`Interop::semaphore`] is a vulkano semaphore of its own that imports
//!   the timeline's payload through an fd: nothing is borrowed, each side
//!   destroys its own handle. It needs `VK_KHR_external_semaphore_fd`
//!   (Mesa's lavapipe has none: refused there) and an exportable timeline
//!   ([`TimelineSemaphore::new`]). Signals made through it are outside
//!   vk-export's bookkeeping: order them with vk-export's host signals
//!   yourself.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ash::vk;
use vk_export::{Context, KeepAlive, QueueRole, TimelinePoint, TimelineSemaphore, DROP_WAIT};
use vulkano::device::DeviceOwned;
use vulkano::sync::semaphore::{
    ExternalSemaphoreHandleType, ImportSemaphoreFdInfo, Semaphore, SemaphoreCreateInfo,
    SemaphoreType,
};
use vulkano::VulkanObject;

use crate::context::Interop;
use crate::error::{Error, Result};

/// What a submission keeps alive until its fence signals.
struct Kept {
    _commands: Vec<Arc<dyn Any + Send + Sync>>,
    _semaphores: Vec<KeepAlive>,
}

/// A submission made by [`Interop::submit`]: its fence, and what it uses.
/// Dropping it waits (bounded) for the fence.
pub struct Submission {
    context: Context,
    fence: vk::Fence,
    kept: Option<Kept>,
}

impl fmt::Debug for Submission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Submission")
            .field("pending", &self.kept.is_some())
            .finish()
    }
}

impl Submission {
    /// Waits on the host, within `timeout`, until the submission completed;
    /// then lets go of its command buffers and semaphores.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        if self.kept.is_none() {
            return Ok(());
        }
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the fence is this submission's, alive until Drop.
        unsafe {
            self.context
                .device()
                .wait_for_fences(&[self.fence], true, nanos)
        }
        .map_err(|result| Error::Vulkan {
            call: "vkWaitForFences",
            result,
        })?;
        self.kept = None;
        Ok(())
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if let Err(e) = self.wait(DROP_WAIT) {
            vk_export::report_drop_error(format_args!(
                "cuda-interop-vulkano: a submission did not complete within {DROP_WAIT:?} ({e}): \
                 its command buffers, semaphores and fence are leaked"
            ));
            std::mem::forget(self.kept.take());
            return;
        }
        // SAFETY: the fence signalled (waited above): no queue uses it.
        unsafe { self.context.device().destroy_fence(self.fence, None) };
    }
}

impl Interop {
    /// Submits `command_buffers` (vulkano's, of this device, for the main
    /// queue's family) to the main queue: after the GPU reached each of
    /// `waits`, and signalling each of `signals` when they complete.
    /// Refused before anything is submitted: a timeline of another
    /// context, a command buffer of another device, a wait at or above a
    /// signal of the same timeline, a signal value vk-export's bookkeeping
    /// refuses (not above the current value and the signals already
    /// submitted, or too far above). The command buffers and timelines
    /// live until the returned [`Submission`] saw the work complete.
    ///
    /// # Safety
    /// As vulkano's `QueueGuard::submit` (the submission bypasses
    /// vulkano's resource tracking): every resource the command buffers use
    /// is in the state (layout, ownership) they expect when they execute,
    /// their accesses are ordered with every other use (here by `waits`,
    /// or by the same queue's earlier work with barriers), a command buffer
    /// recorded for one submission (`OneTimeSubmit`) is submitted once, and
    /// one recorded for several is not pending elsewhere; every wait has a
    /// signal submitted or made by the host that reaches it.
    pub unsafe fn submit<C>(
        &self,
        command_buffers: &[Arc<C>],
        waits: &[TimelinePoint<'_>],
        signals: &[TimelinePoint<'_>],
    ) -> Result<Submission>
    where
        C: VulkanObject<Handle = vk::CommandBuffer> + DeviceOwned + Send + Sync + 'static,
    {
        for point in waits.iter().chain(signals) {
            if !point.semaphore.context().is_same(self.context()) {
                return Err(Error::Refused(
                    "a timeline of another vk-export context than this Interop's".into(),
                ));
            }
        }
        for cb in command_buffers {
            if cb.device().handle() != self.device().handle() {
                return Err(Error::Refused(
                    "a command buffer of another vulkano device".into(),
                ));
            }
        }
        if let Some((wait, signal)) = TimelinePoint::wait_on_own_signal(waits, signals) {
            return Err(Error::Refused(format!(
                "a wait for {wait} and a signal of {signal} on one timeline in one submission: \
                 it would wait for its own signal"
            )));
        }
        let pairs: Vec<_> = signals.iter().map(|p| (p.semaphore, p.value)).collect();
        // Checked and reserved under each timeline's signal lock, taken
        // before the queue's as vk-export's own submissions take them (the
        // other order deadlocks against one of them signalling the same
        // timeline), held until the submission is recorded: no other signal
        // of this process slips in.
        let reservation = TimelineSemaphore::reserve_submitted_signals(&pairs)?;
        let device = self.context().device();
        // SAFETY: plain creation on the live device.
        let fence = unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(
            |result| Error::Vulkan {
                call: "vkCreateFence",
                result,
            },
        )?;
        let handles: Vec<vk::CommandBuffer> = command_buffers.iter().map(|c| c.handle()).collect();
        let wait_semaphores: Vec<vk::Semaphore> = waits.iter().map(|p| p.semaphore.raw()).collect();
        let wait_values: Vec<u64> = waits.iter().map(|p| p.value).collect();
        let stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; waits.len()];
        let signal_semaphores: Vec<vk::Semaphore> =
            signals.iter().map(|p| p.semaphore.raw()).collect();
        let signal_values: Vec<u64> = signals.iter().map(|p| p.value).collect();
        let run = || -> Result<()> {
            let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
                .wait_semaphore_values(&wait_values)
                .signal_semaphore_values(&signal_values);
            let info = vk::SubmitInfo::default()
                .wait_semaphores(&wait_semaphores)
                .wait_dst_stage_mask(&stages)
                .command_buffers(&handles)
                .signal_semaphores(&signal_semaphores)
                .push_next(&mut timeline);
            let queue = self.queue();
            queue
                .with(|_guard| {
                    // SAFETY: the queue is locked (the context's lock around
                    // this closure, vulkano's here); the info and its chain
                    // live across the call; the command buffers and
                    // semaphores are of this device (checked above) and are
                    // kept until the fence signals; the rest is the
                    // caller's promise.
                    unsafe { device.queue_submit(queue.handle(), &[info], fence) }
                })
                .map_err(|result| Error::Vulkan {
                    call: "vkQueueSubmit",
                    result,
                })
        };
        let submitted = self
            .context()
            .with_queue_of(QueueRole::Main, |_| run())
            .map_err(Error::from)
            .and_then(|r| r);
        match &submitted {
            Ok(()) => reservation.submitted(),
            Err(_) => drop(reservation),
        }
        if let Err(e) = submitted {
            // SAFETY: nothing was submitted with the fence.
            unsafe { device.destroy_fence(fence, None) };
            return Err(e);
        }
        Ok(Submission {
            context: self.context().clone(),
            fence,
            kept: Some(Kept {
                _commands: command_buffers
                    .iter()
                    .map(|c| c.clone() as Arc<dyn Any + Send + Sync>)
                    .collect(),
                _semaphores: waits
                    .iter()
                    .chain(signals)
                    .map(|p| p.semaphore.keep_alive())
                    .collect(),
            }),
        })
    }

    /// A vulkano timeline [`Semaphore`] of its own on `timeline`'s payload
    /// (an fd export and import): waits and signals on either are on the
    /// same timeline. Refused: a timeline of another context, a device
    /// without `VK_KHR_external_semaphore_fd` (lavapipe), a timeline made
    /// without export ([`TimelineSemaphore::new_local`]).
    pub fn semaphore(&self, timeline: &TimelineSemaphore) -> Result<Arc<Semaphore>> {
        if !timeline.context().is_same(self.context()) {
            return Err(Error::Refused(
                "the timeline belongs to another vk-export context than this Interop's".into(),
            ));
        }
        if !self.context().supports_semaphore_fds() {
            return Err(Error::Refused(
                "the device offers no VK_KHR_external_semaphore_fd (Mesa's lavapipe has none): \
                 a timeline's payload cannot be shared with a vulkano semaphore; use \
                 Interop::submit's timeline points"
                    .into(),
            ));
        }
        let fd = timeline.export_fd()?;
        let semaphore = Semaphore::new(
            self.device().clone(),
            SemaphoreCreateInfo {
                semaphore_type: SemaphoreType::Timeline,
                ..Default::default()
            },
        )
        .map_err(|e| Error::Vulkano(e.to_string()))?;
        let import = ImportSemaphoreFdInfo {
            file: Some(std::fs::File::from(fd)),
            ..ImportSemaphoreFdInfo::handle_type(ExternalSemaphoreHandleType::OpaqueFd)
        };
        // SAFETY: the semaphore was just made and is not in use; the fd is
        // a fresh OPAQUE_FD export of a timeline of this very device (same
        // context: same device and driver UUIDs), of the same type.
        unsafe { semaphore.import_fd(import) }.map_err(|e| Error::Vulkano(e.to_string()))?;
        Ok(Arc::new(semaphore))
    }
}
