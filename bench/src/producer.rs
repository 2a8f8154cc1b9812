//! The Vulkan producers of the frame scenarios, written as an application's
//! renderer would: its own command pool and pre-recorded command buffers,
//! submitted with timeline waits and signals, never waited for on a fence.
//!
//! Two variants (issue 19, [`Variant`]):
//!
//! * **render**: each slot's command buffer clears its image (a stand-in
//!   for rendering, which needs the graphics engine) on the context's main
//!   queue, in a pool of the main family;
//! * **copy**: each slot's command buffer copies a device-local buffer,
//!   filled once, into its image (`vkCmdCopyBufferToImage`), in a pool of
//!   the transfer family, submitted on the transfer queue
//!   (`Context::with_queue_of(QueueRole::Transfer, ..)`); where the context
//!   has no transfer queue (lavapipe), that role is the main queue and
//!   family.
//!
//! Then it releases the image to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL`
//! layout from the family it was recorded for (the barriers use only
//! `TRANSFER`, `TOP_OF_PIPE`, `BOTTOM_OF_PIPE` and `HOST` stages and
//! transfer accesses, which a transfer-only queue may record); the staging
//! variant copies the image into a host-visible buffer instead.
//! Submissions wait for `consumed >= wait_value[slot]` and signal
//! `produced = signal_value[slot]`; the values live in boxed arrays of
//! `Cell`s that the submit infos point into (interior mutability: writing
//! them through those pointers, or through `Cell::set`, is allowed), so a
//! frame loop (Rust or C) only writes them. A producer's drop waits, bounded,
//! for its last signalled value, and leaks its command pool (and source
//! buffer) if that does not come.

use std::cell::Cell;

use vk_export::ash::vk;
use vk_export::{Context, QueueRole, SubmitSync};

use crate::Res;

/// Which engine a producer's frames need (see the module's contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Clears on the main queue: pays the graphics-engine switch between
    /// Vulkan and CUDA by nature.
    Render,
    /// Copies from a device-local buffer on the transfer queue.
    Copy,
}

impl Variant {
    /// The queue the variant submits to.
    pub fn role(self) -> QueueRole {
        match self {
            Variant::Render => QueueRole::Main,
            Variant::Copy => QueueRole::Transfer,
        }
    }

    /// The label of its rows.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Render => "render producer",
            Variant::Copy => "copy producer",
        }
    }

    /// What its command buffers do and where, for the rows and notes.
    pub fn describe(self, ctx: &Context) -> String {
        let family = ctx.queue_family_of(self.role());
        match self {
            Variant::Render => format!("clear on the main queue, family {family}"),
            Variant::Copy if ctx.queues().transfer.is_some() => {
                format!("buffer-to-image copy on the transfer queue, family {family}")
            }
            Variant::Copy => format!(
                "buffer-to-image copy on the main queue, family {family} (no transfer queue here)"
            ),
        }
    }
}

