/* What the C CUDA programs of these tests share (cuda_recv.c,
 * cuda_handoff.c): fatal checks of C ABI and driver calls, the driver API's
 * types as cuda.h declares them (no CUDA header is needed: the C ABI names
 * CUDA objects as void * and uint64_t), and libcuda.so.1 opened with dlopen
 * with the entry points both use. Header-only: each program is one
 * translation unit. */
#ifndef CUDA_DL_H
#define CUDA_DL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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

/* Opens libcuda.so.1, loads the entry points above and calls cuInit; the
 * library's handle (for more entry points), or exits saying why. */
static void *cuda_open(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
        exit(1);
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
    return lib;
}

#endif
