//! The adapter on the machine's Vulkan device (lavapipe in CI; on NVIDIA with
//! `--features cuda-interop-testkit/device-local`, in the GPU bundle) with the
//! Khronos validation layer required (unless `CUDA_INTEROP_VALIDATION=off`):
//! texture and buffer round trips with exact texels, a timeline signalled by
//! wgpu and waited by the host, the lifetime guard, the refusals, and the
//! layer's errors counted.

use std::time::Duration;

use cuda_interop_testkit::Mem;
use cuda_interop_wgpu::pattern::{self, first_mismatch};
use cuda_interop_wgpu::{Error, InteropDevice, TimelinePoint};
use vk_export::{
    ExportableBuffer, ImageDesc, QueueRole, SubmitSync, TimelineSemaphore, WaitStrategy,
};

mod common;
use common::{assert_clean, device, options, Image};

#[test]
fn a_texture_written_by_wgpu_reads_back_exactly() {
    let device = device();
    let image = Image::new(device.context(), ImageDesc::new_2d(70, 33)).unwrap();
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    assert_eq!(texture.format(), wgpu::TextureFormat::Rgba8Unorm);
    assert_eq!((texture.width(), texture.height()), (70, 33));
    assert!(texture
        .usage()
        .contains(wgpu::TextureUsages::STORAGE_BINDING));
    let queue = device.queue();
    queue
        .submit([pattern::encode_pattern(&device, &texture, 7)])
        .unwrap();
    let pixels = pattern::read_texture(&device, queue, &texture).unwrap();
    assert_eq!(pixels.len(), 70 * 33 * 4);
    assert_eq!(first_mismatch(&pixels, 70, 7), None);
    drop(texture);
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
}

#[test]
fn a_buffer_round_trips_between_vk_export_and_wgpu() {
    let device = device();
    let ctx = device.context();
    let buffer = ExportableBuffer::<Mem>::new(ctx, 4096).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
    let wgpu_buffer = device.buffer_from_buffer(&buffer).unwrap();
    assert_eq!(wgpu_buffer.size(), 4096);
    // vk-export -> wgpu: a copy into a mappable buffer.
    let readback = device.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 4096,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = device.device().create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(&wgpu_buffer, 0, &readback, 0, 4096);
    device.queue().submit([encoder.finish()]).unwrap();
    let got = pattern::read_mapped(&device, &readback, 4096, 4096, 1).unwrap();
    assert_eq!(got, data);
    // wgpu -> vk-export: a wgpu write, then vk-export's readback.
    let other: Vec<u8> = data.iter().map(|b| !b).collect();
    device.queue().write_buffer(&wgpu_buffer, 0, &other);
    device.queue().submit([]).unwrap();
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    let back = ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap();
    assert_eq!(back, other);
    drop(wgpu_buffer);
    assert_clean(&device);
}

#[test]
fn a_timeline_signalled_in_a_wgpu_submission_is_waited_by_the_host() {
    let device = device();
    let timeline = TimelineSemaphore::new_local(device.context()).unwrap();
    let image = Image::new(device.context(), ImageDesc::new_2d(16, 16)).unwrap();
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    let queue = device.queue();
    queue
        .submit_with(
            [pattern::encode_pattern(&device, &texture, 1)],
            &[],
            &[TimelinePoint::new(&timeline, 1)],
        )
        .unwrap();
    timeline
        .wait(1, Duration::from_secs(10), WaitStrategy::Block)
        .unwrap();
    assert_eq!(timeline.value().unwrap(), 1);
    // The host signals a gate; wgpu waits for it and signals 3. (A host
    // signal of `timeline` itself is refused while wgpu's 3 is pending.)
    let gate = TimelineSemaphore::new_local(device.context()).unwrap();
    queue
        .submit_with(
            [pattern::encode_pattern(&device, &texture, 2)],
            &[
                TimelinePoint::new(&gate, 1),
                TimelinePoint::new(&timeline, 1),
            ],
            &[TimelinePoint::new(&timeline, 3)],
        )
        .unwrap();
    assert_eq!(
        timeline.value().unwrap(),
        1,
        "wgpu's work waits for the gate"
    );
    assert!(timeline.signal(2).is_err(), "a signal of 3 is pending");
    gate.signal(1).unwrap();
    timeline
        .wait(3, Duration::from_secs(10), WaitStrategy::Block)
        .unwrap();
    let pixels = pattern::read_texture(&device, queue, &texture).unwrap();
    assert_eq!(first_mismatch(&pixels, 16, 2), None);
    drop(texture);
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
}

