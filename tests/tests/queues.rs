//! The context's queues: which queue each helper submits to, the transfer
//! queue where the device has a transfer-only family, resources moving
//! between the main and the transfer family with their contents, and a
//! device the application made itself with ash, wrapped by
//! `Context::from_raw` with its own queue choices (checked).
//!
//! Lavapipe has one queue family with one queue (graphics, compute,
//! transfer): there the helpers' fallback to the main queue is what runs.
//! The NVIDIA H200 has a transfer-only family 1: there the same tests (GPU
//! bundle, `test-queues`) run the two-family moves, with the validation
//! layer counting; the own-device test gives the context a second queue of
//! the main family where a device has no transfer-only family but two
//! queues in the main one.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use ash::vk;
use cuda_interop_testkit::{assert_no_validation_errors, pattern, vulkan, Image, Mem};
use vk_export::{
    Context, DeviceRequirements, Error, ExportableBuffer, HeadlessOptions, ImageDesc, QueueChoice,
    QueueRole, Queues, SubmitSync, TransferQueue, Validation, OPTIONAL_DEVICE_EXTENSIONS,
    REQUIRED_DEVICE_EXTENSIONS,
};

/// The first family with TRANSFER and neither GRAPHICS nor COMPUTE, asked
/// of the driver here, not of the crate.
fn transfer_only_family(ctx: &Context) -> Option<u32> {
    // SAFETY: plain query on the context's live instance.
    let families = unsafe {
        ctx.instance()
            .get_physical_device_queue_family_properties(ctx.physical_device())
    };
    families
        .iter()
        .position(|f| {
            f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        })
        .map(|i| i as u32)
}

/// What `DeviceRequirements` lists for a device is what `headless` made of
/// it, and what the driver says it offers (asked here, not of the crate).
#[test]
fn device_requirements_list_what_headless_creates_and_the_driver_offers() {
    let ctx = vulkan(None);
    // SAFETY: the context's live instance (headless: Vulkan 1.2) and its
    // physical device.
    let needs = unsafe { DeviceRequirements::of(ctx.instance(), ctx.physical_device()) }.unwrap();
    assert_eq!(needs.queues, ctx.queues(), "the queues headless created");
    assert_eq!(
        needs.queues.transfer.map(|t| t.family),
        transfer_only_family(&ctx)
    );
    // SAFETY: plain enumeration on the context's live instance.
    let offered = unsafe {
        ctx.instance()
            .enumerate_device_extension_properties(ctx.physical_device())
    }
    .unwrap();
    let offers = |name: &std::ffi::CStr| {
        offered
            .iter()
            .any(|e| e.extension_name_as_c_str().ok() == Some(name))
    };
    let want: Vec<_> = REQUIRED_DEVICE_EXTENSIONS
        .iter()
        .chain(OPTIONAL_DEVICE_EXTENSIONS.iter().filter(|e| offers(e)))
        .copied()
        .collect();
    assert_eq!(needs.extensions, want);
    assert_eq!(
        needs.semaphore_fd,
        offers(ash::khr::external_semaphore_fd::NAME)
    );
    assert_eq!(needs.semaphore_fd, ctx.supports_semaphore_fds());
    assert_eq!(needs.extension_names().len(), needs.extensions.len());
    let priorities = [1.0f32];
    let infos = needs.queue_create_infos(&priorities);
    assert_eq!(
        infos.len(),
        1 + usize::from(needs.queues.transfer.is_some())
    );
    assert_eq!(infos[0].queue_family_index, needs.queues.main.family);
    assert_eq!(needs.features12().timeline_semaphore, vk::TRUE);
}

