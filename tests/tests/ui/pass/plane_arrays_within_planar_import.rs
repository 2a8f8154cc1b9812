// Twin of fail/plane_array_outlives_planar_import.rs: the arrays go first, then the import.
use cuda_interop::*;
use vk_export::format::*;
use vk_export::markers::*;

fn check(image: ImportedPlanarImage<Nv12Planes, DeviceLocal>) -> Result<()> {
    let (luma, chroma) = image.map_planes()?;
    let _ = (luma.levels(), chroma.levels());
    drop((luma, chroma));
    drop(image);
    Ok(())
}

fn main() {}
