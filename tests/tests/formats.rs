//! The image formats end to end (issue 31): every format of
//! `vk_export::format::SUPPORTED` is exported, imported into a second
//! device and read back exactly; what the bytes of the BGRA, sRGB, packed
//! and 16-bit UNORM formats are in memory (what CUDA and DLPack see: memory
//! order, no conversion); storage usage the driver does not grant (the sRGB
//! formats) refused by the preflight, naming the feature. Lavapipe in CI.
//!
//! The tests ignored as "needs an NVIDIA GPU" take the new formats through
//! CUDA (import, map as array, surface or texture, the copies, the bytes of
//! a BGRA texel as a `uchar4`): `cargo test -p cuda-interop-tests --test
//! formats -- --include-ignored`, or the GPU bundle. The others run
//! everywhere (lavapipe has every format here; only storage usage of the two
//! sRGB formats is refused, as on NVIDIA).

use ash::vk;
use cuda_interop_testkit::{assert_no_validation_errors, pattern, vulkan, Mem};
use vk_export::format::*;
use vk_export::markers::{usage, Optimal, Usage};
use vk_export::{Context, Error, ExportableImage, ImageDesc, SubmitSync};

/// Calls `$m!(Format, Usage)` for every format of `SUPPORTED`, with a usage
/// the format's features grant on lavapipe and NVIDIA (storage, but colour
/// attachment for sRGB); yields how many.
macro_rules! every_format {
    ($m:ident) => {{
        $m!(R8Unorm, usage::Storage);
        $m!(Rg8Unorm, usage::Storage);
        $m!(Rgba8Unorm, usage::Storage);
        $m!(Rgba8Uint, usage::Storage);
        $m!(Rgba8Srgb, usage::ColorAttachment);
        $m!(Bgra8Unorm, usage::Storage);
        $m!(Bgra8Srgb, usage::ColorAttachment);
        $m!(A2b10g10r10UnormPack32, usage::Storage);
        $m!(R16Unorm, usage::Storage);
        $m!(Rg16Unorm, usage::Storage);
        $m!(R16Sfloat, usage::Storage);
        $m!(Rgba16Sfloat, usage::Storage);
        $m!(Rgba16Uint, usage::Storage);
        $m!(R32Uint, usage::Storage);
        $m!(R32Sfloat, usage::Storage);
        $m!(Rg32Sfloat, usage::Storage);
        $m!(Rgba32Sfloat, usage::Storage);
        17
    }};
}

/// Writes a pattern into a `F` image on `a`, imports it into `b` and reads
/// it back there: the same bytes.
fn exported_and_read_back<F: Format, U: Usage>(a: &Context, b: &Context) {
    let (w, h) = (19u32, 7u32);
    let image = ExportableImage::<F, Optimal, Mem, U>::new(a, ImageDesc::new_2d(w, h))
        .unwrap_or_else(|e| panic!("{}: {e}", F::NAME));
    assert_eq!(image.info().format(), F::VK);
    let data = pattern((w * h * F::TEXEL_BYTES) as usize, F::VK.as_raw() as u32);
    a.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    let imported = ExportableImage::<F, Optimal, Mem, U>::import_from(b, &image)
        .unwrap_or_else(|e| panic!("{}: import: {e}", F::NAME));
    let got = b.read_image(&imported, 0, 0, SubmitSync::new()).unwrap();
    assert!(got == data, "{}: other bytes after the import", F::NAME);
}

#[test]
fn every_supported_format_is_exported_imported_and_read_back_exactly() {
    let (a, b) = (vulkan(None), vulkan(None));
    let mut names = Vec::new();
    macro_rules! each {
        ($f:ty, $u:ty) => {
            exported_and_read_back::<$f, $u>(&a, &b);
            names.push(<$f>::NAME);
        };
    }
    let n = every_format!(each);
    assert_eq!(n, SUPPORTED.len(), "every_format! lists every format");
    for (_, name, _, _) in SUPPORTED {
        assert!(names.contains(name), "{name} was not tested");
    }
    assert_no_validation_errors(&a);
    assert_no_validation_errors(&b);
}

