/* A fake libcuda.so.1 for CPU-only tests of the safe crate's CUDA side.
 * It implements the driver functions cuda-interop calls, with cuda.h 12.9's
 * ABI, records every descriptor it is given (fake_cuda_log), enforces that a
 * context is current for calls that need one (and that a resource is used
 * in the context that made it), counts live objects (fake_cuda_live), keeps
 * an imported fd until its import is destroyed, and lets the test make
 * imports and mappings fail, raise a sticky error on every later call
 * (sticky: what an illegal address does), make enqueued work take time, lower device limits, and
 * choose the devices and their UUIDs (fake_cuda_set*). No GPU is touched:
 * mapped "device" memory is host memory. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUsurfObject;
typedef unsigned long long CUtexObject;
typedef struct { char bytes[16]; } CUuuid;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_CONTEXT = 201,
    ILLEGAL_ADDRESS = 700,
    INVALID_HANDLE = 400,
    NOT_READY = 600,
    NOT_PERMITTED = 800,
    NOT_SUPPORTED = 801,
    UNKNOWN = 999,
};

typedef struct {
    int type;
    union {
        int fd;
        struct { void *handle; const void *name; } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} MemHandleDesc;
typedef struct {
    unsigned long long offset;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} BufferDesc;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned int NumChannels;
    unsigned int Flags;
} Array3DDesc;
typedef struct {
    unsigned long long offset;
    Array3DDesc arrayDesc;
    unsigned int numLevels;
    unsigned int reserved[16];
} MipmappedDesc;
typedef struct {
    int type;
    union {
        int fd;
        struct { void *handle; const void *name; } win32;
        const void *nvSciSyncObj;
    } handle;
    unsigned int flags;
    unsigned int reserved[16];
} SemHandleDesc;
typedef struct {
    struct {
        struct { unsigned long long value; } fence;
        union { void *fence; unsigned long long reserved; } nvSciSync;
        struct { unsigned long long key; } keyedMutex;
        unsigned int reserved[12];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} SignalParams;
typedef struct {
    struct {
        struct { unsigned long long value; } fence;
        union { void *fence; unsigned long long reserved; } nvSciSync;
        struct { unsigned long long key; unsigned int timeoutMs; } keyedMutex;
        unsigned int reserved[10];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} WaitParams;
typedef struct {
    int resType;
    union {
        struct { void *hArray; } array;
        int reserved[32];
    } res;
    unsigned int flags;
} ResourceDesc;

_Static_assert(sizeof(MemHandleDesc) == 104, "CUDA_EXTERNAL_MEMORY_HANDLE_DESC");
_Static_assert(sizeof(BufferDesc) == 88, "CUDA_EXTERNAL_MEMORY_BUFFER_DESC");
_Static_assert(sizeof(Array3DDesc) == 40, "CUDA_ARRAY3D_DESCRIPTOR");
_Static_assert(sizeof(MipmappedDesc) == 120, "CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC");
_Static_assert(sizeof(SemHandleDesc) == 96, "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC");
_Static_assert(sizeof(SignalParams) == 144, "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS");
_Static_assert(sizeof(WaitParams) == 144, "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS");
_Static_assert(sizeof(ResourceDesc) == 144, "CUDA_RESOURCE_DESC");

/* Objects: every handle is a pointer to one of these, tagged by kind. */
enum Kind { K_MEMORY = 1, K_BUFFER, K_ALLOC, K_ARRAY, K_LEVEL, K_SURFACE, K_TEXTURE, K_SEMAPHORE, K_STREAM, K_EVENT, K_KINDS };
static const char *kind_names[K_KINDS] = {
    "", "memory", "buffer", "alloc", "array", "level", "surface", "texture", "semaphore", "stream", "event",
};
typedef struct Obj {
    int kind;
    CUcontext ctx;
    int fd;                 /* memory, semaphore: the fd the import holds */
    unsigned long long size;
    unsigned char *bytes;   /* buffer, alloc: the "device" memory */
    unsigned int flags;     /* array: CUDA_ARRAY3D flags */
    unsigned int levels;    /* array */
    struct Obj *levelv;     /* array: its level views */
    struct Obj *parent;     /* level: its array */
    long long busy_until;   /* stream: when its enqueued work completes; event: when it does */
} Obj;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long live[K_KINDS];
static char *logbuf;
static size_t loglen, logcap;

