//! What the adapter's test binaries share: the adapter on the machine's
//! device with the validation layer required (unless
//! `CUDA_INTEROP_VALIDATION=off`), and the check that it reported nothing.

use cuda_interop_testkit::Mem;
use cuda_interop_wgpu::{Error, InteropDevice, Options};
use vk_export::format::Rgba8Unorm;
use vk_export::markers::{usage, Optimal};
use vk_export::{ExportableImage, Validation};

/// The image the tests wrap as a texture.
pub type Image = ExportableImage<Rgba8Unorm, Optimal, Mem, usage::Storage>;

/// The adapter's options: validation required unless turned off.
pub fn options() -> Options {
    Options {
        validation: match std::env::var("CUDA_INTEROP_VALIDATION").as_deref() {
            Ok("off") => Validation::Off,
            _ => Validation::Required,
        },
        ..Options::default()
    }
}

/// The adapter: a queue of its own for wgpu where the device has two, the
/// one queue shared otherwise (lavapipe).
pub fn device() -> InteropDevice {
    match InteropDevice::new(&options()) {
        Ok(d) => d,
        Err(Error::OneQueue(_)) => {
            // SAFETY: no test thread calls wgpu while the device drops.
            unsafe { InteropDevice::new_shared_queue(&options()) }
                .expect("the shared-queue adapter")
        }
        Err(e) => panic!("a Vulkan device with external memory is needed: {e}"),
    }
}

/// Fails the test on any validation error the adapter's device reported.
pub fn assert_clean(device: &InteropDevice) {
    assert_eq!(
        device.validation_errors(),
        0,
        "validation errors: {:?}",
        device.validation_error_ids()
    );
}
