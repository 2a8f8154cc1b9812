/* A Vulkan receiver written in C: `vk_recv NAME FRAMES` connects to the
 * image ring NAME (app_publish.cpp's: RGBA8, 96x56, 3 slots, a region at
 * [5, 3] of its render target, whose first 32 rows hold the pattern; or,
 * with `vk_recv NAME FRAMES W H OFF_X OFF_Y PATTERN_ROWS SLOTS`, another
 * ring of the same pattern: engine_host.cpp's) through ci_vulkan_receiver_connect_named on
 * a headless context, lossless, takes FRAMES frames and checks every texel
 * of every frame (ci_vulkan_receiver_read) against texel() below (the
 * app's), describes each frame's image (ci_vulkan_receiver_image: GENERAL,
 * owned by VK_QUEUE_FAMILY_EXTERNAL, one image per slot), and checks the
 * error paths that need a live Vulkan receiver and frame (a too-small
 * buffer, a short struct, a released frame, handles of other kinds, a freed
 * receiver). Exit status 0: all good; otherwise what failed is on stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_interop.h"

/* The ring and its render target (app_publish.cpp's unless given). */
static uint32_t RING_W = 96, RING_H = 56, OFF_X = 5, OFF_Y = 3, PATTERN_ROWS = 32, SLOTS = 3;
#define MAX_SLOTS 16u

static int failures = 0;

