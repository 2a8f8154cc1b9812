//! The CPU reference of the colour conversions (`cuda_interop::convert`):
//! f64 arithmetic straight from the ITU-R equations, written apart from the
//! crate's kernels and coefficients (only the enums are shared), and checked
//! against FFmpeg's libswscale on the fixtures of
//! `tests/fixtures/convert` (`tests/tests/convert.rs`).
//!
//! * `E'Y = Kr R' + Kg G' + Kb B'`, `E'Cb = (B' - E'Y) / (2 (1 - Kb))`,
//!   `E'Cr = (R' - E'Y) / (2 (1 - Kr))`, `Kg = 1 - Kr - Kb` (BT.601 table 4
//!   item 3.2, BT.709 part 2 items 3.2-3.3, BT.2020 table 4 non-constant
//!   luminance), (Kr, Kb) from [`Matrix::kr_kb`].
//! * n-bit codes (ITU-T H.273 equations 20-31): limited
//!   `Y = round((219 E'Y + 16) 2^(n-8))`, `C = round((224 E'C + 128)
//!   2^(n-8))`; full `Y = round((2^n - 1) E'Y)`, `C = round((2^n - 1) E'C +
//!   2^(n-1))`; rounding half up, clamped to `0..=2^n - 1`.
//! * 4:2:0: each chroma sample is the mean of the 2 x 2 block's E'Cb, E'Cr
//!   (before quantisation); back, each is used for its 2 x 2 block.
//! * Back to R'G'B': the inverse equations on the dequantised codes, clamped
//!   to [0, 1].

use cuda_interop::convert::{Matrix, Range, Yuv420};

/// `(luma scale, luma offset, chroma scale, chroma offset)` of n-bit codes.
fn scales(range: Range, bits: u32) -> (f64, f64, f64, f64) {
    let s = f64::from(1u32 << (bits - 8));
    match range {
        Range::Limited => (219.0 * s, 16.0 * s, 224.0 * s, 128.0 * s),
        Range::Full => {
            let max = f64::from((1u32 << bits) - 1);
            (max, 0.0, max, f64::from(1u32 << (bits - 1)))
        }
    }
}

/// Rounds half up and clamps to `0..=max`.
pub fn quantize(v: f64, max: u32) -> u32 {
    (v + 0.5).floor().clamp(0.0, f64::from(max)) as u32
}

/// `(E'Y, E'Cb, E'Cr)` of R'G'B' in [0, 1].
pub fn ycbcr(matrix: Matrix, [r, g, b]: [f64; 3]) -> [f64; 3] {
    let (kr, kb) = matrix.kr_kb();
    let y = kr * r + (1.0 - kr - kb) * g + kb * b;
    [
        y,
        (b - y) / (2.0 * (1.0 - kb)),
        (r - y) / (2.0 * (1.0 - kr)),
    ]
}

/// R'G'B' (unclamped) of `(E'Y, E'Cb, E'Cr)`.
pub fn rgb(matrix: Matrix, [y, cb, cr]: [f64; 3]) -> [f64; 3] {
    let (kr, kb) = matrix.kr_kb();
    let kg = 1.0 - kr - kb;
    let r = y + 2.0 * (1.0 - kr) * cr;
    let b = y + 2.0 * (1.0 - kb) * cb;
    [r, (y - kr * r - kb * b) / kg, b]
}

/// A 4:2:0 frame as codes: `luma` (`width * height`) and interleaved Cb, Cr
/// (`width * height / 2`), row after row with no padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Luma codes.
    pub luma: Vec<u16>,
    /// Cb, Cr codes, interleaved.
    pub chroma: Vec<u16>,
}

impl Frame {
    /// The frame as it lies in memory, tightly packed (NV12 bytes, P010
    /// little-endian words with the code in the high 10 bits).
    pub fn to_bytes(&self, format: Yuv420) -> Vec<u8> {
        let codes = self.luma.iter().chain(&self.chroma);
        match format {
            Yuv420::Nv12 => codes.map(|&c| c as u8).collect(),
            Yuv420::P010 => codes.flat_map(|&c| (c << 6).to_le_bytes()).collect(),
        }
    }

