//! What the test binaries share: a vulkano instance with the Khronos
//! validation layer required (unless `CUDA_INTEROP_VALIDATION=off`) and
//! vk-export's counting messenger on it, vulkano devices made with or
//! without what vk-export needs, and the check that the layer reported
//! nothing.

#![allow(dead_code, reason = "each test binary uses part of it")]

use std::sync::Arc;

use cuda_interop_vulkano::{device_extensions, device_features, Interop, MIN_API_VERSION};
use vk_export::ValidationMessenger;
use vulkano::device::physical::PhysicalDevice;
use vulkano::device::{
    Device, DeviceCreateInfo, DeviceExtensions, DeviceFeatures, Queue, QueueCreateInfo, QueueFlags,
};
use vulkano::instance::{Instance, InstanceCreateInfo, InstanceExtensions};
use vulkano::{Version, VulkanLibrary, VulkanObject};

/// A vulkano instance and vk-export's validation messenger on it (dropped
/// before the instance).
pub struct Vk {
    pub messenger: Option<ValidationMessenger>,
    pub instance: Arc<Instance>,
}

impl Vk {
    /// An instance of `version` with the validation layer (required unless
    /// `CUDA_INTEROP_VALIDATION=off`).
    pub fn new(version: Version) -> Vk {
        let validation = std::env::var("CUDA_INTEROP_VALIDATION").as_deref() != Ok("off");
        let library = VulkanLibrary::new().expect("the Vulkan loader");
        let info = if validation {
            InstanceCreateInfo {
                max_api_version: Some(version),
                enabled_layers: vec!["VK_LAYER_KHRONOS_validation".into()],
                enabled_extensions: InstanceExtensions {
                    ext_debug_utils: true,
                    ..InstanceExtensions::empty()
                },
                ..Default::default()
            }
        } else {
            InstanceCreateInfo {
                max_api_version: Some(version),
                ..Default::default()
            }
        };
        let instance = Instance::new(library, info).expect(
            "a Vulkan instance (with VK_LAYER_KHRONOS_validation: vulkan-validationlayers)",
        );
        let messenger = validation.then(|| {
            // SAFETY: loading the system loader (the one vulkano loaded).
            let entry = unsafe { ash::Entry::load() }.unwrap();
            // SAFETY: vulkano's live instance, made with debug utils; the
            // messenger is dropped before it (Vk's field order).
            let ash_instance = unsafe { ash::Instance::load(entry.static_fn(), instance.handle()) };
            // SAFETY: as above.
            unsafe { ValidationMessenger::new(&entry, &ash_instance) }.unwrap()
        });
        Vk {
            messenger,
            instance,
        }
    }

    /// The first physical device and its first graphics family.
    pub fn physical(&self) -> (Arc<PhysicalDevice>, u32) {
        let physical = self
            .instance
            .enumerate_physical_devices()
            .unwrap()
            .next()
            .expect("a Vulkan device (lavapipe in CI)");
        let family = physical
            .queue_family_properties()
            .iter()
            .position(|f| f.queue_flags.contains(QueueFlags::GRAPHICS))
            .expect("a graphics family") as u32;
        (physical, family)
    }

    /// A vulkano device with `extensions` and `features`, and its one queue.
    pub fn device_with(
        &self,
        extensions: DeviceExtensions,
        features: DeviceFeatures,
    ) -> (Arc<Device>, Arc<Queue>) {
        let (physical, family) = self.physical();
        let (device, mut queues) = Device::new(
            physical,
            DeviceCreateInfo {
                enabled_extensions: extensions,
                enabled_features: features,
                queue_create_infos: vec![QueueCreateInfo {
                    queue_family_index: family,
                    ..Default::default()
                }],
                ..Default::default()
            },
        )
        .expect("a vulkano device");
        (device, queues.next().unwrap())
    }

    /// A vulkano device made as the crate says, wrapped.
    pub fn interop(&self) -> Interop {
        let (physical, _) = self.physical();
        let (device, queue) = self.device_with(device_extensions(&physical), device_features());
        // SAFETY: the tests submit to the queue only through the Interop.
        unsafe { Interop::new(&device, &queue, None) }.expect("the vulkano device wrapped")
    }

    /// Fails the test on any validation error reported so far.
    pub fn assert_clean(&self) {
        if let Some(m) = &self.messenger {
            assert_eq!(m.errors(), 0, "validation errors: {:?}", m.error_ids());
        }
    }
}

/// The version the instance of the tests asks for.
pub const VERSION: Version = MIN_API_VERSION;

use std::time::Duration;

use cuda_interop_vulkano::InteropImage;
use vulkano::buffer::{Buffer, BufferCreateInfo, BufferUsage, Subbuffer};
use vulkano::command_buffer::allocator::StandardCommandBufferAllocator;
use vulkano::command_buffer::{
    AutoCommandBufferBuilder, ClearColorImageInfo, CommandBufferUsage, CopyBufferToImageInfo,
    CopyImageToBufferInfo, PrimaryAutoCommandBuffer,
};
use vulkano::memory::allocator::{AllocationCreateInfo, MemoryTypeFilter, StandardMemoryAllocator};

