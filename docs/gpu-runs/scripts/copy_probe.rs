// Runs 55 (H100): the copy probe. A throwaway program outside the workspace
// (ash 0.38 with "loaded", "std", "debug"); its first run printed what the
// driver offers (maintenance8: yes; maintenance10: no; DEPTH_COPY_ON_*_QUEUE:
// no), this version what each copy costs on each queue family.
// Throwaway probe: what image copies cost on each queue family (host time of
// N copies submitted at once, minus an empty submission).
use ash::vk;
use std::ffi::c_void;
use std::time::Instant;
#[repr(C)]
struct M { s_type: vk::StructureType, p_next: *mut c_void, on: vk::Bool32 }
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for M {}
unsafe impl vk::ExtendsDeviceCreateInfo for M {}

const W: u32 = 1920; const H: u32 = 1080;

unsafe fn mem(inst: &ash::Instance, p: vk::PhysicalDevice, dev: &ash::Device, req: vk::MemoryRequirements) -> vk::DeviceMemory {
    let mp = inst.get_physical_device_memory_properties(p);
    let idx = (0..mp.memory_type_count).find(|&i| req.memory_type_bits & (1 << i) != 0 && mp.memory_types[i as usize].property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)).unwrap();
    dev.allocate_memory(&vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(idx), None).unwrap()
}
unsafe fn image(inst: &ash::Instance, p: vk::PhysicalDevice, dev: &ash::Device, f: vk::Format, usage: vk::ImageUsageFlags) -> vk::Image {
    let img = dev.create_image(&vk::ImageCreateInfo::default().image_type(vk::ImageType::TYPE_2D).format(f).extent(vk::Extent3D{width:W,height:H,depth:1}).mip_levels(1).array_layers(1).samples(vk::SampleCountFlags::TYPE_1).tiling(vk::ImageTiling::OPTIMAL).usage(usage).sharing_mode(vk::SharingMode::EXCLUSIVE).initial_layout(vk::ImageLayout::UNDEFINED), None).unwrap();
    let m = mem(inst, p, dev, dev.get_image_memory_requirements(img));
    dev.bind_image_memory(img, m, 0).unwrap();
    img
}
fn sub(aspect: vk::ImageAspectFlags) -> vk::ImageSubresourceLayers { vk::ImageSubresourceLayers{aspect_mask: aspect, mip_level:0, base_array_layer:0, layer_count:1} }
fn range(aspect: vk::ImageAspectFlags) -> vk::ImageSubresourceRange { vk::ImageSubresourceRange{aspect_mask: aspect, base_mip_level:0, level_count:1, base_array_layer:0, layer_count:1} }

