// A copy source's format is its type: an RGBA16F source cannot be copied
// into an RGBA8 image.
use vk_export::format::{Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::{HostVisible, Optimal};
use vk_export::{Context, ExportableImage, SourceImage, SubmitSync};

fn copy(
    ctx: &Context,
    source: &SourceImage<Rgba16Sfloat>,
    image: &ExportableImage<Rgba8Unorm, Optimal, HostVisible>,
) {
    let _ = ctx.copy_image_from(source, image, SubmitSync::new());
}

fn main() {}