/// One pre-recorded command buffer per slot, and the submit chains that
/// point into `wait_values` / `signal_values`.
pub struct Producer<'c> {
    ctx: &'c Context,
    variant: Variant,
    pool: vk::CommandPool,
    /// The copy variant's source, filled once.
    source: Option<SourceBuffer<'c>>,
    // The chains point into these boxes: kept, never moved or resized.
    _commands: Box<[vk::CommandBuffer]>,
    _wait_semaphores: Box<[vk::Semaphore]>,
    _signal_semaphores: Box<[vk::Semaphore]>,
    _stages: Box<[vk::PipelineStageFlags]>,
    _timeline_infos: Box<[vk::TimelineSemaphoreSubmitInfo<'static>]>,
    pub wait_values: Box<[Cell<u64>]>,
    pub signal_values: Box<[Cell<u64>]>,
    /// The semaphore the submissions signal, and the highest value signalled.
    produced: vk::Semaphore,
    last_signalled: u64,
    pub submit_infos: Box<[vk::SubmitInfo<'static>]>,
}

/// What a slot's command buffer does after the clear.
pub enum After {
    /// Release the image to the external queue family (zero-copy).
    Release,
    /// Copy the image into this host-visible buffer (staging).
    CopyTo(vk::Buffer),
}

impl<'c> Producer<'c> {
    /// Records one command buffer per image for `variant`'s queue family.
    /// `texel_bytes` sizes the copy variant's source buffer (the largest
    /// image's bytes). `consumed`/`produced` are the timelines the
    /// submissions wait for and signal (`consumed` may be `None`: no wait).
    pub fn new(
        ctx: &'c Context,
        variant: Variant,
        texel_bytes: u32,
        images: &[(vk::Image, vk::Extent2D)],
        after: &[After],
        consumed: Option<vk::Semaphore>,
        produced: vk::Semaphore,
    ) -> Res<Self> {
        let device = ctx.device();
        let slots = images.len();
        let family = ctx.queue_family_of(variant.role());
        let source = match variant {
            Variant::Render => None,
            Variant::Copy => {
                let bytes = images
                    .iter()
                    .map(|(_, e)| u64::from(e.width) * u64::from(e.height))
                    .max()
                    .unwrap_or(1)
                    * u64::from(texel_bytes);
                Some(SourceBuffer::new(ctx, bytes)?)
            }
        };
        // SAFETY: a valid device and queue family; destroyed in Drop.
        let pool = unsafe {
            device.create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(family),
                None,
            )
        }?;
        // SAFETY: the pool just created; buffers freed with it.
        let commands: Box<[vk::CommandBuffer]> = unsafe {
            device.allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(slots as u32),
            )
        }?
        .into();
        let range = vk::ImageSubresourceRange::default()
            .aspect_mask(vk::ImageAspectFlags::COLOR)
            .level_count(1)
            .layer_count(1);
        let layers = vk::ImageSubresourceLayers::default()
            .aspect_mask(vk::ImageAspectFlags::COLOR)
            .layer_count(1);
        for ((&cmd, &(image, extent)), after) in commands.iter().zip(images).zip(after) {
            let full = vk::BufferImageCopy::default()
                .image_subresource(layers)
                .image_extent(vk::Extent3D {
                    width: extent.width,
                    height: extent.height,
                    depth: 1,
                });
            // SAFETY: recording into a fresh primary command buffer of this
            // device, in a pool of `family`, only commands that family
            // supports (clears only on the main family); every handle is
            // live for the producer's life.
            unsafe {
                device.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())?;
                let to_transfer = vk::ImageMemoryBarrier::default()
                    .image(image)
                    .subresource_range(range)
                    .old_layout(vk::ImageLayout::UNDEFINED)
                    .new_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
                    .dst_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                    .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED);
                match &source {
                    None => {
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::TOP_OF_PIPE,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::DependencyFlags::empty(),
                            &[],
                            &[],
                            &[to_transfer],
                        );
                        device.cmd_clear_color_image(
                            cmd,
                            image,
                            vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                            &vk::ClearColorValue {
                                float32: [0.25, 0.5, 0.75, 1.0],
                            },
                            &[range],
                        );
                    }
                    Some(source) => {
                        // The source's one fill (an earlier submission on
                        // this queue) is visible to the copy.
                        let filled = vk::MemoryBarrier::default()
                            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                            .dst_access_mask(vk::AccessFlags::TRANSFER_READ);
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::DependencyFlags::empty(),
                            &[filled],
                            &[],
                            &[to_transfer],
                        );
                        device.cmd_copy_buffer_to_image(
                            cmd,
                            source.buffer,
                            image,
                            vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                            &[full],
                        );
                    }
                }
                match after {
                    After::Release => {
                        let release = vk::ImageMemoryBarrier::default()
                            .image(image)
                            .subresource_range(range)
                            .old_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
                            .new_layout(vk::ImageLayout::GENERAL)
                            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                            .src_queue_family_index(family)
                            .dst_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL);
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                            vk::DependencyFlags::empty(),
                            &[],
                            &[],
                            &[release],
                        );
                    }
                    After::CopyTo(buffer) => {
                        let to_source = vk::ImageMemoryBarrier::default()
                            .image(image)
                            .subresource_range(range)
                            .old_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
                            .new_layout(vk::ImageLayout::TRANSFER_SRC_OPTIMAL)
                            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                            .dst_access_mask(vk::AccessFlags::TRANSFER_READ)
                            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED);
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::DependencyFlags::empty(),
                            &[],
                            &[],
                            &[to_source],
                        );
                        device.cmd_copy_image_to_buffer(
                            cmd,
                            image,
                            vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
                            *buffer,
                            &[full],
                        );
                        let to_host = vk::BufferMemoryBarrier::default()
                            .buffer(*buffer)
                            .size(vk::WHOLE_SIZE)
                            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                            .dst_access_mask(vk::AccessFlags::HOST_READ)
                            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED);
                        device.cmd_pipeline_barrier(
                            cmd,
                            vk::PipelineStageFlags::TRANSFER,
                            vk::PipelineStageFlags::HOST,
                            vk::DependencyFlags::empty(),
                            &[],
                            &[to_host],
                            &[],
                        );
                    }
                }
                device.end_command_buffer(cmd)?;
            }
        }
        let wait_values: Box<[Cell<u64>]> = (0..slots).map(|_| Cell::new(0)).collect();
        let signal_values: Box<[Cell<u64>]> = (0..slots).map(|_| Cell::new(0)).collect();
        let wait_semaphores: Box<[vk::Semaphore]> =
            vec![consumed.unwrap_or_default(); slots].into();
        let signal_semaphores: Box<[vk::Semaphore]> = vec![produced; slots].into();
        let stages: Box<[vk::PipelineStageFlags]> =
            vec![vk::PipelineStageFlags::ALL_COMMANDS; slots].into();
        let waits = u32::from(consumed.is_some());
        let timeline_infos: Box<[vk::TimelineSemaphoreSubmitInfo<'static>]> = (0..slots)
            .map(|s| vk::TimelineSemaphoreSubmitInfo {
                wait_semaphore_value_count: waits,
                p_wait_semaphore_values: wait_values[s].as_ptr(),
                signal_semaphore_value_count: 1,
                p_signal_semaphore_values: signal_values[s].as_ptr(),
                ..Default::default()
            })
            .collect();
        let submit_infos: Box<[vk::SubmitInfo<'static>]> = (0..slots)
            .map(|s| vk::SubmitInfo {
                p_next: (&timeline_infos[s] as *const vk::TimelineSemaphoreSubmitInfo).cast(),
                wait_semaphore_count: waits,
                p_wait_semaphores: &wait_semaphores[s],
                p_wait_dst_stage_mask: &stages[s],
                command_buffer_count: 1,
                p_command_buffers: &commands[s],
                signal_semaphore_count: 1,
                p_signal_semaphores: &signal_semaphores[s],
                ..Default::default()
            })
            .collect();
        Ok(Producer {
            ctx,
            variant,
            pool,
            source,
            _commands: commands,
            _wait_semaphores: wait_semaphores,
            _signal_semaphores: signal_semaphores,
            _stages: stages,
            _timeline_infos: timeline_infos,
            wait_values,
            signal_values,
            produced,
            last_signalled: 0,
            submit_infos,
        })
    }

    /// The queue this producer submits to (the C loop takes it too).
    pub fn role(&self) -> QueueRole {
        self.variant.role()
    }

    /// Submits slot `slot`'s command buffer, waiting for `consumed >= wait`
    /// and signalling `produced = signal`.
    pub fn submit(&mut self, slot: usize, wait: u64, signal: u64) -> Res<()> {
        self.submit_batch(&[(slot, wait, signal)])
    }

    /// Submits several frames in one `vkQueueSubmit`, one submit info each:
    /// `(slot, wait, signal)` in order, signals increasing, no slot twice
    /// (each slot's values live in one place).
    pub fn submit_batch(&mut self, frames: &[(usize, u64, u64)]) -> Res<()> {
        let mut infos = Vec::with_capacity(frames.len());
        for (i, &(slot, wait, signal)) in frames.iter().enumerate() {
            if frames[..i].iter().any(|&(s, _, _)| s == slot) {
                return Err(format!("slot {slot} twice in one batch").into());
            }
            self.wait_values[slot].set(wait);
            self.signal_values[slot].set(signal);
            self.last_signalled = self.last_signalled.max(signal);
            infos.push(self.submit_infos[slot]);
        }
        let device = self.ctx.device();
        // SAFETY: the submit infos point into boxes this producer owns,
        // whose values were just written (one slot each); the semaphores
        // and command buffers are live, recorded for this role's family,
        // and not pending (callers wait for a slot's last frame before
        // they submit it again); the queue is used under the context's lock.
        self.ctx
            .with_queue_of(self.variant.role(), |queue| unsafe {
                device.queue_submit(queue, &infos, vk::Fence::null())
            })??;
        Ok(())
    }
}

