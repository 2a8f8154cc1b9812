//! An application's own image, as a game engine's render target is: made
//! here with ash on a context's device, with no external-memory info, in
//! OPTIMAL tiling, filled with given texels and left in a layout of the
//! test's choice, exclusively owned by the family that filled it. What
//! `vk_export::SourceImage` copies from in the tests.

use ash::vk;
use vk_export::{Context, QueueRole, SubmitSync};

/// A non-exportable OPTIMAL image (RGBA8 unless made with
/// [`AppImage::of_format`]) with transfer source, transfer
/// destination and colour attachment usage, and its memory. Its drop
/// waits (at most 10 s a queue) for the context's queues to finish what
/// was submitted before it.
#[derive(Debug)]
pub struct AppImage {
    ctx: Context,
    /// The image.
    pub image: vk::Image,
    memory: vk::DeviceMemory,
    /// Width and height.
    pub extent: [u32; 2],
    /// The layout it was left in.
    pub layout: vk::ImageLayout,
    /// The family that owns it (the one of `role`'s queue, which filled it).
    pub family: u32,
    /// The property flags of the memory type it is bound to.
    pub memory_flags: vk::MemoryPropertyFlags,
}

fn memory_type(ctx: &Context, bits: u32, want: vk::MemoryPropertyFlags) -> u32 {
    memory_type_and_flags(ctx, bits, want).0
}

fn memory_type_and_flags(
    ctx: &Context,
    bits: u32,
    want: vk::MemoryPropertyFlags,
) -> (u32, vk::MemoryPropertyFlags) {
    // SAFETY: a plain query on the context's live instance.
    let props = unsafe {
        ctx.instance()
            .get_physical_device_memory_properties(ctx.physical_device())
    };
    (0..props.memory_type_count)
        .find(|&i| {
            bits & (1 << i) != 0 && props.memory_types[i as usize].property_flags.contains(want)
        })
        .map(|i| (i, props.memory_types[i as usize].property_flags))
        .unwrap_or_else(|| panic!("no memory type with {want:?} among bits {bits:#x}"))
}

impl AppImage {
    /// An image of `extent` holding `texels` (tightly packed RGBA8 rows),
    /// filled by a copy on `role`'s queue and left there in `layout`.
    pub fn new(
        ctx: &Context,
        extent: [u32; 2],
        texels: &[u8],
        layout: vk::ImageLayout,
        role: QueueRole,
    ) -> AppImage {
        AppImage::shared(ctx, extent, texels, layout, role, &[])
    }

    /// [`AppImage::new`], `VK_SHARING_MODE_CONCURRENT` over `families` (two
    /// or more; none: exclusive).
    pub fn shared(
        ctx: &Context,
        extent: [u32; 2],
        texels: &[u8],
        layout: vk::ImageLayout,
        role: QueueRole,
        families: &[u32],
    ) -> AppImage {
        AppImage::in_memory(
            ctx,
            extent,
            texels,
            layout,
            role,
            families,
            vk::MemoryPropertyFlags::empty(),
        )
    }

    /// [`AppImage::shared`], bound to the first memory type of the image's
    /// allowed ones with at least `want` (empty: the first allowed type,
    /// which NVIDIA lists without any property flag).
    pub fn in_memory(
        ctx: &Context,
        extent: [u32; 2],
        texels: &[u8],
        layout: vk::ImageLayout,
        role: QueueRole,
        families: &[u32],
        want: vk::MemoryPropertyFlags,
    ) -> AppImage {
        AppImage::make(
            ctx,
            (vk::Format::R8G8B8A8_UNORM, 4),
            extent,
            texels,
            layout,
            role,
            families,
            want,
        )
    }