/// The first texel's bytes after Vulkan clears a 4x4 `F` image to `color`.
fn cleared_texel<F: Format, U: Usage>(ctx: &Context, color: [f32; 4]) -> Vec<u8> {
    let image = ExportableImage::<F, Optimal, Mem, U>::new(ctx, ImageDesc::new_2d(4, 4)).unwrap();
    ctx.clear_image(
        &image,
        vk::ClearColorValue { float32: color },
        SubmitSync::new(),
    )
    .unwrap();
    let bytes = ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap();
    let texel = F::TEXEL_BYTES as usize;
    assert!(
        bytes.chunks_exact(texel).all(|t| t == &bytes[..texel]),
        "{}: a uniform clear",
        F::NAME
    );
    bytes[..texel].to_vec()
}

/// BGRA arrives as B, G, R, A bytes: channel 0 (what CUDA's `uchar4.x` and
/// DLPack's `[..., 0]` read) is blue. The bytes CUDA maps are these bytes
/// (`map_array` is zero copy; `cuda_reads_a_bgra_texel_as_blue_green_red_alpha`
/// checks on a GPU).
#[test]
fn bgra8_texels_are_blue_green_red_alpha_in_memory() {
    let ctx = vulkan(None);
    // 128/255, not 0.5: 127.5 may round either way (NVIDIA 580 stores
    // 127, lavapipe 128; GPU run 23).
    let orange = [1.0, 128.0 / 255.0, 0.0, 1.0];
    assert_eq!(
        cleared_texel::<Rgba8Unorm, usage::Storage>(&ctx, orange),
        [255, 128, 0, 255]
    );
    assert_eq!(
        cleared_texel::<Bgra8Unorm, usage::Storage>(&ctx, orange),
        [0, 128, 255, 255],
        "B, G, R, A"
    );
    let srgb = cleared_texel::<Bgra8Srgb, usage::ColorAttachment>(&ctx, orange);
    assert_eq!((srgb[0], srgb[2], srgb[3]), (0, 255, 255), "B, G, R, A");
    assert_no_validation_errors(&ctx);
}

/// An sRGB image holds the encoded bytes: a clear to linear 0.5 stores
/// sRGB's 188 (not 128), and bytes written are read back unchanged (the
/// copies, as CUDA's mapping, never convert).
#[test]
fn srgb_texels_are_the_encoded_bytes() {
    let ctx = vulkan(None);
    let half = [0.5, 0.5, 0.5, 0.5];
    let unorm = cleared_texel::<Rgba8Unorm, usage::Storage>(&ctx, half);
    let srgb = cleared_texel::<Rgba8Srgb, usage::ColorAttachment>(&ctx, half);
    assert!(
        unorm[..3].iter().all(|b| (127..=128).contains(b)),
        "{unorm:?}"
    );
    assert!(
        srgb[..3].iter().all(|b| (187..=188).contains(b)),
        "sRGB-encoded 0.5 is 188: {srgb:?}"
    );
    assert!((127..=128).contains(&srgb[3]), "alpha is linear: {srgb:?}");
    let image = ExportableImage::<Rgba8Srgb, Optimal, Mem, usage::Sampled>::new(
        &ctx,
        ImageDesc::new_2d(8, 8),
    )
    .unwrap();
    let data = pattern(8 * 8 * 4, 31);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    assert!(ctx.read_image(&image, 0, 0, SubmitSync::new()).unwrap() == data);
    assert_no_validation_errors(&ctx);
}

