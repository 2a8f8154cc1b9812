/* A C++ receiver on the CUDA runtime API (GPU machine only; built there
 * with nvcc against the installed header and the staticlib):
 *
 *   runtime_recv NAME FRAMES
 *
 * connects to `frame_server`'s ring NAME (an RGBA8 buffer ring, or with
 * `--image` an RGBA8 image ring) through the C ABI, and uses each frame the
 * way CUDA runtime code does, on the primary context the C ABI shares:
 *
 * - `cudaSetDevice` on the ring's device, a `cudaStream_t` of its own,
 *   passed to `ci_cuda_receiver_wait_on` and `ci_cuda_receiver_release_after`
 *   as it is (a `cudaStream_t` is a `CUstream`);
 * - an image ring: `ci_cuda_receiver_wait_produced` (no pitched copy) and
 *   the frame as a `cudaArray_t` (`ci_cuda_receiver_array`, zero copy),
 *   read by this program's own kernel through a texture object and copied
 *   out with `cudaMemcpy2DFromArrayAsync`;
 * - a buffer ring: the frame as pitched device memory
 *   (`ci_cuda_receiver_pitched`), read by the same kernel and copied out
 *   with `cudaMemcpy2DAsync`.
 *
 * Every texel of every frame is checked twice: on the GPU by the kernel
 * (a count of wrong texels) and on the host from the copy. The expected
 * pixels are `frame_server`'s demo pattern: frame f's texels are the
 * little-endian word f, but for a band of max(height / 16, 1) rows starting
 * at row (8 f) mod (height - rows + 1), whose texels are ~f.
 *
 * Exit status 0 and "runtime receiver: N frames checked, 0 bad": all good. */
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

extern "C" {
#include "cuda_interop.h"
}

#define CHECK(call)                                                                      \
    do {                                                                                 \
        ci_status s_ = (call);                                                           \
        if (s_ != CI_OK) {                                                               \
            std::fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call,     \
                         (int)s_, ci_last_error_message());                              \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

#define RT(call)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,         \
                         cudaGetErrorString(e_));                                        \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

struct Pattern {
    uint32_t background, band;
    uint32_t band_start, band_end;
};

static Pattern pattern_of(uint64_t frame, uint32_t height) {
    uint32_t rows = height / 16 > 0 ? height / 16 : 1;
    uint64_t span = (uint64_t)(height - rows + 1);
    uint32_t start = (uint32_t)((frame * 8) % span);
    return Pattern{(uint32_t)frame, ~(uint32_t)frame, start, start + rows};
}

__device__ __host__ static uint32_t expected(const Pattern &p, uint32_t y) {
    return (y >= p.band_start && y < p.band_end) ? p.band : p.background;
}

/* Counts the texels that are not the pattern's: one thread a texel. */
__global__ void count_wrong_pitched(const uint8_t *base, size_t pitch, uint32_t width,
                                    uint32_t height, Pattern p, unsigned long long *wrong) {
    uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    uint32_t texel = *reinterpret_cast<const uint32_t *>(base + (size_t)y * pitch + (size_t)x * 4);
    if (texel != expected(p, y)) atomicAdd(wrong, 1ull);
}

__global__ void count_wrong_texture(cudaTextureObject_t tex, uint32_t width, uint32_t height,
                                    Pattern p, unsigned long long *wrong) {
    uint32_t x = blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    uchar4 t = tex2D<uchar4>(tex, (float)x + 0.5f, (float)y + 0.5f);
    uint32_t texel = (uint32_t)t.x | ((uint32_t)t.y << 8) | ((uint32_t)t.z << 16) |
                     ((uint32_t)t.w << 24);
    if (texel != expected(p, y)) atomicAdd(wrong, 1ull);
}

