// Invariant: a plane's CUDA array cannot outlive the two-plane import it is mapped from (E0505). Twin: pass/plane_arrays_within_planar_import.rs
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;

fn check(image: ImportedPlanarImage<Nv12Planes, DeviceLocal>) -> Result<()> {
    let (luma, chroma) = image.map_planes()?;
    drop(image);
    let _ = (luma.levels(), chroma.levels());
    Ok(())
}

fn main() {}
