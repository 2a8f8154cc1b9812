// Invariant: importing a bare fd under a record the crate cannot vouch for needs `unsafe` (E0133). Twin: pass/bare_fd_import_with_unsafe.rs
use std::os::fd::OwnedFd;
use vk_export::format::Rgba8Unorm;
use vk_export::{Context, ExportableImage, ImageRecord};

fn import(ctx: &Context, record: &ImageRecord<Rgba8Unorm>, fd: OwnedFd) {
    let _ = ExportableImage::import_fd(ctx, record, fd);
}

fn main() {}
