// Twin of fail/multi_planar_format_as_image.rs: the disjoint two-plane type takes it.
use vk_export::format::*;
use vk_export::{Context, ExportablePlanarImage};

fn check(ctx: &Context) -> vk_export::Result<()> {
    let _ = ExportablePlanarImage::<Nv12Planes>::new(ctx, 1920, 1080)?;
    Ok(())
}

fn main() {}