static long long import_fail = 0;       /* CUresult the imports return (0: succeed) */
static long long map_fail = 0;          /* CUresult the buffer and array mappings return (0: succeed) */
static long long sticky = 0;            /* a sticky error (e.g. 700): every call needing a context returns it */
static long long close_on_fail = 0;     /* a failed import closes its fd (Mesa's habit) */
static long long alloc_size = 0;        /* the allocation behind every fd (0: as large as imported) */
static long long latency_ms = 0;        /* enqueued work completes after this (-1: never) */
static long long event_query_fail_at = 0; /* cuEventQuery fails once this many have been counted (0: never) */
static int release_stuck = 0;           /* set: the work that was never to complete has completed */
static long long streams_of_another_context = 0; /* cuStreamGetCtx reports a context of its own for each stream */
static long long max_surface2d = 131072;
static long long max_tex2d_mipmapped = 32768;
static int device_count = 1;
static unsigned char uuids[4][16] = {{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};
static int retained[4];

static __thread CUcontext stack[64];
static __thread int depth;
/* Set while a host function (cuLaunchHostFunc) runs on this thread: CUDA calls are refused. */
static __thread int in_host_function;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void say(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&lock);
    if (loglen + n + 1 > logcap) {
        size_t cap = logcap ? logcap * 2 : 1 << 16;
        while (cap < loglen + n + 1) cap *= 2;
        logbuf = realloc(logbuf, cap);
        logcap = cap;
    }
    memcpy(logbuf + loglen, line, n);
    loglen += n;
    logbuf[loglen] = 0;
    pthread_mutex_unlock(&lock);
}

static CUcontext current(void) { return depth > 0 ? stack[depth - 1] : NULL; }
static CUcontext primary(int dev) { return (CUcontext)(uintptr_t)(0x1000 + 0x100 * dev); }

static Obj *make(int kind) {
    Obj *o = calloc(1, sizeof(Obj));
    o->kind = kind;
    o->ctx = current();
    o->fd = -1;
    pthread_mutex_lock(&lock);
    live[kind]++;
    pthread_mutex_unlock(&lock);
    return o;
}

static void unmake(Obj *o) {
    pthread_mutex_lock(&lock);
    live[o->kind]--;
    pthread_mutex_unlock(&lock);
    free(o->bytes);
    free(o);
}

/* Streams of the process, to report work still pending when something is destroyed. */
static Obj *streams[4096];
/* When the work of the streams destroyed so far completes. */
static long long destroyed_busy_until;
/* The default stream handles (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
 * are one stream of the current context here: calls that take a stream
 * resolve them with `default_stream` first. */
static Obj default_stream_obj = {.kind = K_STREAM, .fd = -1};
static void *default_stream(void *h) {
    if ((uintptr_t)h > 2) return h;
    default_stream_obj.ctx = current();
    return &default_stream_obj;
}

/* Whether work busy until `until` is still running at `t`. */
static int still_busy(long long until, long long t) {
    if (until == INT64_MAX && release_stuck) return 0;
    return until > t;
}

static int busy_streams(void) {
    long long t = now_ns();
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (streams[i] && still_busy(streams[i]->busy_until, t)) n++;
    if (still_busy(default_stream_obj.busy_until, t)) n++;
    if (still_busy(destroyed_busy_until, t)) n++;
    pthread_mutex_unlock(&lock);
    return n;
}

static int all_zero(const unsigned int *words, int n) {
    for (int i = 0; i < n; i++)
        if (words[i]) return 0;
    return 1;
}

/* A call that needs a current context, on an object of `kind` (or none). */
static CUresult need(Obj *o, int kind, const char *call) {
    if (sticky) {
        say("%s error=sticky code=%lld", call, sticky);
        return (CUresult)sticky;
    }
    if (in_host_function) {
        say("%s error=cuda-call-in-host-function", call);
        return NOT_PERMITTED;
    }
    if (!current()) {
        say("%s error=no-current-context", call);
        return INVALID_CONTEXT;
    }
    if (kind && (!o || o->kind != kind)) {
        say("%s error=bad-handle", call);
        return INVALID_HANDLE;
    }
    if (o && o->ctx != current()) {
        say("%s error=wrong-context ctx=%p made-in=%p", call, current(), o->ctx);
        return INVALID_CONTEXT;
    }
    return OK;
}

/* Pointers handed out (mapped buffers and allocations), to free by address. */
static Obj *pointers[65536];
static void remember(Obj *o) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 65536; i++)
        if (!pointers[i]) { pointers[i] = o; break; }
    pthread_mutex_unlock(&lock);
}
static Obj *forget_pointer(CUdeviceptr p) {
    Obj *found = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 65536; i++)
        if (pointers[i] && (CUdeviceptr)(uintptr_t)pointers[i]->bytes == p) {
            found = pointers[i];
            pointers[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&lock);
    return found;
}