/// Frame `f`'s texel at (x, y): inside the copied rectangle the buffer's
/// pattern, elsewhere the frame's clear colour.
pub fn texel(f: u64, x: u32, y: u32, (w, h): (u32, u32)) -> [u8; 4] {
    if x < w / 2 && y < h / 2 {
        [(x as u8) ^ (f as u8), y as u8, (x + y) as u8 ^ 0x5a, 255]
    } else {
        clear_colour(f)
    }
}

/// Frame `f`'s clear colour, as bytes.
pub fn clear_colour(f: u64) -> [u8; 4] {
    [(f * 37) as u8, (f * 11 + 5) as u8, 200, 255]
}

/// The first texel of `pixels` (frame `f`, tightly packed RGBA8) that is
/// not [`texel`]'s: where, what it is and what it should be.
pub fn first_mismatch(
    pixels: &[u8],
    f: u64,
    size: (u32, u32),
) -> Option<(u32, u32, [u8; 4], [u8; 4])> {
    assert_eq!(pixels.len(), (size.0 * size.1 * 4) as usize);
    for y in 0..size.1 {
        for x in 0..size.0 {
            let i = ((y * size.0 + x) * 4) as usize;
            let got: [u8; 4] = pixels[i..i + 4].try_into().unwrap();
            let want = texel(f, x, y, size);
            if got != want {
                return Some((x, y, got, want));
            }
        }
    }
    None
}

/// vulkano's allocators on the interop's device.
pub struct Allocators {
    pub memory: Arc<StandardMemoryAllocator>,
    pub commands: Arc<StandardCommandBufferAllocator>,
}

impl Allocators {
    pub fn new(interop: &Interop) -> Allocators {
        let device = interop.device().clone();
        Allocators {
            memory: Arc::new(StandardMemoryAllocator::new_default(device.clone())),
            commands: Arc::new(StandardCommandBufferAllocator::new(
                device,
                Default::default(),
            )),
        }
    }

    /// A host-visible buffer of `len` bytes for transfers.
    pub fn host_buffer(&self, len: u64, usage: BufferUsage) -> Subbuffer<[u8]> {
        Buffer::new_slice::<u8>(
            self.memory.clone(),
            BufferCreateInfo {
                usage,
                ..Default::default()
            },
            AllocationCreateInfo {
                memory_type_filter: MemoryTypeFilter::PREFER_HOST
                    | MemoryTypeFilter::HOST_RANDOM_ACCESS,
                ..Default::default()
            },
            len,
        )
        .unwrap()
    }

    /// A vulkano command buffer that writes frame `f` into `image` (`size`):
    /// a clear of the whole image, then a copy of the pattern into its
    /// top-left quarter from `staging` (filled here).
    pub fn frame_commands(
        &self,
        interop: &Interop,
        image: &InteropImage,
        staging: &Subbuffer<[u8]>,
        f: u64,
        size: (u32, u32),
    ) -> Arc<PrimaryAutoCommandBuffer> {
        let (qw, qh) = (size.0 / 2, size.1 / 2);
        {
            let mut bytes = staging.write().unwrap();
            for y in 0..qh {
                for x in 0..qw {
                    let i = ((y * qw + x) * 4) as usize;
                    bytes[i..i + 4].copy_from_slice(&texel(f, x, y, size));
                }
            }
        }
        let mut builder = AutoCommandBufferBuilder::primary(
            self.commands.clone(),
            interop.queue().queue_family_index(),
            CommandBufferUsage::OneTimeSubmit,
        )
        .unwrap();
        let c = clear_colour(f);
        builder
            .clear_color_image(ClearColorImageInfo {
                clear_value: [c[0] as u32, c[1] as u32, c[2] as u32, c[3] as u32]
                    .map(|v| v as f32 / 255.0)
                    .into(),
                ..ClearColorImageInfo::image(image.image().clone())
            })
            .unwrap();
        let mut copy = CopyBufferToImageInfo::buffer_image(
            staging.clone().slice(..u64::from(qw * qh * 4)),
            image.image().clone(),
        );
        copy.regions[0].image_extent = [qw, qh, 1];
        builder.copy_buffer_to_image(copy).unwrap();
        builder.build().unwrap()
    }

    /// `image`'s pixels (RGBA8, `size`), read by a vulkano copy to a host
    /// buffer on the interop's queue.
    pub fn read(&self, interop: &Interop, image: &InteropImage, size: (u32, u32)) -> Vec<u8> {
        let len = u64::from(size.0 * size.1 * 4);
        let out = self.host_buffer(len, BufferUsage::TRANSFER_DST);
        let mut builder = AutoCommandBufferBuilder::primary(
            self.commands.clone(),
            interop.queue().queue_family_index(),
            CommandBufferUsage::OneTimeSubmit,
        )
        .unwrap();
        builder
            .copy_image_to_buffer(CopyImageToBufferInfo::image_buffer(
                image.image().clone(),
                out.clone(),
            ))
            .unwrap();
        let commands = builder.build().unwrap();
        // SAFETY: the image is in GENERAL (vulkano's layout between command
        // buffers), used by nothing else; the command buffer is submitted once.
        let mut submission = unsafe { interop.submit(&[commands], &[], &[]) }.unwrap();
        submission.wait(Duration::from_secs(10)).unwrap();
        let bytes = out.read().unwrap().to_vec();
        bytes
    }
}