#define CHECK(call)                                                                   \
    do {                                                                              \
        ci_status s_ = (call);                                                        \
        if (s_ != CI_OK) {                                                            \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, (int)s_, \
                    ci_last_error_message());                                         \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* A call that must fail with `want` and say why. */
#define EXPECT(call, want)                                                               \
    do {                                                                                 \
        ci_status s_ = (call);                                                           \
        if (s_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s -> %d, expected %d: %s\n", __FILE__, __LINE__, #call, \
                    (int)s_, (int)(want), ci_last_error_message());                      \
            failures++;                                                                  \
        } else if ((want) != CI_OK && ci_last_error_message()[0] == '\0') {              \
            fprintf(stderr, "%s:%d: %s -> %d without a message\n", __FILE__, __LINE__,    \
                    #call, (int)s_);                                                     \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

/* Frame f's texel at (x, y) of the app's render target. */
static void texel(uint64_t f, uint32_t x, uint32_t y, uint8_t out[4]) {
    if (y < PATTERN_ROWS) {
        out[0] = (uint8_t)(x * 3 + f);
        out[1] = (uint8_t)(y * 5 + 2 * f);
        out[2] = (uint8_t)(x ^ y);
        out[3] = (uint8_t)(7 * f + 1);
    } else {
        out[0] = (uint8_t)(f * 11);
        out[1] = (uint8_t)(255 - f);
        out[2] = (uint8_t)(f * 29 + 3);
        out[3] = 255;
    }
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 9) {
        fprintf(stderr, "usage: vk_recv NAME FRAMES [W H OFF_X OFF_Y PATTERN_ROWS SLOTS]\n");
        return 2;
    }
    if (argc == 9) {
        uint32_t *given[] = {&RING_W, &RING_H, &OFF_X, &OFF_Y, &PATTERN_ROWS, &SLOTS};
        for (int i = 0; i < 6; i++) *given[i] = (uint32_t)strtoul(argv[3 + i], NULL, 10);
    }
    if (RING_W == 0 || RING_H == 0 || SLOTS == 0 || SLOTS > MAX_SLOTS) {
        fprintf(stderr, "vk_recv: a ring of %ux%u, %u slots: not one to check\n", RING_W, RING_H,
                SLOTS);
        return 2;
    }
    const char *name = argv[1];
    uint64_t frames = strtoull(argv[2], NULL, 10);
    ci_context *ctx = NULL;
    ci_vulkan_receiver *rx = NULL;
    CHECK(ci_context_new_headless(NULL, &ctx));
    CHECK(ci_vulkan_receiver_connect_named(ctx, name, CI_DELIVERY_LOSSLESS, 120.0, &rx));

    ci_ring_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    CHECK(ci_vulkan_receiver_get_layout(rx, &layout));
    if (layout.format != CI_FORMAT_IMAGE || layout.vk_format != 37 || layout.width != RING_W ||
        layout.height != RING_H || layout.slots != SLOTS ||
        strcmp(layout.format_name, "r8g8b8a8_unorm") != 0) {
        fprintf(stderr, "unexpected layout: format %u, VkFormat %u, %ux%u, %u slots, %s\n",
                layout.format, layout.vk_format, layout.width, layout.height, layout.slots,
                layout.format_name);
        return 1;
    }
    const size_t bytes = (size_t)RING_W * RING_H * 4;
    uint8_t *pixels = malloc(bytes);
    if (!pixels) return 1;
    uint64_t images[MAX_SLOTS] = {0};
    uint64_t wrong_texels = 0;
    for (uint64_t n = 1; n <= frames; n++) {
        ci_frame *frame = NULL;
        CHECK(ci_vulkan_receiver_next(rx, 60.0, &frame));
        ci_frame_info info;
        CHECK(ci_frame_get_info(frame, &info));
        if (info.sequence != n || info.frame_bytes != bytes || info.width != RING_W ||
            info.height != RING_H || info.slot >= SLOTS) {
            fprintf(stderr, "frame %" PRIu64 ": sequence %" PRIu64 ", %" PRIu64
                            " bytes, %ux%u, slot %u\n",
                    n, info.sequence, info.frame_bytes, info.width, info.height, info.slot);
            return 1;
        }
        ci_vulkan_image image;
        memset(&image, 0, sizeof image);
        if (n == 1) {
            uint8_t small[16];
            EXPECT(ci_vulkan_receiver_read(rx, frame, small, sizeof small, 30.0),
                   CI_BUFFER_TOO_SMALL);
            EXPECT(ci_vulkan_receiver_read(rx, frame, pixels, bytes - 1, 30.0),
                   CI_BUFFER_TOO_SMALL);
            EXPECT(ci_vulkan_receiver_read(rx, frame, NULL, bytes, 30.0), CI_NULL_POINTER);
            EXPECT(ci_vulkan_receiver_read(rx, frame, pixels, bytes, -1.0), CI_INVALID_ARGUMENT);
            EXPECT(ci_vulkan_receiver_read(rx, NULL, pixels, bytes, 30.0), CI_NULL_POINTER);
            EXPECT(ci_vulkan_receiver_read(rx, (ci_frame *)rx, pixels, bytes, 30.0),
                   CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_read((ci_vulkan_receiver *)ctx, frame, pixels, bytes, 30.0),
                   CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_read((ci_vulkan_receiver *)frame, frame, pixels, bytes, 30.0),
                   CI_WRONG_HANDLE);
            /* A Vulkan receiver's handle and frame through the host and CUDA
             * receivers' functions: another kind. */
            EXPECT(ci_receiver_read((ci_receiver *)rx, frame, pixels, bytes, 30.0),
                   CI_WRONG_HANDLE);
            EXPECT(ci_frame_release((ci_receiver *)rx, frame), CI_WRONG_HANDLE);
            EXPECT(ci_cuda_receiver_release((ci_cuda_receiver *)rx, frame), CI_WRONG_HANDLE);
            EXPECT(ci_receiver_get_layout((ci_receiver *)rx, &layout), CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_image(rx, frame, 30.0, &image), CI_INVALID_ARGUMENT);
            EXPECT(ci_vulkan_receiver_image(rx, frame, 30.0, NULL), CI_NULL_POINTER);
            EXPECT(ci_vulkan_receiver_image(NULL, frame, 30.0, &image), CI_NULL_POINTER);
            EXPECT(ci_vulkan_receiver_image((ci_vulkan_receiver *)ctx, frame, 30.0, &image),
                   CI_WRONG_HANDLE);
        }
        image.struct_size = sizeof image;
        CHECK(ci_vulkan_receiver_image(rx, frame, 30.0, &image));
        if (image.image == 0 || image.layout != 1 /* GENERAL */ ||
            image.queue_family != 0xFFFFFFFEu /* VK_QUEUE_FAMILY_EXTERNAL */ ||
            image.vk_format != 37 || image.width != RING_W || image.height != RING_H ||
            image.slot != info.slot || image.usage == 0 || image.struct_size != sizeof image) {
            fprintf(stderr, "frame %" PRIu64 "'s image: %#" PRIx64 ", layout %u, family %#x, "
                            "VkFormat %u, %ux%u, slot %u, usage %#x\n",
                    n, image.image, image.layout, image.queue_family, image.vk_format,
                    image.width, image.height, image.slot, image.usage);
            failures++;
        }
        if (images[info.slot] == 0) {
            for (uint32_t s = 0; s < SLOTS; s++)
                if (images[s] == image.image) {
                    fprintf(stderr, "slots %u and %u share VkImage %#" PRIx64 "\n", s, info.slot,
                            image.image);
                    failures++;
                }
            images[info.slot] = image.image;
        } else if (images[info.slot] != image.image) {
            fprintf(stderr, "slot %u changed its VkImage\n", info.slot);
            failures++;
        }
        memset(pixels, 0, bytes);
        CHECK(ci_vulkan_receiver_read(rx, frame, pixels, bytes, 60.0));
        uint64_t wrong = 0;
        for (uint32_t y = 0; y < RING_H; y++)
            for (uint32_t x = 0; x < RING_W; x++) {
                uint8_t want[4];
                texel(n, x + OFF_X, y + OFF_Y, want);
                const uint8_t *got = pixels + ((size_t)y * RING_W + x) * 4;
                if (memcmp(got, want, 4) != 0) {
                    if (wrong < 4)
                        fprintf(stderr, "frame %" PRIu64 " (%u, %u): got %u %u %u %u, want %u %u "
                                        "%u %u\n",
                                n, x, y, got[0], got[1], got[2], got[3], want[0], want[1],
                                want[2], want[3]);
                    wrong++;
                }
            }
        wrong_texels += wrong;
        CHECK(ci_vulkan_receiver_release(rx, frame));
        if (n == 1) {
            EXPECT(ci_vulkan_receiver_release(rx, frame), CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_read(rx, frame, pixels, bytes, 30.0), CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_image(rx, frame, 30.0, &image), CI_WRONG_HANDLE);
            EXPECT(ci_frame_get_info(frame, &info), CI_WRONG_HANDLE);
        }
    }
    uint32_t slots_seen = 0;
    for (uint32_t s = 0; s < SLOTS; s++) slots_seen += images[s] != 0;
    /* Lossless, and the app presents nothing more: a timeout. */
    ci_frame *none = NULL;
    EXPECT(ci_vulkan_receiver_next(rx, 0.2, &none), CI_TIMEOUT);
    if (none != NULL) failures++;
    CHECK(ci_vulkan_receiver_free(rx));
    EXPECT(ci_vulkan_receiver_free(rx), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_next(rx, 0.0, &none), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_get_layout(rx, &layout), CI_WRONG_HANDLE);
    CHECK(ci_context_free(ctx));
    free(pixels);
    if (wrong_texels != 0) {
        fprintf(stderr, "%" PRIu64 " texels were not the app's\n", wrong_texels);
        failures++;
    }
    printf("vk_recv: %" PRIu64 " frames of %ux%u checked texel for texel (%" PRIu64
           " wrong), %u slots seen, %d failures\n",
           frames, RING_W, RING_H, wrong_texels, slots_seen, failures);
    return failures == 0 ? 0 : 1;
}
