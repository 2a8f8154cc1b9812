//! The submission engine: one-shot command buffers submitted to a context's
//! queues ("lanes": its main queue and, where the device has one, a
//! transfer-only queue), each submission signalling the next value of its
//! lane's private "progress" timeline, waited for with a bound.
//!
//! # Contract
//!
//! * **Values are the completion record.** Every submission signals its
//!   lane's progress timeline with a value one above the last, under the
//!   queue lock, so submission order and value order agree per lane. A
//!   resource remembers, per lane, the value of the last submission that used
//!   it ([`LastUse`]), and its `Drop` waits for those values (bounded) instead
//!   of idling the device.
//! * **Lanes are ordered as one queue.** Every submission on a lane waits (on
//!   the GPU) for the last submission of every other lane that has not
//!   completed yet, so the crate's helpers keep the order of one queue
//!   whichever lane they use.
//! * **Every wait is bounded.** A submission whose fence does not signal in
//!   time is *retired*: its command buffer, fence and staging buffer are kept
//!   (never freed while the GPU may use them) and reclaimed once their fence
//!   signals; the next submission gets a fresh slot, so the engine stays
//!   usable.
//! * The queue is used only under [`QueueState`]'s lock.
//!
//! This module knows devices, queues and handles, not `Context`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ash::vk;

use crate::error::{unsupported, vk_error, Error, Result};
use crate::wait::WaitStrategy;

/// The queue, and the last progress value a submission to it signals.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub(crate) queue: vk::Queue,
    pub(crate) last_value: u64,
}

/// The most lanes a context has: its main queue and a transfer queue.
pub(crate) const MAX_LANES: usize = 2;

/// One queue this crate submits to, with its lock, its progress timeline and
/// its command buffers.
pub(crate) struct Lane {
    pub(crate) family: u32,
    pub(crate) index: u32,
    /// One lock around every submission to the queue (Vulkan requires
    /// external synchronisation per queue), with the last progress value.
    pub(crate) queue: Mutex<QueueState>,
    /// `QueueState::last_value`, readable without the queue lock: what other
    /// lanes' submissions wait for.
    pub(crate) last_submitted: AtomicU64,
    /// Private timeline every submission on this lane signals.
    pub(crate) progress: vk::Semaphore,
    /// The helpers' command buffers.
    pub(crate) engine: Mutex<Engine>,
    /// Command buffers of queue-family ownership releases that another
    /// lane's helper submits here. A lock of its own, taken while that
    /// helper holds its own lane's `engine` and never held while taking an
    /// `engine`: so two helpers moving resources in opposite directions
    /// cannot wait for each other.
    pub(crate) handoff: Mutex<Engine>,
}

/// Per lane, the progress value of the last submission that used a
/// resource (0: none).
#[derive(Debug, Default)]
pub(crate) struct LastUse([AtomicU64; MAX_LANES]);

impl LastUse {
    /// Records that the submission of `value` on `lane` uses the resource.
    pub(crate) fn note(&self, lane: usize, value: u64) {
        self.0[lane].fetch_max(value, Ordering::AcqRel);
    }

    /// The values, per lane.
    pub(crate) fn values(&self) -> [u64; MAX_LANES] {
        [0, 1].map(|lane| self.0[lane].load(Ordering::Acquire))
    }
}

/// A host-visible buffer a submission copies through.
pub(crate) struct Staging {
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub(crate) ptr: *mut u8,
    size: u64,
}

/// What one submission needs: a command buffer, its fence and staging memory.
pub(crate) struct Slot {
    pool: vk::CommandPool,
    pub(crate) cmd: vk::CommandBuffer,
    fence: vk::Fence,
    pub(crate) staging: Option<Staging>,
}

/// Idle slot and retired ones.
#[derive(Default)]
pub(crate) struct Engine {
    idle: Option<Slot>,
    retired: Vec<Slot>,
}

// SAFETY: the staging pointer is only dereferenced by the thread holding the
// engine's lock, and the handles are plain values.
unsafe impl Send for Engine {}

/// Whether [`Engine::run`] waits for its submission.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Completion {
    /// Waits up to this long, as the strategy says; [`Error::Timeout`]
    /// after it.
    Wait(Duration, WaitStrategy),
    /// Returns once submitted (what a later submission waits for on the GPU).
    DontWait,
}

/// Semaphore operations of one submission, as raw arrays.
#[derive(Default)]
pub(crate) struct RawSync {
    pub(crate) wait_semaphores: Vec<vk::Semaphore>,
    pub(crate) wait_values: Vec<u64>,
    pub(crate) signal_semaphores: Vec<vk::Semaphore>,
    pub(crate) signal_values: Vec<u64>,
}