    /// [`AppImage::new`] of another `format` of `texel_bytes` bytes a
    /// texel: a colour format, or a depth one (`D32_SFLOAT`: texels in
    /// [0, 1]; `D16_UNORM`), then with depth-attachment usage instead of
    /// colour-attachment and the depth aspect.
    pub fn of_format(
        ctx: &Context,
        (format, texel_bytes): (vk::Format, u32),
        extent: [u32; 2],
        texels: &[u8],
        layout: vk::ImageLayout,
        role: QueueRole,
    ) -> AppImage {
        AppImage::make(
            ctx,
            (format, texel_bytes),
            extent,
            texels,
            layout,
            role,
            &[],
            vk::MemoryPropertyFlags::empty(),
        )
    }

    #[allow(clippy::too_many_arguments, reason = "one image's facts")]
    fn make(
        ctx: &Context,
        (format, texel_bytes): (vk::Format, u32),
        extent: [u32; 2],
        texels: &[u8],
        layout: vk::ImageLayout,
        role: QueueRole,
        families: &[u32],
        want: vk::MemoryPropertyFlags,
    ) -> AppImage {
        let device = ctx.device();
        let depth = matches!(format, vk::Format::D32_SFLOAT | vk::Format::D16_UNORM);
        let (aspect, attachment) = if depth {
            (
                vk::ImageAspectFlags::DEPTH,
                vk::ImageUsageFlags::DEPTH_STENCIL_ATTACHMENT,
            )
        } else {
            (
                vk::ImageAspectFlags::COLOR,
                vk::ImageUsageFlags::COLOR_ATTACHMENT,
            )
        };
        let size = u64::from(extent[0]) * u64::from(extent[1]) * u64::from(texel_bytes);
        assert_eq!(texels.len() as u64, size, "texels of the extent");
        let info = vk::ImageCreateInfo::default()
            .image_type(vk::ImageType::TYPE_2D)
            .format(format)
            .extent(vk::Extent3D {
                width: extent[0],
                height: extent[1],
                depth: 1,
            })
            .mip_levels(1)
            .array_layers(1)
            .samples(vk::SampleCountFlags::TYPE_1)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(
                vk::ImageUsageFlags::TRANSFER_SRC | vk::ImageUsageFlags::TRANSFER_DST | attachment,
            )
            .initial_layout(vk::ImageLayout::UNDEFINED);
        let info = if families.is_empty() {
            info.sharing_mode(vk::SharingMode::EXCLUSIVE)
        } else {
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(families)
        };
        // SAFETY: plain creation, allocation and binding on the context's
        // live device; each object is destroyed once, in Drop (or below).
        let (image, memory, memory_flags) = unsafe {
            let image = device.create_image(&info, None).unwrap();
            let reqs = device.get_image_memory_requirements(image);
            let (index, flags) = memory_type_and_flags(ctx, reqs.memory_type_bits, want);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(reqs.size)
                .memory_type_index(index);
            let memory = device.allocate_memory(&alloc, None).unwrap();
            device.bind_image_memory(image, memory, 0).unwrap();
            (image, memory, flags)
        };
        // A staging buffer of the texels.
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        // SAFETY: as above; the mapping covers `size` bytes and nothing
        // else accesses the fresh memory.
        let (buffer, staging) = unsafe {
            let buffer = device
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(size)
                        .usage(vk::BufferUsageFlags::TRANSFER_SRC),
                    None,
                )
                .unwrap();
            let reqs = device.get_buffer_memory_requirements(buffer);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(reqs.size)
                .memory_type_index(memory_type(ctx, reqs.memory_type_bits, host));
            let staging = device.allocate_memory(&alloc, None).unwrap();
            device.bind_buffer_memory(buffer, staging, 0).unwrap();
            let ptr = device
                .map_memory(staging, 0, size, vk::MemoryMapFlags::empty())
                .unwrap();
            std::ptr::copy_nonoverlapping(texels.as_ptr(), ptr.cast::<u8>(), texels.len());
            device.unmap_memory(staging);
            (buffer, staging)
        };
        let range = vk::ImageSubresourceRange {
            aspect_mask: aspect,
            base_mip_level: 0,
            level_count: 1,
            base_array_layer: 0,
            layer_count: 1,
        };
        let barrier = |old, new| {
            vk::ImageMemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
                .old_layout(old)
                .new_layout(new)
                .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                .image(image)
                .subresource_range(range)
        };
        let mut family = 0;
        ctx.submit_and_wait_on(role, SubmitSync::new(), |device, cmd, f| {
            family = f;
            let region = vk::BufferImageCopy {
                image_subresource: vk::ImageSubresourceLayers {
                    aspect_mask: aspect,
                    mip_level: 0,
                    base_array_layer: 0,
                    layer_count: 1,
                },
                image_extent: vk::Extent3D {
                    width: extent[0],
                    height: extent[1],
                    depth: 1,
                },
                ..Default::default()
            };
            // SAFETY: the recording command buffer submit_and_wait_on gives;
            // the image and buffer live until it completed (it waits).
            unsafe {
                record_image_barrier(
                    device,
                    cmd,
                    barrier(
                        vk::ImageLayout::UNDEFINED,
                        vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                    ),
                );
                device.cmd_copy_buffer_to_image(
                    cmd,
                    buffer,
                    image,
                    vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                    &[region],
                );
                record_image_barrier(
                    device,
                    cmd,
                    barrier(vk::ImageLayout::TRANSFER_DST_OPTIMAL, layout),
                );
            }
        })
        .expect("the application image filled");
        // SAFETY: the fill completed (submit_and_wait_on returned Ok).
        unsafe {
            device.destroy_buffer(buffer, None);
            device.free_memory(staging, None);
        }
        AppImage {
            ctx: ctx.clone(),
            image,
            memory,
            extent,
            layout,
            family,
            memory_flags,
        }
    }
}