#[test]
fn the_copy_helpers_use_the_transfer_only_family_where_the_device_has_one() {
    let ctx = vulkan(None);
    let expected = transfer_only_family(&ctx);
    println!(
        "{}: transfer-only family {expected:?}, queues {:?}",
        ctx.identity().name,
        ctx.queues()
    );
    assert_eq!(
        ctx.queues().transfer.map(|q| q.family),
        expected,
        "a headless context gets a queue of the transfer-only family, if any"
    );
    assert_eq!(
        ctx.queue_family_of(QueueRole::Transfer),
        expected.unwrap_or(ctx.queue_family()),
        "the transfer role falls back to the main queue"
    );
    let main_only = Context::headless(&HeadlessOptions {
        validation: Validation::Required,
        transfer_queue: TransferQueue::Off,
        ..HeadlessOptions::default()
    })
    .unwrap();
    assert_eq!(main_only.queues().transfer, None);
    assert_eq!(
        main_only.queue_family_of(QueueRole::Transfer),
        main_only.queue_family()
    );
}

/// Every helper in turn on one image, alternating the main queue (clears)
/// and the transfer queue (uploads, readbacks, releases): the contents
/// survive each move, and the layer reports nothing.
fn move_an_image_between_the_queues(ctx: &Context) {
    let (w, h) = (64, 32);
    let image = Image::new(ctx, ImageDesc::new_2d(w, h)).unwrap();
    let bytes = (w * h * 4) as usize;
    let red = vk::ClearColorValue {
        float32: [1.0, 0.0, 0.0, 1.0],
    };
    for round in 0..3u32 {
        ctx.clear_image(&image, red, SubmitSync::new()).unwrap();
        let read = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
        assert!(
            read.chunks(4).all(|t| t == [255, 0, 0, 255]),
            "round {round}: a clear on the main queue, read on the transfer queue"
        );
        let data = pattern(bytes, round);
        ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
            .unwrap();
        ctx.release_image(&image, SubmitSync::new()).unwrap();
        let read = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
        assert_eq!(read, data, "round {round}: written, released, read back");
    }
    // A buffer: written and read on the transfer queue, released, read
    // again (acquired back from VK_QUEUE_FAMILY_EXTERNAL).
    let buffer = ExportableBuffer::<Mem>::new(ctx, 4096).unwrap();
    for round in 0..3u32 {
        let data = pattern(4096, round + 7);
        ctx.write_buffer(&buffer, &data, SubmitSync::new()).unwrap();
        ctx.release_buffer(&buffer, SubmitSync::new()).unwrap();
        assert_eq!(
            ctx.read_buffer(&buffer, 4096, SubmitSync::new()).unwrap(),
            data
        );
    }
    assert_no_validation_errors(ctx);
}

#[test]
fn an_image_keeps_its_texels_moving_between_the_main_and_the_transfer_queue() {
    let ctx = vulkan(None);
    move_an_image_between_the_queues(&ctx);
}

/// A device made here with ash, as an application makes its own: its
/// instance (with the validation layer and a messenger that counts errors)
/// and the queues it asked for.
struct OwnDevice {
    entry: ash::Entry,
    instance: ash::Instance,
    physical: vk::PhysicalDevice,
    device: ash::Device,
    families: Vec<vk::QueueFamilyProperties>,
    messenger: vk::DebugUtilsMessengerEXT,
    debug: ash::ext::debug_utils::Instance,
    errors: Box<AtomicU32>,
}

unsafe extern "system" fn count_errors(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        // SAFETY: `user` is the OwnDevice's counter, alive until the
        // messenger is destroyed; the layer passes valid callback data.
        unsafe {
            (*(user as *const AtomicU32)).fetch_add(1, Ordering::SeqCst);
            if let Some(m) = data.as_ref().and_then(|d| d.message_as_c_str()) {
                eprintln!("[validation error] {}", m.to_string_lossy());
            }
        }
    }
    vk::FALSE
}