impl Slot {
    fn new(device: &ash::Device, queue_family: u32) -> Result<Slot> {
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: plain object creation on a live device.
        let pool = unsafe { device.create_command_pool(&pool_info, None) }
            .map_err(vk_error("vkCreateCommandPool", "out of memory"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: allocating from the pool just created; plain fence creation.
        let made = unsafe {
            device.allocate_command_buffers(&alloc).and_then(|c| {
                device
                    .create_fence(&vk::FenceCreateInfo::default(), None)
                    .map(|f| (c[0], f))
            })
        };
        match made {
            Ok((cmd, fence)) => Ok(Slot {
                pool,
                cmd,
                fence,
                staging: None,
            }),
            Err(e) => {
                // SAFETY: the pool is unused; destroying it frees its buffers.
                unsafe { device.destroy_command_pool(pool, None) };
                Err(Error::Vulkan {
                    call: "vkAllocateCommandBuffers / vkCreateFence",
                    result: e,
                    hint: "out of memory",
                })
            }
        }
    }

    /// # Safety
    /// The slot's last submission has completed (its fence signalled) or it
    /// was never submitted.
    unsafe fn destroy(self, device: &ash::Device) {
        // SAFETY: forwarded from the caller: nothing of this slot is in use.
        unsafe {
            if let Some(s) = self.staging {
                device.destroy_buffer(s.buffer, None);
                device.free_memory(s.memory, None);
            }
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.pool, None);
        }
    }

    fn completed(&self, device: &ash::Device) -> bool {
        // SAFETY: a live fence of this device.
        matches!(unsafe { device.get_fence_status(self.fence) }, Ok(true))
    }

    /// A staging buffer of at least `size` bytes in a memory type `find_type`
    /// picks, mapped; `fits_heap` says why an allocation of that size and
    /// type cannot be asked for (`memory::check_fits_heap`).
    pub(crate) fn ensure_staging(
        &mut self,
        device: &ash::Device,
        size: u64,
        find_type: impl Fn(u32) -> Option<u32>,
        fits_heap: impl Fn(u64, u32) -> std::result::Result<(), String>,
    ) -> Result<(vk::Buffer, *mut u8)> {
        if let Some(s) = self.staging.as_ref().filter(|s| s.size >= size) {
            return Ok((s.buffer, s.ptr));
        }
        if let Some(old) = self.staging.take() {
            // SAFETY: the slot is idle (its last submission completed).
            unsafe {
                device.destroy_buffer(old.buffer, None);
                device.free_memory(old.memory, None);
            }
        }
        let size = size
            .checked_next_power_of_two()
            .ok_or_else(|| Error::InvalidArgument(format!("a staging buffer of {size} bytes")))?
            .max(1 << 16);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST);
        // SAFETY: plain creation.
        let buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(vk_error("vkCreateBuffer (staging)", "out of memory"))?;
        // SAFETY: the buffer was just created.
        let reqs = unsafe { device.get_buffer_memory_requirements(buffer) };
        let Some(index) = find_type(reqs.memory_type_bits) else {
            // SAFETY: unused.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(unsupported(
                "a staging buffer",
                "no host-visible coherent memory",
            ));
        };
        if let Err(why) = fits_heap(reqs.size, index) {
            // SAFETY: unused.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(Error::InvalidArgument(format!(
                "a staging buffer needs {why}"
            )));
        }
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(reqs.size)
            .memory_type_index(index);
        // SAFETY: plain allocation; bind and map a fresh allocation at offset 0.
        let result = unsafe {
            device.allocate_memory(&alloc, None).and_then(|memory| {
                device
                    .bind_buffer_memory(buffer, memory, 0)
                    .and_then(|()| {
                        device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                    })
                    .map(|ptr| (memory, ptr))
                    .inspect_err(|_| device.free_memory(memory, None))
            })
        };
        match result {
            Ok((memory, ptr)) => {
                self.staging = Some(Staging {
                    buffer,
                    memory,
                    ptr: ptr.cast(),
                    size,
                });
                Ok((buffer, ptr.cast()))
            }
            Err(e) => {
                // SAFETY: unused.
                unsafe { device.destroy_buffer(buffer, None) };
                Err(Error::Vulkan {
                    call: "vkAllocateMemory (staging)",
                    result: e,
                    hint: "out of host-visible memory",
                })
            }
        }
    }
}

impl Engine {
    /// Frees retired slots whose submissions have completed.
    pub(crate) fn reap(&mut self, device: &ash::Device) {
        let mut i = 0;
        while i < self.retired.len() {
            if self.retired[i].completed(device) {
                let slot = self.retired.swap_remove(i);
                // SAFETY: its fence signalled: the GPU is done with it.
                unsafe { slot.destroy(device) };
            } else {
                i += 1;
            }
        }
    }

