//! Bring your own device: an application that creates its Vulkan instance
//! and device with ash, as a renderer does, and wraps them with
//! `Context::from_raw`, naming the queues the crate may use: a queue of a
//! graphics-or-compute family, and a queue of a transfer-only family where
//! the device has one (copies there do not switch the GPU's graphics engine
//! between Vulkan and CUDA).
//!
//! It enables what `from_raw` needs, as `DeviceRequirements` lists it for
//! the device (Vulkan 1.2, `timelineSemaphore`, `REQUIRED_DEVICE_EXTENSIONS`,
//! and the optional extensions offered, `VK_KHR_external_semaphore_fd`
//! among them; the queues), exports an image, clears it on the main queue, reads it back
//! and writes it on the transfer queue, checks every texel, and tears down in
//! order: the crate's objects first, then the application's device and
//! instance.
//!
//! ```sh
//! cargo run -p vk-export --example own_device
//! ```

use std::process::ExitCode;

use ash::vk;
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, DeviceLocal, HostVisible, MemoryLocation, Optimal};
use vk_export::{Context, DeviceRequirements, ExportableImage, ImageDesc, QueueRole, SubmitSync};

const USAGE: &str = "usage: own_device [--help]\n\n\
    Creates a Vulkan device with ash, wraps it with Context::from_raw (a main queue and, where\n\
    the device has one, a transfer-only queue), exports an image, clears it on the main queue,\n\
    reads and writes it on the transfer queue, and checks every texel.";

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("own_device: unknown argument {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("own_device: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The application's own objects, destroyed in `Drop` (device, then
/// instance). It keeps a clone of the entry: the loader library stays loaded
/// until the last clone goes, and the Context holds another.
struct App {
    instance: ash::Instance,
    device: ash::Device,
    _entry: ash::Entry,
}

impl Drop for App {
    fn drop(&mut self) {
        // SAFETY: `run` drops every Context and resource made from the
        // device before the App; nothing else uses them.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

fn run() -> Result<(), Error> {
    // SAFETY: loading the system's Vulkan loader.
    let entry = unsafe { ash::Entry::load() }?;
    let app_info = vk::ApplicationInfo::default()
        .application_name(c"own_device")
        .api_version(vk::API_VERSION_1_2);
    // SAFETY: the create info lives across the call.
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app_info),
            None,
        )
    }?;
    // What to create the device with: the crate's `DeviceRequirements`
    // (an engine adds its own extensions, features and queues to these).
    let made = (|| -> Result<_, Error> {
        // SAFETY: plain enumeration.
        let physicals = unsafe { instance.enumerate_physical_devices() }?;
        let &physical = physicals.first().ok_or("no Vulkan device")?;
        // SAFETY: the instance above (Vulkan 1.2) and one of its devices.
        let needs = unsafe { DeviceRequirements::of(&instance, physical) }?;
        let priorities = [1.0f32];
        let queue_infos = needs.queue_create_infos(&priorities);
        let extensions = needs.extension_names();
        let mut features12 = needs.features12();
        let device_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_infos)
            .enabled_extension_names(&extensions)
            .push_next(&mut features12);
        // SAFETY: the create info and its chain live across the call.
        let device = unsafe { instance.create_device(physical, &device_info, None) }?;
        Ok((physical, device, needs))
    })();
    let (physical, device, needs) = match made {
        Ok(made) => made,
        Err(e) => {
            // SAFETY: nothing else was made from the instance.
            unsafe { instance.destroy_instance(None) };
            return Err(e);
        }
    };
    let transfer = needs.queues.transfer;
    let app = App {
        instance,
        device,
        _entry: entry.clone(),
    };
    // SAFETY: the device was created above from `physical` of the instance
    // with everything `needs` lists (Vulkan 1.2, timelineSemaphore, its
    // extensions, queue 0 of each family of `needs.queues`); this
    // application submits to neither queue itself; `app` (device and
    // instance) is dropped after `ctx` and the image, which are declared
    // after it.
    let ctx = unsafe {
        Context::from_raw(
            entry,
            app.instance.clone(),
            physical,
            app.device.clone(),
            needs.queues,
            needs.semaphore_fd,
        )
    }?;
    println!(
        "{}: main queue family {}, copies on family {}{}",
        ctx.identity().name,
        ctx.queue_family(),
        ctx.queue_family_of(QueueRole::Transfer),
        if transfer.is_some() {
            " (transfer-only)"
        } else {
            " (no transfer-only family: the main queue)"
        }
    );
    // Device-local memory where the driver offers it for exportable images
    // (NVIDIA), host-visible otherwise (lavapipe has no device-local-only type).
    match check_image::<DeviceLocal>(&ctx) {
        Err(CheckError::Unsupported(why)) => {
            println!("device-local exportable images not offered ({why}): host-visible memory");
            check_image::<HostVisible>(&ctx).map_err(CheckError::into_boxed)?;
        }
        other => other.map_err(CheckError::into_boxed)?,
    }
    drop(ctx);
    drop(app);
    println!("own_device: ok");
    Ok(())
}

/// Why [`check_image`] failed: the memory class is not offered, or anything else.
enum CheckError {
    Unsupported(String),
    Other(Error),
}

impl CheckError {
    fn into_boxed(self) -> Error {
        match self {
            CheckError::Unsupported(why) => why.into(),
            CheckError::Other(e) => e,
        }
    }
}

impl<E: Into<Error>> From<E> for CheckError {
    fn from(e: E) -> Self {
        CheckError::Other(e.into())
    }
}

/// Exports an image in memory class `M`, clears it on the main queue, reads
/// and writes it on the transfer queue, and checks every texel.
fn check_image<M: MemoryLocation>(ctx: &Context) -> Result<(), CheckError> {
    let (width, height) = (256, 128);
    let image = match ExportableImage::<Rgba8Unorm, Optimal, M, usage::Storage>::new(
        ctx,
        ImageDesc::new_2d(width, height),
    ) {
        Err(e @ vk_export::Error::Unsupported { .. }) => {
            return Err(CheckError::Unsupported(e.to_string()))
        }
        other => other?,
    };
    let blue = vk::ClearColorValue {
        float32: [0.0, 0.0, 1.0, 1.0],
    };
    ctx.clear_image(&image, blue, SubmitSync::new())?;
    let texels = ctx.read_image(&image, 0, 0, SubmitSync::new())?;
    if !texels.chunks(4).all(|t| t == [0, 0, 255, 255]) {
        return Err(CheckError::Other(
            "the cleared image read back wrong".into(),
        ));
    }
    let gradient: Vec<u8> = (0..width * height * 4).map(|i| (i % 251) as u8).collect();
    ctx.write_image(&image, 0, 0, &gradient, SubmitSync::new())?;
    if ctx.read_image(&image, 0, 0, SubmitSync::new())? != gradient {
        return Err(CheckError::Other(
            "the written image read back wrong".into(),
        ));
    }
    println!(
        "{width}x{height} RGBA8 in {:?} memory: cleared on the main queue, read and written on family {}: every texel checked; \
         its memory ({} bytes) exports as an OPAQUE_FD",
        M::REQUIRED,
        ctx.queue_family_of(QueueRole::Transfer),
        image.info().allocation_size()
    );
    Ok(())
}