impl OwnDevice {
    /// One queue of the first graphics-or-compute family, plus (as the
    /// application's choice for the crate) a queue of the transfer-only
    /// family, else a second queue of the main family where it has two.
    fn new() -> (OwnDevice, Queues) {
        // SAFETY: the system loader.
        let entry = unsafe { ash::Entry::load() }.expect("libvulkan");
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_2);
        let layers = [c"VK_LAYER_KHRONOS_validation".as_ptr()];
        let extensions = [ash::ext::debug_utils::NAME.as_ptr()];
        let info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        // SAFETY: the create info lives across the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .expect("a Vulkan 1.2 instance with the validation layer");
        let debug = ash::ext::debug_utils::Instance::new(&entry, &instance);
        let errors = Box::new(AtomicU32::new(0));
        let messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR)
            .message_type(vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION)
            .pfn_user_callback(Some(count_errors))
            .user_data(&*errors as *const AtomicU32 as *mut c_void);
        // SAFETY: the counter outlives the messenger (destroyed in Drop first).
        let messenger = unsafe { debug.create_debug_utils_messenger(&messenger_info, None) }
            .expect("a debug messenger");
        // SAFETY: plain queries.
        let physical = unsafe { instance.enumerate_physical_devices() }.unwrap()[0];
        // SAFETY: plain query.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let main = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .expect("a compute family") as u32;
        let transfer_only = families.iter().position(|f| {
            f.queue_flags.contains(vk::QueueFlags::TRANSFER)
                && !f
                    .queue_flags
                    .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
        });
        let transfer = match transfer_only {
            Some(f) => Some(QueueChoice {
                family: f as u32,
                index: 0,
            }),
            None if families[main as usize].queue_count > 1 => Some(QueueChoice {
                family: main,
                index: 1,
            }),
            None => None,
        };
        let mut queue_counts = vec![0u32; families.len()];
        queue_counts[main as usize] = 1;
        if let Some(t) = transfer {
            queue_counts[t.family as usize] = queue_counts[t.family as usize].max(t.index + 1);
        }
        let priorities = [1.0f32; 2];
        let queue_infos: Vec<_> = queue_counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(f, &n)| {
                vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(f as u32)
                    .queue_priorities(&priorities[..n as usize])
            })
            .collect();
        let mut device_extensions: Vec<*const i8> = REQUIRED_DEVICE_EXTENSIONS
            .iter()
            .map(|e| e.as_ptr())
            .collect();
        // SAFETY: plain enumeration.
        let offered = unsafe { instance.enumerate_device_extension_properties(physical) }.unwrap();
        let semaphore_fd = offered.iter().any(|e| {
            e.extension_name_as_c_str().ok() == Some(ash::khr::external_semaphore_fd::NAME)
        });
        if semaphore_fd {
            device_extensions.push(ash::khr::external_semaphore_fd::NAME.as_ptr());
        }
        let mut features12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
        let device_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_extension_names(&device_extensions)
            .push_next(&mut features12);
        // SAFETY: the create info and its chain live across the call.
        let device = unsafe { instance.create_device(physical, &device_info, None) }
            .expect("a device with timeline semaphores");
        let queues = Queues {
            main: QueueChoice {
                family: main,
                index: 0,
            },
            transfer,
        };
        (
            OwnDevice {
                entry,
                instance,
                physical,
                device,
                families,
                messenger,
                debug,
                errors,
            },
            queues,
        )
    }

    /// Wraps the device with `queues`.
    fn context(&self, queues: Queues) -> Result<Context, Error> {
        // SAFETY: the device was made above from `physical` of `instance`
        // with Vulkan 1.2, timeline semaphores and the required extensions;
        // the queues named exist (a test that names others expects a
        // refusal before any is used); nothing else submits to them; the device and instance outlive every context of the test
        // (destroyed in Drop, after the tests drop their contexts).
        unsafe {
            Context::from_raw(
                self.entry.clone(),
                self.instance.clone(),
                self.physical,
                self.device.clone(),
                queues,
                false,
            )
        }
    }
}

