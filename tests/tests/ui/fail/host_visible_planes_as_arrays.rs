// Invariant: host-visible two-plane images have no CUDA arrays, as images (E0277). Twin: pass/plane_arrays_within_planar_import.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;

fn check(image: ImportedPlanarImage<P010Planes, HostVisible>) -> Result<()> {
    let _ = image.map_planes()?;
    Ok(())
}

fn main() {}