    /// The idle slot, created on first use.
    pub(crate) fn slot(&mut self, device: &ash::Device, queue_family: u32) -> Result<&mut Slot> {
        self.reap(device);
        if self.idle.is_none() {
            self.idle = Some(Slot::new(device, queue_family)?);
        }
        Ok(self.idle.as_mut().expect("created above"))
    }

    /// Records with `record`, submits with `sync` plus the progress signal,
    /// and waits for completion up to `timeout`. Returns the progress value
    /// the submission signals (also on `Timeout`, through `on_submitted`,
    /// which runs right after a successful `vkQueueSubmit`).
    #[allow(
        clippy::too_many_arguments,
        reason = "the engine's one entry point; each argument is a distinct fact"
    )]
    pub(crate) fn run(
        &mut self,
        device: &ash::Device,
        lanes: &[Lane],
        lane: usize,
        sync: &RawSync,
        wait: Completion,
        record: impl FnOnce(vk::CommandBuffer) -> Result<()>,
        on_submitted: impl FnOnce(u64),
    ) -> Result<()> {
        let this = &lanes[lane];
        let slot = self.slot(device, this.family)?;
        let cmd = slot.cmd;
        let fence = slot.fence;
        // SAFETY: the slot is idle (its last submission completed) and only
        // used by the holder of the engine's lock.
        unsafe {
            device
                .reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_error("vkResetCommandBuffer", "out of memory"))?;
            device
                .begin_command_buffer(
                    cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(vk_error("vkBeginCommandBuffer", "out of memory"))?;
        }
        // Every batch holds at least one command: a later batch's progress
        // signal covers "all commands earlier in submission order", so this
        // barrier (which runs after this batch's semaphore waits) keeps a
        // later progress value from completing before this batch's waits.
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
            .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE);
        // SAFETY: recording state; a plain global memory barrier.
        unsafe {
            device.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::PipelineStageFlags::ALL_COMMANDS,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            )
        };
        // A failed recording leaves the buffer recording; the next use of the
        // slot resets it.
        record(cmd)?;
        // SAFETY: recording state.
        unsafe { device.end_command_buffer(cmd) }
            .map_err(vk_error("vkEndCommandBuffer", "out of memory"))?;
        let value = {
            let mut q = this.queue.lock().unwrap_or_else(|p| p.into_inner());
            let value = q.last_value + 1;
            let mut wait_semaphores = sync.wait_semaphores.clone();
            let mut wait_values = sync.wait_values.clone();
            // One queue's order across lanes: wait for the other lanes'
            // latest submissions that have not completed yet (read after
            // anything this call submitted there, e.g. an ownership release).
            for (i, other) in lanes.iter().enumerate() {
                let last = other.last_submitted.load(Ordering::Acquire);
                // SAFETY: a live timeline semaphore of this device.
                let done = unsafe { device.get_semaphore_counter_value(other.progress) };
                if i != lane && last > 0 && !done.is_ok_and(|d| d >= last) {
                    wait_semaphores.push(other.progress);
                    wait_values.push(last);
                }
            }
            let wait_stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; wait_semaphores.len()];
            let mut signal_semaphores = sync.signal_semaphores.clone();
            let mut signal_values = sync.signal_values.clone();
            signal_semaphores.push(this.progress);
            signal_values.push(value);
            let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
                .wait_semaphore_values(&wait_values)
                .signal_semaphore_values(&signal_values);
            let cmds = [cmd];
            let submit = vk::SubmitInfo::default()
                .wait_semaphores(&wait_semaphores)
                .wait_dst_stage_mask(&wait_stages)
                .command_buffers(&cmds)
                .signal_semaphores(&signal_semaphores)
                .push_next(&mut timeline);
            // SAFETY: the queue is locked; everything the submit refers to
            // lives until its fence signals (a timed-out slot is retired, not
            // freed); the callers checked that every semaphore belongs to
            // this device and is alive (borrowed) for the call.
            unsafe { device.queue_submit(q.queue, &[submit], fence) }.map_err(vk_error(
                "vkQueueSubmit",
                "the device was lost, or out of memory",
            ))?;
            q.last_value = value;
            this.last_submitted.store(value, Ordering::Release);
            value
        };
        on_submitted(value);
        let (timeout, strategy) = match wait {
            Completion::Wait(timeout, strategy) => (timeout, strategy),
            Completion::DontWait => {
                // Reclaimed by `reap` once its fence signals.
                let slot = self.idle.take().expect("the slot in use");
                self.retired.push(slot);
                return Ok(());
            }
        };
        let start = std::time::Instant::now();
        match wait_fence(device, fence, timeout, strategy) {
            Ok(()) => {
                // SAFETY: the fence signalled; nothing waits on it.
                unsafe { device.reset_fences(&[fence]) }
                    .map_err(vk_error("vkResetFences", "out of memory"))?;
                // A returned helper's timeline signals read as done: a driver
                // may signal the fence before it updates the counters
                // (lavapipe under load: a host signal right after a helper
                // saw the value it had signalled still pending).
                let (semaphores, values): (Vec<_>, Vec<_>) = sync
                    .signal_semaphores
                    .iter()
                    .zip(&sync.signal_values)
                    .filter(|(_, v)| **v > 0)
                    .map(|(s, v)| (*s, *v))
                    .chain([(this.progress, value)])
                    .unzip();
                let info = vk::SemaphoreWaitInfo::default()
                    .semaphores(&semaphores)
                    .values(&values);
                // What is left of the one bound: the fence took the rest.
                let left = timeout.saturating_sub(start.elapsed());
                let nanos = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX);
                // SAFETY: live timeline semaphores of this device (the
                // callers borrow them for the call); arrays live across it.
                match unsafe { device.wait_semaphores(&info, nanos) } {
                    Ok(()) => Ok(()),
                    Err(vk::Result::TIMEOUT) => Err(Error::Timeout(timeout)),
                    Err(e) => Err(Error::Vulkan {
                        call: "vkWaitSemaphores (after the fence)",
                        result: e,
                        hint: "the device was lost",
                    }),
                }
            }
            Err(vk::Result::TIMEOUT) => {
                let slot = self.idle.take().expect("the slot in use");
                self.retired.push(slot);
                Err(Error::Timeout(timeout))
            }
            Err(e) => Err(Error::Vulkan {
                call: match strategy {
                    WaitStrategy::Block => "vkWaitForFences",
                    WaitStrategy::Poll { .. } => "vkGetFenceStatus",
                },
                result: e,
                hint: "the device was lost",
            }),
        }
    }

    /// Destroys every slot.
    ///
    /// # Safety
    /// No slot's submission may still be executing (the caller waited for
    /// every progress value it submitted).
    pub(crate) unsafe fn destroy(self, device: &ash::Device) {
        for slot in self.idle.into_iter().chain(self.retired) {
            // SAFETY: forwarded from the caller.
            unsafe { slot.destroy(device) };
        }
    }
}