impl Producer<'_> {
    /// Records that a frame loop outside [`Producer::submit`] (the C loop)
    /// signalled up to `value`, so that the drop waits for it.
    pub fn signalled_up_to(&mut self, value: u64) {
        self.last_signalled = self.last_signalled.max(value);
    }
}

impl Drop for Producer<'_> {
    fn drop(&mut self) {
        let semaphores = [self.produced];
        let values = [self.last_signalled];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: a live timeline semaphore; arrays live across the call;
        // bounded (5 s).
        let idle = unsafe { self.ctx.device().wait_semaphores(&info, 5_000_000_000) };
        match idle {
            // SAFETY: every submission of this producer signalled at most
            // `last_signalled` and that value was reached, so no command
            // buffer of the pool is pending; destroyed once. The source
            // buffer drops after this (a field), no copy reading it pending.
            Ok(()) => unsafe { self.ctx.device().destroy_command_pool(self.pool, None) },
            Err(e) => {
                // Copies from the source may still run: it is leaked too.
                if let Some(source) = self.source.as_mut() {
                    source.leak = true;
                }
                eprintln!(
                    "bench: a producer's last frame did not complete ({e}): its command pool is leaked"
                )
            }
        }
    }
}

/// The 32-bit word the copy producer's source buffer is filled with (its
/// frames' every texel of RGBA8, little-endian bytes).
pub const SOURCE_FILL: u32 = 0x3f40_c080;