    /// A tightly packed frame of `width x height` from memory.
    pub fn from_bytes(format: Yuv420, width: usize, height: usize, bytes: &[u8]) -> Frame {
        let codes: Vec<u16> = match format {
            Yuv420::Nv12 => bytes.iter().map(|&b| u16::from(b)).collect(),
            Yuv420::P010 => bytes
                .chunks_exact(2)
                .map(|w| u16::from_le_bytes([w[0], w[1]]) >> 6)
                .collect(),
        };
        assert_eq!(
            codes.len(),
            width * height * 3 / 2,
            "a {width}x{height} frame"
        );
        let (luma, chroma) = codes.split_at(width * height);
        Frame {
            luma: luma.to_vec(),
            chroma: chroma.to_vec(),
        }
    }
}

/// `pixels` (R'G'B' in [0, 1], `width x height`, both even) to a 4:2:0 frame.
pub fn to_yuv420(
    pixels: &[[f64; 3]],
    width: usize,
    height: usize,
    format: Yuv420,
    matrix: Matrix,
    range: Range,
) -> Frame {
    assert!(width.is_multiple_of(2) && height.is_multiple_of(2) && pixels.len() == width * height);
    let bits = format.bits();
    let max = (1u32 << bits) - 1;
    let (ys, yo, cs, co) = scales(range, bits);
    let e: Vec<[f64; 3]> = pixels.iter().map(|&p| ycbcr(matrix, p)).collect();
    let luma = e
        .iter()
        .map(|v| quantize(v[0] * ys + yo, max) as u16)
        .collect();
    let mut chroma = Vec::with_capacity(width * height / 2);
    for cy in 0..height / 2 {
        for cx in 0..width / 2 {
            let mut sum = [0.0; 2];
            for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let v = e[(2 * cy + dy) * width + 2 * cx + dx];
                sum[0] += v[1];
                sum[1] += v[2];
            }
            chroma.push(quantize(sum[0] / 4.0 * cs + co, max) as u16);
            chroma.push(quantize(sum[1] / 4.0 * cs + co, max) as u16);
        }
    }
    Frame { luma, chroma }
}

/// A 4:2:0 frame to R'G'B' in [0, 1] (clamped), `width x height`.
pub fn from_yuv420(
    frame: &Frame,
    width: usize,
    height: usize,
    format: Yuv420,
    matrix: Matrix,
    range: Range,
) -> Vec<[f64; 3]> {
    let (ys, yo, cs, co) = scales(range, format.bits());
    let mut out = Vec::with_capacity(width * height);
    for y in 0..height {
        for x in 0..width {
            let c = (y / 2) * width + (x / 2) * 2;
            let e = [
                (f64::from(frame.luma[y * width + x]) - yo) / ys,
                (f64::from(frame.chroma[c]) - co) / cs,
                (f64::from(frame.chroma[c + 1]) - co) / cs,
            ];
            out.push(rgb(matrix, e).map(|v| v.clamp(0.0, 1.0)));
        }
    }
    out
}

/// RGBA8 bytes (alpha ignored) as R'G'B' in [0, 1]; `bgra`: blue first.
pub fn from_rgba8(bytes: &[u8], bgra: bool) -> Vec<[f64; 3]> {
    bytes
        .chunks_exact(4)
        .map(|p| {
            let v = |i: usize| f64::from(p[i]) / 255.0;
            if bgra {
                [v(2), v(1), v(0)]
            } else {
                [v(0), v(1), v(2)]
            }
        })
        .collect()
}