impl Drop for OwnDevice {
    fn drop(&mut self) {
        // SAFETY: every context and resource made from the device is gone
        // (the tests drop them first); the messenger goes before the instance.
        unsafe {
            self.device.destroy_device(None);
            self.debug
                .destroy_debug_utils_messenger(self.messenger, None);
            self.instance.destroy_instance(None);
        }
    }
}

#[test]
fn an_application_device_with_its_own_queue_choices_is_wrapped_and_used() {
    let (own, queues) = OwnDevice::new();
    println!(
        "families {:?}, queues given {queues:?}",
        own.families
            .iter()
            .map(|f| (f.queue_flags, f.queue_count))
            .collect::<Vec<_>>()
    );
    {
        let ctx = own.context(queues).unwrap();
        assert_eq!(ctx.queues(), queues);
        assert!(
            !ctx.validation_enabled(),
            "from_raw adds no messenger of its own"
        );
        move_an_image_between_the_queues(&ctx);
    }
    assert_eq!(own.errors.load(Ordering::SeqCst), 0, "validation errors");
}

#[test]
fn from_raw_refuses_queues_the_device_cannot_have() {
    let (own, queues) = OwnDevice::new();
    let main = queues.main;
    let refused = |queues: Queues, why: &str| match own.context(queues) {
        Err(Error::InvalidArgument(m)) => {
            println!("{why}: {m}");
            assert!(m.contains("queue"), "{m}");
        }
        other => panic!("{why}: expected a refusal, got {other:?}"),
    };
    let families = own.families.len() as u32;
    refused(
        Queues {
            main: QueueChoice {
                family: families,
                index: 0,
            },
            transfer: None,
        },
        "a family the device does not have",
    );
    refused(
        Queues {
            main: QueueChoice {
                family: main.family,
                index: own.families[main.family as usize].queue_count,
            },
            transfer: None,
        },
        "an index past the family's queueCount",
    );
    refused(
        Queues {
            main,
            transfer: Some(main),
        },
        "the same queue twice",
    );
    if let Some(f) = own.families.iter().position(|f| {
        !f.queue_flags
            .intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
    }) {
        refused(
            Queues {
                main: QueueChoice {
                    family: f as u32,
                    index: 0,
                },
                transfer: None,
            },
            "a main queue that cannot clear",
        );
    }
    assert_eq!(own.errors.load(Ordering::SeqCst), 0, "validation errors");
}