/// A2B10G10R10 is one little-endian word: bits 0-9 R, 10-19 G, 20-29 B,
/// 30-31 A.
#[test]
fn a2b10g10r10_is_one_packed_word_red_in_the_low_bits() {
    let ctx = vulkan(None);
    let word = |color| {
        let t = cleared_texel::<A2b10g10r10UnormPack32, usage::Storage>(&ctx, color);
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    };
    assert_eq!(word([1.0, 0.0, 0.0, 0.0]), 0x0000_03ff, "R");
    assert_eq!(word([0.0, 1.0, 0.0, 0.0]), 0x000f_fc00, "G");
    assert_eq!(word([0.0, 0.0, 1.0, 0.0]), 0x3ff0_0000, "B");
    assert_eq!(word([0.0, 0.0, 0.0, 1.0]), 0xc000_0000, "A");
    assert_no_validation_errors(&ctx);
}

/// R16 and R16G16 UNORM are unsigned 16-bit integers (65535 for 1.0),
/// little-endian, R first.
#[test]
fn r16_and_r16g16_unorm_are_little_endian_u16_channels() {
    let ctx = vulkan(None);
    assert_eq!(
        cleared_texel::<R16Unorm, usage::Storage>(&ctx, [1.0, 0.0, 0.0, 0.0]),
        [0xff, 0xff]
    );
    assert_eq!(
        cleared_texel::<Rg16Unorm, usage::Storage>(&ctx, [0.0, 1.0, 0.0, 0.0]),
        [0, 0, 0xff, 0xff]
    );
    assert_no_validation_errors(&ctx);
}

/// Storage usage of an sRGB format (no `STORAGE_IMAGE` feature on lavapipe
/// or NVIDIA) is refused before anything is made, naming the feature and
/// the usages to take instead.
#[test]
fn storage_usage_without_the_format_feature_is_refused_naming_it() {
    let ctx = vulkan(None);
    fn refused<F: Format>(ctx: &Context) {
        let desc = ImageDesc::new_2d(16, 16);
        for result in [
            ExportableImage::<F, Optimal, Mem, usage::Storage>::preflight(ctx, &desc).err(),
            ExportableImage::<F, Optimal, Mem, usage::Storage>::new(ctx, desc).err(),
        ] {
            match result {
                Some(Error::Unsupported { reason, .. }) => assert!(
                    reason.contains("without STORAGE_IMAGE")
                        && reason.contains("usage::Sampled or usage::ColorAttachment"),
                    "{}: {reason}",
                    F::NAME
                ),
                other => panic!("{}: {other:?}", F::NAME),
            }
        }
        ExportableImage::<F, Optimal, Mem, usage::Sampled>::new(ctx, ImageDesc::new_2d(16, 16))
            .unwrap();
    }
    refused::<Rgba8Srgb>(&ctx);
    refused::<Bgra8Srgb>(&ctx);
    assert_no_validation_errors(&ctx);
}

/// On the GPU: each new format imported into CUDA, mapped as an array,
/// read exactly, with a texture always and a surface with storage usage;
/// the copy kernel (4-byte texels with storage) or the driver (sRGB
/// without storage, 2-byte R16) copies it to linear memory exactly.
mod gpu {
    use super::*;
    use cuda_interop::{CopyEngine, DeviceBuffer, PitchedMut, Stream};
    use cuda_interop_testkit::gpu::pair;
    use cuda_interop_testkit::{fds, TIMEOUT};
    use vk_export::markers::DeviceLocal;