/// Waits until every lane's progress reaches its value in `values` (0:
/// nothing to wait for), up to `timeout` for all of them.
pub(crate) fn wait_lanes(
    device: &ash::Device,
    lanes: &[Lane],
    values: [u64; MAX_LANES],
    timeout: Duration,
) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    for (lane, value) in lanes.iter().zip(values) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        wait_progress(device, lane.progress, value, left).map_err(|e| match e {
            Error::Timeout(_) => Error::Timeout(timeout),
            e => e,
        })?;
    }
    Ok(())
}

/// Waits until `progress` reaches `value`, up to `timeout`.
pub(crate) fn wait_progress(
    device: &ash::Device,
    progress: vk::Semaphore,
    value: u64,
    timeout: Duration,
) -> Result<()> {
    if value == 0 {
        return Ok(());
    }
    let semaphores = [progress];
    let values = [value];
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&semaphores)
        .values(&values);
    let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    // SAFETY: a live timeline semaphore of this device; arrays live across the call.
    match unsafe { device.wait_semaphores(&info, nanos) } {
        Ok(()) => Ok(()),
        Err(vk::Result::TIMEOUT) => Err(Error::Timeout(timeout)),
        Err(e) => Err(Error::Vulkan {
            call: "vkWaitSemaphores (progress)",
            result: e,
            hint: "the device was lost",
        }),
    }
}
/// Waits for `fence` (of `device`, signalled by a submission) within
/// `timeout`: [`WaitStrategy::Block`] in `vkWaitForFences`, which wakes
/// with the driver's latency; [`WaitStrategy::Poll`] reads
/// `vkGetFenceStatus`, spinning, then yielding, then sleeping in steps, as
/// the semaphore waits do. `TIMEOUT` when it did not signal in time.
fn wait_fence(
    device: &ash::Device,
    fence: vk::Fence,
    timeout: Duration,
    strategy: WaitStrategy,
) -> std::result::Result<(), vk::Result> {
    let WaitStrategy::Poll {
        spin,
        yield_until,
        sleep,
    } = strategy
    else {
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: a fence of `device` (the caller's).
        return unsafe { device.wait_for_fences(&[fence], true, nanos) };
    };
    let start = std::time::Instant::now();
    loop {
        // SAFETY: as above.
        if unsafe { device.get_fence_status(fence) }? {
            return Ok(());
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(vk::Result::TIMEOUT);
        }
        if elapsed < spin {
            std::hint::spin_loop();
        } else if elapsed < yield_until {
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep.min(timeout - elapsed));
        }
    }
}