/// An application's own image (no external memory, OPTIMAL, rendered into
/// and left in `COLOR_ATTACHMENT_OPTIMAL` on the main queue) copied into
/// an exportable image by `copy_image_from`: every texel arrives, whole or
/// from a region at an offset, the source is left in its layout (a second
/// copy from the same facts is valid), and the layer reports nothing. On
/// the H200 the source owned by the main family is copied on the main
/// queue; a `CONCURRENT` one would go to the transfer queue (lavapipe: one
/// family, the main queue for both).
#[test]
fn an_application_image_is_copied_into_an_exportable_one_texel_for_texel() {
    use cuda_interop_testkit::app_image::AppImage;
    use vk_export::format::Rgba8Unorm;
    use vk_export::{SourceImage, SourceSharing};
    let ctx = vulkan(None);
    let (w, h) = (40u32, 24u32);
    let (sw, sh) = (w + 9, h + 5);
    let texels = pattern((sw * sh * 4) as usize, 11);
    let app = AppImage::new(
        &ctx,
        [sw, sh],
        &texels,
        vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
        QueueRole::Main,
    );
    let exclusive = SourceSharing::Exclusive(app.family);
    // SAFETY: `app` is a live image of this device, RGBA8, one sample,
    // transfer-source usage, sw x sh, in COLOR_ATTACHMENT_OPTIMAL, owned
    // by `app.family`, filled by a completed submission, and nothing else
    // touches it until it is dropped (its drop waits for the queues).
    let source = |extent, offset| unsafe {
        SourceImage::<Rgba8Unorm>::new(app.image, extent, app.layout, exclusive)
            .unwrap()
            .with_offset(offset)
    };
    let sub = |ox: u32, oy: u32, cw: u32, ch: u32| -> Vec<u8> {
        (0..ch)
            .flat_map(|y| {
                let start = (((oy + y) * sw + ox) * 4) as usize;
                texels[start..start + (cw * 4) as usize].to_vec()
            })
            .collect()
    };
    // Copied where the source is: its own family's queue (the main one on
    // the H200; lavapipe's one queue is both).
    let expected = if ctx.queues().transfer.is_some() {
        QueueRole::Main
    } else {
        QueueRole::Transfer
    };
    assert_eq!(
        source([sw, sh], [0, 0]).check_copy(&ctx, [sw, sh]).unwrap(),
        expected
    );
    // The whole image.
    let whole = Image::new(&ctx, ImageDesc::new_2d(sw, sh)).unwrap();
    ctx.copy_image_from(&source([sw, sh], [0, 0]), &whole, SubmitSync::new())
        .unwrap();
    assert_eq!(
        ctx.read_image(&whole, 0, 0, SubmitSync::new()).unwrap(),
        texels
    );
    // A region at an offset, twice (the source went back to its layout).
    let part = Image::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    for _ in 0..2 {
        ctx.copy_image_from(&source([sw, sh], [6, 4]), &part, SubmitSync::new())
            .unwrap();
        assert_eq!(
            ctx.read_image(&part, 0, 0, SubmitSync::new()).unwrap(),
            sub(6, 4, w, h)
        );
    }
    // The far corner exactly fits.
    ctx.copy_image_from(&source([sw, sh], [9, 5]), &part, SubmitSync::new())
        .unwrap();
    assert_eq!(
        ctx.read_image(&part, 0, 0, SubmitSync::new()).unwrap(),
        sub(9, 5, w, h)
    );
    drop(app);
    assert_no_validation_errors(&ctx);
}

