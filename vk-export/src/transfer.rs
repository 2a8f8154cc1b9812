//! Blocking helpers that fill, clear and read back resources with one-shot
//! submissions, and the queue-family ownership transfers to and from
//! `VK_QUEUE_FAMILY_EXTERNAL` that sharing needs.
//!
//! These are conveniences for tools, tests and simple pipelines: each call
//! submits under the context's queue lock and waits for its fence. A renderer
//! records the same barriers into its own command buffers instead
//! ([`ExportableImage::raw`](crate::ExportableImage::raw) gives the handle).

use ash::vk;

use crate::buffer::ExportableBuffer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::image::{ExportableImage, ImageInner, Owner};
use crate::markers::{MemoryLocation, Tiling, Usage};
use crate::semaphore::{Binary, Semaphore, Timeline};

pub(crate) struct TransferState {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    staging: Option<Staging>,
}

struct Staging {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: *mut u8,
    size: u64,
}

// SAFETY: the staging pointer is only dereferenced under the context's
// transfer lock; the Vulkan handles are plain values.
unsafe impl Send for TransferState {}

impl TransferState {
    /// # Safety
    /// Called once, with the device idle and nothing using these objects.
    pub(crate) unsafe fn destroy(self, device: &ash::Device) {
        // SAFETY: forwarded.
        unsafe {
            if let Some(s) = self.staging {
                device.destroy_buffer(s.buffer, None);
                device.free_memory(s.memory, None);
            }
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.pool, None);
        }
    }
}

/// A semaphore operation attached to a submission.
#[derive(Clone, Copy, Debug)]
pub struct SemaphoreSubmit {
    semaphore: vk::Semaphore,
    value: u64,
}

impl SemaphoreSubmit {
    /// Wait for / signal a binary semaphore.
    pub fn binary(semaphore: &Semaphore<Binary>) -> SemaphoreSubmit {
        SemaphoreSubmit {
            semaphore: semaphore.raw(),
            value: 0,
        }
    }
    /// Wait for / signal a timeline semaphore at `value`.
    pub fn timeline(semaphore: &Semaphore<Timeline>, value: u64) -> SemaphoreSubmit {
        SemaphoreSubmit {
            semaphore: semaphore.raw(),
            value,
        }
    }
}

/// Semaphores a helper's submission waits for and signals.
#[derive(Clone, Copy, Debug, Default)]
pub struct SubmitSync<'a> {
    /// Waited for before the commands run (at all stages).
    pub waits: &'a [SemaphoreSubmit],
    /// Signalled when the commands complete.
    pub signals: &'a [SemaphoreSubmit],
}

fn full_barrier_image(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    image: &ImageInner,
    old: vk::ImageLayout,
    new: vk::ImageLayout,
    src_family: u32,
    dst_family: u32,
) {
    let barrier = vk::ImageMemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
        .old_layout(old)
        .new_layout(new)
        .src_queue_family_index(src_family)
        .dst_queue_family_index(dst_family)
        .image(image.image)
        .subresource_range(vk::ImageSubresourceRange {
            aspect_mask: vk::ImageAspectFlags::COLOR,
            base_mip_level: 0,
            level_count: vk::REMAINING_MIP_LEVELS,
            base_array_layer: 0,
            layer_count: vk::REMAINING_ARRAY_LAYERS,
        });
    // SAFETY: recording into a command buffer in the recording state.
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::DependencyFlags::empty(),
            &[],
            &[],
            &[barrier],
        )
    };
}

/// Records the transition of `image` into `new` for use by this queue family,
/// acquiring it from `VK_QUEUE_FAMILY_EXTERNAL` if it was released.
fn take_image(ctx: &Context, cmd: vk::CommandBuffer, image: &ImageInner, new: vk::ImageLayout) {
    let mut owner = image.owner.lock().unwrap_or_else(|p| p.into_inner());
    let family = ctx.inner.queue_family;
    match *owner {
        Owner::Vulkan(old) => full_barrier_image(
            &ctx.inner.device,
            cmd,
            image,
            old,
            new,
            vk::QUEUE_FAMILY_IGNORED,
            vk::QUEUE_FAMILY_IGNORED,
        ),
        Owner::External(old) => full_barrier_image(
            &ctx.inner.device,
            cmd,
            image,
            old,
            new,
            vk::QUEUE_FAMILY_EXTERNAL,
            family,
        ),
    }
    *owner = Owner::Vulkan(new);
}