static void enqueue(Obj *stream) {
    long long until = latency_ms < 0 ? INT64_MAX : now_ns() + latency_ms * 1000000LL;
    if (!still_busy(stream->busy_until, now_ns()) || until > stream->busy_until) stream->busy_until = until;
}

/* ---- controls, for the tests ---- */

size_t fake_cuda_log(char *out, size_t cap) {
    pthread_mutex_lock(&lock);
    size_t n = loglen;
    if (out && cap) {
        size_t m = n < cap - 1 ? n : cap - 1;
        memcpy(out, logbuf ? logbuf : "", m);
        out[m] = 0;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

void fake_cuda_clear_log(void) {
    pthread_mutex_lock(&lock);
    loglen = 0;
    if (logbuf) logbuf[0] = 0;
    pthread_mutex_unlock(&lock);
}

int fake_cuda_set(const char *key, long long value) {
    if (!strcmp(key, "import_fail")) import_fail = value;
    else if (!strcmp(key, "close_on_fail")) close_on_fail = value;
    else if (!strcmp(key, "map_fail")) map_fail = value;
    else if (!strcmp(key, "sticky")) sticky = value;
    else if (!strcmp(key, "alloc_size")) alloc_size = value;
    else if (!strcmp(key, "latency_ms")) latency_ms = value;
    else if (!strcmp(key, "event_query_fail_at")) event_query_fail_at = value;
    else if (!strcmp(key, "release_stuck")) release_stuck = value;
    else if (!strcmp(key, "streams_of_another_context")) streams_of_another_context = value;
    else if (!strcmp(key, "max_surface2d")) max_surface2d = value;
    else if (!strcmp(key, "max_tex2d_mipmapped")) max_tex2d_mipmapped = value;
    else return -1;
    return 0;
}

int fake_cuda_set_devices(const unsigned char *ids, int count) {
    if (count < 0 || count > 4) return -1;
    memcpy(uuids, ids, 16 * (size_t)count);
    device_count = count;
    return 0;
}

long fake_cuda_live(const char *what) {
    for (int k = 1; k < K_KINDS; k++)
        if (!strcmp(what, kind_names[k])) {
            pthread_mutex_lock(&lock);
            long n = live[k];
            pthread_mutex_unlock(&lock);
            return n;
        }
    return -1;
}

/* How many cuStreamQuery and cuEventQuery calls were made (not logged: a
 * bounded wait makes thousands). */
static long long stream_queries = 0, event_queries = 0;

/* The count of `what` ("cuStreamQuery", "cuEventQuery"); -1 for another name. */
long long fake_cuda_queries(const char *what) {
    long long n = -1;
    pthread_mutex_lock(&lock);
    if (!strcmp(what, "cuStreamQuery")) n = stream_queries;
    else if (!strcmp(what, "cuEventQuery")) n = event_queries;
    pthread_mutex_unlock(&lock);
    return n;
}

void *fake_cuda_current(void) { return current(); }

/* ---- initialisation, errors, devices ---- */

CUresult cuInit(unsigned int flags) {
    say("cuInit flags=%u", flags);
    return flags ? INVALID_VALUE : OK;
}

CUresult cuDriverGetVersion(int *v) {
    *v = 12090;
    return OK;
}

static const char *name_of(CUresult r) {
    switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult r, const char **s) {
    *s = name_of(r);
    return *s ? OK : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **s) {
    *s = name_of(r) ? "fake driver error" : NULL;
    return *s ? OK : INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *n) {
    *n = device_count;
    return OK;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count) return INVALID_VALUE;
    *d = ordinal;
    return OK;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake CUDA device %d", d);
    return OK;
}

#ifndef FAKE_OMIT_UUID_V2
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    memcpy(u->bytes, uuids[d], 16);
    return OK;
}
#endif

CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    switch (attribute) {
    case 20: *v = 0; break; /* compute mode: default */
    case 56: case 57: *v = (int)max_surface2d; break;
    case 73: case 74: *v = (int)max_tex2d_mipmapped; break;
    default: *v = 0;
    }
    say("cuDeviceGetAttribute attribute=%d value=%d", attribute, *v);
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (d < 0 || d >= device_count) return INVALID_VALUE;
    retained[d]++;
    *c = primary(d);
    say("cuDevicePrimaryCtxRetain device=%d ctx=%p", d, *c);
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= device_count || retained[d] == 0) return INVALID_CONTEXT;
    retained[d]--;
    say("cuDevicePrimaryCtxRelease device=%d", d);
    return OK;
}

CUresult cuCtxPushCurrent_v2(CUcontext c) {
    if (!c || depth == 64) return INVALID_VALUE;
    stack[depth++] = c;
    return OK;
}

CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    if (depth == 0) return INVALID_CONTEXT;
    CUcontext top = stack[--depth];
    if (c) *c = top;
    return OK;
}

CUresult cuCtxGetCurrent(CUcontext *c) {
    *c = current();
    return OK;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    CUresult r = need(NULL, 0, "cuMemGetInfo");
    if (r) return r;
    *free_bytes = 1ull << 33;
    *total = 1ull << 34;
    return OK;
}

/* ---- external memory ---- */

CUresult cuImportExternalMemory(void **out, const MemHandleDesc *d) {
    CUresult r = need(NULL, 0, "cuImportExternalMemory");
    if (r) return r;
    int open = fcntl(d->handle.fd, F_GETFD) != -1;
    say("cuImportExternalMemory ctx=%p type=%d fd=%d fd_open=%d size=%llu flags=%u reserved_zero=%d",
        current(), d->type, d->handle.fd, open, d->size, d->flags, all_zero(d->reserved, 16));
    if (!open || d->size == 0 || (d->flags & ~1u) || !all_zero(d->reserved, 16)) return INVALID_VALUE;
    if (import_fail) {
        if (close_on_fail) close(d->handle.fd);
        return (CUresult)import_fail;
    }
    Obj *o = make(K_MEMORY);
    o->fd = d->handle.fd; /* the driver owns it now */
    o->size = d->size;
    *out = o;
    return OK;
}

CUresult cuDestroyExternalMemory(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_MEMORY, "cuDestroyExternalMemory");
    if (r) return r;
    say("cuDestroyExternalMemory ctx=%p size=%llu busy_streams=%d", current(), o->size, busy_streams());
    close(o->fd);
    unmake(o);
    return OK;
}

CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *ptr, void *h, const BufferDesc *d) {
    Obj *m = h;
    CUresult r = need(m, K_MEMORY, "cuExternalMemoryGetMappedBuffer");
    if (r) return r;
    say("cuExternalMemoryGetMappedBuffer ctx=%p offset=%llu size=%llu flags=%u reserved_zero=%d import_size=%llu",
        current(), d->offset, d->size, d->flags, all_zero(d->reserved, 16), m->size);
    if (d->flags || !all_zero(d->reserved, 16) || d->size == 0 || d->offset + d->size > m->size) return INVALID_VALUE;
    /* As the H200's driver: the import takes any size, a mapping past the
       real allocation does not. */
    if (alloc_size && d->offset + d->size > (unsigned long long)alloc_size) return INVALID_VALUE;
    if (map_fail) return (CUresult)map_fail;
    Obj *o = make(K_BUFFER);
    o->size = d->size;
    o->bytes = calloc(1, d->size);
    remember(o);
    *ptr = (CUdeviceptr)(uintptr_t)o->bytes;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    CUresult r = need(NULL, 0, "cuMemAlloc");
    if (r) return r;
    if (!size) return INVALID_VALUE;
    Obj *o = make(K_ALLOC);
    o->size = size;
    o->bytes = calloc(1, size);
    remember(o);
    *ptr = (CUdeviceptr)(uintptr_t)o->bytes;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    CUresult r = need(NULL, 0, "cuMemFree");
    if (r) return r;
    Obj *o = forget_pointer(p);
    if (!o) {
        say("cuMemFree error=unknown-pointer");
        return INVALID_VALUE;
    }
    if (o->ctx != current()) {
        say("cuMemFree error=wrong-context");
        return INVALID_CONTEXT;
    }
    say("cuMemFree ctx=%p kind=%s size=%llu busy_streams=%d", current(), kind_names[o->kind], o->size, busy_streams());
    unmake(o);
    return OK;
}

#ifndef FAKE_OMIT_MIPMAPPED
CUresult cuExternalMemoryGetMappedMipmappedArray(void **out, void *h, const MipmappedDesc *d) {
    Obj *m = h;
    CUresult r = need(m, K_MEMORY, "cuExternalMemoryGetMappedMipmappedArray");
    if (r) return r;
    const Array3DDesc *a = &d->arrayDesc;
    say("cuExternalMemoryGetMappedMipmappedArray ctx=%p offset=%llu width=%zu height=%zu depth=%zu format=%d "
        "channels=%u flags=%u levels=%u reserved_zero=%d",
        current(), d->offset, a->Width, a->Height, a->Depth, a->Format, a->NumChannels, a->Flags, d->numLevels,
        all_zero(d->reserved, 16));
    if (!all_zero(d->reserved, 16) || d->numLevels == 0 || d->numLevels > 16) return INVALID_VALUE;
    if (map_fail) return (CUresult)map_fail;
    Obj *o = make(K_ARRAY);
    o->flags = a->Flags;
    o->levels = d->numLevels;
    o->levelv = calloc(d->numLevels, sizeof(Obj));
    for (unsigned i = 0; i < d->numLevels; i++) {
        o->levelv[i].kind = K_LEVEL;
        o->levelv[i].ctx = o->ctx;
        o->levelv[i].parent = o;
    }
    *out = o;
    return OK;
}
#endif

