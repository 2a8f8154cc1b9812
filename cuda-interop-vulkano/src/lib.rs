//! vulkano 0.35 on a vk-export context: a vulkano device and its queues
//! wrapped as a [`vk_export::Context`] ([`Interop`]), vk-export images
//! (exportable images, frame-ring slots, imported images) as vulkano
//! [`Image`](vulkano::image::Image)s ([`InteropImage`]), and vk-export
//! timelines in vulkano submissions ([`Interop::submit`]) or as vulkano
//! semaphores ([`Interop::semaphore`]).
//!
//! # Contract
//!
//! * **The device is the application's.** It creates the vulkano device
//!   with [`device_extensions`] and [`device_features`] (and Vulkan
//!   [`MIN_API_VERSION`]); [`Interop::new`] checks that and says in
//!   [`Error::Missing`] which vulkano field to set. The context holds the
//!   vulkano `Device` and the queues it was given until it and everything
//!   made from it are gone: vulkano never destroys the device under it.
//! * **Queues.** The context submits to the queues it was given, under its
//!   own lock; the application's vulkano submissions to those queues go
//!   through [`Interop::with_queue`], [`Interop::locked`] or
//!   [`Interop::submit`] (the promise [`Interop::new`]'s `unsafe` stands
//!   for). On a device with one queue (lavapipe) vulkano and vk-export
//!   share it that way.
//! * **Images are borrowed, and kept alive.** An [`InteropImage`] keeps
//!   its vk-export image alive; if vulkano still holds the vulkano image
//!   when the wrapper goes, the vk-export image is leaked (reported in
//!   [`vk_export::drop_errors`]), never destroyed under vulkano. vulkano
//!   tracks the layout and leaves the image in `GENERAL` after each command
//!   buffer, where frame rings and CUDA expect it ([`Interop::image`] says
//!   what nobody else may do meanwhile).
//! * **Timelines.** [`Interop::submit`] waits for and signals vk-export
//!   timelines around vulkano command buffers with vk-export's signal
//!   bookkeeping, and keeps everything alive until its fence signals;
//!   [`Interop::semaphore`] imports a timeline's payload into a vulkano
//!   semaphore of its own (needs `VK_KHR_external_semaphore_fd`).
//!
//! # Example
//!
//! A vulkano device made for vk-export, wrapped; vulkano clears an
//! exportable image and signals a timeline CUDA could wait for.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cuda_interop_vulkano::{device_extensions, device_features, CurrentLayout, Interop,
//!                            TimelinePoint, MIN_API_VERSION};
//! use vk_export::format::Rgba8Unorm;
//! use vk_export::markers::{usage, HostVisible, Optimal};
//! use vk_export::{ExportableImage, ImageDesc, TimelineSemaphore};
//! use vulkano::command_buffer::allocator::StandardCommandBufferAllocator;
//! use vulkano::command_buffer::{AutoCommandBufferBuilder, ClearColorImageInfo, CommandBufferUsage};
//! use vulkano::device::{Device, DeviceCreateInfo, QueueCreateInfo, QueueFlags};
//! use vulkano::instance::{Instance, InstanceCreateInfo};
//! use vulkano::VulkanLibrary;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let library = VulkanLibrary::new()?;
//! let instance = Instance::new(library, InstanceCreateInfo {
//!     max_api_version: Some(MIN_API_VERSION),
//!     ..Default::default()
//! })?;
//! let physical = instance.enumerate_physical_devices()?.next().ok_or("no device")?;
//! let family = physical.queue_family_properties().iter()
//!     .position(|f| f.queue_flags.contains(QueueFlags::GRAPHICS)).ok_or("no graphics")? as u32;
//! let (device, mut queues) = Device::new(physical.clone(), DeviceCreateInfo {
//!     enabled_extensions: device_extensions(&physical), // plus your own
//!     enabled_features: device_features(),
//!     queue_create_infos: vec![QueueCreateInfo { queue_family_index: family, ..Default::default() }],
//!     ..Default::default()
//! })?;
//! let queue = queues.next().ok_or("no queue")?;
//! // SAFETY: this program submits to `queue` only through the Interop.
//! let interop = unsafe { Interop::new(&device, &queue, None) }?;
//!
//! type Image = ExportableImage<Rgba8Unorm, Optimal, HostVisible, usage::Storage>;
//! let image = Image::new(interop.context(), ImageDesc::new_2d(256, 256))?;
//! // SAFETY: only vulkano uses the new image while it is wrapped.
//! let wrapped = unsafe { interop.image(&image, CurrentLayout::Undefined) }?;
//! let allocator = Arc::new(StandardCommandBufferAllocator::new(device.clone(), Default::default()));
//! let mut builder = AutoCommandBufferBuilder::primary(
//!     allocator, family, CommandBufferUsage::OneTimeSubmit)?;
//! builder.clear_color_image(ClearColorImageInfo {
//!     clear_value: [1.0, 0.0, 0.0, 1.0].into(),
//!     ..ClearColorImageInfo::image(wrapped.image().clone())
//! })?;
//! let commands = builder.build()?;
//! let done = TimelineSemaphore::new(interop.context())?; // exportable: CUDA imports it
//! // SAFETY: the image is vulkano's alone; the command buffer is submitted once.
//! let mut submission =
//!     unsafe { interop.submit(&[commands], &[], &[TimelinePoint::new(&done, 1)]) }?;
//! submission.wait(Duration::from_secs(5))?;
//! // CUDA: cuda.import_image(&image)?, cuda.import_semaphore(&done)?.wait(&stream, 1)?
//! # Ok(())
//! # }
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod context;
mod error;
mod image;
mod requirements;
mod sync;

pub use context::Interop;
pub use error::{Error, Result};
pub use image::{CurrentLayout, InteropImage};
pub use requirements::{device_extensions, device_features, MIN_API_VERSION};
pub use sync::Submission;
/// A timeline value to wait for or to signal in [`Interop::submit`] (a
/// timeline of the interop's context).
pub use vk_export::TimelinePoint;
