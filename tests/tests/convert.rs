//! Colour conversion (`cuda-interop/src/convert.rs`): the CPU reference
//! (`cuda_interop_testkit::yuv`) against FFmpeg's libswscale on checked-in
//! fixtures; the checks, launches and tracking against the fake driver; the
//! kernels against the CPU reference, and their bandwidth, on the real driver.
//!
//! The tests ignored as "GPU: ..." need the real CUDA driver; on the GPU
//! machine: `cargo test -p cuda-interop-tests --test convert -- --ignored
//! --skip child_ --nocapture`. The others run everywhere.
//!
//! `child_*` tests are entry points of child processes, run by their parent
//! test of this binary by exact name (`cuda_interop_testkit::child`) with the
//! testkit's fake `libcuda.so.1`; they fail when run by hand.
//!
//! Fd checks: every test of this binary that is not a `child_*` entry point
//! holds `fds::lock()` for its whole run, as the other binaries do.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_interop::convert::{
    Matrix, Planar, PlanarMut, Range, RgbaFormat, RgbaImage, RgbaImageMut, Yuv420,
};
use cuda_interop::{CudaDevice, DeviceBuffer, Error as CudaError, Pitched, PitchedMut, Stream};
use cuda_interop_testkit::yuv::{self, Frame};
use cuda_interop_testkit::{fake, fds, pattern, TIMEOUT};
use vk_export::format::{Bgra8Unorm, Rgba16Sfloat, Rgba8Unorm};
use vk_export::markers::usage;

const W: usize = 32;
const H: usize = 16;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/convert")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn matrix_name(m: Matrix) -> &'static str {
    match m {
        Matrix::Bt601 => "bt601",
        Matrix::Bt709 => "bt709",
        Matrix::Bt2020 => "bt2020",
    }
}

fn range_name(r: Range) -> &'static str {
    match r {
        Range::Limited => "limited",
        Range::Full => "full",
    }
}

fn format_name(f: Yuv420) -> &'static str {
    match f {
        Yuv420::Nv12 => "nv12",
        Yuv420::P010 => "p010",
    }
}