CUresult cuMipmappedArrayGetLevel(void **level, void *h, unsigned int i) {
    Obj *o = h;
    CUresult r = need(o, K_ARRAY, "cuMipmappedArrayGetLevel");
    if (r) return r;
    if (i >= o->levels) return INVALID_VALUE;
    *level = &o->levelv[i];
    return OK;
}

CUresult cuMipmappedArrayDestroy(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_ARRAY, "cuMipmappedArrayDestroy");
    if (r) return r;
    say("cuMipmappedArrayDestroy ctx=%p busy_streams=%d", current(), busy_streams());
    free(o->levelv);
    unmake(o);
    return OK;
}

static CUresult level_of(const ResourceDesc *res, Obj **level) {
    Obj *l = res->res.array.hArray;
    if (res->resType != 0 || !l || l->kind != K_LEVEL) return INVALID_HANDLE;
    *level = l;
    return OK;
}

CUresult cuSurfObjectCreate(CUsurfObject *s, const ResourceDesc *res) {
    Obj *l;
    CUresult r = need(NULL, 0, "cuSurfObjectCreate");
    if (r || (r = level_of(res, &l))) return r;
    int ldst = (l->parent->flags & 2) != 0;
    say("cuSurfObjectCreate ctx=%p surface_ldst=%d", current(), ldst);
    if (!ldst) return INVALID_VALUE; /* as the driver: only arrays with SURFACE_LDST */
    Obj *o = make(K_SURFACE);
    *s = (CUsurfObject)(uintptr_t)o;
    return OK;
}

CUresult cuSurfObjectDestroy(CUsurfObject s) {
    Obj *o = (Obj *)(uintptr_t)s;
    CUresult r = need(o, K_SURFACE, "cuSurfObjectDestroy");
    if (r) return r;
    unmake(o);
    return OK;
}

CUresult cuTexObjectCreate(CUtexObject *t, const ResourceDesc *res, const void *tex, const void *view) {
    Obj *l;
    (void)tex;
    (void)view;
    CUresult r = need(NULL, 0, "cuTexObjectCreate");
    if (r || (r = level_of(res, &l))) return r;
    Obj *o = make(K_TEXTURE);
    *t = (CUtexObject)(uintptr_t)o;
    return OK;
}

CUresult cuTexObjectDestroy(CUtexObject t) {
    Obj *o = (Obj *)(uintptr_t)t;
    CUresult r = need(o, K_TEXTURE, "cuTexObjectDestroy");
    if (r) return r;
    unmake(o);
    return OK;
}

/* ---- external semaphores ---- */

CUresult cuImportExternalSemaphore(void **out, const SemHandleDesc *d) {
    CUresult r = need(NULL, 0, "cuImportExternalSemaphore");
    if (r) return r;
    int open = fcntl(d->handle.fd, F_GETFD) != -1;
    say("cuImportExternalSemaphore ctx=%p type=%d fd=%d fd_open=%d flags=%u reserved_zero=%d", current(), d->type,
        d->handle.fd, open, d->flags, all_zero(d->reserved, 16));
    if (!open || d->flags || !all_zero(d->reserved, 16)) return INVALID_VALUE;
    if (import_fail) {
        if (close_on_fail) close(d->handle.fd);
        return (CUresult)import_fail;
    }
    Obj *o = make(K_SEMAPHORE);
    o->fd = d->handle.fd;
    o->size = (unsigned long long)d->type;
    *out = o;
    return OK;
}

CUresult cuDestroyExternalSemaphore(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_SEMAPHORE, "cuDestroyExternalSemaphore");
    if (r) return r;
    say("cuDestroyExternalSemaphore ctx=%p busy_streams=%d", current(), busy_streams());
    close(o->fd);
    unmake(o);
    return OK;
}

/* Numbers each batched semaphore call, so that a log line says which call
   (and how many entries) it belongs to. */
static unsigned semaphore_calls;

