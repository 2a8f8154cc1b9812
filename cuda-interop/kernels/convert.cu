// Source of cuda-interop/src/generated/convert_ptx.rs (`cargo xtask codegen
// ptx` on a machine with nvcc; the crate builds from the checked-in PTX).
//
// Colour conversion between 4-channel RGB(A) images (RGBA8, BGRA8 unorm,
// RGBA16F; read or written through a surface object or as pitched linear
// memory) and 4:2:0 Y'CbCr in two planes (NV12: 8-bit samples; P010: 10-bit
// samples in the high bits of 16-bit words), luma then interleaved Cb, Cr,
// both planes with the same row pitch. See cuda-interop/src/convert.rs for
// the contract; the host computes the matrix (`Coeffs`) in f64 from the
// ITU-R equations, the kernels only apply it in f32.
//
// One thread converts a 4 x 2 block of pixels: two chroma samples of one
// chroma row. To 4:2:0, each chroma sample is the mean of its 2 x 2 pixels'
// R'G'B' (the same as the mean of their Cb, Cr: the matrix is linear), so it
// is sited at the centre of the block. From 4:2:0, each chroma sample is
// used for its 2 x 2 pixels (nearest, replicated). Width and height are even
// (checked by the host); a row whose width is not a multiple of 4 ends with
// a thread of 2 x 2 pixels. `flags & 1` (VEC): both planes' addresses and the
// pitch are multiples of 4 samples, so 4 samples move as one vector.
#include <cuda_runtime.h>

// Row 0: luma, 1: Cb, 2: Cr. To Y'CbCr: code = m[row] . (R', G', B') + off[row]
// with R'G'B' in [0, 1]. From Y'CbCr: (R', G', B')[row] = m[row] . (Y - off[0],
// Cb - off[1], Cr - off[2]).
struct Coeffs {
  float m[9];
  float off[3];
};

#define VEC 1u

enum { RGBA8 = 0, BGRA8 = 1, RGBA16F = 2 };

// Half <-> float without cuda_fp16.h (which needs CCCL's headers too).
__device__ __forceinline__ float half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ float unit(float v) { return fminf(fmaxf(v, 0.0f), 1.0f); }

// Rounds half up and clamps to [0, max]; NaN gives 0.
__device__ __forceinline__ unsigned quantize(float v, float max) {
  return (unsigned)fminf(fmaxf(floorf(v + 0.5f), 0.0f), max);
}

template <int FMT, bool SURF>
__device__ __forceinline__ float3 load_rgb(unsigned long long src, unsigned long long pitch, unsigned x, unsigned y) {
  if (FMT == RGBA16F) {
    ushort4 v;
    if (SURF) {
      v = surf2Dread<ushort4>((cudaSurfaceObject_t)src, x * 8, y, cudaBoundaryModeTrap);
    } else {
      v = __ldg((const ushort4*)(src + y * pitch + (unsigned long long)x * 8));
    }
    return make_float3(unit(half_to_float(v.x)), unit(half_to_float(v.y)),
                       unit(half_to_float(v.z)));
  } else {
    uchar4 v;
    if (SURF) {
      v = surf2Dread<uchar4>((cudaSurfaceObject_t)src, x * 4, y, cudaBoundaryModeTrap);
    } else {
      v = __ldg((const uchar4*)(src + y * pitch + (unsigned long long)x * 4));
    }
    const float k = 1.0f / 255.0f;
    if (FMT == BGRA8) return make_float3(v.z * k, v.y * k, v.x * k);
    return make_float3(v.x * k, v.y * k, v.z * k);
  }
}

