// Twin of fail/fd_used_after_import.rs: dup before import to keep a handle; a failed import gives the fd back.
use cuda_interop::*;
use vk_export::format::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

#[allow(dead_code)]
fn check(device: &CudaDevice, record: vk_export::ImageRecord<Rgba8Unorm>, fd: OwnedFd) -> std::io::Result<()> {
    let copy = fd.try_clone()?;
    // SAFETY: (in a real program) `fd` exports the image `record` describes.
    match unsafe { device.import_image_fd(record, fd) } {
        Ok(_image) => {}
        Err(failed) => drop(failed.fd),
    }
    let _ = copy.as_raw_fd();
    Ok(())
}

fn main() {}
