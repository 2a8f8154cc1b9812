//! The Vulkan producer of the frame scenarios, written as an application's
//! renderer would: its own command pool and pre-recorded command buffers,
//! submitted with timeline waits and signals, never waited for on a fence.
//!
//! Each slot's command buffer clears its image (a stand-in for rendering)
//! and releases it to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` layout; the
//! staging variant also copies the image into a host-visible buffer.
//! Submissions wait for `consumed >= wait_value[slot]` and signal
//! `produced = signal_value[slot]`; the values live in boxed arrays of
//! `Cell`s that the submit infos point into (interior mutability: writing
//! them through those pointers, or through `Cell::set`, is allowed), so a
//! frame loop (Rust or C) only writes them. A producer's drop waits, bounded,
//! for its last signalled value, and leaks its command pool if that does not
//! come.

use std::cell::Cell;

use vk_export::ash::vk;
use vk_export::Context;

use crate::Res;

/// One pre-recorded command buffer per slot, and the submit chains that
/// point into `wait_values` / `signal_values`.
pub struct Producer<'c> {
    ctx: &'c Context,
    pool: vk::CommandPool,
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
    /// Records one command buffer per image. `consumed`/`produced` are the
    /// timelines the submissions wait for and signal (`consumed` may be
    /// `None`: no wait).
    pub fn new(
        ctx: &'c Context,
        images: &[(vk::Image, vk::Extent2D)],
        after: &[After],
        consumed: Option<vk::Semaphore>,
        produced: vk::Semaphore,
    ) -> Res<Self> {
        let device = ctx.device();
        let slots = images.len();
        // SAFETY: a valid device and queue family; destroyed in Drop.
        let pool = unsafe {
            device.create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(ctx.queue_family()),
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
        for ((&cmd, &(image, extent)), after) in commands.iter().zip(images).zip(after) {
            // SAFETY: recording into a fresh primary command buffer of this
            // device; every handle is live for the producer's life.
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
                match after {
                    After::Release => {
                        let release = vk::ImageMemoryBarrier::default()
                            .image(image)
                            .subresource_range(range)
                            .old_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
                            .new_layout(vk::ImageLayout::GENERAL)
                            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                            .src_queue_family_index(ctx.queue_family())
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
                        let region = vk::BufferImageCopy::default()
                            .image_subresource(
                                vk::ImageSubresourceLayers::default()
                                    .aspect_mask(vk::ImageAspectFlags::COLOR)
                                    .layer_count(1),
                            )
                            .image_extent(vk::Extent3D {
                                width: extent.width,
                                height: extent.height,
                                depth: 1,
                            });
                        device.cmd_copy_image_to_buffer(
                            cmd,
                            image,
                            vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
                            *buffer,
                            &[region],
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
            pool,
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

    /// Submits slot `slot`'s command buffer, waiting for `consumed >= wait`
    /// and signalling `produced = signal`.
    pub fn submit(&mut self, slot: usize, wait: u64, signal: u64) -> Res<()> {
        self.wait_values[slot].set(wait);
        self.signal_values[slot].set(signal);
        self.last_signalled = self.last_signalled.max(signal);
        let info = self.submit_infos[slot];
        let device = self.ctx.device();
        // SAFETY: the submit info points into boxes this producer owns,
        // whose values were just written; the semaphores and command buffer
        // are live; the queue is used under the context's lock.
        self.ctx.with_queue(|queue| unsafe {
            device.queue_submit(queue, &[info], vk::Fence::null())
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
            // buffer of the pool is pending; destroyed once.
            Ok(()) => unsafe { self.ctx.device().destroy_command_pool(self.pool, None) },
            Err(e) => eprintln!(
                "bench: a producer's last frame did not complete ({e}): its command pool is leaked"
            ),
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
