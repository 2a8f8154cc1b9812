//! The CUDA array descriptor is derived from the image's typed record alone
//! (the format from the record's type, checked against its `VkFormat` by
//! `typed`); these pin the derivation (no GPU needed), and the no-driver
//! error path.

use ash::vk;
use cuda_interop::sys::{
    CUarray_format, CUDA_ARRAY3D_COLOR_ATTACHMENT, CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED,
    CUDA_ARRAY3D_SURFACE_LDST,
};
use cuda_interop::{array_descriptor, CudaDevice, Error};
use cuda_interop_testkit::sample::ImageFields;
use vk_export::format::{
    A2b10g10r10UnormPack32, Bgra8Srgb, Bgra8Unorm, Format, R16Unorm, R32Sfloat, Rg16Unorm,
    Rgba16Sfloat, Rgba8Srgb, Rgba8Unorm,
};
use vk_export::markers::{usage, DeviceLocal, Optimal, Usage};
use vk_export::ImageRecord;

/// An optimal, device-local image record of format `F` and usage `U`, made
/// by the decoder and typed the way a receiver types it.
fn record<F: Format, U: Usage>(
    extent: [u32; 3],
    levels: u32,
    layers: u32,
    cube: bool,
) -> ImageRecord<F, Optimal, DeviceLocal, U> {
    ImageFields {
        format: F::VK.as_raw() as u32,
        image_type: if extent[2] > 1 { 2 } else { 1 },
        extent,
        mip_levels: levels,
        array_layers: layers,
        flags: if cube {
            vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw()
        } else {
            0
        },
        tiling: 0,
        usage: U::VK.as_raw(),
        allocation_size: 1 << 30,
        memory_type_index: 0,
        memory_flags: vk::MemoryPropertyFlags::DEVICE_LOCAL.as_raw(),
    }
    .decode()
    .typed::<F, Optimal, DeviceLocal, U>()
    .expect("the record has the types it was made with")
}

#[test]
fn rgba8_storage_2d() {
    let d = array_descriptor(&record::<Rgba8Unorm, usage::Storage>(
        [1920, 1080, 1],
        1,
        1,
        false,
    ));
    assert_eq!((d.Width, d.Height, d.Depth), (1920, 1080, 0));
    assert_eq!(d.Format, CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8);
    assert_eq!(d.NumChannels, 4);
    assert_eq!(d.Flags, CUDA_ARRAY3D_SURFACE_LDST);
}

#[test]
fn half_float_layered_colour_attachment() {
    let d = array_descriptor(&record::<Rgba16Sfloat, usage::ColorAttachment>(
        [64, 64, 1],
        3,
        4,
        false,
    ));
    assert_eq!(d.Format, CUarray_format::CU_AD_FORMAT_HALF);
    assert_eq!(d.Depth, 4, "layers go in Depth");
    assert_eq!(
        d.Flags,
        CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_COLOR_ATTACHMENT,
        "no SURFACE_LDST without storage"
    );
}

#[test]
fn float_cube_and_3d() {
    let d = array_descriptor(&record::<R32Sfloat, usage::StorageColorAttachment>(
        [32, 32, 1],
        1,
        6,
        true,
    ));
    assert_eq!(
        (d.Format, d.NumChannels, d.Depth),
        (CUarray_format::CU_AD_FORMAT_FLOAT, 1, 6)
    );
    assert_eq!(
        d.Flags,
        CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_COLOR_ATTACHMENT
    );
    let d = array_descriptor(&record::<R32Sfloat, usage::Sampled>(
        [16, 16, 8],
        1,
        1,
        false,
    ));
    assert_eq!((d.Width, d.Height, d.Depth, d.Flags), (16, 16, 8, 0));
    let cubes = array_descriptor(&record::<R32Sfloat, usage::Sampled>([8, 8, 1], 1, 12, true));
    assert_eq!(cubes.Flags, CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_LAYERED);
}

/// The `(Format, NumChannels, Flags)` of a 2D `F` image's descriptor.
fn layout_of<F: Format, U: Usage>() -> (CUarray_format, u32, u32) {
    let d = array_descriptor(&record::<F, U>([64, 32, 1], 1, 1, false));
    assert_eq!((d.Width, d.Height, d.Depth), (64, 32, 0), "{}", F::NAME);
    (d.Format, d.NumChannels, d.Flags)
}

/// Issue 31's formats: BGRA and sRGB are the bytes as they lie
/// (`UNSIGNED_INT8` x 4, channel 0 blue for BGRA, encoded sRGB); the packed
/// A2B10G10R10 is one 32-bit word; R16 and R16G16 UNORM are 16-bit
/// unsigned channels.
#[test]
fn bgra_srgb_packed_and_16_bit_unorm_descriptors() {
    const U8: CUarray_format = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8;
    const U16: CUarray_format = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT16;
    const U32: CUarray_format = CUarray_format::CU_AD_FORMAT_UNSIGNED_INT32;
    let ldst = CUDA_ARRAY3D_SURFACE_LDST;
    assert_eq!(layout_of::<Bgra8Unorm, usage::Storage>(), (U8, 4, ldst));
    assert_eq!(
        layout_of::<Rgba8Srgb, usage::Sampled>(),
        (U8, 4, 0),
        "sRGB: the UNORM8 x 4 descriptor"
    );
    assert_eq!(
        layout_of::<Bgra8Srgb, usage::ColorAttachment>(),
        (U8, 4, CUDA_ARRAY3D_COLOR_ATTACHMENT)
    );
    assert_eq!(
        layout_of::<A2b10g10r10UnormPack32, usage::Storage>(),
        (U32, 1, ldst),
        "one packed word"
    );
    assert_eq!(layout_of::<R16Unorm, usage::Storage>(), (U16, 1, ldst));
    assert_eq!(layout_of::<Rg16Unorm, usage::Storage>(), (U16, 2, ldst));
}

#[test]
fn without_a_driver_pairing_says_what_is_missing() {
    if cuda_interop::sys::Driver::global().is_ok() {
        // On a GPU machine this path is covered by import.rs
        // (a_foreign_uuid_is_refused_before_any_driver_call_and_the_fd_comes_back).
        let err = CudaDevice::for_uuid(vk_export::DeviceUuid::from_bytes([0xab; 16])).unwrap_err();
        assert!(matches!(err, Error::NoMatchingDevice { .. }), "{err}");
        return;
    }
    let err = CudaDevice::for_uuid(vk_export::DeviceUuid::from_bytes([0xab; 16])).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no CUDA driver") && text.contains("libcuda.so.1"),
        "{text}"
    );
}