impl Drop for AppImage {
    /// Waits, bounded, for each of the context's queues to finish what was
    /// submitted before (a fence submitted behind it); destroys the image
    /// and its memory, or leaks them with a line on stderr if a queue did
    /// not finish in time (a stuck GPU: never an unbounded wait here).
    fn drop(&mut self) {
        let device = self.ctx.device();
        let mut idle = true;
        for role in [QueueRole::Main, QueueRole::Transfer] {
            // SAFETY: plain creation; the fence is destroyed below once
            // signalled, or leaked with the image.
            let fence = unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }
                .expect("vkCreateFence");
            // SAFETY: the queue, under the context's lock for it; an empty
            // submission that signals the fence after all earlier work.
            let submitted = self
                .ctx
                .with_queue_of(role, |q| unsafe { device.queue_submit(q, &[], fence) })
                .expect("the queue");
            // SAFETY: the fence of that submission.
            let done = submitted.is_ok()
                && unsafe { device.wait_for_fences(&[fence], true, 10_000_000_000) }.is_ok();
            if done {
                // SAFETY: signalled: nothing uses it.
                unsafe { device.destroy_fence(fence, None) };
            } else {
                idle = false;
            }
        }
        if !idle {
            eprintln!(
                "testkit: an application image is leaked: a queue did not finish within 10 s"
            );
            return;
        }
        // SAFETY: both queues finished everything submitted before: no copy
        // from it runs.
        unsafe {
            device.destroy_image(self.image, None);
            device.free_memory(self.memory, None);
        }
    }
}

/// Records `barrier` as a pipeline barrier between all commands before and
/// after it (what the tests' application-side barriers need, not fast).
///
/// # Safety
/// `cmd` is a command buffer of `device` in the recording state, and the
/// barrier's image is a live image of `device` until the commands complete.
pub unsafe fn record_image_barrier(
    device: &ash::Device,
    cmd: vk::CommandBuffer,
    barrier: vk::ImageMemoryBarrier<'_>,
) {
    let all = vk::PipelineStageFlags::ALL_COMMANDS;
    // SAFETY: forwarded from the caller.
    unsafe {
        device.cmd_pipeline_barrier(
            cmd,
            all,
            all,
            vk::DependencyFlags::empty(),
            &[],
            &[],
            &[barrier],
        )
    };
}
