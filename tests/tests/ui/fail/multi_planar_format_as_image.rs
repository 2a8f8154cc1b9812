// Invariant: a multi-planar format is no single-array image format: a (joint) multi-planar ExportableImage does not compile. Twin: pass/multi_planar_format_as_planar_image.rs
use vk_export::format::*;
use vk_export::{Context, ExportableImage, ImageDesc};

fn check(ctx: &Context) -> vk_export::Result<()> {
    let _ = ExportableImage::<Nv12Planes>::new(ctx, ImageDesc::new_2d(1920, 1080))?;
    Ok(())
}

fn main() {}
