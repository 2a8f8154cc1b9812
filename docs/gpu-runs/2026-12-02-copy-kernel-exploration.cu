// Exploration: array <-> pitched linear copy kernels vs cudaMemcpy2D*Array vs D2D.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

template <typename T, int ROWS>
__global__ void a2l(cudaSurfaceObject_t s, char* d, size_t pitch, unsigned w, unsigned h) {
  unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned y0 = (blockIdx.y * blockDim.y * ROWS) + threadIdx.y;
  if (x >= w) return;
  T v[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) v[r] = surf2Dread<T>(s, x * sizeof(T), y); }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) *(T*)(d + (size_t)y * pitch + (size_t)x * sizeof(T)) = v[r]; }
}
template <typename T, int ROWS>
__global__ void l2a(const char* d, size_t pitch, cudaSurfaceObject_t s, unsigned w, unsigned h) {
  unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned y0 = (blockIdx.y * blockDim.y * ROWS) + threadIdx.y;
  if (x >= w) return;
  T v[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) v[r] = __ldg((const T*)(d + (size_t)y * pitch + (size_t)x * sizeof(T))); }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) surf2Dwrite<T>(v[r], s, x * sizeof(T), y); }
}
// 4 texels of 4 bytes per thread horizontally, one 16-byte store.
template <int ROWS>
__global__ void a2l_x4(cudaSurfaceObject_t s, char* d, size_t pitch, unsigned w, unsigned h) {
  unsigned x = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  unsigned y0 = (blockIdx.y * blockDim.y * ROWS) + threadIdx.y;
  if (x >= w) return;
  uint4 v[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) {
    v[r].x = surf2Dread<unsigned>(s, x * 4, y); v[r].y = surf2Dread<unsigned>(s, x * 4 + 4, y);
    v[r].z = surf2Dread<unsigned>(s, x * 4 + 8, y); v[r].w = surf2Dread<unsigned>(s, x * 4 + 12, y); } }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) *(uint4*)(d + (size_t)y * pitch + (size_t)x * 4) = v[r]; }
}
template <typename T, int ROWS>
__global__ void a2l_tex(cudaTextureObject_t t, char* d, size_t pitch, unsigned w, unsigned h) {
  unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned y0 = (blockIdx.y * blockDim.y * ROWS) + threadIdx.y;
  if (x >= w) return;
  T v[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) v[r] = tex2D<T>(t, x, y); }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) { unsigned y = y0 + r * blockDim.y; if (y < h) *(T*)(d + (size_t)y * pitch + (size_t)x * sizeof(T)) = v[r]; }
}

static float timeit(cudaEvent_t a, cudaEvent_t b, int iters) { float ms; CK(cudaEventElapsedTime(&ms, a, b)); return ms * 1000.f / iters; }

template <typename T>
void run(const char* name, unsigned w, unsigned h, cudaChannelFormatDesc desc) {
  cudaArray_t arr; CK(cudaMallocArray(&arr, &desc, w, h, cudaArraySurfaceLoadStore));
  size_t pitch; char* lin; CK(cudaMallocPitch((void**)&lin, &pitch, w * sizeof(T), h));
  char *a, *b; size_t bytes = (size_t)w * h * sizeof(T); CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
  cudaResourceDesc rd = {}; rd.resType = cudaResourceTypeArray; rd.res.array.array = arr;
  cudaSurfaceObject_t s; CK(cudaCreateSurfaceObject(&s, &rd));
  cudaTextureDesc td = {}; td.readMode = cudaReadModeElementType; td.filterMode = cudaFilterModePoint;
  cudaTextureObject_t t = 0; bool tex_ok = cudaCreateTextureObject(&t, &rd, &td, nullptr) == cudaSuccess; cudaGetLastError();
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int it = 50;
  auto bench = [&](const char* what, auto fn) {
    fn(); CK(cudaDeviceSynchronize());
    cudaEventRecord(e0); for (int i = 0; i < it; ++i) fn(); cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
    float us = timeit(e0, e1, it); printf("%-6s %5ux%-5u %-28s %8.1f us %7.0f GB/s\n", name, w, h, what, us, bytes / us / 1e3);
  };
  bench("d2d cudaMemcpy", [&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  bench("a2l cudaMemcpy2DFromArray", [&] { cudaMemcpy2DFromArrayAsync(lin, pitch, arr, 0, 0, w * sizeof(T), h, cudaMemcpyDeviceToDevice); });
  bench("l2a cudaMemcpy2DToArray", [&] { cudaMemcpy2DToArrayAsync(arr, 0, 0, lin, pitch, w * sizeof(T), h, cudaMemcpyDeviceToDevice); });
#define A2L(R, BX, BY) bench("a2l surf r" #R " " #BX "x" #BY, [&] { dim3 bl(BX, BY), g((w + BX - 1) / BX, (h + BY * R - 1) / (BY * R)); a2l<T, R><<<g, bl>>>(s, lin, pitch, w, h); });
#define L2A(R, BX, BY) bench("l2a surf r" #R " " #BX "x" #BY, [&] { dim3 bl(BX, BY), g((w + BX - 1) / BX, (h + BY * R - 1) / (BY * R)); l2a<T, R><<<g, bl>>>(lin, pitch, s, w, h); });
#define TEX(R, BX, BY) if (tex_ok) bench("a2l tex r" #R " " #BX "x" #BY, [&] { dim3 bl(BX, BY), g((w + BX - 1) / BX, (h + BY * R - 1) / (BY * R)); a2l_tex<T, R><<<g, bl>>>(t, lin, pitch, w, h); });
  A2L(1, 32, 8) A2L(2, 32, 8) A2L(4, 32, 8) A2L(8, 32, 8) A2L(4, 16, 16) A2L(4, 64, 4) A2L(2, 16, 8) A2L(4, 8, 8) A2L(8, 8, 8) A2L(2,64,8)
  L2A(1, 32, 8) L2A(2, 32, 8) L2A(4, 32, 8) L2A(8, 32, 8) L2A(4, 16, 16) L2A(4, 64, 4) L2A(2, 16, 8) L2A(4, 8, 8) L2A(8,8,8)
  TEX(1, 32, 8) TEX(4, 32, 8) TEX(4, 16, 16)
  if (sizeof(T) == 4) {
#define X4(R, BX, BY) bench("a2l surf x4 r" #R " " #BX "x" #BY, [&] { dim3 bl(BX, BY), g((w / 4 + BX - 1) / BX, (h + BY * R - 1) / (BY * R)); a2l_x4<R><<<g, bl>>>(s, lin, pitch, w, h); });
    X4(1, 32, 8) X4(2, 32, 8) X4(4, 32, 8) X4(2, 16, 8) X4(4, 16, 16)
  }
  cudaDestroySurfaceObject(s); if (tex_ok) cudaDestroyTextureObject(t); cudaFreeArray(arr); cudaFree(lin); cudaFree(a); cudaFree(b);
}
int main() {
  unsigned sizes[2][2] = {{3840, 2160}, {7680, 4320}};
  for (auto& sz : sizes) {
    run<uchar4>("rgba8", sz[0], sz[1], cudaCreateChannelDesc<uchar4>());
    run<uint2>("8B", sz[0], sz[1], cudaCreateChannelDesc<uint2>());
    run<uint4>("16B", sz[0], sz[1], cudaCreateChannelDesc<uint4>());
  }
}