#[test]
fn the_texture_keeps_the_image_alive_after_its_owner_drops_it() {
    let device = device();
    let image = Image::new(device.context(), ImageDesc::new_2d(32, 8)).unwrap();
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    let buffer = ExportableBuffer::<Mem>::new(device.context(), 256).unwrap();
    let wgpu_buffer = device.buffer_from_buffer(&buffer).unwrap();
    drop(image);
    drop(buffer);
    // Both still usable: the keep-alives hold the VkImage, VkBuffer and memory.
    device
        .queue()
        .submit([pattern::encode_pattern(&device, &texture, 5)])
        .unwrap();
    let pixels = pattern::read_texture(&device, device.queue(), &texture).unwrap();
    assert_eq!(first_mismatch(&pixels, 32, 5), None);
    device.queue().write_buffer(&wgpu_buffer, 0, &[1; 256]);
    device.queue().submit([]).unwrap();
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
    // The device itself outlives everything: drop it first, then the texture.
    drop(device);
    drop(texture);
    drop(wgpu_buffer);
}

#[test]
fn the_context_outlives_the_adapter_and_wgpu() {
    let device = device();
    let ctx = device.context().clone();
    let image = Image::new(&ctx, ImageDesc::new_2d(8, 8)).unwrap();
    drop(device);
    // The Vulkan device is still there for vk-export (the context owns a share).
    ctx.clear_image(
        &image,
        vk_export::ash::vk::ClearColorValue {
            float32: [1.0, 0.0, 0.0, 1.0],
        },
        SubmitSync::new(),
    )
    .unwrap();
    let pixels = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
    assert!(pixels.chunks_exact(4).all(|p| p == [255, 0, 0, 255]));
}

#[test]
fn a_one_queue_device_is_refused_unless_shared() {
    match InteropDevice::new(&options()) {
        Err(Error::OneQueue(name)) => {
            println!("one queue on {name}: refused");
            let device = device();
            assert!(device.shares_queue());
            assert!(
                // SAFETY: only checked, never submitted on.
                unsafe { device.queue().wgpu_queue() }.is_none(),
                "no bare queue when shared"
            );
        }
        Ok(device) => {
            assert!(!device.shares_queue());
            // SAFETY: only checked, never submitted on.
            assert!(unsafe { device.queue().wgpu_queue() }.is_some());
            let queues = device.context().queues();
            assert_ne!(queues.main, device.wgpu_queue_choice());
            assert_ne!(queues.transfer, Some(device.wgpu_queue_choice()));
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn resources_of_another_device_are_refused() {
    let device = device();
    let other = cuda_interop_testkit::vulkan(None);
    let image = Image::new(&other, ImageDesc::new_2d(8, 8)).unwrap();
    // SAFETY: refused before anything is made.
    let err = unsafe { device.texture_from_image(&image) }.unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
    let buffer = ExportableBuffer::<Mem>::new(&other, 256).unwrap();
    let err = device.buffer_from_buffer(&buffer).unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
    let timeline = TimelineSemaphore::new_local(&other).unwrap();
    let err = device
        .queue()
        .submit_with([], &[], &[TimelinePoint::new(&timeline, 1)])
        .unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
    let err = device
        .queue()
        .submit_with([], &[TimelinePoint::new(&timeline, 1)], &[])
        .unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
    assert_clean(&device);
}

#[test]
fn a_signal_not_above_the_timeline_is_refused() {
    let device = device();
    let timeline = TimelineSemaphore::new_local(device.context()).unwrap();
    timeline.signal(4).unwrap();
    for value in [0, 3, 4] {
        let err = device
            .queue()
            .submit_with([], &[], &[TimelinePoint::new(&timeline, value)])
            .unwrap_err();
        assert!(matches!(err, Error::Refused(_)), "{value}: {err}");
    }
    device
        .queue()
        .submit_with([], &[], &[TimelinePoint::new(&timeline, 5)])
        .unwrap();
    timeline
        .wait(5, Duration::from_secs(10), WaitStrategy::Block)
        .unwrap();
    assert_clean(&device);
}

#[test]
fn a_cube_image_is_refused() {
    let device = device();
    let image = Image::new(device.context(), ImageDesc::new_2d(8, 8).cube(6)).unwrap();
    // SAFETY: refused before anything is made.
    let err = unsafe { device.texture_from_image(&image) }.unwrap_err();
    assert!(matches!(err, Error::Refused(_)), "{err}");
}

/// wgpu and vk-export submitting from two threads at once: on a shared
/// queue every wgpu submission runs under the context's queue lock (the
/// validation layer's thread-safety checks report two threads in one
/// `VkQueue` otherwise); on separate queues they never meet.
#[test]
fn wgpu_and_vk_export_submit_from_two_threads_at_once() {
    let device = device();
    let ctx = device.context().clone();
    let image = Image::new(&ctx, ImageDesc::new_2d(64, 64)).unwrap();
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    let buffer = ExportableBuffer::<Mem>::new(&ctx, 1 << 16).unwrap();
    let data = vec![0x5a; 1 << 16];
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..40 {
                device
                    .queue()
                    .submit([pattern::encode_pattern(&device, &texture, i)])
                    .unwrap();
                for _ in 0..50 {
                    device.queue().submit([]).unwrap();
                }
            }
        });
        s.spawn(|| {
            for _ in 0..40 {
                ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
                let back = ctx.read_buffer(&buffer, 16, SubmitSync::new()).unwrap();
                assert_eq!(back, [0x5a; 16]);
                // The application's own submissions, inside the lock.
                for _ in 0..50 {
                    ctx.with_queue_of(QueueRole::Main, |queue| {
                        // SAFETY: an empty submission on the context's
                        // queue, inside its lock.
                        unsafe {
                            ctx.device()
                                .queue_submit(queue, &[], vk_export::ash::vk::Fence::null())
                        }
                        .unwrap()
                    })
                    .unwrap();
                }
            }
        });
    });
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    let pixels = pattern::read_texture(&device, device.queue(), &texture).unwrap();
    assert_eq!(first_mismatch(&pixels, 64, 39), None);
    drop(texture);
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
}