/// The conversion accuracy table: the CPU reference within one code value
/// of FFmpeg 5.1's libswscale (fixtures made by
/// `tests/fixtures/convert/make.sh`) for every sample, in every case:
/// RGBA8 to NV12 and P010 (luma and chroma codes), NV12 and P010 to RGBA8
/// (R, G, B bytes), for each matrix and range. Prints the table
/// (docs/conversion.md has a copy).
#[test]
fn the_cpu_reference_is_within_one_code_value_of_ffmpeg() {
    let _fds = fds::lock();
    let rgb = yuv::from_rgba8(&fixture("rgba.raw"), false);
    let mut rows = Vec::new();
    let mut worst = 0;
    for format in Yuv420::ALL {
        for matrix in Matrix::ALL {
            for range in Range::ALL {
                let (f, m, r) = (format_name(format), matrix_name(matrix), range_name(range));
                let ours = yuv::to_yuv420(&rgb, W, H, format, matrix, range);
                let theirs =
                    Frame::from_bytes(format, W, H, &fixture(&format!("to_{f}_{m}_{r}.yuv")));
                let codes = |fr: &Frame| -> Vec<i64> {
                    fr.luma
                        .iter()
                        .chain(&fr.chroma)
                        .map(|&c| i64::from(c))
                        .collect()
                };
                let (max, mean) = yuv::diff(codes(&ours), codes(&theirs));
                rows.push(format!("| RGBA8 -> {f} | {m} | {r} | {max} | {mean:.4} |"));
                worst = worst.max(max);
                assert!(max <= 1, "RGBA8 -> {f} {m} {r}: {max} codes from FFmpeg");

                let input = Frame::from_bytes(format, W, H, &fixture(&format!("{f}_{r}.yuv")));
                let back = yuv::to_rgba8(
                    &yuv::from_yuv420(&input, W, H, format, matrix, range),
                    false,
                );
                let theirs = fixture(&format!("from_{f}_{m}_{r}.rgba"));
                let rgb_only = |b: &[u8]| -> Vec<i64> {
                    b.chunks_exact(4)
                        .flat_map(|p| p[..3].iter().map(|&v| i64::from(v)))
                        .collect()
                };
                let (max, mean) = yuv::diff(rgb_only(&back), rgb_only(&theirs));
                rows.push(format!("| {f} -> RGBA8 | {m} | {r} | {max} | {mean:.4} |"));
                worst = worst.max(max);
                assert!(max <= 1, "{f} -> RGBA8 {m} {r}: {max} codes from FFmpeg");
            }
        }
    }
    println!("conversion accuracy table (CPU reference vs FFmpeg 5.1 libswscale, {W}x{H} fixtures; codes of the output):");
    println!("| conversion | matrix | range | max abs diff | mean abs diff |");
    println!("|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    println!("worst: {worst} code value(s)");
}

// ---- Against the fake driver ----

/// Conversions against the fake driver: every refusal (odd, zero or
/// mismatched sizes, a pitch under a row, a chroma plane over the luma plane
/// or past the end of its memory, an odd P010 pitch, a misaligned or short
/// pitched RGB image, a buffer or stream of another device, a 3-D image's
/// level) happens before any driver call; a conversion launches the kernel
/// named after its formats with the grid, block and parameters of
/// `convert.cu` (module loaded once, surface of the level's copies reused);
/// it returns before the kernel completes and the destination's drop waits
/// for it; the module is unloaded with the device.
#[test]
fn conversions_are_checked_launched_and_tracked() {
    let _fds = fds::lock();
    fake::run("child_fake_conversions", fake::Variant::Full);
}

#[test]
#[ignore = "entry point of a child process of convert.rs, with a fake libcuda: run by conversions_are_checked_launched_and_tracked"]
fn child_fake_conversions() {
    let fake = fake::Fake::open();
    let other_uuid = vk_export::DeviceUuid::from_bytes([8; 16]);
    fake.set_devices(&[fake::UUID, other_uuid]);
    let cuda = CudaDevice::for_uuid(fake::UUID).unwrap();
    let other = CudaDevice::for_uuid(other_uuid).unwrap();
    let errors = cuda_interop::drop_errors();
    let stream = Stream::new(&cuda).unwrap();
    let storage = fake::image::<Rgba8Unorm, usage::Storage>([64, 32, 1], 1, 1, false);
    // SAFETY: the driver is the fake: it records, holds the fd, and nothing
    // reads or writes memory through the import.
    let imported = unsafe { cuda.import_image_fd(storage, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let volume = fake::image::<Rgba8Unorm, usage::Storage>([64, 64, 2], 2, 1, false);
    // SAFETY: as above.
    let imported_volume = unsafe { cuda.import_image_fd(volume, fake::some_fd()) }
        .map_err(|e| e.error)
        .unwrap();
    let array_volume = imported_volume.map_array().unwrap();
    let level_volume = array_volume.level(1).unwrap();
    let (w, h) = (64u32, 32u32);
    let nv12_len = (w * h * 3 / 2) as usize;
    let mut nv12 = DeviceBuffer::new(&cuda, nv12_len).unwrap();
    let mut p010 = DeviceBuffer::new(&cuda, 2 * nv12_len).unwrap();
    let short = DeviceBuffer::new(&cuda, nv12_len - 1).unwrap();
    let mut elsewhere = DeviceBuffer::new(&other, nv12_len).unwrap();
    let stream_elsewhere = Stream::new(&other).unwrap();
    let rgba = DeviceBuffer::new(&cuda, (w * h * 4) as usize).unwrap();
    let mut bgra_out = DeviceBuffer::new(&cuda, (w * h * 4) as usize).unwrap();
    let source = RgbaImage::level(&level).unwrap();

    // Refused before the driver.
    let before = fake.log().len();
    let invalid: Vec<(&str, CudaError)> = vec![
        (
            "odd width",
            PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, 63, 32).unwrap_err(),
        ),
        (
            "odd height",
            PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, 64, 31).unwrap_err(),
        ),
        (
            "zero size",
            PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, 0, 32).unwrap_err(),
        ),
        (
            "pitch under a row",
            PlanarMut::new(
                PitchedMut::buffer(&mut nv12).with_row_pitch(62),
                Yuv420::Nv12,
                64,
                32,
            )
            .unwrap_err(),
        ),
        (
            "chroma plane over the luma plane",
            PlanarMut::with_chroma_offset(
                PitchedMut::buffer(&mut nv12),
                Yuv420::Nv12,
                64,
                32,
                64 * 32 - 1,
            )
            .unwrap_err(),
        ),
        (
            "chroma plane one byte past the end",
            Planar::new(Pitched::buffer(&short), Yuv420::Nv12, 64, 32).unwrap_err(),
        ),
        (
            "odd P010 pitch",
            PlanarMut::new(
                PitchedMut::buffer(&mut p010).with_row_pitch(129),
                Yuv420::P010,
                64,
                16,
            )
            .unwrap_err(),
        ),
        (
            "RGB pitch under a row",
            RgbaImage::<Rgba8Unorm>::pitched(Pitched::buffer(&rgba).with_row_pitch(252), 64, 32)
                .unwrap_err(),
        ),
        (
            "RGB pitch no multiple of the texel",
            RgbaImage::<Rgba8Unorm>::pitched(Pitched::buffer(&rgba).with_row_pitch(258), 64, 16)
                .unwrap_err(),
        ),
        (
            "RGB memory one row short",
            RgbaImage::<Rgba16Sfloat>::pitched(Pitched::buffer(&rgba), 64, 32).unwrap_err(),
        ),
        (
            "sizes differ",
            stream
                .enqueue_rgba_to_yuv(
                    source,
                    PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, 64, 30).unwrap(),
                    Matrix::Bt709,
                    Range::Limited,
                )
                .unwrap_err(),
        ),
    ];
    for (what, err) in invalid {
        assert!(
            matches!(err, CudaError::InvalidArgument(_)),
            "{what}: {err}"
        );
        println!("{what}: {err}");
    }
    for (what, err) in [
        (
            "a frame of another device",
            stream
                .enqueue_rgba_to_yuv(
                    source,
                    PlanarMut::new(PitchedMut::buffer(&mut elsewhere), Yuv420::Nv12, w, h).unwrap(),
                    Matrix::Bt709,
                    Range::Limited,
                )
                .unwrap_err(),
        ),
        (
            "a stream of another device",
            stream_elsewhere
                .enqueue_rgba_to_yuv(
                    source,
                    PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, w, h).unwrap(),
                    Matrix::Bt709,
                    Range::Limited,
                )
                .unwrap_err(),
        ),
    ] {
        assert!(
            matches!(err, CudaError::DeviceMismatch { .. }),
            "{what}: {err}"
        );
    }
    let err = RgbaImage::level(&level_volume).unwrap_err();
    assert!(matches!(err, CudaError::Unsupported(_)), "{err}");
    assert_eq!(fake.log().len(), before, "no driver call for a refusal");

    // The level to NV12: the kernel's name, grid (4 x 2 pixels a thread,
    // 32 x 8 threads a block), parameters; vector stores for aligned planes.
    let surfaces = fake.live("surface");
    stream
        .enqueue_rgba_to_yuv(
            source,
            PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, w, h).unwrap(),
            Matrix::Bt709,
            Range::Limited,
        )
        .unwrap();
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "convert_rgba8_surface_to_nv12");
    assert_eq!((call.get("grid"), call.get("block")), ("1,2,1", "32,8,1"));
    assert_eq!((call.get("surface"), call.get("surface_ok")), ("1", "1"));
    assert_eq!((call.num("a2"), call.num("pitch")), (nv12.device_ptr(), 64));
    assert_eq!(call.num("chroma"), nv12.device_ptr() + 64 * 32);
    assert_eq!((call.num("width"), call.num("height")), (64, 32));
    assert_eq!(
        call.get("flags"),
        if nv12.device_ptr().is_multiple_of(4) {
            "1"
        } else {
            "0"
        }
    );
    assert_eq!(
        (call.get("m0"), call.get("off0"), call.get("off1")),
        ("46.559399", "16.000", "128.000")
    );
    assert_eq!(
        fake.live("surface"),
        surfaces,
        "the level's copy surface, made above"
    );

    // P010 (pitched, odd chroma offset in samples: no vector stores) to a
    // pitched BGRA8 image.
    let p010_src = Planar::with_chroma_offset(
        Pitched::buffer(&p010).with_row_pitch(130),
        Yuv420::P010,
        64,
        16,
        130 * 16 + 2,
    )
    .unwrap();
    stream
        .enqueue_yuv_to_rgba(
            p010_src,
            RgbaImageMut::<Bgra8Unorm>::pitched(PitchedMut::buffer(&mut bgra_out), 64, 16).unwrap(),
            Matrix::Bt2020,
            Range::Full,
        )
        .unwrap();
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "convert_p010_to_bgra8_pitched");
    assert_eq!((call.get("grid"), call.get("surface")), ("1,1,1", "0"));
    assert_eq!(
        (call.num("a0"), call.num("a1"), call.num("a2")),
        (p010.device_ptr(), 130, bgra_out.device_ptr())
    );
    assert_eq!(
        (call.num("pitch"), call.num("chroma")),
        (256, p010.device_ptr() + 130 * 16 + 2)
    );
    assert_eq!(call.get("flags"), "0");
    assert_eq!((call.get("off0"), call.get("off1")), ("0.000", "512.000"));
    // Half floats into a level-sized NV12 frame from pitched memory; then
    // the level as a destination.
    let half_src = DeviceBuffer::new(&cuda, (w * h * 8) as usize).unwrap();
    stream
        .enqueue_rgba_to_yuv(
            RgbaImage::<Rgba16Sfloat>::pitched(Pitched::buffer(&half_src), w, h).unwrap(),
            PlanarMut::new(PitchedMut::buffer(&mut nv12), Yuv420::Nv12, w, h).unwrap(),
            Matrix::Bt601,
            Range::Full,
        )
        .unwrap();
    assert_eq!(
        fake.last("cuLaunchKernel").get("kernel"),
        "convert_rgba16f_pitched_to_nv12"
    );
    stream
        .enqueue_yuv_to_rgba(
            Planar::new(Pitched::buffer(&nv12), Yuv420::Nv12, w, h).unwrap(),
            RgbaImageMut::level(&level).unwrap(),
            Matrix::Bt601,
            Range::Limited,
        )
        .unwrap();
    let call = fake.last("cuLaunchKernel");
    assert_eq!(call.get("kernel"), "convert_nv12_to_rgba8_surface");
    assert_eq!(call.get("surface_ok"), "1");
    let loads: Vec<_> = fake.calls("cuModuleLoadData");
    assert_eq!(loads.len(), 1, "loaded once");
    stream.synchronize(TIMEOUT).unwrap();

    // Nothing waits for the kernel; the destination's drop does.
    let pending = Duration::from_millis(300);
    fake.set("latency_ms", pending.as_millis() as i64);
    let mut destination = DeviceBuffer::new(&cuda, nv12_len).unwrap();
    let start = Instant::now();
    stream
        .enqueue_rgba_to_yuv(
            RgbaImage::level(&level).unwrap(),
            PlanarMut::new(PitchedMut::buffer(&mut destination), Yuv420::Nv12, w, h).unwrap(),
            Matrix::Bt709,
            Range::Limited,
        )
        .unwrap();
    let enqueued = start.elapsed();
    assert!(enqueued < Duration::from_millis(100), "{enqueued:?}");
    assert!(!stream.query().unwrap(), "the conversion is still pending");
    let start = Instant::now();
    drop(destination);
    let took = start.elapsed();
    println!("conversion enqueued in {enqueued:?}; its destination dropped in {took:?}");
    assert!(took >= pending - Duration::from_millis(50), "{took:?}");
    assert_eq!(fake.last("cuMemFree").get("busy_streams"), "0");
    fake.set("latency_ms", 0);

    drop((array_volume, array));
    drop((imported_volume, imported));
    drop((nv12, p010, short, elsewhere, rgba, bgra_out, half_src));
    drop((stream_elsewhere, other, stream));
    assert!(fake.calls("cuModuleUnload").is_empty(), "the device lives");
    drop(cuda);
    assert_eq!(
        fake.calls("cuModuleUnload").len(),
        1,
        "unloaded with the device"
    );
    assert_eq!(cuda_interop::drop_errors(), errors, "no destroy failed");
    assert!(!fake.log().contains("error="), "{}", fake.log());
    assert_eq!(fake.all_live(), []);
}

