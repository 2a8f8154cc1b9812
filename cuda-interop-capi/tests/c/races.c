/* Handles used and freed concurrently: threads call a sender's functions
 * in a loop while the main thread frees it, and threads free one context
 * at once. Every status must be CI_OK or CI_WRONG_HANDLE (never a crash or
 * a sanitizer report), exactly one concurrent free must succeed, and every
 * thread must see the freed handle as CI_WRONG_HANDLE. No sleeps: the
 * main thread frees after every thread has made progress, and threads stop
 * after seeing the free. `races NAME`; exit status 0 when all held. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>

#include "cuda_interop.h"

#define THREADS 4

static ci_sender *g_sender;
static ci_context *g_ctx;
static atomic_int g_progress;
static atomic_int g_bad;
static atomic_int g_free_ok;
static atomic_int g_free_wrong;
static atomic_int g_start;

static void *use_sender(void *arg) {
    long id = (long)arg;
    int calls = 0;
    for (;;) {
        ci_sender_stats stats;
        ci_status s;
        if (id == 0) {
            s = ci_sender_wait_for_receivers(g_sender, 1, 0.0);
            if (s == CI_TIMEOUT) s = CI_OK;
        } else if (id == 1) {
            s = ci_sender_serve(g_sender, 0.0);
        } else {
            s = ci_sender_stats_get(g_sender, &stats);
        }
        if (s == CI_WRONG_HANDLE) {
            if (ci_last_error_message()[0] == '\0') atomic_fetch_add(&g_bad, 1);
            break;
        }
        if (s != CI_OK) {
            fprintf(stderr, "thread %ld: status %d: %s\n", id, (int)s, ci_last_error_message());
            atomic_fetch_add(&g_bad, 1);
            break;
        }
        if (++calls == 50) atomic_fetch_add(&g_progress, 1);
    }
    return NULL;
}

static void *free_context(void *arg) {
    (void)arg;
    while (!atomic_load(&g_start)) sched_yield();
    ci_status s = ci_context_free(g_ctx);
    if (s == CI_OK)
        atomic_fetch_add(&g_free_ok, 1);
    else if (s == CI_WRONG_HANDLE)
        atomic_fetch_add(&g_free_wrong, 1);
    else
        atomic_fetch_add(&g_bad, 1);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (ci_context_new_headless(NULL, &g_ctx) != CI_OK) {
        fprintf(stderr, "context: %s\n", ci_last_error_message());
        return 1;
    }
    if (ci_sender_new(g_ctx, argv[1], 16, 16, 2, &g_sender) != CI_OK) {
        fprintf(stderr, "sender: %s\n", ci_last_error_message());
        return 1;
    }
    pthread_t users[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&users[i], NULL, use_sender, (void *)i);
    /* Free only once every thread has made 50 calls. */
    while (atomic_load(&g_progress) < THREADS && atomic_load(&g_bad) == 0) sched_yield();
    ci_status freed = ci_sender_free(g_sender);
    for (int i = 0; i < THREADS; i++) pthread_join(users[i], NULL);
    if (freed != CI_OK) {
        fprintf(stderr, "ci_sender_free: %d: %s\n", (int)freed, ci_last_error_message());
        return 1;
    }

    pthread_t freers[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&freers[i], NULL, free_context, NULL);
    atomic_store(&g_start, 1);
    for (int i = 0; i < THREADS; i++) pthread_join(freers[i], NULL);

    int ok = atomic_load(&g_bad) == 0 && atomic_load(&g_free_ok) == 1 &&
             atomic_load(&g_free_wrong) == THREADS - 1;
    printf("races: bad %d, concurrent frees ok %d, wrong handle %d: %s\n", atomic_load(&g_bad),
           atomic_load(&g_free_ok), atomic_load(&g_free_wrong), ok ? "all held" : "FAILED");
    return ok ? 0 : 1;
}