fn buffer_barrier(ctx: &Context, cmd: vk::CommandBuffer, buffer: vk::Buffer, src: u32, dst: u32) {
    let barrier = vk::BufferMemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
        .src_queue_family_index(src)
        .dst_queue_family_index(dst)
        .buffer(buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    // SAFETY: recording into a command buffer in the recording state.
    unsafe {
        ctx.inner.device.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::PipelineStageFlags::ALL_COMMANDS,
            vk::DependencyFlags::empty(),
            &[],
            &[barrier],
            &[],
        )
    };
}

fn take_buffer<M>(ctx: &Context, cmd: vk::CommandBuffer, buffer: &ExportableBuffer<M>) {
    let mut owner = buffer.inner.owner.lock().unwrap_or_else(|p| p.into_inner());
    let (src, dst) = match *owner {
        Owner::External(_) => (vk::QUEUE_FAMILY_EXTERNAL, ctx.inner.queue_family),
        Owner::Vulkan(_) => (vk::QUEUE_FAMILY_IGNORED, vk::QUEUE_FAMILY_IGNORED),
    };
    buffer_barrier(ctx, cmd, buffer.inner.buffer, src, dst);
    *owner = Owner::Vulkan(vk::ImageLayout::UNDEFINED);
}

impl Context {
    /// Runs `f` with the context's transfer state, locked, created on first use.
    fn with_transfer<R>(&self, f: impl FnOnce(&mut TransferState) -> Result<R>) -> Result<R> {
        let mut guard = self
            .inner
            .transfer
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let device = &self.inner.device;
            let pool_info = vk::CommandPoolCreateInfo::default()
                .queue_family_index(self.inner.queue_family)
                .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
            // SAFETY: plain object creation on a live device.
            let pool = unsafe { device.create_command_pool(&pool_info, None) }
                .map_err(Error::vk("vkCreateCommandPool", "out of memory"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            // SAFETY: allocating from the pool just created.
            let cmd = match unsafe { device.allocate_command_buffers(&alloc) } {
                Ok(c) => c[0],
                Err(e) => {
                    // SAFETY: unused pool.
                    unsafe { device.destroy_command_pool(pool, None) };
                    return Err(Error::Vulkan {
                        call: "vkAllocateCommandBuffers",
                        result: e,
                        hint: "out of memory",
                    });
                }
            };
            // SAFETY: plain object creation.
            let fence = match unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }
            {
                Ok(f) => f,
                Err(e) => {
                    // SAFETY: unused pool.
                    unsafe { device.destroy_command_pool(pool, None) };
                    return Err(Error::Vulkan {
                        call: "vkCreateFence",
                        result: e,
                        hint: "out of memory",
                    });
                }
            };
            *guard = Some(TransferState {
                pool,
                cmd,
                fence,
                staging: None,
            });
        }
        f(guard.as_mut().expect("created above"))
    }