CUresult cuSignalExternalSemaphoresAsync(void *const *sems, const SignalParams *p, unsigned int n, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuSignalExternalSemaphoresAsync");
    if (r) return r;
    semaphore_calls++;
    for (unsigned i = 0; i < n; i++) {
        Obj *s = sems[i];
        if ((r = need(s, K_SEMAPHORE, "cuSignalExternalSemaphoresAsync"))) return r;
        say("cuSignalExternalSemaphoresAsync ctx=%p call=%u n=%u value=%llu flags=%u reserved_zero=%d", current(), semaphore_calls, n,
            p[i].params.fence.value, p[i].flags,
            all_zero(p[i].params.reserved, 12) && all_zero(p[i].reserved, 16) && !p[i].params.nvSciSync.reserved &&
                !p[i].params.keyedMutex.key);
    }
    enqueue(stream);
    return OK;
}

CUresult cuWaitExternalSemaphoresAsync(void *const *sems, const WaitParams *p, unsigned int n, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuWaitExternalSemaphoresAsync");
    if (r) return r;
    semaphore_calls++;
    for (unsigned i = 0; i < n; i++) {
        Obj *s = sems[i];
        if ((r = need(s, K_SEMAPHORE, "cuWaitExternalSemaphoresAsync"))) return r;
        say("cuWaitExternalSemaphoresAsync ctx=%p call=%u n=%u value=%llu flags=%u reserved_zero=%d", current(), semaphore_calls, n,
            p[i].params.fence.value, p[i].flags,
            all_zero(p[i].params.reserved, 10) && all_zero(p[i].reserved, 16) && !p[i].params.nvSciSync.reserved &&
                !p[i].params.keyedMutex.key && !p[i].params.keyedMutex.timeoutMs);
    }
    enqueue(stream);
    return OK;
}

/* ---- streams, events, copies ---- */

CUresult cuStreamCreate(void **out, unsigned int flags) {
    (void)flags;
    CUresult r = need(NULL, 0, "cuStreamCreate");
    if (r) return r;
    Obj *o = make(K_STREAM);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (!streams[i]) { streams[i] = o; break; }
    pthread_mutex_unlock(&lock);
    *out = o;
    return OK;
}

CUresult cuStreamDestroy_v2(void *h) {
    Obj *o = h;
    CUresult r = need(o, K_STREAM, "cuStreamDestroy");
    if (r) return r;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 4096; i++)
        if (streams[i] == o) streams[i] = NULL;
    /* Its work still completes (as the driver has it): counted as busy until then. */
    if (o->busy_until > destroyed_busy_until) destroyed_busy_until = o->busy_until;
    pthread_mutex_unlock(&lock);
    unmake(o);
    return OK;
}

/* The stream's context; the default stream handles (NULL, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) are the current context's, as the driver has it. */
CUresult cuStreamGetCtx(void *h, CUcontext *out) {
    CUresult r = need(NULL, 0, "cuStreamGetCtx");
    if (r) return r;
    uintptr_t v = (uintptr_t)h;
    if (v == 0 || v == 1 || v == 2) {
        *out = current();
        return OK;
    }
    Obj *o = h;
    if (o->kind != K_STREAM) return INVALID_HANDLE;
    /* A stand-in for a stream of a context the caller created (not the
     * primary one): the streams are the fake's all the same. */
    *out = streams_of_another_context ? (CUcontext)(uintptr_t)0xC0FFEE000 : o->ctx;
    say("cuStreamGetCtx ctx=%p", *out);
    return OK;
}

CUresult cuStreamQuery(void *h) {
    h = default_stream(h);
    Obj *o = h;
    CUresult r = need(o, K_STREAM, "cuStreamQuery");
    if (r) return r;
    pthread_mutex_lock(&lock);
    stream_queries++;
    pthread_mutex_unlock(&lock);
    return still_busy(o->busy_until, now_ns()) ? NOT_READY : OK;
}

CUresult cuEventCreate(void **out, unsigned int flags) {
    (void)flags;
    CUresult r = need(NULL, 0, "cuEventCreate");
    if (r) return r;
    *out = make(K_EVENT);
    return OK;
}

CUresult cuEventRecord(void *e, void *stream) {
    stream = default_stream(stream);
    Obj *ev = e, *s = stream;
    CUresult r = need(ev, K_EVENT, "cuEventRecord");
    if (r || (r = need(s, K_STREAM, "cuEventRecord"))) return r;
    ev->busy_until = s->busy_until;
    say("cuEventRecord ctx=%p pending=%d", current(), now_ns() < ev->busy_until);
    return OK;
}

CUresult cuEventQuery(void *e) {
    Obj *ev = e;
    CUresult r = need(ev, K_EVENT, "cuEventQuery");
    if (r) return r;
    pthread_mutex_lock(&lock);
    int failing = event_query_fail_at > 0 && event_queries >= event_query_fail_at;
    if (!failing) event_queries++;
    pthread_mutex_unlock(&lock);
    if (failing) {
        say("cuEventQuery error=injected");
        return UNKNOWN;
    }
    return still_busy(ev->busy_until, now_ns()) ? NOT_READY : OK;
}