#[test]
fn the_texture_has_the_images_dimension_and_layers() {
    let device = device();
    let image = Image::new(device.context(), ImageDesc::new_3d(8, 8, 4)).unwrap();
    assert_eq!(
        image.info().image_type(),
        vk_export::ash::vk::ImageType::TYPE_3D
    );
    // SAFETY: only wgpu uses the image while the texture lives.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    assert_eq!(texture.dimension(), wgpu::TextureDimension::D3);
    assert_eq!(texture.depth_or_array_layers(), 4);
    drop(texture);
    let image = Image::new(device.context(), ImageDesc::new_2d(8, 8).array_layers(3)).unwrap();
    // SAFETY: as above.
    let texture = unsafe { device.texture_from_image(&image) }.unwrap();
    assert_eq!(texture.dimension(), wgpu::TextureDimension::D2);
    assert_eq!(texture.depth_or_array_layers(), 3);
    drop(texture);
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
}

/// The adapter counts the layer's errors on its own instance (vk-export's
/// `ValidationMessenger`): an invalid call made on purpose on its device
/// (a buffer of size 0) is one error with its id; without the count every
/// `assert_clean` here would pass vacuously.
#[test]
fn an_invalid_call_on_the_adapters_device_is_counted() {
    if std::env::var("CUDA_INTEROP_VALIDATION").as_deref() == Ok("off") {
        println!("NOT RUN: CUDA_INTEROP_VALIDATION=off");
        return;
    }
    let device = device();
    assert_clean(&device);
    let ctx = device.context();
    let info = ash::vk::BufferCreateInfo::default()
        .size(0)
        .usage(ash::vk::BufferUsageFlags::TRANSFER_SRC);
    // SAFETY: a plain creation on the live device; size 0 is invalid usage
    // on purpose (reported by the layer first); whatever the driver made is
    // destroyed once.
    if let Ok(buffer) = unsafe { ctx.device().create_buffer(&info, None) } {
        // SAFETY: unused.
        unsafe { ctx.device().destroy_buffer(buffer, None) };
    }
    assert_eq!(
        device.validation_error_ids(),
        ["VUID-VkBufferCreateInfo-size-00912"]
    );
    assert_eq!(device.validation_errors(), 1);
}

/// Issue 31's formats as wgpu textures (BGRA, sRGB, A2B10G10R10 as
/// `Rgb10a2Unorm`, R16 and R16G16 UNORM with `TEXTURE_FORMAT_16BIT_NORM`,
/// which the device enables where the adapter offers it).
#[test]
fn the_bgra_srgb_packed_and_16_bit_formats_are_wgpu_textures() {
    use vk_export::format::{
        A2b10g10r10UnormPack32, Bgra8Srgb, Bgra8Unorm, Format, R16Unorm, Rg16Unorm, Rgba8Srgb,
    };
    use vk_export::markers::{usage, Optimal, Usage};
    use vk_export::ExportableImage;
    use wgpu::TextureFormat as T;
    let device = device();
    fn check<F: Format, U: Usage>(device: &InteropDevice, want: wgpu::TextureFormat) {
        let image =
            ExportableImage::<F, Optimal, Mem, U>::new(device.context(), ImageDesc::new_2d(8, 4))
                .unwrap();
        // SAFETY: only wgpu uses the image while the texture lives.
        let texture = unsafe { device.texture_from_image(&image) }
            .unwrap_or_else(|e| panic!("{}: {e}", F::NAME));
        assert_eq!(texture.format(), want, "{}", F::NAME);
    }
    check::<Bgra8Unorm, usage::Storage>(&device, T::Bgra8Unorm);
    check::<Bgra8Srgb, usage::ColorAttachment>(&device, T::Bgra8UnormSrgb);
    check::<Rgba8Srgb, usage::Sampled>(&device, T::Rgba8UnormSrgb);
    check::<A2b10g10r10UnormPack32, usage::Storage>(&device, T::Rgb10a2Unorm);
    if device
        .device()
        .features()
        .contains(wgpu::Features::TEXTURE_FORMAT_16BIT_NORM)
    {
        check::<R16Unorm, usage::Storage>(&device, T::R16Unorm);
        check::<Rg16Unorm, usage::Storage>(&device, T::Rg16Unorm);
    } else {
        println!("the adapter offers no TEXTURE_FORMAT_16BIT_NORM: R16 and R16G16 not checked");
    }
    pattern::wait_idle(&device, Duration::from_secs(10)).unwrap();
    assert_clean(&device);
}