/// The copy producer's source: a device-local (where offered) transfer
/// buffer, filled once on the transfer queue.
struct SourceBuffer<'c> {
    ctx: &'c Context,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// The fill did not complete in time: it may still write, so the
    /// buffer is leaked rather than destroyed.
    leak: bool,
}

impl<'c> SourceBuffer<'c> {
    fn new(ctx: &'c Context, len: u64) -> Res<Self> {
        let device = ctx.device();
        // SAFETY: plain buffer creation on a live device; from here the
        // value's Drop destroys what was made, also on an early return.
        let buffer = unsafe {
            device.create_buffer(
                &vk::BufferCreateInfo::default()
                    .size(len)
                    .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST),
                None,
            )
        }?;
        let mut source = SourceBuffer {
            ctx,
            buffer,
            memory: vk::DeviceMemory::null(),
            leak: false,
        };
        // SAFETY: queries of live handles.
        let (req, props) = unsafe {
            (
                device.get_buffer_memory_requirements(buffer),
                ctx.instance()
                    .get_physical_device_memory_properties(ctx.physical_device()),
            )
        };
        let allowed = |i: u32| req.memory_type_bits & (1 << i) != 0;
        let index = (0..props.memory_type_count)
            .find(|&i| {
                allowed(i)
                    && props.memory_types[i as usize]
                        .property_flags
                        .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
            })
            .or_else(|| (0..props.memory_type_count).find(|&i| allowed(i)))
            .ok_or("no memory type for the copy producer's source buffer")?;
        // SAFETY: allocation and binding of the buffer's memory on a live
        // device; the handle is stored at once, for Drop.
        unsafe {
            source.memory = device.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(req.size)
                    .memory_type_index(index),
                None,
            )?;
            device.bind_buffer_memory(buffer, source.memory, 0)?;
        }
        let filled = ctx.submit_and_wait_on(QueueRole::Transfer, SubmitSync::new(), |d, cmd, _| {
            // SAFETY: a fill of the whole live buffer (TRANSFER_DST), a
            // command every queue with TRANSFER records; the buffer outlives
            // it (leaked below if the wait gives up).
            unsafe { d.cmd_fill_buffer(cmd, buffer, 0, vk::WHOLE_SIZE, SOURCE_FILL) }
        });
        if let Err(e) = filled {
            source.leak = true;
            return Err(format!("filling the copy producer's source buffer: {e}").into());
        }
        Ok(source)
    }
}

