// Twin of fail/record_imported_as_other_format.rs; a received untyped record is checked at run time with ImageInfo::typed.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(device: &CudaDevice, info: vk_export::ImageInfo, fd: OwnedFd) -> Result<()> {
    let record = info.typed::<R32Sfloat, Optimal, DeviceLocal, usage::Storage>()?;
    let _image: ImportedImage<R32Sfloat, Optimal, DeviceLocal, usage::Storage> =
        device.import_image_fd(record, fd).map_err(ImportError::into_error)?;
    Ok(())
}

fn main() {}
