/* Does a stream blocked behind a wait hold back the crate's sleeper stream?
 * (Stream::synchronize_sleeping's safety condition; from the run-62 review.)
 *
 * N streams wait (cuStreamWaitValue64) on word 0 of a pinned page, which the
 * host sets only at t = 3 s. Then, as Stream::synchronize_sleeping does: a
 * stream B writes 2 into word 1 (cuStreamWriteValue64), a sleeper stream S
 * waits for word 1 >= 2 and records a blocking-sync event, and a watchdog
 * thread compare-and-swaps word 1 from 0 to 3 at t = 0.2 s. The caller
 * sleeps in cuEventSynchronize. It should return at once (B's write) or at
 * 0.2 s at the latest; it returns at 3 s when one of the N streams shares a
 * hardware queue (CUDA_DEVICE_MAX_CONNECTIONS) with S or B.
 *
 *   gcc -O1 sleeper_queue.c -o sleeper_queue $(ldconfig -p | grep -m1 'libcuda.so.1 ' | awk '{print $NF}') -lpthread
 *   ./sleeper_queue N
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *Handle;
typedef unsigned long long u64;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(Handle *, int);
CUresult cuCtxSetCurrent(Handle);
CUresult cuStreamCreate(Handle *, unsigned);
CUresult cuMemAllocHost_v2(Handle *, size_t);
CUresult cuStreamWaitValue64_v2(Handle, u64, u64, unsigned);
CUresult cuStreamWriteValue64_v2(Handle, u64, u64, unsigned);
CUresult cuEventCreate(Handle *, unsigned);
CUresult cuEventRecord(Handle, Handle);
CUresult cuEventSynchronize(Handle);

static volatile u64 *word;
static double t0;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9 - t0;
}

static void *watchdog(void *unused) {
    (void)unused;
    usleep(200000);
    u64 expected = 0;
    int swapped = __atomic_compare_exchange_n(&word[1], &expected, 3, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    printf("%.3f s: watchdog compare-and-swap %s\n", now(), swapped ? "wrote 3" : "found the stream's write");
    usleep(2800000);
    __atomic_store_n(&word[0], 1, __ATOMIC_SEQ_CST);
    printf("%.3f s: the %s blocked streams released\n", now(), "N");
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8, device, errors = 0;
    Handle context, stream, writer, sleeper, event;
    setvbuf(stdout, NULL, _IONBF, 0);
    cuInit(0);
    cuDeviceGet(&device, 0);
    cuDevicePrimaryCtxRetain(&context, device);
    cuCtxSetCurrent(context);
    cuMemAllocHost_v2((Handle *)&word, 4096);
    word[0] = word[1] = 0;
    for (int i = 0; i < n; i++) {
        cuStreamCreate(&stream, 1);
        errors |= cuStreamWaitValue64_v2(stream, (u64)&word[0], 1, 0);
    }
    cuStreamCreate(&writer, 1);
    cuStreamCreate(&sleeper, 1);
    cuEventCreate(&event, 3); /* BLOCKING_SYNC | DISABLE_TIMING */
    t0 = 0;
    t0 = now();
    errors |= cuStreamWriteValue64_v2(writer, (u64)&word[1], 2, 0);
    errors |= cuStreamWaitValue64_v2(sleeper, (u64)&word[1], 2, 0);
    errors |= cuEventRecord(event, sleeper);
    pthread_t thread;
    pthread_create(&thread, NULL, watchdog, NULL);
    CUresult r = cuEventSynchronize(event);
    printf("N=%d (CUDA_DEVICE_MAX_CONNECTIONS=%s): errors %d; the sleep returned at %.3f s (status %d), word 1 = %llu\n",
           n, getenv("CUDA_DEVICE_MAX_CONNECTIONS") ? getenv("CUDA_DEVICE_MAX_CONNECTIONS") : "unset", errors, now(), r,
           word[1]);
    pthread_join(thread, NULL);
    return 0;
}