impl Drop for SourceBuffer<'_> {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        // SAFETY: no pending command uses the buffer (the fill was waited
        // for; the producer owning it waited for its copies or forgot this
        // value); each handle made is destroyed once.
        unsafe {
            self.ctx.device().destroy_buffer(self.buffer, None);
            if self.memory != vk::DeviceMemory::null() {
                self.ctx.device().free_memory(self.memory, None);
            }
        }
    }
}

/// A host-visible (and, where offered, host-cached) buffer with its memory
/// mapped: the staging baseline's landing place.
pub struct HostBuffer<'c> {
    ctx: &'c Context,
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub mapped: *const u8,
}

impl<'c> HostBuffer<'c> {
    pub fn new(ctx: &'c Context, len: usize) -> Res<Self> {
        let device = ctx.device();
        // SAFETY: plain buffer creation on a live device; from here the
        // value's Drop destroys what was made, also on an early return.
        let buffer = unsafe {
            device.create_buffer(
                &vk::BufferCreateInfo::default()
                    .size(len as u64)
                    .usage(vk::BufferUsageFlags::TRANSFER_DST),
                None,
            )
        }?;
        let mut host = HostBuffer {
            ctx,
            buffer,
            memory: vk::DeviceMemory::null(),
            mapped: std::ptr::null(),
        };
        // SAFETY: queries of live handles.
        let (req, props) = unsafe {
            (
                device.get_buffer_memory_requirements(buffer),
                ctx.instance()
                    .get_physical_device_memory_properties(ctx.physical_device()),
            )
        };
        let pick = |flags: vk::MemoryPropertyFlags| {
            (0..props.memory_type_count).find(|&i| {
                req.memory_type_bits & (1 << i) != 0
                    && props.memory_types[i as usize]
                        .property_flags
                        .contains(flags)
            })
        };
        let coherent =
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let index = pick(coherent | vk::MemoryPropertyFlags::HOST_CACHED)
            .or_else(|| pick(coherent))
            .ok_or("no host-visible coherent memory type")?;
        // SAFETY: allocation, binding and mapping of the buffer's memory on
        // a live device; each handle is stored at once, for Drop.
        unsafe {
            host.memory = device.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(req.size)
                    .memory_type_index(index),
                None,
            )?;
            device.bind_buffer_memory(buffer, host.memory, 0)?;
            host.mapped = device
                .map_memory(host.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())?
                .cast::<u8>()
                .cast_const();
        }
        Ok(host)
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the producer that copies into the buffer is dropped
        // first (it is declared after it) and waited for its last frame, so
        // no copy uses the buffer; each handle made is destroyed once.
        unsafe {
            if self.memory != vk::DeviceMemory::null() {
                if !self.mapped.is_null() {
                    self.ctx.device().unmap_memory(self.memory);
                }
                self.ctx.device().free_memory(self.memory, None);
            }
            self.ctx.device().destroy_buffer(self.buffer, None);
        }
    }
}
