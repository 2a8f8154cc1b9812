/* The steady-state frame loop of the benchmark's S3 scenario, written with
 * raw driver calls: the baseline the safe API is measured against.
 *
 * Per frame n (slot s = n % slots):
 *   host:   spin on vkGetSemaphoreCounterValue(consumed) until frame
 *           n - in_flight is consumed (at most `in_flight` frames pending);
 *   Vulkan: vkQueueSubmit of slot s's pre-recorded command buffer, waiting
 *           consumed >= n - slots + 1 (slot s free), signalling produced = n+1;
 *   CUDA:   cuWaitExternalSemaphoresAsync(produced, n+1), the copy kernel of
 *           slot s, cuSignalExternalSemaphoresAsync(consumed, n+1).
 * At the end the host spins until the last frame is consumed.
 *
 * No Vulkan or CUDA header: handles are opaque pointers, and the Rust side
 * prepares the VkSubmitInfo chains and the CUDA parameter blocks; this file
 * only writes the 64-bit values their first fields (or the pointed-to value
 * arrays) hold. Returns 0, or the first failing call's code (negative for
 * Vulkan, positive for CUDA), or 1000 when a spin wait passes its bound. */
#include <stdint.h>
#include <time.h>

typedef int32_t (*vk_queue_submit_fn)(void *queue, uint32_t count, const void *submits, uint64_t fence);
typedef int32_t (*vk_get_counter_fn)(void *device, uint64_t semaphore, uint64_t *value);
typedef int (*cu_ext_sem_fn)(const void *const *semaphores, const void *params, unsigned int count, void *stream);
typedef int (*cu_launch_fn)(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int shared, void *stream, void **args,
                            void **extra);

struct frame_loop {
    void *vk_device;
    void *vk_queue;
    vk_queue_submit_fn vk_queue_submit;
    vk_get_counter_fn vk_get_counter;
    uint64_t vk_consumed; /* VkSemaphore (non-dispatchable: 64-bit) */
    uint32_t slots;
    uint32_t in_flight;
    const void *const *submit_infos; /* per slot: a VkSubmitInfo */
    uint64_t *submit_wait_values;   /* per slot: the value its timeline info waits for */
    uint64_t *submit_signal_values; /* per slot: the value it signals */
    cu_ext_sem_fn cu_wait;
    cu_ext_sem_fn cu_signal;
    cu_launch_fn cu_launch;
    void *cu_produced; /* CUexternalSemaphore */
    void *cu_consumed;
    uint64_t *cu_wait_params;   /* CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, fence value first */
    uint64_t *cu_signal_params; /* CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, fence value first */
    void *cu_stream;
    void *kernel;
    void **const *kernel_args; /* per slot */
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t spin_limit_ns;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int spin_until(const struct frame_loop *l, uint64_t value) {
    uint64_t start = now_ns(), current = 0;
    for (;;) {
        int32_t r = l->vk_get_counter(l->vk_device, l->vk_consumed, &current);
        if (r != 0) return r < 0 ? r : -r;
        if (current >= value) return 0;
        if (now_ns() - start > l->spin_limit_ns) return 1000;
    }
}

int frame_loop_run(const struct frame_loop *l, uint64_t first_frame, uint32_t frames) {
    for (uint64_t n = first_frame; n < first_frame + frames; ++n) {
        uint32_t s = (uint32_t)(n % l->slots);
        int r;
        if (n >= l->in_flight && (r = spin_until(l, n - l->in_flight + 1)) != 0) return r;
        l->submit_wait_values[s] = n >= l->slots ? n - l->slots + 1 : 0;
        l->submit_signal_values[s] = n + 1;
        int32_t v = l->vk_queue_submit(l->vk_queue, 1, l->submit_infos[s], 0);
        if (v != 0) return v < 0 ? v : -v;
        l->cu_wait_params[0] = n + 1;
        if ((r = l->cu_wait((const void *const *)&l->cu_produced, l->cu_wait_params, 1, l->cu_stream)) != 0) return r;
        if ((r = l->cu_launch(l->kernel, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], 0,
                              l->cu_stream, l->kernel_args[s], 0)) != 0)
            return r;
        l->cu_signal_params[0] = n + 1;
        if ((r = l->cu_signal((const void *const *)&l->cu_consumed, l->cu_signal_params, 1, l->cu_stream)) != 0)
            return r;
    }
    return spin_until(l, first_frame + frames);
}