    fn through_cuda<F: Format, U: Usage>(
        ctx: &Context,
        cuda: &cuda_interop::CudaDevice,
        engine: CopyEngine,
    ) {
        let (w, h) = (100u32, 30u32);
        let image =
            ExportableImage::<F, Optimal, DeviceLocal, U>::new(ctx, ImageDesc::new_2d(w, h))
                .unwrap_or_else(|e| panic!("{}: {e}", F::NAME));
        let data = pattern((w * h * F::TEXEL_BYTES) as usize, 7 + F::VK.as_raw() as u32);
        ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
            .unwrap();
        ctx.release_image(&image, SubmitSync::new()).unwrap();
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(0).unwrap();
        let stream = Stream::new(cuda).unwrap();
        let mut out = vec![0u8; level.byte_len().unwrap()];
        level.copy_to_host(&stream, &mut out).unwrap();
        assert!(out == data, "{}: CUDA read other bytes", F::NAME);
        drop(level.texture().unwrap());
        let mut linear = DeviceBuffer::new(cuda, data.len()).unwrap();
        let used = level
            .enqueue_copy_to(&stream, PitchedMut::buffer(&mut linear))
            .unwrap();
        assert_eq!(used, engine, "{}", F::NAME);
        stream.synchronize(TIMEOUT).unwrap();
        let mut got = vec![0u8; data.len()];
        stream.copy_to_host(&linear, &mut got).unwrap();
        assert!(got == data, "{}: the copy to linear memory", F::NAME);
        println!("{}: CUDA read, texture, copy ({used:?}) exact", F::NAME);
    }

    fn with_surface<F: Format>(ctx: &Context, cuda: &cuda_interop::CudaDevice) {
        through_cuda::<F, usage::Storage>(ctx, cuda, CopyEngine::Kernel);
        let image = ExportableImage::<F, Optimal, DeviceLocal, usage::Storage>::new(
            ctx,
            ImageDesc::new_2d(8, 8),
        )
        .unwrap();
        ctx.release_image(&image, SubmitSync::new()).unwrap();
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(0).unwrap();
        drop(
            level
                .surface()
                .unwrap_or_else(|e| panic!("{}: surface: {e}", F::NAME)),
        );
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test formats -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
    fn the_new_formats_go_through_cuda_exactly() {
        let _fds = fds::lock();
        let (ctx, cuda) = pair();
        with_surface::<Bgra8Unorm>(&ctx, &cuda);
        with_surface::<A2b10g10r10UnormPack32>(&ctx, &cuda);
        with_surface::<Rg16Unorm>(&ctx, &cuda);
        through_cuda::<R16Unorm, usage::Storage>(&ctx, &cuda, CopyEngine::Driver);
        through_cuda::<Rgba8Srgb, usage::ColorAttachment>(&ctx, &cuda, CopyEngine::Driver);
        through_cuda::<Bgra8Srgb, usage::Sampled>(&ctx, &cuda, CopyEngine::Driver);
        assert_no_validation_errors(&ctx);
    }

    /// A BGRA texel cleared to orange by Vulkan reads in CUDA as the bytes
    /// 0, 128, 255, 255: channel 0 is blue.
    #[test]
    #[ignore = "needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test formats -- --ignored, or cargo xtask gpu-bundle then bash .gpu/bundle/run.sh there"]
    fn cuda_reads_a_bgra_texel_as_blue_green_red_alpha() {
        let _fds = fds::lock();
        let (ctx, cuda) = pair();
        let image = ExportableImage::<Bgra8Unorm>::new(&ctx, ImageDesc::new_2d(4, 4)).unwrap();
        let orange = vk::ClearColorValue {
            // 128/255: exact in UNORM8 (0.5 may round to 127 or 128).
            float32: [1.0, 128.0 / 255.0, 0.0, 1.0],
        };
        ctx.clear_image(&image, orange, SubmitSync::new()).unwrap();
        ctx.release_image(&image, SubmitSync::new()).unwrap();
        let imported = cuda.import_image(&image).unwrap();
        let array = imported.map_array().unwrap();
        let level = array.level(0).unwrap();
        let stream = Stream::new(&cuda).unwrap();
        let mut out = vec![0u8; level.byte_len().unwrap()];
        level.copy_to_host(&stream, &mut out).unwrap();
        assert_eq!(&out[..4], &[0, 128, 255, 255]);
        assert_no_validation_errors(&ctx);
    }
}
