// Invariant: a record is imported as its own format type (E0308). Twin: pass/record_imported_as_its_format.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(device: &CudaDevice, received: vk_export::ReceivedImage<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>) {
    let _image: std::result::Result<ImportedImage<R32Sfloat, Optimal, DeviceLocal, usage::Storage>, ImportError> =
        device.import_received_image(received);
}

fn main() {}
