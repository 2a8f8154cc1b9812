// Twin of fail/record_imported_as_other_format.rs; a received record is typed at run time when it is taken from the message.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(device: &CudaDevice, received: &mut vk_export::wire::Received) -> Result<()> {
    let bundle = received.take_image::<R32Sfloat, Optimal, DeviceLocal, usage::Storage>(0)?;
    let _image: ImportedImage<R32Sfloat, Optimal, DeviceLocal, usage::Storage> =
        device.import_received_image(bundle).map_err(ImportError::into_error)?;
    Ok(())
}

fn main() {}
