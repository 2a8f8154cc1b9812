/* A C sender and a C receiver of the frame ring, by name (one program,
 * two roles, two processes): `frames send NAME FRAMES` presents FRAMES
 * frames, frame n filled with the word 0xC0DE0000 + n (odd frames with
 * ci_sender_present_fill, even ones with ci_sender_present_record and a
 * vkCmdFillBuffer of the application's own, loaded from libvulkan.so.1),
 * to one lossless receiver, then serves until it has left; `frames recv NAME FRAMES`
 * takes every frame and checks every word of it. Exit status 0: all good;
 * otherwise the failing call and its message are on stderr. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static uint32_t word_of(uint64_t sequence) { return 0xC0DE0000u + (uint32_t)sequence; }

/* The few Vulkan types the callback needs (no Vulkan headers needed). */
typedef void (*vk_void_fn)(void);
typedef vk_void_fn (*vk_get_device_proc_addr_fn)(void *device, const char *name);
typedef void (*vk_cmd_fill_buffer_fn)(void *cmd, uint64_t buffer, uint64_t offset,
                                      uint64_t size, uint32_t data);

struct fill_job {
    vk_get_device_proc_addr_fn get_device_proc_addr;
    uint32_t word;
    int calls;
};

static void record_fill(void *user, void *device, void *cmd, uint64_t buffer, uint64_t size) {
    struct fill_job *job = user;
    job->calls++;
    vk_void_fn f = job->get_device_proc_addr(device, "vkCmdFillBuffer");
    vk_cmd_fill_buffer_fn fill;
    memcpy(&fill, &f, sizeof fill);
    if (fill) fill(cmd, buffer, 0, size, job->word);
}

static int do_send(const char *name, uint64_t frames) {
    ci_context *ctx = NULL;
    ci_sender *sender = NULL;
    CHECK(ci_context_new_headless(NULL, &ctx));
    CHECK(ci_sender_new(ctx, name, 64, 48, 3, &sender));
    printf("sender %s up\n", name);
    fflush(stdout);
    struct fill_job job = {0};
    void *vulkan = dlopen("libvulkan.so.1", RTLD_NOW);
    if (!vulkan) {
        fprintf(stderr, "dlopen(libvulkan.so.1): %s\n", dlerror());
        return 1;
    }
    void *sym = dlsym(vulkan, "vkGetDeviceProcAddr");
    memcpy(&job.get_device_proc_addr, &sym, sizeof sym);
    if (!job.get_device_proc_addr) return 1;
    CHECK(ci_sender_present_record(sender, NULL, NULL, 0, 1.0, NULL) == CI_NULL_POINTER
              ? CI_OK
              : CI_INVALID_ARGUMENT);
    CHECK(ci_sender_wait_for_receivers(sender, 1, 60.0));
    for (uint64_t n = 1; n <= frames; n++) {
        uint64_t sequence = 0;
        /* Lossless: the acquire waits for the receiver's releases. */
        if (n % 2 == 1) {
            CHECK(ci_sender_present_fill(sender, word_of(n), 0, 30.0, &sequence));
        } else {
            job.word = word_of(n);
            job.calls = 0;
            CHECK(ci_sender_present_record(sender, record_fill, &job, 0, 30.0, &sequence));
            if (job.calls != 1) {
                fprintf(stderr, "the record callback ran %d times\n", job.calls);
                return 1;
            }
        }
        if (sequence != n) {
            fprintf(stderr, "frame %" PRIu64 " got sequence %" PRIu64 "\n", n, sequence);
            return 1;
        }
    }
    /* Serve until the receiver has left (it releases everything first). */
    ci_sender_stats stats;
    for (int i = 0; i < 6000; i++) {
        CHECK(ci_sender_serve(sender, 0.01));
        CHECK(ci_sender_stats_get(sender, &stats));
        if (stats.receivers == 0) break;
    }
    CHECK(ci_sender_stats_get(sender, &stats));
    printf("sender: presented %" PRIu64 ", skipped %" PRIu64 ", receivers left %" PRIu64 "\n",
           stats.presented, stats.skipped, stats.receivers);
    if (stats.presented != frames || stats.receivers != 0) return 1;
    CHECK(ci_sender_free(sender));
    CHECK(ci_context_free(ctx));
    return 0;
}

