// Invariant: a successful import consumes the fd (E0382). Twin: pass/fd_duplicated_before_import.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;
#[allow(unused_imports)]
use vk_export::semaphore_kinds::*;
#[allow(unused_imports)]
use std::os::fd::{AsRawFd, OwnedFd};

fn check(device: &CudaDevice, record: vk_export::ImageRecord<Rgba8Unorm>, fd: OwnedFd) {
    // SAFETY: (in a real program) `fd` exports the image `record` describes.
    let _ = unsafe { device.import_image_fd(record, fd) };
    let _ = fd.as_raw_fd();
}

fn main() {}
