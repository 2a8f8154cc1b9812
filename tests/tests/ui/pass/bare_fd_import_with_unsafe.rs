// Twin of fail/bare_fd_import_without_unsafe.rs: the caller states the contract in an unsafe block; a received bundle needs none.
use std::os::fd::OwnedFd;
use vk_export::format::Rgba8Unorm;
use vk_export::{Context, ExportableImage, ImageRecord, ReceivedImage};

fn import(ctx: &Context, record: &ImageRecord<Rgba8Unorm>, fd: OwnedFd) {
    // SAFETY: (in a real program) `fd` is the export of the image `record` describes.
    let _ = unsafe { ExportableImage::import_fd(ctx, record, fd) };
}

fn import_received(ctx: &Context, bundle: ReceivedImage<Rgba8Unorm>) {
    let _ = ExportableImage::import_received(ctx, bundle);
}

fn main() {}
