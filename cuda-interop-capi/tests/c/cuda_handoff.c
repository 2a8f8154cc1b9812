/* The C ABI's CUDA hand-off, timed as frame_client (the Rust receiver)
 * times its own (GPU machine only): `cuda_handoff NAME FRAMES` connects to
 * the sender NAME (frame_server --name NAME) with
 * ci_cuda_receiver_connect_named, lossless, and for each frame: the
 * hand-off is from ci_cuda_receiver_next returning to the frame usable on
 * this program's CUstream (ci_cuda_receiver_wait_on, then cuStreamQuery
 * until the stream is idle: the spin the Rust receiver's
 * Stream::synchronize does first, so that both time the library's path,
 * not two ways of waiting); then ci_cuda_receiver_release_after. The first
 * frame is not timed (the import). Prints
 * "c hand-off (packet -> CUDA waited) median M us p99 P us over N frames".
 * libcuda is loaded with dlopen (cuda_dl.h). */
#define _POSIX_C_SOURCE 199309L
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "cuda_dl.h"

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
    void *lib = cuda_open();
    CUresult (*cuStreamQuery)(CUstream);
    load((void **)&cuStreamQuery, lib, "cuStreamQuery");

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
        CUresult idle;
        while ((idle = cuStreamQuery(stream)) == 600 /* CUDA_ERROR_NOT_READY */) {
        }
        CU(idle);
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
