// Invariant: a record is imported as its own format type (E0308). Twin: pass/record_imported_as_its_format.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(device: &CudaDevice, record: vk_export::ImageRecord<Rgba8Unorm>, fd: OwnedFd) {
    let _image: std::result::Result<ImportedImage<R32Sfloat, Optimal, DeviceLocal, usage::Storage>, ImportError> =
        device.import_image_fd(record, fd);
}

fn main() {}