// ---- On the GPU ----

/// An RGB(A) format's texels from R'G'B' in [0, 1] and back, for the
/// reference.
trait Texels: RgbaFormat {
    fn encode(rgb: &[[f64; 3]]) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Vec<[f64; 3]>;
    /// The output's codes, for the one-code-value comparison (bytes, or half
    /// bits: one code value is one unit in the last place of a half).
    fn codes(bytes: &[u8]) -> Vec<i64>;
}

impl Texels for Rgba8Unorm {
    fn encode(rgb: &[[f64; 3]]) -> Vec<u8> {
        yuv::to_rgba8(rgb, false)
    }
    fn decode(bytes: &[u8]) -> Vec<[f64; 3]> {
        yuv::from_rgba8(bytes, false)
    }
    fn codes(bytes: &[u8]) -> Vec<i64> {
        bytes.iter().map(|&b| i64::from(b)).collect()
    }
}

impl Texels for Bgra8Unorm {
    fn encode(rgb: &[[f64; 3]]) -> Vec<u8> {
        yuv::to_rgba8(rgb, true)
    }
    fn decode(bytes: &[u8]) -> Vec<[f64; 3]> {
        yuv::from_rgba8(bytes, true)
    }
    fn codes(bytes: &[u8]) -> Vec<i64> {
        bytes.iter().map(|&b| i64::from(b)).collect()
    }
}