fn main() {
    unsafe {
        let entry = ash::Entry::load().unwrap();
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let inst = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None).unwrap();
        let p = inst.enumerate_physical_devices().unwrap()[0];
        let fams = [0u32, 1, 2];
        let prio = [1.0f32];
        let qi: Vec<_> = fams.iter().map(|&f| vk::DeviceQueueCreateInfo::default().queue_family_index(f).queue_priorities(&prio)).collect();
        let mut m8 = M { s_type: vk::StructureType::from_raw(1000574000), p_next: std::ptr::null_mut(), on: 1 };
        let ext = [c"VK_KHR_maintenance8".as_ptr()];
        let dev = inst.create_device(p, &vk::DeviceCreateInfo::default().queue_create_infos(&qi).enabled_extension_names(&ext).push_next(&mut m8), None).unwrap();
        let rgba = vk::Format::R8G8B8A8_UNORM;
        let tu = vk::ImageUsageFlags::TRANSFER_SRC | vk::ImageUsageFlags::TRANSFER_DST;
        let a = image(&inst, p, &dev, rgba, tu);
        let b = image(&inst, p, &dev, rgba, tu);
        let d = image(&inst, p, &dev, vk::Format::D32_SFLOAT, tu | vk::ImageUsageFlags::DEPTH_STENCIL_ATTACHMENT);
        let r = image(&inst, p, &dev, vk::Format::R32_SFLOAT, tu);
        let buf = dev.create_buffer(&vk::BufferCreateInfo::default().size((W*H*4) as u64).usage(vk::BufferUsageFlags::TRANSFER_SRC|vk::BufferUsageFlags::TRANSFER_DST), None).unwrap();
        let bm = mem(&inst, p, &dev, dev.get_buffer_memory_requirements(buf));
        dev.bind_buffer_memory(buf, bm, 0).unwrap();
        let color = vk::ImageAspectFlags::COLOR; let depth = vk::ImageAspectFlags::DEPTH;
        // Everything to GENERAL once on the graphics queue; later families use CONCURRENT-free barriers-less access (probe only).
        let run = |fam: u32, name: &str, n: u32, rec: &dyn Fn(vk::CommandBuffer)| {
            let q = dev.get_device_queue(fam, 0);
            let pool = dev.create_command_pool(&vk::CommandPoolCreateInfo::default().queue_family_index(fam), None).unwrap();
            let cmd = dev.allocate_command_buffers(&vk::CommandBufferAllocateInfo::default().command_pool(pool).command_buffer_count(1)).unwrap()[0];
            let fence = dev.create_fence(&vk::FenceCreateInfo::default(), None).unwrap();
            let mut times = vec![];
            for k in 0..2u32 {
                for _ in 0..5 {
                    dev.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty()).unwrap();
                    dev.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default()).unwrap();
                    for _ in 0..(if k == 0 { 0 } else { n }) {
                        rec(cmd);
                        let mb = [vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::MEMORY_WRITE).dst_access_mask(vk::AccessFlags::MEMORY_READ|vk::AccessFlags::MEMORY_WRITE)];
                        dev.cmd_pipeline_barrier(cmd, vk::PipelineStageFlags::ALL_COMMANDS, vk::PipelineStageFlags::ALL_COMMANDS, vk::DependencyFlags::empty(), &mb, &[], &[]);
                    }
                    dev.end_command_buffer(cmd).unwrap();
                    let t = Instant::now();
                    let cbs = [cmd];
                    dev.queue_submit(q, &[vk::SubmitInfo::default().command_buffers(&cbs)], fence).unwrap();
                    dev.wait_for_fences(&[fence], true, u64::MAX).unwrap();
                    dev.reset_fences(&[fence]).unwrap();
                    times.push((k, t.elapsed().as_secs_f64() * 1e6));
                }
            }
            let med = |k: u32| { let mut v: Vec<f64> = times.iter().filter(|t| t.0 == k).map(|t| t.1).collect(); v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len()/2] };
            let (e, f) = (med(0), med(1));
            println!("{name:<48} family {fam}: {:.1} us per op ({n} ops {f:.0} us, empty {e:.0} us)", (f - e) / n as f64);
            dev.destroy_fence(fence, None); dev.destroy_command_pool(pool, None);
        };
        // Layouts: GENERAL for all, once on family 0.
        run(0, "layout setup", 1, &|cmd| {
            let bars: Vec<_> = [(a, color), (b, color), (d, depth), (r, color)].iter().map(|&(i, asp)| vk::ImageMemoryBarrier::default().image(i).old_layout(vk::ImageLayout::UNDEFINED).new_layout(vk::ImageLayout::GENERAL).subresource_range(range(asp)).src_queue_family_index(vk::QUEUE_FAMILY_IGNORED).dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED).dst_access_mask(vk::AccessFlags::MEMORY_WRITE)).collect();
            dev.cmd_pipeline_barrier(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, vk::PipelineStageFlags::ALL_COMMANDS, vk::DependencyFlags::empty(), &[], &[], &bars);
        });
        let g = vk::ImageLayout::GENERAL;
        let ext3 = vk::Extent3D{width:W,height:H,depth:1};
        let devr = &dev;
        let copy = |src, sa, dst, da| move |cmd| devr.cmd_copy_image(cmd, src, g, dst, g, &[vk::ImageCopy{src_subresource: sub(sa), src_offset: Default::default(), dst_subresource: sub(da), dst_offset: Default::default(), extent: ext3}]);
        let n = 20;
        let att = tu | vk::ImageUsageFlags::COLOR_ATTACHMENT | vk::ImageUsageFlags::SAMPLED;
        let sto = tu | vk::ImageUsageFlags::STORAGE | vk::ImageUsageFlags::SAMPLED;
        let a_att = image(&inst, p, &dev, rgba, att);
        let b_sto = image(&inst, p, &dev, rgba, sto);
        let r_sto = image(&inst, p, &dev, vk::Format::R32_SFLOAT, sto);
        let u_sto = image(&inst, p, &dev, vk::Format::R32_UINT, sto);
        let d2 = image(&inst, p, &dev, vk::Format::D32_SFLOAT, tu | vk::ImageUsageFlags::DEPTH_STENCIL_ATTACHMENT | vk::ImageUsageFlags::SAMPLED);
        run(0, "layout setup 2", 1, &|cmd| {
            let bars: Vec<_> = [(a_att, color), (b_sto, color), (r_sto, color), (u_sto, color), (d2, depth)].iter().map(|&(i, asp)| vk::ImageMemoryBarrier::default().image(i).old_layout(vk::ImageLayout::UNDEFINED).new_layout(vk::ImageLayout::GENERAL).subresource_range(range(asp)).src_queue_family_index(vk::QUEUE_FAMILY_IGNORED).dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED).dst_access_mask(vk::AccessFlags::MEMORY_WRITE)).collect();
            dev.cmd_pipeline_barrier(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, vk::PipelineStageFlags::ALL_COMMANDS, vk::DependencyFlags::empty(), &[], &[], &bars);
        });
        for fam in [0u32, 1, 2] {
            run(fam, "copy RGBA8 transfer-only -> transfer-only", n, &copy(a, color, b, color));
            run(fam, "copy RGBA8 attachment -> storage", n, &copy(a_att, color, b_sto, color));
            run(fam, "copy RGBA8 transfer-only -> storage", n, &copy(a, color, b_sto, color));
            run(fam, "copy RGBA8 attachment -> R32_UINT storage", n, &copy(a_att, color, u_sto, color));
            run(fam, "copy R32F storage -> R32F transfer-only", n, &copy(r_sto, color, r, color));
        }
        run(0, "copy D32 -> R32 transfer-only (maint8)", n, &copy(d, depth, r, color));
        run(0, "copy D32(sampled) -> R32 storage (maint8)", n, &copy(d2, depth, r_sto, color));
        run(0, "3 parts: att->sto, D32->R32 sto, att->R32U", 10, &|cmd| {
            copy(a_att, color, b_sto, color)(cmd);
            copy(d2, depth, r_sto, color)(cmd);
            copy(a_att, color, u_sto, color)(cmd);
        });
        run(2, "2 colour parts on compute family", 10, &|cmd| {
            copy(a_att, color, b_sto, color)(cmd);
            copy(a_att, color, u_sto, color)(cmd);
        });
        run(2, "1 part 3x bytes? (3 copies, no barrier)", 10, &|cmd| {
            copy(a_att, color, b_sto, color)(cmd);
            copy(a, color, b, color)(cmd);
            copy(r_sto, color, r, color)(cmd);
        });
        dev.device_wait_idle().unwrap();
        println!("done");
    }
}