static cudaTextureObject_t texture_of(cudaArray_t array) {
    cudaResourceDesc res;
    std::memset(&res, 0, sizeof res);
    res.resType = cudaResourceTypeArray;
    res.res.array.array = array;
    cudaTextureDesc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.addressMode[0] = cudaAddressModeClamp;
    desc.addressMode[1] = cudaAddressModeClamp;
    desc.filterMode = cudaFilterModePoint;
    desc.readMode = cudaReadModeElementType;
    desc.normalizedCoords = 0;
    cudaTextureObject_t tex = 0;
    RT(cudaCreateTextureObject(&tex, &res, &desc, nullptr));
    return tex;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: runtime_recv NAME FRAMES\n");
        return 2;
    }
    const char *name = argv[1];
    uint64_t frames = std::strtoull(argv[2], nullptr, 10);

    ci_cuda_receiver *rx = nullptr;
    CHECK(ci_cuda_receiver_connect_named(name, CI_DELIVERY_LOSSLESS, 60.0, &rx));
    ci_ring_layout layout;
    std::memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    CHECK(ci_cuda_receiver_get_layout(rx, &layout));
    const bool image = layout.format == CI_FORMAT_IMAGE;
    if ((!image && layout.format != CI_FORMAT_RGBA8_BUFFER) || layout.texel_bytes != 4 ||
        (image && std::strcmp(layout.format_name, "r8g8b8a8_unorm") != 0)) {
        std::fprintf(stderr, "not an RGBA8 ring: format %u (%s)\n", layout.format,
                     layout.format_name);
        return 1;
    }
    int32_t ordinal = -1;
    CHECK(ci_cuda_receiver_device(rx, &ordinal));
    /* The runtime's context on this device is the primary context, the one
     * the C ABI's receiver uses: no context switch between the two APIs. */
    RT(cudaSetDevice(ordinal));
    cudaStream_t stream;
    RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned long long *wrong_dev = nullptr;
    unsigned long long *wrong_host = nullptr;
    RT(cudaMalloc(&wrong_dev, sizeof *wrong_dev));
    RT(cudaMallocHost(&wrong_host, sizeof *wrong_host));

    const uint32_t width = layout.width, height = layout.height;
    const size_t row = (size_t)width * 4;
    std::vector<uint8_t> pixels(row * height);
    const dim3 block(32, 8);
    const dim3 grid((width + block.x - 1) / block.x, (height + block.y - 1) / block.y);
    uint64_t bad_gpu = 0, bad_host = 0, last = 0;
    for (uint64_t n = 0; n < frames; n++) {
        ci_frame *frame = nullptr;
        ci_frame_info info;
        CHECK(ci_cuda_receiver_next(rx, 30.0, &frame));
        CHECK(ci_frame_get_info(frame, &info));
        if (info.sequence <= last) {
            std::fprintf(stderr, "frame %" PRIu64 " after %" PRIu64 "\n", info.sequence, last);
            return 1;
        }
        last = info.sequence;
        const Pattern p = pattern_of(info.sequence, height);
        /* An image ring is read through its array alone: the "produced"
         * wait only, no pitched copy (zero copy). */
        if (image)
            CHECK(ci_cuda_receiver_wait_produced(rx, frame, stream));
        else
            CHECK(ci_cuda_receiver_wait_on(rx, frame, stream));
        RT(cudaMemsetAsync(wrong_dev, 0, sizeof *wrong_dev, stream));
        cudaTextureObject_t tex = 0;
        if (image) {
            void *array = nullptr;
            CHECK(ci_cuda_receiver_array(rx, frame, &array));
            cudaArray_t arr = static_cast<cudaArray_t>(array);
            cudaChannelFormatDesc fmt;
            cudaExtent extent;
            unsigned flags = 0;
            RT(cudaArrayGetInfo(&fmt, &extent, &flags, arr));
            if (extent.width != width || extent.height != height || fmt.x != 8 || fmt.w != 8 ||
                fmt.f != cudaChannelFormatKindUnsigned) {
                std::fprintf(stderr, "the cudaArray_t is %zux%zu, channels %d/%d/%d/%d kind %d\n",
                             extent.width, extent.height, fmt.x, fmt.y, fmt.z, fmt.w, (int)fmt.f);
                return 1;
            }
            tex = texture_of(arr);
            count_wrong_texture<<<grid, block, 0, stream>>>(tex, width, height, p, wrong_dev);
            RT(cudaGetLastError());
            RT(cudaMemcpy2DFromArrayAsync(pixels.data(), row, arr, 0, 0, row, height,
                                          cudaMemcpyDeviceToHost, stream));
        } else {
            ci_pitched_plane plane;
            CHECK(ci_cuda_receiver_pitched(rx, frame, &plane));
            const uint8_t *base = reinterpret_cast<const uint8_t *>(plane.ptr);
            count_wrong_pitched<<<grid, block, 0, stream>>>(base, plane.pitch, width, height, p,
                                                            wrong_dev);
            RT(cudaGetLastError());
            RT(cudaMemcpy2DAsync(pixels.data(), row, base, plane.pitch, row, height,
                                 cudaMemcpyDeviceToHost, stream));
        }
        RT(cudaMemcpyAsync(wrong_host, wrong_dev, sizeof *wrong_dev, cudaMemcpyDeviceToHost,
                           stream));
        /* The slot goes back once this stream's reads are done (on the GPU). */
        CHECK(ci_cuda_receiver_release_after(rx, frame, stream));
        RT(cudaStreamSynchronize(stream));
        if (tex) RT(cudaDestroyTextureObject(tex));
        if (*wrong_host) {
            bad_gpu++;
            std::fprintf(stderr, "frame %" PRIu64 ": the kernel found %llu wrong texels\n",
                         info.sequence, *wrong_host);
        }
        uint64_t wrong = 0;
        for (uint32_t y = 0; y < height; y++) {
            const uint32_t want = expected(p, y);
            for (uint32_t x = 0; x < width; x++) {
                uint32_t texel;
                std::memcpy(&texel, pixels.data() + (size_t)y * row + (size_t)x * 4, 4);
                wrong += texel != want;
            }
        }
        if (wrong) {
            bad_host++;
            std::fprintf(stderr, "frame %" PRIu64 ": the host copy has %" PRIu64 " wrong texels\n",
                         info.sequence, wrong);
        }
    }
    CHECK(ci_cuda_receiver_free(rx));
    RT(cudaFree(wrong_dev));
    RT(cudaFreeHost(wrong_host));
    RT(cudaStreamDestroy(stream));
    std::printf("runtime receiver (%s ring %ux%u, %s): %" PRIu64
                " frames checked, %" PRIu64 " bad by its kernel, %" PRIu64 " bad by the host copy\n",
                image ? "image" : "buffer", width, height,
                image ? "cudaArray_t, texture object, cudaMemcpy2DFromArrayAsync"
                      : "pitched pointer, cudaMemcpy2DAsync",
                frames, bad_gpu, bad_host);
    return (bad_gpu || bad_host) ? 1 : 0;
}
