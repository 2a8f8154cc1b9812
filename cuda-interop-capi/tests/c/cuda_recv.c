/* A C CUDA receiver (GPU machine only): `cuda_recv NAME FRAMES` connects
 * to the sender NAME (frames.c's `send`: frame n's every word is
 * 0xC0DE0000 + n) with ci_cuda_receiver_connect_named, and for each frame:
 * ci_cuda_receiver_wait_on on its own CUstream, ci_cuda_receiver_pitched,
 * cuMemcpy2DAsync of the pitched rows to the host on that stream,
 * cuStreamSynchronize, every word checked, ci_cuda_receiver_release_after
 * on the stream. Also: a buffer ring has no array and no chroma plane
 * (CI_UNSUPPORTED), a released frame's handle is CI_WRONG_HANDLE (release
 * twice), the layout matches. libcuda is loaded with dlopen: the header
 * names CUDA objects as void * and uint64_t, so no CUDA header is needed.
 * Exit status 0: all good. */
#include <inttypes.h>
#include <string.h>

#include "cuda_dl.h"

enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
typedef struct {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

static CUresult (*cuMemcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);

static uint32_t word_of(uint64_t sequence) { return 0xC0DE0000u + (uint32_t)sequence; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cuda_recv NAME FRAMES\n");
        return 2;
    }
    const char *name = argv[1];
    uint64_t frames = strtoull(argv[2], NULL, 10);
    void *lib = cuda_open();
    load((void **)&cuMemcpy2DAsync, lib, "cuMemcpy2DAsync_v2");

    ci_cuda_receiver *rx = NULL;
    CHECK(ci_cuda_receiver_connect_named(name, CI_DELIVERY_LOSSLESS, 60.0, &rx));
    ci_ring_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    CHECK(ci_cuda_receiver_get_layout(rx, &layout));
    if (layout.format != CI_FORMAT_RGBA8_BUFFER || layout.width != 64 || layout.height != 48) {
        fprintf(stderr, "unexpected layout: format %u, %ux%u\n", layout.format, layout.width,
                layout.height);
        return 1;
    }
    /* The ring's device, its primary context (the receiver's), a stream of
     * this program's own. */
    int32_t ordinal = -1;
    CHECK(ci_cuda_receiver_device(rx, &ordinal));
    CUdevice dev;
    CUcontext cuctx;
    CU(cuDeviceGet(&dev, ordinal));
    CU(cuDevicePrimaryCtxRetain(&cuctx, dev));
    CU(cuCtxSetCurrent(cuctx));
    CUstream stream;
    CU(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));

    size_t row = (size_t)layout.width * 4;
    uint8_t *pixels = malloc(row * layout.height);
    if (!pixels) return 1;
    for (uint64_t n = 1; n <= frames; n++) {
        ci_frame *frame = NULL;
        ci_frame_info info;
        CHECK(ci_cuda_receiver_next(rx, 30.0, &frame));
        CHECK(ci_frame_get_info(frame, &info));
        if (info.sequence != n) {
            fprintf(stderr, "frame %" PRIu64 " arrived as %" PRIu64 "\n", n, info.sequence);
            return 1;
        }
        CHECK(ci_cuda_receiver_wait_on(rx, frame, stream));
        ci_pitched_plane plane;
        CHECK(ci_cuda_receiver_pitched(rx, frame, &plane));
        if (plane.row_bytes != row || plane.rows != layout.height ||
            plane.pitch != layout.row_pitch || plane.ptr == 0) {
            fprintf(stderr, "unexpected plane: %" PRIu64 " bytes x %u rows, pitch %" PRIu64 "\n",
                    plane.row_bytes, plane.rows, plane.pitch);
            return 1;
        }
        if (n == 1) {
            ci_pitched_plane chroma;
            void *array = NULL;
            if (ci_cuda_receiver_chroma(rx, frame, &chroma) != CI_UNSUPPORTED ||
                ci_cuda_receiver_array(rx, frame, &array) != CI_UNSUPPORTED) {
                fprintf(stderr, "a buffer ring gave a chroma plane or an array\n");
                return 1;
            }
        }
        memset(pixels, 0, row * layout.height);
        CUDA_MEMCPY2D copy;
        memset(&copy, 0, sizeof copy);
        copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        copy.srcDevice = plane.ptr;
        copy.srcPitch = plane.pitch;
        copy.dstMemoryType = CU_MEMORYTYPE_HOST;
        copy.dstHost = pixels;
        copy.dstPitch = row;
        copy.WidthInBytes = plane.row_bytes;
        copy.Height = plane.rows;
        CU(cuMemcpy2DAsync(&copy, stream));
        CU(cuStreamSynchronize(stream));
        for (size_t i = 0; i < row * layout.height / 4; i++) {
            uint32_t w;
            memcpy(&w, pixels + 4 * i, 4);
            if (w != word_of(info.sequence)) {
                fprintf(stderr, "frame %" PRIu64 " word %zu is %08x, not %08x\n", n, i, w,
                        word_of(info.sequence));
                return 1;
            }
        }
        CHECK(ci_cuda_receiver_release_after(rx, frame, stream));
        /* Releasing twice: the handle is gone. */
        if (ci_cuda_receiver_release_after(rx, frame, stream) != CI_WRONG_HANDLE ||
            ci_cuda_receiver_pitched(rx, frame, &plane) != CI_WRONG_HANDLE) {
            fprintf(stderr, "a released frame's handle was still accepted\n");
            return 1;
        }
    }
    CU(cuStreamSynchronize(stream));
    free(pixels);
    CHECK(ci_cuda_receiver_free(rx));
    CU(cuStreamDestroy(stream));
    CU(cuDevicePrimaryCtxRelease(dev));
    printf("cuda receiver: %" PRIu64 " frames checked\n", frames);
    return 0;
}
