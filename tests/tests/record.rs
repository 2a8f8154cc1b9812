//! Records: decoded records that cannot describe a mappable resource, cube
//! descriptions, and records of other types refused when typed. Lavapipe
//! (or NVIDIA), with the validation layer on.
//!
//! Fd checks: some tests compare the fd table or count open fds, which are
//! process-wide, so every test of this binary that is not a `child_*` entry
//! point holds `fds::lock()` for its whole run (a `child_*` test runs alone in
//! a process of its own).

use ash::vk;
use cuda_interop_testkit::sample::ImageFields;
use cuda_interop_testkit::{assert_no_validation_errors, fds, sample, tamper, vulkan, Image, Mem};
use vk_export::format::{R32Sfloat, Rgba8Unorm};
use vk_export::markers::{usage, DeviceLocal, MemoryLocation, Optimal};
use vk_export::wire::{Resource, WireError};
use vk_export::{Error, ImageDesc, ImageInfo};

/// The field the decoder names when it rejects `edit` of an image record's
/// `field`, or `None` if it accepts it.
fn image_rejection(
    info: &ImageInfo,
    field: &str,
    edit: impl FnOnce(&mut [u8]),
) -> Option<&'static str> {
    match tamper::edit(
        Resource::Image(info.clone()),
        tamper::IMAGE_FIELDS,
        field,
        edit,
    )
    .1
    {
        Err(WireError::InvalidValue { field, .. }) => Some(field),
        Err(e) => panic!("{field}: rejected, but not as an invalid value: {e}"),
        Ok(_) => None,
    }
}

/// Cases 6, 11, 15, 16, 19, 22: records that cannot describe a mappable
/// resource never exist: the decoder (the only way a peer's record is
/// made) rejects an allocation of 0 bytes, a buffer larger than its
/// allocation, 0 or too many mip levels, formats outside the whitelist
/// (three channels, sRGB, block-compressed, depth), cubes that are not
/// square or not a multiple of 6 layers, and an offset other than 0.
#[test]
fn records_that_cannot_describe_a_mappable_resource_are_rejected_by_the_decoder() {
    let _fds = fds::lock();
    let image = sample::image();
    let reject = |field: &str, value: u64| image_rejection(&image, field, tamper::set(value));
    // Case 6: size 0.
    assert_eq!(reject("allocation_size", 0), Some("image.allocation_size"));
    let buffer = sample::buffer();
    for (field, value, named) in [
        ("allocation_size", 0, "buffer.allocation_size"),
        ("size", 0, "buffer.size"),
        // Case 11: a buffer larger than its allocation.
        ("size", 4097, "buffer.allocation_size"),
    ] {
        let decoded = tamper::edit(
            Resource::Buffer(buffer.clone()),
            tamper::BUFFER_FIELDS,
            field,
            tamper::set(value),
        )
        .1;
        assert!(
            matches!(decoded, Err(WireError::InvalidValue { field: f, .. }) if f == named),
            "buffer {field} = {value}: {decoded:?}"
        );
    }
    // Case 15: 0 levels, and one more than 1920 allows (1 + floor(log2) = 11).
    assert_eq!(reject("mip_levels", 0), Some("image.mip_levels"));
    assert_eq!(reject("mip_levels", 12), Some("image.mip_levels"));
    assert_eq!(reject("mip_levels", 11), None, "11 levels fit 1920 wide");
    // Case 16: formats outside the whitelist.
    for format in [
        vk::Format::R8G8B8_UNORM,
        vk::Format::R8G8B8A8_SNORM,
        vk::Format::BC1_RGBA_UNORM_BLOCK,
        vk::Format::D32_SFLOAT,
        vk::Format::R32G32B32_SFLOAT,
    ] {
        assert_eq!(
            reject("format", format.as_raw() as u64),
            Some("image.format"),
            "{format:?}"
        );
    }
    // Case 22: a non-zero offset.
    assert_eq!(reject("offset", 4096), Some("image.offset"));
    // Case 19: a cube that is not square, and one of 7 layers.
    let cube = vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw() as u64;
    assert_eq!(reject("flags", cube), Some("image.array_layers"));
    let square = ImageFields {
        format: vk::Format::R8G8B8A8_UNORM.as_raw() as u32,
        image_type: 1,
        extent: [64, 64, 1],
        mip_levels: 1,
        array_layers: 6,
        flags: vk::ImageCreateFlags::CUBE_COMPATIBLE.as_raw(),
        tiling: 0,
        usage: 0xf,
        allocation_size: 1 << 20,
        memory_type_index: 0,
        memory_flags: 1,
    }
    .decode();
    assert_eq!(
        image_rejection(&square, "array_layers", tamper::set(7)),
        Some("image.array_layers")
    );
    assert_eq!(
        image_rejection(&square, "array_layers", tamper::set(12)),
        None,
        "two cubes"
    );
}

/// Case 19: cube descriptions that are not square, not a multiple of 6
/// layers or 3D are refused before anything is created (the preflight and
/// the constructor agree, and the layer sees no Vulkan call to complain of).
#[test]
fn cube_descriptions_are_refused_before_anything_is_created() {
    let _fds = fds::lock();
    let ctx = vulkan(None);
    for desc in [
        ImageDesc::new_2d(16, 8).cube(6),
        ImageDesc::new_2d(16, 16).cube(7),
        ImageDesc::new_2d(16, 16).cube(0),
        ImageDesc::new_3d(16, 16, 6).cube(6),
    ] {
        let err = Image::new(&ctx, desc).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{desc:?}: {err}");
        let again = Image::preflight(&ctx, &desc).unwrap_err();
        assert_eq!(again.to_string(), err.to_string());
        println!("{desc:?}: {err}");
    }
    let ok = Image::new(&ctx, ImageDesc::new_2d(16, 16).cube(12)).unwrap();
    assert!(ok.info().is_cube());
    assert_no_validation_errors(&ctx);
}

#[test]
fn records_of_other_types_are_rejected_when_typed() {
    let _fds = fds::lock();
    let a = vulkan(None);
    let image = Image::new(&a, ImageDesc::new_2d(16, 16)).unwrap();
    let err = image
        .info()
        .clone()
        .typed::<R32Sfloat, Optimal, Mem, usage::Storage>()
        .unwrap_err();
    assert!(err.to_string().contains("R32_SFLOAT"), "{err}");
    let err = image
        .info()
        .clone()
        .typed::<Rgba8Unorm, Optimal, Mem, usage::Sampled>()
        .unwrap_err();
    assert!(matches!(err, Error::Record(_)), "{err}");
    // A host-visible image's own record is not a DeviceLocal record, also on
    // a driver whose host-visible memory is device-local too (lavapipe).
    println!(
        "the image's memory flags: {:?}",
        image.info().memory_flags()
    );
    // ... and a device-local-only record is not a HostVisible one.
    if DeviceLocal::admits(image.info().memory_flags()) {
        let err = image
            .info()
            .clone()
            .typed::<Rgba8Unorm, Optimal, vk_export::markers::HostVisible, usage::Storage>()
            .unwrap_err();
        println!("{err}");
    } else {
        let err = image
            .info()
            .clone()
            .typed::<Rgba8Unorm, Optimal, DeviceLocal, usage::Storage>()
            .unwrap_err();
        assert!(err.to_string().contains("without"), "{err}");
    }
    assert_no_validation_errors(&a);
}