    /// A host-visible staging buffer of at least `size` bytes, and its mapping.
    fn ensure_staging(
        &self,
        state: &mut TransferState,
        size: u64,
    ) -> Result<(vk::Buffer, *mut u8)> {
        if let Some(s) = state.staging.as_ref().filter(|s| s.size >= size) {
            return Ok((s.buffer, s.ptr));
        }
        let device = &self.inner.device;
        if let Some(old) = state.staging.take() {
            // SAFETY: no submission is in flight (every helper waits for its fence).
            unsafe {
                device.destroy_buffer(old.buffer, None);
                device.free_memory(old.memory, None);
            }
        }
        let size = size.next_power_of_two().max(1 << 16);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST);
        // SAFETY: plain creation.
        let buffer = unsafe { device.create_buffer(&info, None) }
            .map_err(Error::vk("vkCreateBuffer (staging)", "out of memory"))?;
        // SAFETY: the buffer was just created.
        let reqs = unsafe { device.get_buffer_memory_requirements(buffer) };
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let Some(index) = self.memory_type(
            reqs.memory_type_bits,
            host,
            vk::MemoryPropertyFlags::empty(),
        ) else {
            // SAFETY: unused.
            unsafe { device.destroy_buffer(buffer, None) };
            return Err(Error::unsupported(
                "a staging buffer",
                "no host-visible coherent memory",
            ));
        };
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
                state.staging = Some(Staging {
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

    /// Records commands with `record`, submits them with `sync`, and waits
    /// until they complete. The closure gets the device and a command buffer
    /// in the recording state.
    pub fn submit_and_wait(
        &self,
        sync: SubmitSync<'_>,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        self.with_transfer(|state| self.run(state, sync, |cmd| record(&self.inner.device, cmd)))
    }

    /// Copies `data` into the staging buffer, then submits `record` (given
    /// the staging buffer) and waits.
    fn upload(
        &self,
        data: &[u8],
        sync: SubmitSync<'_>,
        record: impl FnOnce(vk::CommandBuffer, vk::Buffer),
    ) -> Result<()> {
        self.with_transfer(|state| {
            let (staging, ptr) = self.ensure_staging(state, data.len() as u64)?;
            // SAFETY: the staging mapping holds at least data.len() bytes and no
            // submission is using it (the last one was waited for).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
            self.run(state, sync, |cmd| record(cmd, staging))
        })
    }

    /// Submits `record` (given the staging buffer), waits, and returns the
    /// first `len` bytes of the staging buffer.
    fn download(
        &self,
        len: u64,
        sync: SubmitSync<'_>,
        record: impl FnOnce(vk::CommandBuffer, vk::Buffer),
    ) -> Result<Vec<u8>> {
        self.with_transfer(|state| {
            let (staging, ptr) = self.ensure_staging(state, len)?;
            self.run(state, sync, |cmd| record(cmd, staging))?;
            let mut out = vec![0u8; len as usize];
            // SAFETY: the copy completed (fence waited); coherent memory.
            unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
            Ok(out)
        })
    }

    fn run(
        &self,
        state: &TransferState,
        sync: SubmitSync<'_>,
        record: impl FnOnce(vk::CommandBuffer),
    ) -> Result<()> {
        let device = &self.inner.device;
        let cmd = state.cmd;
        // SAFETY: the command buffer is idle (every run waits for its fence)
        // and only used under the transfer lock.
        unsafe {
            device
                .reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(Error::vk("vkResetCommandBuffer", "out of memory"))?;
            device
                .begin_command_buffer(
                    cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(Error::vk("vkBeginCommandBuffer", "out of memory"))?;
        }
        record(cmd);
        // SAFETY: recording state.
        unsafe { device.end_command_buffer(cmd) }
            .map_err(Error::vk("vkEndCommandBuffer", "out of memory"))?;
        let wait_semaphores: Vec<_> = sync.waits.iter().map(|s| s.semaphore).collect();
        let wait_values: Vec<_> = sync.waits.iter().map(|s| s.value).collect();
        let wait_stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; sync.waits.len()];
        let signal_semaphores: Vec<_> = sync.signals.iter().map(|s| s.semaphore).collect();
        let signal_values: Vec<_> = sync.signals.iter().map(|s| s.value).collect();
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
        self.with_queue(|queue| {
            // SAFETY: the queue is locked; everything the submit refers to lives
            // until the fence wait below returns.
            unsafe { device.queue_submit(queue, &[submit], state.fence) }
        })
        .map_err(Error::vk(
            "vkQueueSubmit",
            "the device was lost, or a waited semaphore has no pending signal",
        ))?;
        // SAFETY: the fence belongs to this submission.
        unsafe {
            let waited = device
                .wait_for_fences(&[state.fence], true, u64::MAX)
                .map_err(Error::vk("vkWaitForFences", "the device was lost"));
            let reset = device
                .reset_fences(&[state.fence])
                .map_err(Error::vk("vkResetFences", "out of memory"));
            waited.and(reset)
        }
    }

    fn level_bytes(info: &crate::ImageInfo, level: u32, layer: u32) -> Result<(u64, [u32; 3])> {
        let out_of_range = || {
            Error::InvalidArgument(format!(
                "level {level} layer {layer} of an image with {} levels and {} layers",
                info.mip_levels(),
                info.array_layers()
            ))
        };
        if layer >= info.array_layers() {
            return Err(out_of_range());
        }
        let extent = info.level_extent(level).ok_or_else(out_of_range)?;
        let bytes = info.level_bytes(level).ok_or_else(out_of_range)?;
        Ok((bytes, extent))
    }

    fn copy_region(level: u32, layer: u32, extent: [u32; 3]) -> vk::BufferImageCopy {
        vk::BufferImageCopy {
            buffer_offset: 0,
            buffer_row_length: 0,
            buffer_image_height: 0,
            image_subresource: vk::ImageSubresourceLayers {
                aspect_mask: vk::ImageAspectFlags::COLOR,
                mip_level: level,
                base_array_layer: layer,
                layer_count: 1,
            },
            image_offset: vk::Offset3D::default(),
            image_extent: vk::Extent3D {
                width: extent[0],
                height: extent[1],
                depth: extent[2],
            },
        }
    }

    /// Uploads tightly packed texels into one level and layer of `image`.
    pub fn write_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        level: u32,
        layer: u32,
        data: &[u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        let (bytes, extent) = Self::level_bytes(&image.inner.info, level, layer)?;
        if data.len() as u64 != bytes {
            return Err(Error::InvalidArgument(format!(
                "level {level} needs {bytes} bytes of tightly packed texels, got {}",
                data.len()
            )));
        }
        self.upload(data, sync, |cmd, staging_buffer| {
            take_image(
                self,
                cmd,
                &image.inner,
                vk::ImageLayout::TRANSFER_DST_OPTIMAL,
            );
            // SAFETY: recording; the image is in TRANSFER_DST_OPTIMAL.
            unsafe {
                self.inner.device.cmd_copy_buffer_to_image(
                    cmd,
                    staging_buffer,
                    image.inner.image,
                    vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                    &[Self::copy_region(level, layer, extent)],
                )
            };
            take_image(self, cmd, &image.inner, vk::ImageLayout::GENERAL);
        })
    }

    /// Reads one level and layer of `image` back as tightly packed texels.
    pub fn read_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        level: u32,
        layer: u32,
        sync: SubmitSync<'_>,
    ) -> Result<Vec<u8>> {
        let (bytes, extent) = Self::level_bytes(&image.inner.info, level, layer)?;
        self.download(bytes, sync, |cmd, staging_buffer| {
            take_image(
                self,
                cmd,
                &image.inner,
                vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
            );
            // SAFETY: recording; the image is in TRANSFER_SRC_OPTIMAL.
            unsafe {
                self.inner.device.cmd_copy_image_to_buffer(
                    cmd,
                    image.inner.image,
                    vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
                    staging_buffer,
                    &[Self::copy_region(level, layer, extent)],
                )
            };
            take_image(self, cmd, &image.inner, vk::ImageLayout::GENERAL);
        })
    }

    /// Clears every level and layer of `image` to `color`.
    pub fn clear_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        color: vk::ClearColorValue,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.submit_and_wait(sync, |_, cmd| {
            take_image(
                self,
                cmd,
                &image.inner,
                vk::ImageLayout::TRANSFER_DST_OPTIMAL,
            );
            let range = vk::ImageSubresourceRange {
                aspect_mask: vk::ImageAspectFlags::COLOR,
                base_mip_level: 0,
                level_count: vk::REMAINING_MIP_LEVELS,
                base_array_layer: 0,
                layer_count: vk::REMAINING_ARRAY_LAYERS,
            };
            // SAFETY: recording; the image is in TRANSFER_DST_OPTIMAL.
            unsafe {
                self.inner.device.cmd_clear_color_image(
                    cmd,
                    image.inner.image,
                    vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                    &color,
                    &[range],
                )
            };
            take_image(self, cmd, &image.inner, vk::ImageLayout::GENERAL);
        })
    }