static int do_recv(const char *name, uint64_t frames) {
    ci_receiver *rx = NULL;
    CHECK(ci_receiver_connect_named(name, CI_DELIVERY_LOSSLESS, 60.0, &rx));
    /* Connected: the sender is listed, with its ring. */
    size_t count = 0;
    CHECK(ci_list_senders(NULL, 0, &count));
    ci_sender_info listed[8];
    CHECK(ci_list_senders(listed, 8, &count));
    int found = 0;
    for (size_t i = 0; i < count && i < 8; i++) {
        if (strcmp(listed[i].name, name) == 0 && listed[i].width == 64 &&
            listed[i].height == 48 && listed[i].slots == 3 && listed[i].row_pitch == 64 * 4 &&
            listed[i].kind == CI_SLOTS_BUFFERS && strcmp(listed[i].format, "r8g8b8a8_unorm") == 0)
            found = 1;
    }
    if (!found) {
        fprintf(stderr, "ci_list_senders did not list %s as a 64x48 ring of 3 buffers\n", name);
        return 1;
    }
    /* The ring's layout, as the receiver sees it. */
    ci_ring_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    CHECK(ci_receiver_get_layout(rx, &layout));
    if (layout.format != CI_FORMAT_RGBA8_BUFFER || layout.width != 64 || layout.height != 48 ||
        layout.slots != 3 || layout.row_pitch != 64 * 4 || layout.vk_format != 37 ||
        layout.frame_bytes != 64 * 4 * 48 || layout.texel_bytes != 4 ||
        layout.chroma_offset != 0 || strcmp(layout.format_name, "r8g8b8a8_unorm") != 0) {
        fprintf(stderr, "unexpected layout: format %u %ux%u, %u slots, pitch %" PRIu64 ", %s\n",
                layout.format, layout.width, layout.height, layout.slots, layout.row_pitch,
                layout.format_name);
        return 1;
    }
    uint8_t *pixels = NULL;
    size_t len = 0;
    for (uint64_t n = 1; n <= frames; n++) {
        ci_frame *frame = NULL;
        ci_frame_info info;
        CHECK(ci_receiver_next(rx, 30.0, &frame));
        CHECK(ci_frame_get_info(frame, &info));
        if (info.sequence != n || info.dropped_before != 0 || info.width != 64 ||
            info.height != 48 || info.row_pitch != 64 * 4 ||
            info.frame_bytes != info.row_pitch * info.height) {
            fprintf(stderr, "frame %" PRIu64 ": unexpected info (sequence %" PRIu64 ")\n", n,
                    info.sequence);
            return 1;
        }
        if (len < info.frame_bytes) {
            len = (size_t)info.frame_bytes;
            pixels = realloc(pixels, len);
            if (!pixels) return 1;
        }
        memset(pixels, 0, len);
        CHECK(ci_receiver_read(rx, frame, pixels, len, 30.0));
        for (size_t i = 0; i < info.frame_bytes / 4; i++) {
            uint32_t w;
            memcpy(&w, pixels + 4 * i, 4);
            if (w != word_of(info.sequence)) {
                fprintf(stderr, "frame %" PRIu64 " word %zu is %08x, not %08x\n", n, i, w,
                        word_of(info.sequence));
                return 1;
            }
        }
        CHECK(ci_frame_release(rx, frame));
    }
    free(pixels);
    CHECK(ci_receiver_free(rx));
    printf("receiver: %" PRIu64 " frames checked\n", frames);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: frames send|recv NAME FRAMES\n");
        return 2;
    }
    uint64_t frames = strtoull(argv[3], NULL, 10);
    if (strcmp(argv[1], "send") == 0) return do_send(argv[2], frames);
    if (strcmp(argv[1], "recv") == 0) return do_recv(argv[2], frames);
    return 2;
}