/// R'G'B' in [0, 1] as RGBA8 (or BGRA8) bytes, alpha 255.
pub fn to_rgba8(pixels: &[[f64; 3]], bgra: bool) -> Vec<u8> {
    pixels
        .iter()
        .flat_map(|p| {
            let [r, g, b] = p.map(|v| quantize(v * 255.0, 255) as u8);
            if bgra {
                [b, g, r, 255]
            } else {
                [r, g, b, 255]
            }
        })
        .collect()
}

/// `f32` to IEEE half bits, rounding to nearest even (finite values in
/// [0, 1] are all this needs).
pub fn f32_to_half(v: f32) -> u16 {
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = bits & 0x7f_ffff;
    if exp <= 0 {
        if exp < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - exp) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// IEEE half bits to `f64`.
pub fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f64::from(h & 0x3ff);
    sign * match exp {
        0 => mant * 2f64.powi(-24),
        // A NaN is NaN (the kernels read it as 0), not infinity.
        31 if mant != 0.0 => f64::NAN,
        31 => f64::INFINITY,
        e => (1.0 + mant / 1024.0) * 2f64.powi(e - 15),
    }
}

/// RGBA16F bytes (little-endian halves, alpha ignored) as R'G'B', clamped
/// to [0, 1] as the kernels clamp them (NaN as 0).
pub fn from_rgba16f(bytes: &[u8]) -> Vec<[f64; 3]> {
    bytes
        .chunks_exact(8)
        .map(|p| {
            let v = |i: usize| {
                let x = half_to_f64(u16::from_le_bytes([p[2 * i], p[2 * i + 1]]));
                if x.is_nan() {
                    0.0
                } else {
                    x.clamp(0.0, 1.0)
                }
            };
            [v(0), v(1), v(2)]
        })
        .collect()
}

/// The largest and the mean absolute difference of two equally long
/// sequences of codes.
pub fn diff(a: impl IntoIterator<Item = i64>, b: impl IntoIterator<Item = i64>) -> (i64, f64) {
    let (mut max, mut sum, mut n) = (0, 0i64, 0usize);
    for (x, y) in a.into_iter().zip(b) {
        let d = (x - y).abs();
        max = max.max(d);
        sum += d;
        n += 1;
    }
    (max, if n == 0 { 0.0 } else { sum as f64 / n as f64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NaN half is NaN (read as 0, as the kernels do), infinity is
    /// infinity (clamped to 1): GPU run 24 caught the reference reading the
    /// first as the second.
    #[test]
    fn nan_and_infinite_halves() {
        assert!(half_to_f64(0x7e00).is_nan());
        assert_eq!(half_to_f64(0x7c00), f64::INFINITY);
        assert_eq!(
            from_rgba16f(&[0x00, 0x7e, 0x00, 0x7c, 0, 0x3c, 0, 0]),
            [[0.0, 1.0, 1.0]]
        );
    }

    #[test]
    fn textbook_codes() {
        let white = to_yuv420(
            &[[1.0; 3]; 4],
            2,
            2,
            Yuv420::Nv12,
            Matrix::Bt709,
            Range::Limited,
        );
        assert_eq!(white.luma, [235; 4]);
        assert_eq!(white.chroma, [128, 128]);
        let blue = to_yuv420(
            &[[0.0, 0.0, 1.0]; 4],
            2,
            2,
            Yuv420::P010,
            Matrix::Bt2020,
            Range::Full,
        );
        assert_eq!(
            blue.chroma[0], 1023,
            "Cb of blue is +0.5: clamped to the top code"
        );
        let back = from_yuv420(&white, 2, 2, Yuv420::Nv12, Matrix::Bt709, Range::Limited);
        assert_eq!(to_rgba8(&back, false), [255, 255, 255, 255].repeat(4));
    }

    #[test]
    fn halves_round_trip() {
        for h in 0..=0x3c00u16 {
            assert_eq!(f32_to_half(half_to_f64(h) as f32), h);
        }
        assert_eq!(f32_to_half(1.0), 0x3c00);
        assert_eq!(f32_to_half(0.5), 0x3800);
    }
}