template <int FMT, bool SURF>
__device__ __forceinline__ void store_rgb(unsigned long long dst, unsigned long long pitch, unsigned x, unsigned y,
                                          float3 c) {
  if (FMT == RGBA16F) {
    ushort4 v = make_ushort4(float_to_half(unit(c.x)), float_to_half(unit(c.y)),
                             float_to_half(unit(c.z)), 0x3c00);
    if (SURF) {
      surf2Dwrite<ushort4>(v, (cudaSurfaceObject_t)dst, x * 8, y, cudaBoundaryModeTrap);
    } else {
      *(ushort4*)(dst + y * pitch + (unsigned long long)x * 8) = v;
    }
  } else {
    unsigned char r = quantize(c.x * 255.0f, 255.0f), g = quantize(c.y * 255.0f, 255.0f),
                  b = quantize(c.z * 255.0f, 255.0f);
    uchar4 v = FMT == BGRA8 ? make_uchar4(b, g, r, 255) : make_uchar4(r, g, b, 255);
    if (SURF) {
      surf2Dwrite<uchar4>(v, (cudaSurfaceObject_t)dst, x * 4, y, cudaBoundaryModeTrap);
    } else {
      *(uchar4*)(dst + y * pitch + (unsigned long long)x * 4) = v;
    }
  }
}

__device__ __forceinline__ float dot3(float a, float b, float c, float3 v) { return a * v.x + b * v.y + c * v.z; }

// Stores 4 (or, at the end of a row, 2) samples at `row`; P010 shifts the
// 10-bit codes into the high bits.
template <bool P010>
__device__ __forceinline__ void store_samples(char* row, unsigned x, const unsigned* s, bool four, bool vec) {
  if (P010) {
    unsigned short* p = (unsigned short*)row + x;
    if (four && vec) {
      *(ushort4*)p = make_ushort4(s[0] << 6, s[1] << 6, s[2] << 6, s[3] << 6);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (i < 2 || four) p[i] = (unsigned short)(s[i] << 6);
    }
  } else {
    unsigned char* p = (unsigned char*)row + x;
    if (four && vec) {
      *(uchar4*)p = make_uchar4(s[0], s[1], s[2], s[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (i < 2 || four) p[i] = (unsigned char)s[i];
    }
  }
}

// Loads 4 (or 2) samples at `row`, as codes.
template <bool P010>
__device__ __forceinline__ void load_samples(const char* row, unsigned x, float* s, bool four, bool vec) {
  if (P010) {
    const unsigned short* p = (const unsigned short*)row + x;
    if (four && vec) {
      ushort4 v = __ldg((const ushort4*)p);
      s[0] = v.x >> 6, s[1] = v.y >> 6, s[2] = v.z >> 6, s[3] = v.w >> 6;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = (i < 2 || four) ? __ldg(p + i) >> 6 : 0;
    }
  } else {
    const unsigned char* p = (const unsigned char*)row + x;
    if (four && vec) {
      uchar4 v = __ldg((const uchar4*)p);
      s[0] = v.x, s[1] = v.y, s[2] = v.z, s[3] = v.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = (i < 2 || four) ? __ldg(p + i) : 0;
    }
  }
}

template <int FMT, bool SURF, bool P010>
__device__ __forceinline__ void to_yuv(unsigned long long src, unsigned long long src_pitch, char* luma,
                                       unsigned width, unsigned height, unsigned long long pitch, char* chroma,
                                       unsigned flags, Coeffs c) {
  unsigned x0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  unsigned cy = blockIdx.y * blockDim.y + threadIdx.y;
  unsigned y0 = cy * 2;
  if (x0 >= width || y0 >= height) return;
  bool four = width - x0 >= 4;  // x0 < width: no wrap (x0 + 4 could)
  bool vec = flags & VEC;
  float max = P010 ? 1023.0f : 255.0f;
  float3 px[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < 2 || four) px[r][i] = load_rgb<FMT, SURF>(src, src_pitch, x0 + i, y0 + r);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    unsigned s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = (i < 2 || four) ? quantize(dot3(c.m[0], c.m[1], c.m[2], px[r][i]) + c.off[0], max) : 0;
    store_samples<P010>(luma + (unsigned long long)(y0 + r) * pitch, x0, s, four, vec);
  }
  unsigned s[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (k == 1 && !four) continue;
    float3 a = px[0][2 * k], b = px[0][2 * k + 1], d = px[1][2 * k], e = px[1][2 * k + 1];
    float3 mean = make_float3((a.x + b.x + d.x + e.x) * 0.25f, (a.y + b.y + d.y + e.y) * 0.25f,
                              (a.z + b.z + d.z + e.z) * 0.25f);
    s[2 * k] = quantize(dot3(c.m[3], c.m[4], c.m[5], mean) + c.off[1], max);
    s[2 * k + 1] = quantize(dot3(c.m[6], c.m[7], c.m[8], mean) + c.off[2], max);
  }
  store_samples<P010>(chroma + (unsigned long long)cy * pitch, x0, s, four, vec);
}

template <int FMT, bool SURF, bool P010>
__device__ __forceinline__ void from_yuv(const char* luma, unsigned long long pitch, unsigned long long dst,
                                         unsigned width, unsigned height, unsigned long long dst_pitch,
                                         const char* chroma, unsigned flags, Coeffs c) {
  unsigned x0 = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  unsigned cy = blockIdx.y * blockDim.y + threadIdx.y;
  unsigned y0 = cy * 2;
  if (x0 >= width || y0 >= height) return;
  bool four = width - x0 >= 4;  // x0 < width: no wrap (x0 + 4 could)
  bool vec = flags & VEC;
  float y[2][4], uv[4];
  load_samples<P010>(luma + (unsigned long long)y0 * pitch, x0, y[0], four, vec);
  load_samples<P010>(luma + (unsigned long long)(y0 + 1) * pitch, x0, y[1], four, vec);
  load_samples<P010>(chroma + (unsigned long long)cy * pitch, x0, uv, four, vec);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (k == 1 && !four) continue;
    float u = uv[2 * k] - c.off[1], v = uv[2 * k + 1] - c.off[2];
    float3 cc = make_float3(c.m[1] * u + c.m[2] * v, c.m[4] * u + c.m[5] * v, c.m[7] * u + c.m[8] * v);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float l = y[r][2 * k + i] - c.off[0];
        float3 rgb = make_float3(c.m[0] * l + cc.x, c.m[3] * l + cc.y, c.m[6] * l + cc.z);
        store_rgb<FMT, SURF>(dst, dst_pitch, x0 + 2 * k + i, y0 + r, rgb);
      }
  }
}

