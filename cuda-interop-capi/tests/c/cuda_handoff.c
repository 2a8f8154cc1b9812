/* The C ABI's CUDA hand-off, timed as frame_client (the Rust receiver)
 * times its own (GPU machine only): `cuda_handoff NAME FRAMES` connects to
 * the sender NAME (frame_server --name NAME) with
 * ci_cuda_receiver_connect_named, lossless, and for each frame: the
 * hand-off is from ci_cuda_receiver_next returning to the frame usable on
 * this program's CUstream (ci_cuda_receiver_wait_on, then
 * cuStreamSynchronize); then ci_cuda_receiver_release_after. The first
 * frame is not timed (the import). Prints
 * "c hand-off (packet -> CUDA waited) median M us p99 P us over N frames".
 * libcuda is loaded with dlopen, as cuda_recv.c does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_interop.h"

#define CHECK(call)                                                                   \
    do {                                                                              \
        ci_status s_ = (call);                                                        \
        if (s_ != CI_OK) {                                                            \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, (int)s_, \
                    ci_last_error_message());                                         \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CU(call)                                                                  \
    do {                                                                          \
        int r_ = (call);                                                          \
        if (r_ != 0) {                                                            \
            fprintf(stderr, "%s:%d: %s -> CUresult %d\n", __FILE__, __LINE__, #call, r_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

/* The driver API's types this program uses, as cuda.h declares them. */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamDestroy)(CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);

static void load(void **fn, void *lib, const char *name) {
    *fn = dlsym(lib, name);
    if (!*fn) {
        fprintf(stderr, "libcuda.so.1 lacks %s\n", name);
        exit(1);
    }
}


static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cuda_handoff NAME FRAMES\n");
        return 2;
    }
    const char *name = argv[1];
    uint64_t frames = strtoull(argv[2], NULL, 10);
    if (frames < 2) {
        fprintf(stderr, "FRAMES must be at least 2\n");
        return 2;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    load((void **)&cuInit, lib, "cuInit");
    load((void **)&cuDeviceGet, lib, "cuDeviceGet");
    load((void **)&cuDevicePrimaryCtxRetain, lib, "cuDevicePrimaryCtxRetain");
    load((void **)&cuDevicePrimaryCtxRelease, lib, "cuDevicePrimaryCtxRelease_v2");
    load((void **)&cuCtxSetCurrent, lib, "cuCtxSetCurrent");
    load((void **)&cuStreamCreate, lib, "cuStreamCreate");
    load((void **)&cuStreamDestroy, lib, "cuStreamDestroy_v2");
    load((void **)&cuStreamSynchronize, lib, "cuStreamSynchronize");
    CU(cuInit(0));

    ci_cuda_receiver *rx = NULL;
    CHECK(ci_cuda_receiver_connect_named(name, CI_DELIVERY_LOSSLESS, 60.0, &rx));
    int32_t ordinal = -1;
    CHECK(ci_cuda_receiver_device(rx, &ordinal));
    CUdevice dev;
    CUcontext cuctx;
    CU(cuDeviceGet(&dev, ordinal));
    CU(cuDevicePrimaryCtxRetain(&cuctx, dev));
    CU(cuCtxSetCurrent(cuctx));
    CUstream stream;
    CU(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));

    double *handoff = malloc(sizeof(double) * frames);
    if (!handoff) return 1;
    uint64_t timed = 0;
    for (uint64_t n = 1; n <= frames; n++) {
        ci_frame *frame = NULL;
        CHECK(ci_cuda_receiver_next(rx, 30.0, &frame));
        double arrived = now_us();
        CHECK(ci_cuda_receiver_wait_on(rx, frame, stream));
        CU(cuStreamSynchronize(stream));
        if (n > 1) handoff[timed++] = now_us() - arrived;
        CHECK(ci_cuda_receiver_release_after(rx, frame, stream));
    }
    CU(cuStreamSynchronize(stream));
    qsort(handoff, timed, sizeof(double), by_value);
    printf("c hand-off (packet -> CUDA waited) median %.1f us p99 %.1f us over %" PRIu64
           " frames\n",
           handoff[timed / 2], handoff[(timed * 99) / 100], timed);
    free(handoff);
    CHECK(ci_cuda_receiver_free(rx));
    CU(cuStreamDestroy(stream));
    CU(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