    /// Releases `image` to `VK_QUEUE_FAMILY_EXTERNAL` in `GENERAL` layout, so
    /// CUDA or another process may use it. The next helper that touches it
    /// acquires it back. `sync.signals` tell the other side when it may start.
    pub fn release_image<F, T: Tiling, M: MemoryLocation, U: Usage>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.submit_and_wait(sync, |_, cmd| {
            let mut owner = image.inner.owner.lock().unwrap_or_else(|p| p.into_inner());
            let old = match *owner {
                Owner::Vulkan(l) => l,
                Owner::External(l) => l,
            };
            full_barrier_image(
                &self.inner.device,
                cmd,
                &image.inner,
                old,
                vk::ImageLayout::GENERAL,
                self.inner.queue_family,
                vk::QUEUE_FAMILY_EXTERNAL,
            );
            *owner = Owner::External(vk::ImageLayout::GENERAL);
        })
    }

    /// Marks `image` as owned by `VK_QUEUE_FAMILY_EXTERNAL` in `layout`
    /// without a barrier: for an importer whose exporter released it.
    pub fn assume_image_released<F, T, M, U>(
        &self,
        image: &ExportableImage<F, T, M, U>,
        layout: vk::ImageLayout,
    ) {
        *image.inner.owner.lock().unwrap_or_else(|p| p.into_inner()) = Owner::External(layout);
    }

    /// Uploads `data` at the start of `buffer`.
    pub fn write_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        data: &[u8],
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        if data.len() as u64 > buffer.size() || data.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes into a buffer of {}",
                data.len(),
                buffer.size()
            )));
        }
        self.upload(data, sync, |cmd, src| {
            take_buffer(self, cmd, buffer);
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: data.len() as u64,
            };
            // SAFETY: recording; both buffers are large enough.
            unsafe {
                self.inner
                    .device
                    .cmd_copy_buffer(cmd, src, buffer.raw(), &[region])
            };
            buffer_barrier(
                self,
                cmd,
                buffer.raw(),
                vk::QUEUE_FAMILY_IGNORED,
                vk::QUEUE_FAMILY_IGNORED,
            );
        })
    }

    /// Reads the first `len` bytes of `buffer`.
    pub fn read_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        len: u64,
        sync: SubmitSync<'_>,
    ) -> Result<Vec<u8>> {
        if len > buffer.size() || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes from a buffer of {}",
                buffer.size()
            )));
        }
        self.download(len, sync, |cmd, dst| {
            take_buffer(self, cmd, buffer);
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: len,
            };
            // SAFETY: recording; both buffers are large enough.
            unsafe {
                self.inner
                    .device
                    .cmd_copy_buffer(cmd, buffer.raw(), dst, &[region])
            };
        })
    }

    /// Releases `buffer` to `VK_QUEUE_FAMILY_EXTERNAL`.
    pub fn release_buffer<M: MemoryLocation>(
        &self,
        buffer: &ExportableBuffer<M>,
        sync: SubmitSync<'_>,
    ) -> Result<()> {
        self.submit_and_wait(sync, |_, cmd| {
            buffer_barrier(
                self,
                cmd,
                buffer.raw(),
                self.inner.queue_family,
                vk::QUEUE_FAMILY_EXTERNAL,
            );
            *buffer.inner.owner.lock().unwrap_or_else(|p| p.into_inner()) =
                Owner::External(vk::ImageLayout::UNDEFINED);
        })
    }
}