impl Texels for Rgba16Sfloat {
    fn encode(rgb: &[[f64; 3]]) -> Vec<u8> {
        rgb.iter()
            .flat_map(|p| {
                let [r, g, b] = p.map(|v| yuv::f32_to_half(v as f32));
                [r, g, b, 0x3c00].into_iter().flat_map(u16::to_le_bytes)
            })
            .collect()
    }
    fn decode(bytes: &[u8]) -> Vec<[f64; 3]> {
        yuv::from_rgba16f(bytes)
    }
    fn codes(bytes: &[u8]) -> Vec<i64> {
        bytes
            .chunks_exact(2)
            .map(|w| i64::from(u16::from_le_bytes([w[0], w[1]])))
            .collect()
    }
}

/// A pseudo-random image with the corners of the cube, some out-of-range
/// half floats (negative, above 1, NaN, which the kernels clamp).
fn test_image<F: Texels>(w: usize, h: usize, seed: u32) -> Vec<u8> {
    let noise = pattern(w * h * 3, seed);
    let rgb: Vec<[f64; 3]> = (0..w * h)
        .map(|i| {
            if i < 8 {
                [(i & 1) as f64, ((i >> 1) & 1) as f64, ((i >> 2) & 1) as f64]
            } else {
                [0, 1, 2].map(|c| f64::from(noise[3 * i + c]) / 255.0)
            }
        })
        .collect();
    let mut bytes = F::encode(&rgb);
    if F::TEXEL_BYTES == 8 {
        for (i, bits) in [(8usize, 0xbc00u16), (9, 0x4000), (10, 0x7e00)] {
            bytes[i * 8..i * 8 + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }
    bytes
}

/// Puts tight rows of `row` bytes `pitch` apart (gaps `0xab`).
fn spread(tight: &[u8], row: usize, pitch: usize) -> Vec<u8> {
    let rows = tight.len() / row;
    let mut out = vec![0xab; pitch * rows];
    for (r, chunk) in tight.chunks_exact(row).enumerate() {
        out[r * pitch..r * pitch + row].copy_from_slice(chunk);
    }
    out
}

/// Tight rows of `row` bytes from rows `pitch` apart.
fn gather(spread: &[u8], row: usize, pitch: usize, rows: usize) -> Vec<u8> {
    (0..rows)
        .flat_map(|r| spread[r * pitch..r * pitch + row].iter().copied())
        .collect()
}

/// A frame's bytes laid out with `pitch` and `chroma_offset`, and back.
fn frame_layout(
    tight: &[u8],
    format: Yuv420,
    w: usize,
    h: usize,
    pitch: usize,
    offset: usize,
) -> Vec<u8> {
    let row = w * format.sample_bytes() as usize;
    let (luma, chroma) = tight.split_at(row * h);
    let mut out = spread(luma, row, pitch);
    out.resize(offset, 0xcd);
    out.extend(spread(chroma, row, pitch));
    out
}

fn frame_from_layout(
    bytes: &[u8],
    format: Yuv420,
    w: usize,
    h: usize,
    pitch: usize,
    offset: usize,
) -> Frame {
    let row = w * format.sample_bytes() as usize;
    let mut tight = gather(bytes, row, pitch, h);
    tight.extend(gather(&bytes[offset..], row, pitch, h / 2));
    Frame::from_bytes(format, w, h, &tight)
}

/// Every conversion of `F` through pitched memory of `w x h` (both layouts
/// of the planes: aligned to four samples, and not), for every matrix,
/// range and 4:2:0 format, both ways, against the CPU reference: within one
/// code value.
fn pitched_conversions_match<F: Texels>(cuda: &CudaDevice, w: usize, h: usize) -> Vec<String> {
    let stream = Stream::new(cuda).unwrap();
    let texel = F::TEXEL_BYTES as usize;
    let image = test_image::<F>(w, h, w as u32 ^ F::VK.as_raw() as u32);
    let rgb_pitch = (w * texel).next_multiple_of(256) + texel;
    let mut rgb_buffer = DeviceBuffer::new(cuda, rgb_pitch * h).unwrap();
    stream
        .copy_from_host(&spread(&image, w * texel, rgb_pitch), &mut rgb_buffer)
        .unwrap();
    let reference_rgb = F::decode(&image);
    let mut lines = Vec::new();
    for format in Yuv420::ALL {
        let sb = format.sample_bytes() as usize;
        // Aligned (vector path), then odd (one extra sample of pitch, chroma
        // offset of one sample more: scalar path).
        for (pitch, offset) in [
            (
                (w * sb).next_multiple_of(512),
                (w * sb).next_multiple_of(512) * h,
            ),
            (w * sb + sb, (w * sb + sb) * h + sb),
        ] {
            let len = offset + pitch * (h / 2 - 1) + w * sb;
            let mut frame = DeviceBuffer::new(cuda, len).unwrap();
            for matrix in Matrix::ALL {
                for range in Range::ALL {
                    let case = format!(
                        "{} {w}x{h} -> {format:?} pitch {pitch} chroma at {offset}, {matrix:?} {range:?}",
                        F::NAME
                    );
                    stream
                        .enqueue_rgba_to_yuv(
                            RgbaImage::<F>::pitched(
                                Pitched::buffer(&rgb_buffer).with_row_pitch(rgb_pitch as u64),
                                w as u32,
                                h as u32,
                            )
                            .unwrap(),
                            PlanarMut::with_chroma_offset(
                                PitchedMut::buffer(&mut frame).with_row_pitch(pitch as u64),
                                format,
                                w as u32,
                                h as u32,
                                offset as u64,
                            )
                            .unwrap(),
                            matrix,
                            range,
                        )
                        .unwrap();
                    let mut got = vec![0u8; len];
                    stream.copy_to_host(&frame, &mut got).unwrap();
                    let got = frame_from_layout(&got, format, w, h, pitch, offset);
                    let want = yuv::to_yuv420(&reference_rgb, w, h, format, matrix, range);
                    let codes = |f: &Frame| -> Vec<i64> {
                        f.luma
                            .iter()
                            .chain(&f.chroma)
                            .map(|&c| i64::from(c))
                            .collect()
                    };
                    let (max, mean) = yuv::diff(codes(&got), codes(&want));
                    assert!(max <= 1, "{case}: {max} codes from the reference");
                    lines.push(format!("{case}: max {max} mean {mean:.4}"));

                    // Back: the reference's own frame, laid out the same way.
                    let case = format!(
                        "{format:?} pitch {pitch} chroma at {offset} -> {} {w}x{h}, {matrix:?} {range:?}",
                        F::NAME
                    );
                    let bytes = frame_layout(&want.to_bytes(format), format, w, h, pitch, offset);
                    let mut input = DeviceBuffer::new(cuda, bytes.len()).unwrap();
                    stream.copy_from_host(&bytes, &mut input).unwrap();
                    let mut out = DeviceBuffer::new(cuda, rgb_pitch * h).unwrap();
                    stream
                        .enqueue_yuv_to_rgba(
                            Planar::with_chroma_offset(
                                Pitched::buffer(&input).with_row_pitch(pitch as u64),
                                format,
                                w as u32,
                                h as u32,
                                offset as u64,
                            )
                            .unwrap(),
                            RgbaImageMut::<F>::pitched(
                                PitchedMut::buffer(&mut out).with_row_pitch(rgb_pitch as u64),
                                w as u32,
                                h as u32,
                            )
                            .unwrap(),
                            matrix,
                            range,
                        )
                        .unwrap();
                    let mut got = vec![0u8; rgb_pitch * h];
                    stream.copy_to_host(&out, &mut got).unwrap();
                    let got = gather(&got, w * texel, rgb_pitch, h);
                    let want = F::encode(&yuv::from_yuv420(&want, w, h, format, matrix, range));
                    let (max, mean) = yuv::diff(F::codes(&got), F::codes(&want));
                    assert!(max <= 1, "{case}: {max} codes from the reference");
                    lines.push(format!("{case}: max {max} mean {mean:.4}"));
                }
            }
        }
    }
    lines
}

/// Every kernel through pitched memory, each RGB format, an image whose
/// width is no multiple of 4 (the 2 x 2 tail threads) and one that is:
/// within one code value of the CPU reference.
#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test convert -- --ignored --skip child_"]
fn gpu_pitched_conversions_match_the_cpu_reference() {
    let _fds = fds::lock();
    let (_ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let mut lines = Vec::new();
    for (w, h) in [(70, 34), (256, 64)] {
        lines.extend(pitched_conversions_match::<Rgba8Unorm>(&cuda, w, h));
        lines.extend(pitched_conversions_match::<Bgra8Unorm>(&cuda, w, h));
        lines.extend(pitched_conversions_match::<Rgba16Sfloat>(&cuda, w, h));
    }
    for line in &lines {
        println!("{line}");
    }
    println!(
        "{} GPU conversions within one code value of the CPU reference",
        lines.len()
    );
}

/// Levels (through the surface kernels) of each RGB format, both ways,
/// every matrix and range, NV12 and P010: within one code value of the CPU
/// reference; the level written by a conversion reads back the same from
/// Vulkan.
fn level_conversions_match<F: Texels>(ctx: &vk_export::Context, cuda: &CudaDevice, w: u32, h: u32) {
    use vk_export::{ExportableImage, ImageDesc, SubmitSync};
    let (wu, hu) = (w as usize, h as usize);
    let image = ExportableImage::<F>::new(ctx, ImageDesc::new_2d(w, h)).unwrap();
    let data = test_image::<F>(wu, hu, 77 ^ w);
    ctx.write_image(&image, 0, 0, &data, SubmitSync::new())
        .unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let stream = Stream::new(cuda).unwrap();
    let reference_rgb = F::decode(&data);
    for format in Yuv420::ALL {
        let len = wu * hu * 3 / 2 * format.sample_bytes() as usize;
        let mut frame = DeviceBuffer::new(cuda, len).unwrap();
        for matrix in Matrix::ALL {
            for range in Range::ALL {
                stream
                    .enqueue_rgba_to_yuv(
                        RgbaImage::level(&level).unwrap(),
                        PlanarMut::new(PitchedMut::buffer(&mut frame), format, w, h).unwrap(),
                        matrix,
                        range,
                    )
                    .unwrap();
                let mut got = vec![0u8; len];
                stream.copy_to_host(&frame, &mut got).unwrap();
                let got = Frame::from_bytes(format, wu, hu, &got);
                let want = yuv::to_yuv420(&reference_rgb, wu, hu, format, matrix, range);
                let codes = |f: &Frame| -> Vec<i64> {
                    f.luma
                        .iter()
                        .chain(&f.chroma)
                        .map(|&c| i64::from(c))
                        .collect()
                };
                let (max, mean) = yuv::diff(codes(&got), codes(&want));
                assert!(
                    max <= 1,
                    "level {} -> {format:?} {matrix:?} {range:?}: {max}",
                    F::NAME
                );
                println!(
                    "level {} {w}x{h} -> {format:?} {matrix:?} {range:?}: max {max} mean {mean:.4}",
                    F::NAME
                );
            }
        }
    }
    // Back into the level (the last case of each format), read by CUDA.
    for format in Yuv420::ALL {
        let (matrix, range) = (Matrix::Bt2020, Range::Limited);
        let frame = yuv::to_yuv420(&reference_rgb, wu, hu, format, matrix, range);
        let bytes = frame.to_bytes(format);
        let mut input = DeviceBuffer::new(cuda, bytes.len()).unwrap();
        stream.copy_from_host(&bytes, &mut input).unwrap();
        stream
            .enqueue_yuv_to_rgba(
                Planar::new(Pitched::buffer(&input), format, w, h).unwrap(),
                RgbaImageMut::level(&level).unwrap(),
                matrix,
                range,
            )
            .unwrap();
        stream.synchronize(TIMEOUT).unwrap();
        let mut got = vec![0u8; data.len()];
        level.copy_to_host(&stream, &mut got).unwrap();
        let want = F::encode(&yuv::from_yuv420(&frame, wu, hu, format, matrix, range));
        let (max, mean) = yuv::diff(F::codes(&got), F::codes(&want));
        assert!(max <= 1, "{format:?} -> level {}: {max}", F::NAME);
        println!(
            "{format:?} -> level {} {w}x{h} {matrix:?} {range:?}: max {max} mean {mean:.4}",
            F::NAME
        );
    }
}

#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test convert -- --ignored --skip child_"]
fn gpu_level_conversions_match_the_cpu_reference() {
    let _fds = fds::lock();
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    level_conversions_match::<Rgba8Unorm>(&ctx, &cuda, 70, 34);
    level_conversions_match::<Bgra8Unorm>(&ctx, &cuda, 64, 32);
    level_conversions_match::<Rgba16Sfloat>(&ctx, &cuda, 70, 34);
}

/// RGBA8 -> NV12 at 3840x2160 (from a level and from pitched memory), its
/// bandwidth (bytes read + written over the kernel's time, best of 20)
/// beside `cuMemcpyDtoDAsync` of the same number of bytes measured in the
/// same run; prints the ratio (goal: at least 0.7). No timing assert.
#[test]
#[ignore = "GPU: needs an NVIDIA GPU: cargo test -p cuda-interop-tests --test convert -- --ignored --skip child_ --nocapture"]
fn gpu_rgba8_to_nv12_bandwidth_beside_a_device_copy() {
    use vk_export::{ExportableImage, ImageDesc, SubmitSync};
    let _fds = fds::lock();
    let (ctx, cuda) = cuda_interop_testkit::gpu::pair();
    let (w, h) = (3840u32, 2160u32);
    let (rgba_bytes, nv12_bytes) = (w as usize * h as usize * 4, w as usize * h as usize * 3 / 2);
    let moved = (rgba_bytes + nv12_bytes) as f64;
    let stream = Stream::new(&cuda).unwrap();
    let image = ExportableImage::<Rgba8Unorm>::new(&ctx, ImageDesc::new_2d(w, h)).unwrap();
    ctx.release_image(&image, SubmitSync::new()).unwrap();
    let imported = cuda.import_image(&image).unwrap();
    let array = imported.map_array().unwrap();
    let level = array.level(0).unwrap();
    let mut rgba = DeviceBuffer::new(&cuda, rgba_bytes).unwrap();
    stream
        .copy_from_host(&pattern(rgba_bytes, 5), &mut rgba)
        .unwrap();
    let mut frame = DeviceBuffer::new(&cuda, nv12_bytes).unwrap();
    let copy_dst = DeviceBuffer::new(&cuda, rgba_bytes + nv12_bytes).unwrap();
    let copy_src = DeviceBuffer::new(&cuda, rgba_bytes + nv12_bytes).unwrap();
    let (start, end) = (
        cuda_interop::Event::new(&cuda).unwrap(),
        cuda_interop::Event::new(&cuda).unwrap(),
    );
    let best = |what: &str, f: &mut dyn FnMut()| -> f64 {
        let mut best = f64::MAX;
        for _ in 0..20 {
            stream.record(&start).unwrap();
            f();
            stream.record(&end).unwrap();
            end.synchronize(TIMEOUT).unwrap();
            best = best.min(f64::from(end.elapsed_ms_since(&start).unwrap()));
        }
        let gbs = moved / (best * 1e-3) / 1e9;
        println!("{what}: {best:.3} ms, {gbs:.1} GB/s ({moved} bytes read + written)");
        gbs
    };
    // The copy: cuMemcpyDtoDAsync of rgba + nv12 bytes (read and written
    // once each: the bandwidth counts both, 2x the bytes copied, matching
    // `moved`: each conversion reads rgba_bytes and writes nv12_bytes).
    let half = (moved / 2.0) as usize;
    let copy_fn = cuda_interop_testkit::gpu::driver()
        .fns()
        .cuMemcpyDtoDAsync
        .unwrap();
    let copy_gbs = best("cuMemcpyDtoDAsync", &mut || {
        let _guard = cuda.enter().unwrap();
        // SAFETY: both buffers hold `half` bytes (rgba + nv12 bytes, halved:
        // `moved` counts reads and writes), live until the end of the test;
        // the stream and both belong to the current context.
        let status = unsafe {
            copy_fn(
                copy_dst.device_ptr(),
                copy_src.device_ptr(),
                half,
                stream.raw(),
            )
        };
        assert_eq!(status, cuda_interop::sys::CUresult::CUDA_SUCCESS);
    });
    let copy_gbs = copy_gbs * 2.0 * half as f64 / moved;
    let level_gbs = best("RGBA8 level -> NV12 (BT.709 limited)", &mut || {
        stream
            .enqueue_rgba_to_yuv(
                RgbaImage::level(&level).unwrap(),
                PlanarMut::new(PitchedMut::buffer(&mut frame), Yuv420::Nv12, w, h).unwrap(),
                Matrix::Bt709,
                Range::Limited,
            )
            .unwrap();
    });
    let pitched_gbs = best("RGBA8 pitched -> NV12 (BT.709 limited)", &mut || {
        stream
            .enqueue_rgba_to_yuv(
                RgbaImage::<Rgba8Unorm>::pitched(Pitched::buffer(&rgba), w, h).unwrap(),
                PlanarMut::new(PitchedMut::buffer(&mut frame), Yuv420::Nv12, w, h).unwrap(),
                Matrix::Bt709,
                Range::Limited,
            )
            .unwrap();
    });
    println!(
        "RGBA8 -> NV12 3840x2160: level {:.2}x, pitched {:.2}x the device copy's bandwidth ({copy_gbs:.1} GB/s; goal >= 0.70x)",
        level_gbs / copy_gbs,
        pitched_gbs / copy_gbs
    );
    drop(copy_dst);
}