CUresult cuEventDestroy_v2(void *e) {
    Obj *ev = e;
    CUresult r = need(ev, K_EVENT, "cuEventDestroy");
    if (r) return r;
    say("cuEventDestroy ctx=%p pending=%d", current(), now_ns() < ev->busy_until);
    unmake(ev);
    return OK;
}

/* The stream waits for the event's record: its work completes no earlier. */
CUresult cuStreamWaitEvent(void *stream, void *e, unsigned int flags) {
    stream = default_stream(stream);
    Obj *s = stream, *ev = e;
    CUresult r = need(s, K_STREAM, "cuStreamWaitEvent");
    if (r || (r = need(ev, K_EVENT, "cuStreamWaitEvent"))) return r;
    if (flags) return INVALID_VALUE;
    if (ev->busy_until > s->busy_until) s->busy_until = ev->busy_until;
    say("cuStreamWaitEvent ctx=%p", current());
    return OK;
}

/* Host functions: each runs on a thread of its own once the stream's work
 * enqueued before it has completed (its busy_until at the launch), with no
 * context current and CUDA calls refused; one behind work that never
 * completes is never called. */
typedef void (*HostFn)(void *);
typedef struct { HostFn fn; void *data; long long at; } HostCall;

static void *run_host_function(void *p) {
    HostCall *c = p;
    struct timespec at = { (time_t)(c->at / 1000000000LL), (long)(c->at % 1000000000LL) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {}
    say("host_function_ran late_us=%lld", (now_ns() - c->at) / 1000);
    in_host_function = 1;
    c->fn(c->data);
    in_host_function = 0;
    say("host_function_returned");
    free(c);
    return NULL;
}

CUresult cuLaunchHostFunc(void *stream, HostFn fn, void *data) {
    stream = default_stream(stream);
    Obj *s = stream;
    CUresult r = need(s, K_STREAM, "cuLaunchHostFunc");
    if (r) return r;
    if (!fn) return INVALID_VALUE;
    long long at = s->busy_until;
    say("cuLaunchHostFunc ctx=%p never=%d", current(), at == INT64_MAX);
    if (at == INT64_MAX) return OK;
    HostCall *c = malloc(sizeof *c);
    c->fn = fn;
    c->data = data;
    c->at = at;
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, run_host_function, c);
    pthread_attr_destroy(&attr);
    if (failed) {
        free(c);
        return UNKNOWN;
    }
    return OK;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuMemcpyDtoDAsync");
    if (r) return r;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    say("cuMemcpyDtoDAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuMemcpyDtoHAsync");
    if (r) return r;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    say("cuMemcpyDtoHAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuMemcpyHtoDAsync");
    if (r) return r;
    memcpy((void *)(uintptr_t)dst, src, n);
    say("cuMemcpyHtoDAsync ctx=%p bytes=%zu", current(), n);
    enqueue(stream);
    return OK;
}

/* ---- modules, kernel launches, 3D copies (the level copies of copy.rs) ----
 * Modules and functions are not counted among the kinds: the log says what
 * was loaded, launched and unloaded. A launch logs its grid, block and its
 * first five parameters read as the copy kernels declare them (u64 x 3,
 * u32 x 2), and whether the surface parameter is a live surface of the
 * current context; nothing is copied. */
typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} Memcpy3D;
_Static_assert(sizeof(Memcpy3D) == 200, "CUDA_MEMCPY3D");

#define MODULE_MAGIC 0x4d6f64756c65ULL
#define FUNCTION_MAGIC 0x46756e6374ULL
typedef struct { unsigned long long magic; CUcontext ctx; } FakeModule;
typedef struct { unsigned long long magic; CUcontext ctx; FakeModule *module; char name[64]; } FakeFunction;

CUresult cuModuleLoadData(void **out, const void *image) {
    CUresult r = need(NULL, 0, "cuModuleLoadData");
    if (r) return r;
    const char *text = image;
    int copy_kernels = strstr(text, ".entry array_to_linear_4b_r4") && strstr(text, ".entry linear_to_array_16b_r4");
    say("cuModuleLoadData ctx=%p copy_kernels=%d", current(), copy_kernels);
    FakeModule *m = calloc(1, sizeof *m);
    m->magic = MODULE_MAGIC;
    m->ctx = current();
    *out = m;
    return OK;
}