/// What `SourceImage` and `copy_image_from` refuse, before anything is
/// recorded: a source smaller than the destination, a region past its edge
/// (one texel), an offset beyond i32, a source owned by a family the
/// context has no queue of, a source in UNDEFINED or PREINITIALIZED (and a
/// null handle or an empty extent), a destination of depth 2. The format is the type's: a source of
/// another format does not compile (`tests/ui/fail/copy_source_of_another_format.rs`).
/// Whether the image has transfer-source usage cannot be asked of a
/// foreign `VkImage`: it is `SourceImage::new`'s safety contract.
#[test]
fn a_copy_from_an_application_image_that_cannot_fit_is_refused() {
    use cuda_interop_testkit::app_image::AppImage;
    use vk_export::format::Rgba8Unorm;
    use vk_export::{SourceImage, SourceSharing};
    let ctx = vulkan(None);
    let (w, h) = (16u32, 8u32);
    let app = AppImage::new(
        &ctx,
        [w, h],
        &pattern((w * h * 4) as usize, 3),
        vk::ImageLayout::TRANSFER_SRC_OPTIMAL,
        QueueRole::Main,
    );
    let dst = Image::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    let before = ctx.read_image(&dst, 0, 0, SubmitSync::new()).unwrap();
    let families = ctx.queues();
    let foreign = 1 + families
        .main
        .family
        .max(families.transfer.map_or(0, |t| t.family));
    // SAFETY: as in the test above (a live RGBA8 image of this device in
    // TRANSFER_SRC_OPTIMAL, owned by `app.family`); the refused ones are
    // never recorded.
    let source = |extent, offset, layout, sharing| unsafe {
        SourceImage::<Rgba8Unorm>::new(app.image, extent, layout, sharing)
            .map(|s| s.with_offset(offset))
    };
    let own = SourceSharing::Exclusive(app.family);
    let layout = app.layout;
    let refused = |s: SourceImage<Rgba8Unorm>| {
        let e = ctx
            .copy_image_from(&s, &dst, SubmitSync::new())
            .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        e.to_string()
    };
    let e = refused(source([w - 1, h], [0, 0], layout, own).unwrap());
    assert!(
        e.contains("region at [0, 0] of a 15x8 source does not fit"),
        "{e}"
    );
    let e = refused(source([w, h], [0, 1], layout, own).unwrap());
    assert!(
        e.contains("region at [0, 1] of a 16x8 source does not fit"),
        "{e}"
    );
    let e = refused(source([w, h], [1 << 31, 0], layout, own).unwrap());
    assert!(e.contains("beyond 2^31"), "{e}");
    let e = refused(source([w, h], [0, 0], layout, SourceSharing::Exclusive(foreign)).unwrap());
    assert!(
        e.contains(&format!("owned by queue family {foreign}")),
        "{e}"
    );
    for bad in [vk::ImageLayout::UNDEFINED, vk::ImageLayout::PREINITIALIZED] {
        let e = source([w, h], [0, 0], bad, own).unwrap_err();
        assert!(e.to_string().contains("its texels are undefined"), "{e}");
    }
    // SAFETY: refused before anything could use the handle.
    let e = unsafe { SourceImage::<Rgba8Unorm>::new(vk::Image::null(), [w, h], layout, own) }
        .unwrap_err();
    assert!(e.to_string().contains("null handle"), "{e}");
    let e = source([w, 0], [0, 0], layout, own).unwrap_err();
    assert!(e.to_string().contains("empty extent"), "{e}");
    // A destination of depth 2 (the copy is of one 2D layer).
    let deep = Image::new(&ctx, ImageDesc::new_3d(w, h, 2)).unwrap();
    let e = ctx
        .copy_image_from(
            &source([w, h], [0, 0], layout, own).unwrap(),
            &deep,
            SubmitSync::new(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("into an image of depth 2"), "{e}");
    // Nothing was copied.
    assert_eq!(
        ctx.read_image(&dst, 0, 0, SubmitSync::new()).unwrap(),
        before
    );
    drop(app);
    assert_no_validation_errors(&ctx);
}

/// A `CONCURRENT` source (over the main and the transfer family) is copied
/// on the transfer queue, with no ownership transfer, texel for texel.
/// Needs two queue families (the H200); lavapipe has one, and a
/// `CONCURRENT` image needs two: there it says so and checks nothing.
#[test]
fn a_concurrent_application_image_is_copied_on_the_transfer_queue() {
    use cuda_interop_testkit::app_image::AppImage;
    use vk_export::format::Rgba8Unorm;
    use vk_export::{SourceImage, SourceSharing};
    let ctx = vulkan(None);
    let Some(transfer) = ctx.queues().transfer else {
        println!("one queue family: no CONCURRENT image to make (nothing checked)");
        return;
    };
    let (w, h) = (32u32, 16u32);
    let texels = pattern((w * h * 4) as usize, 21);
    let families = [ctx.queue_family(), transfer.family];
    let app = AppImage::shared(
        &ctx,
        [w, h],
        &texels,
        vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL,
        QueueRole::Main,
        &families,
    );
    // SAFETY: a live RGBA8 image of this device, CONCURRENT over both of
    // the context's families, in COLOR_ATTACHMENT_OPTIMAL, filled by a
    // completed submission, untouched until dropped (its drop waits for the
    // queues).
    let source = unsafe {
        SourceImage::<Rgba8Unorm>::new(app.image, [w, h], app.layout, SourceSharing::Concurrent)
    }
    .unwrap();
    assert_eq!(
        source.check_copy(&ctx, [w, h]).unwrap(),
        QueueRole::Transfer
    );
    let image = Image::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    for _ in 0..2 {
        ctx.copy_image_from(&source, &image, SubmitSync::new())
            .unwrap();
        assert_eq!(
            ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap(),
            texels
        );
    }
    drop(app);
    assert_no_validation_errors(&ctx);
}

/// A source the application owns on the main family and released to the
/// transfer family: the copy runs on the transfer queue, records the
/// acquire half and the release back, and the application acquires it
/// back on the main queue; texel for texel, twice, the layer silent. Needs
/// two families (the H200); on lavapipe (one) only the refusal of a
/// "transfer" within one family is checked.
#[test]
fn an_application_image_released_to_the_transfer_family_is_copied_there() {
    use cuda_interop_testkit::app_image::AppImage;
    use vk_export::format::Rgba8Unorm;
    use vk_export::{SourceImage, SourceSharing};
    let ctx = vulkan(None);
    let (w, h) = (24u32, 20u32);
    let texels = pattern((w * h * 4) as usize, 31);
    let layout = vk::ImageLayout::COLOR_ATTACHMENT_OPTIMAL;
    let app = AppImage::new(&ctx, [w, h], &texels, layout, QueueRole::Main);
    let transfer = ctx.queue_family_of(QueueRole::Transfer);
    let main = app.family;
    let image = Image::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    // SAFETY: a live RGBA8 image of this device in `layout`; the refused
    // description is never recorded.
    let same = unsafe {
        SourceImage::<Rgba8Unorm>::new(
            app.image,
            [w, h],
            layout,
            SourceSharing::ReleasedToTransfer { from: transfer },
        )
    }
    .unwrap();
    let e = ctx
        .copy_image_from(&same, &image, SubmitSync::new())
        .unwrap_err();
    assert!(e.to_string().contains("no transfer took place"), "{e}");
    if main == transfer {
        println!("one queue family: no ownership transfer to make (only the refusal checked)");
        drop(app);
        assert_no_validation_errors(&ctx);
        return;
    }
    // The application's half of a transfer from `from` to `to`, on a queue
    // of the family recording it, over the range the crate's half names
    // (the whole image: the H200's layer, run 19, matched the two halves
    // field by field and found none for a level-0-layer-0 range).
    let half = |role, from, to| {
        ctx.submit_and_wait_on(role, SubmitSync::new(), |device, cmd, _| {
            let barrier = vk::ImageMemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                .dst_access_mask(vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE)
                .old_layout(layout)
                .new_layout(layout)
                .src_queue_family_index(from)
                .dst_queue_family_index(to)
                .image(app.image)
                .subresource_range(vk::ImageSubresourceRange {
                    aspect_mask: vk::ImageAspectFlags::COLOR,
                    base_mip_level: 0,
                    level_count: vk::REMAINING_MIP_LEVELS,
                    base_array_layer: 0,
                    layer_count: vk::REMAINING_ARRAY_LAYERS,
                });
            // SAFETY: the recording command buffer the helper gives; the
            // image lives until it completed (the helper waits).
            unsafe { cuda_interop_testkit::app_image::record_image_barrier(device, cmd, barrier) };
        })
        .unwrap()
    };
    for round in 0..2 {
        half(QueueRole::Main, main, transfer);
        // SAFETY: as above, released by the completed submission just
        // made; acquired back below before anything else uses it.
        let source = unsafe {
            SourceImage::<Rgba8Unorm>::new(
                app.image,
                [w, h],
                layout,
                SourceSharing::ReleasedToTransfer { from: main },
            )
        }
        .unwrap();
        assert_eq!(
            source.check_copy(&ctx, [w, h]).unwrap(),
            QueueRole::Transfer
        );
        ctx.copy_image_from(&source, &image, SubmitSync::new())
            .unwrap();
        half(QueueRole::Main, transfer, main);
        assert_eq!(
            ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap(),
            texels,
            "round {round}"
        );
    }
    drop(app);
    assert_no_validation_errors(&ctx);
}