#define TO_YUV(NAME, FMT, SURF, P010)                                                                           \
  extern "C" __global__ void convert_##NAME(unsigned long long src, unsigned long long src_pitch, char* luma,   \
                                            unsigned width, unsigned height, unsigned long long pitch,          \
                                            char* chroma, unsigned flags, Coeffs c) {                           \
    to_yuv<FMT, SURF, P010>(src, src_pitch, luma, width, height, pitch, chroma, flags, c);                       \
  }
#define FROM_YUV(NAME, FMT, SURF, P010)                                                                         \
  extern "C" __global__ void convert_##NAME(const char* luma, unsigned long long pitch, unsigned long long dst,  \
                                            unsigned width, unsigned height, unsigned long long dst_pitch,      \
                                            const char* chroma, unsigned flags, Coeffs c) {                     \
    from_yuv<FMT, SURF, P010>(luma, pitch, dst, width, height, dst_pitch, chroma, flags, c);                     \
  }
#define BOTH(RGB, FMT, SURFNAME, SURF)                   \
  TO_YUV(RGB##_##SURFNAME##_to_nv12, FMT, SURF, false)   \
  TO_YUV(RGB##_##SURFNAME##_to_p010, FMT, SURF, true)    \
  FROM_YUV(nv12_to_##RGB##_##SURFNAME, FMT, SURF, false) \
  FROM_YUV(p010_to_##RGB##_##SURFNAME, FMT, SURF, true)

BOTH(rgba8, RGBA8, surface, true)
BOTH(rgba8, RGBA8, pitched, false)
BOTH(bgra8, BGRA8, surface, true)
BOTH(bgra8, BGRA8, pitched, false)
BOTH(rgba16f, RGBA16F, surface, true)
BOTH(rgba16f, RGBA16F, pitched, false)