CUresult cuModuleGetFunction(void **out, void *module, const char *name) {
    FakeModule *m = module;
    CUresult r = need(NULL, 0, "cuModuleGetFunction");
    if (r) return r;
    if (!m || m->magic != MODULE_MAGIC || m->ctx != current()) return INVALID_HANDLE;
    FakeFunction *f = calloc(1, sizeof *f);
    f->magic = FUNCTION_MAGIC;
    f->ctx = current();
    f->module = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    *out = f; /* never freed: a handful per module */
    return OK;
}

CUresult cuModuleUnload(void *module) {
    FakeModule *m = module;
    CUresult r = need(NULL, 0, "cuModuleUnload");
    if (r) return r;
    if (!m || m->magic != MODULE_MAGIC || m->ctx != current()) return INVALID_HANDLE;
    say("cuModuleUnload ctx=%p busy_streams=%d", current(), busy_streams());
    m->magic = 0;
    free(m);
    return OK;
}

CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    stream = default_stream(stream);
    FakeFunction *f = function;
    CUresult r = need(stream, K_STREAM, "cuLaunchKernel");
    if (r) return r;
    if (!f || f->magic != FUNCTION_MAGIC || f->ctx != current() || f->module->magic != MODULE_MAGIC) {
        say("cuLaunchKernel error=bad-function");
        return INVALID_HANDLE;
    }
    unsigned long long a[3];
    for (int i = 0; i < 3; i++) a[i] = *(const unsigned long long *)params[i];
    unsigned w = *(const unsigned *)params[3], h = *(const unsigned *)params[4];
    if (!strncmp(f->name, "convert_", 8)) {
        /* The colour conversion kernels (cuda-interop/kernels/convert.cu):
           (a0, a1, a2, width, height, pitch a5, chroma a6, flags a7, coefficients a8), the
           surface (if any) a0 when converting from one, a2 when into one. */
        unsigned long long a5 = *(const unsigned long long *)params[5], a6 = *(const unsigned long long *)params[6];
        unsigned flags = *(const unsigned *)params[7];
        const float *c = (const float *)params[8];
        size_t n = strlen(f->name);
        int from_surface = strstr(f->name, "_surface_to_") != NULL;
        int to_surface = n > 8 && !strcmp(f->name + n - 8, "_surface");
        Obj *surface = from_surface ? (Obj *)(uintptr_t)a[0] : to_surface ? (Obj *)(uintptr_t)a[2] : NULL;
        int surface_ok = surface && surface->kind == K_SURFACE && surface->ctx == current();
        say("cuLaunchKernel ctx=%p kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%u extra_null=%d "
            "a0=%llu a1=%llu a2=%llu width=%u height=%u pitch=%llu chroma=%llu flags=%u surface=%d surface_ok=%d "
            "m0=%.6f off0=%.3f off1=%.3f",
            current(), f->name, gx, gy, gz, bx, by, bz, shared, extra == NULL, a[0], a[1], a[2], w, h, a5, a6, flags,
            surface != NULL, surface_ok, c[0], c[9], c[10]);
        enqueue(stream);
        return OK;
    }
    int to_linear = !strncmp(f->name, "array_to_linear", 15);
    Obj *surface = (Obj *)(uintptr_t)(to_linear ? a[0] : a[2]);
    int surface_ok = surface && surface->kind == K_SURFACE && surface->ctx == current();
    say("cuLaunchKernel ctx=%p kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%u extra_null=%d "
        "a0=%llu a1=%llu a2=%llu width=%u height=%u surface_ok=%d",
        current(), f->name, gx, gy, gz, bx, by, bz, shared, extra == NULL, a[0], a[1], a[2], w, h, surface_ok);
    enqueue(stream);
    return OK;
}

CUresult cuMemcpy3DAsync_v2(const Memcpy3D *p, void *stream) {
    stream = default_stream(stream);
    CUresult r = need(stream, K_STREAM, "cuMemcpy3DAsync");
    if (r) return r;
    say("cuMemcpy3DAsync ctx=%p src_type=%d dst_type=%d src_device=%llu dst_device=%llu src_pitch=%zu "
        "dst_pitch=%zu src_height=%zu dst_height=%zu width_bytes=%zu height=%zu depth=%zu array_is_level=%d",
        current(), p->srcMemoryType, p->dstMemoryType, p->srcDevice, p->dstDevice, p->srcPitch, p->dstPitch,
        p->srcHeight, p->dstHeight, p->WidthInBytes, p->Height, p->Depth,
        ((Obj *)(p->srcMemoryType == 3 ? p->srcArray : p->dstArray))->kind == K_LEVEL);
    enqueue(stream);
    return OK;
}
