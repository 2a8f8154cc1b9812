// The twin of part_source_forged: the crate's own sources (a colour
// SourceImage, a DepthSource) are PartSources, side by side in one slice.
use cuda_interop_frames::sender::PartSource;
use vk_export::format::Rgba8Unorm;
use vk_export::{DepthSource, SourceImage};

fn sources<'a>(
    color: &'a SourceImage<Rgba8Unorm>,
    depth: &'a DepthSource,
) -> [&'a dyn PartSource; 2] {
    [color, depth]
}

fn main() {
    let _ = sources;
}
