/* An OpenGL receiver written in C: `gl_recv NAME FRAMES` makes a windowless
 * GL 4.5 core context through EGL (libEGL.so.1 opened with dlopen: no EGL or
 * GL headers or link libraries needed), connects to the image ring NAME
 * (app_publish.cpp's: RGBA8, 96x56, 3 slots, a region at [5, 3] of its
 * render target) through ci_gl_receiver_connect_named, lossless, takes
 * FRAMES frames and checks every texel of every frame's texture
 * (ci_gl_receiver_texture, read back with glGetTextureImage) against
 * texel() below (the app's), and the error paths of a GL receiver: calls
 * from another thread (refused, nothing touched), a NULL loader, a released
 * frame, other kinds' handles, a freed receiver. It reads the receiver's
 * wait mode (ci_gl_receiver_get_wait_mode: one of the three CI_GL_WAIT_*,
 * printed; the frame message on lavapipe, whose rings share no semaphores)
 * and reads each texture right after ci_gl_receiver_texture, which with
 * CI_GL_WAIT_GPU relies on GL's wait alone. Exit status 0: all good;
 * otherwise what failed is on stderr. */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_interop.h"

#define RING_W 96u
#define RING_H 56u
#define SRC_H 64u
#define OFF_X 5u
#define OFF_Y 3u
#define PATTERN_ROWS (SRC_H / 2)

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

/* EGL, resolved at run time. */
typedef void *(*get_proc_fn)(const char *);
typedef void *(*get_platform_display_fn)(unsigned, void *, const int *);
typedef unsigned (*initialize_fn)(void *, int *, int *);
typedef unsigned (*bind_api_fn)(unsigned);
typedef void *(*create_context_fn)(void *, void *, void *, const int *);
typedef unsigned (*make_current_fn)(void *, void *, void *, void *);
static get_proc_fn egl_get_proc;

static const void *loader(void *user, const char *name) {
    (void)user;
    return egl_get_proc(name);
}

/* A GL 4.5 core context without a window, current on this thread. */
static void make_context(void) {
    void *egl = dlopen("libEGL.so.1", RTLD_NOW);
    if (!egl) {
        fprintf(stderr, "no libEGL.so.1: %s\n", dlerror());
        exit(1);
    }
    egl_get_proc = (get_proc_fn)dlsym(egl, "eglGetProcAddress");
    initialize_fn initialize = (initialize_fn)dlsym(egl, "eglInitialize");
    bind_api_fn bind_api = (bind_api_fn)dlsym(egl, "eglBindAPI");
    create_context_fn create = (create_context_fn)dlsym(egl, "eglCreateContext");
    make_current_fn make_current = (make_current_fn)dlsym(egl, "eglMakeCurrent");
    get_platform_display_fn get_display =
        (get_platform_display_fn)egl_get_proc("eglGetPlatformDisplayEXT");
    if (!egl_get_proc || !initialize || !bind_api || !create || !make_current || !get_display) {
        fprintf(stderr, "EGL lacks a function\n");
        exit(1);
    }
    void *display = get_display(0x31DD /* EGL_PLATFORM_SURFACELESS_MESA */, NULL, NULL);
    int major = 0, minor = 0;
    if (!display || !initialize(display, &major, &minor) || !bind_api(0x30A2 /* OPENGL */)) {
        fprintf(stderr, "no surfaceless EGL display with OpenGL\n");
        exit(1);
    }
    const int attributes[] = {0x3098, 4, 0x30FB, 5, 0x30FD, 1, 0x3038};
    void *context = create(display, NULL, NULL, attributes);
    if (!context || !make_current(display, NULL, NULL, context)) {
        fprintf(stderr, "no GL 4.5 core context without a window\n");
        exit(1);
    }
}

struct other_thread {
    ci_gl_receiver *rx;
    ci_frame *frame;
    ci_status next, texture, release, free_, wait_mode;
};

/* Every call of a receiver on a thread that is not its own is refused. */
static void *on_other_thread(void *arg) {
    struct other_thread *t = arg;
    ci_frame *none = NULL;
    uint32_t texture = 0;
    uint32_t mode = 0;
    t->wait_mode = ci_gl_receiver_get_wait_mode(t->rx, &mode);
    t->next = ci_gl_receiver_next(t->rx, 0.0, &none);
    t->texture = ci_gl_receiver_texture(t->rx, t->frame, 1.0, &texture);
    t->release = ci_gl_receiver_release(t->rx, t->frame, 1.0);
    t->free_ = ci_gl_receiver_free(t->rx);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gl_recv NAME FRAMES\n");
        return 2;
    }
    const char *name = argv[1];
    uint64_t frames = strtoull(argv[2], NULL, 10);
    make_context();
    typedef void (*get_texture_image_fn)(uint32_t, int, uint32_t, uint32_t, int, void *);
    typedef void (*pixel_storei_fn)(uint32_t, int);
    get_texture_image_fn get_texture_image =
        (get_texture_image_fn)egl_get_proc("glGetTextureImage");
    pixel_storei_fn pixel_storei = (pixel_storei_fn)egl_get_proc("glPixelStorei");
    if (!get_texture_image || !pixel_storei) {
        fprintf(stderr, "no glGetTextureImage\n");
        return 1;
    }
    ci_gl_receiver *rx = NULL;
    EXPECT(ci_gl_receiver_connect_named(NULL, NULL, name, CI_DELIVERY_LOSSLESS, 1.0, &rx),
           CI_NULL_POINTER);
    CHECK(ci_gl_receiver_connect_named(loader, NULL, name, CI_DELIVERY_LOSSLESS, 120.0, &rx));
    uint32_t wait_mode = 99;
    EXPECT(ci_gl_receiver_get_wait_mode(rx, NULL), CI_NULL_POINTER);
    EXPECT(ci_gl_receiver_get_wait_mode(NULL, &wait_mode), CI_NULL_POINTER);
    CHECK(ci_gl_receiver_get_wait_mode(rx, &wait_mode));
    const char *wait_name = wait_mode == CI_GL_WAIT_GPU             ? "GPU-side wait"
                            : wait_mode == CI_GL_WAIT_HOST          ? "host wait"
                            : wait_mode == CI_GL_WAIT_FRAME_MESSAGE ? "frame message"
                                                                    : NULL;
    if (!wait_name) {
        fprintf(stderr, "ci_gl_receiver_get_wait_mode: %u is no CI_GL_WAIT_*\n", wait_mode);
        failures++;
        wait_name = "?";
    }
    ci_ring_layout layout;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    CHECK(ci_gl_receiver_get_layout(rx, &layout));
    if (layout.vk_format != 37 || layout.width != RING_W || layout.height != RING_H) {
        fprintf(stderr, "unexpected layout: VkFormat %u, %ux%u\n", layout.vk_format,
                layout.width, layout.height);
        return 1;
    }
    const size_t bytes = (size_t)RING_W * RING_H * 4;
    uint8_t *pixels = malloc(bytes);
    if (!pixels) return 1;
    uint64_t wrong_texels = 0;
    for (uint64_t n = 1; n <= frames; n++) {
        ci_frame *frame = NULL;
        CHECK(ci_gl_receiver_next(rx, 60.0, &frame));
        ci_frame_info info;
        CHECK(ci_frame_get_info(frame, &info));
        if (info.sequence != n) {
            fprintf(stderr, "frame %" PRIu64 ": sequence %" PRIu64 "\n", n, info.sequence);
            return 1;
        }
        uint32_t texture = 0;
        if (n == 1) {
            struct other_thread t = {rx, frame, CI_OK, CI_OK, CI_OK, CI_OK, CI_OK};
            pthread_t thread;
            if (pthread_create(&thread, NULL, on_other_thread, &t) != 0) return 1;
            pthread_join(thread, NULL);
            if (t.next != CI_INVALID_ARGUMENT || t.texture != CI_INVALID_ARGUMENT ||
                t.release != CI_INVALID_ARGUMENT || t.free_ != CI_INVALID_ARGUMENT ||
                t.wait_mode != CI_INVALID_ARGUMENT) {
                fprintf(stderr, "another thread's calls: next %d, texture %d, release %d, free %d, "
                                "wait mode %d (all %d expected)\n",
                        (int)t.next, (int)t.texture, (int)t.release, (int)t.free_,
                        (int)t.wait_mode, (int)CI_INVALID_ARGUMENT);
                failures++;
            }
            EXPECT(ci_gl_receiver_texture(rx, frame, 30.0, NULL), CI_NULL_POINTER);
            EXPECT(ci_gl_receiver_texture(NULL, frame, 30.0, &texture), CI_NULL_POINTER);
            EXPECT(ci_gl_receiver_texture((ci_gl_receiver *)frame, frame, 30.0, &texture),
                   CI_WRONG_HANDLE);
            EXPECT(ci_vulkan_receiver_release((ci_vulkan_receiver *)rx, frame), CI_WRONG_HANDLE);
        }
        CHECK(ci_gl_receiver_texture(rx, frame, 30.0, &texture));
        memset(pixels, 0, bytes);
        pixel_storei(0x0D05 /* GL_PACK_ALIGNMENT */, 1);
        get_texture_image(texture, 0, 0x1908 /* GL_RGBA */, 0x1401 /* GL_UNSIGNED_BYTE */,
                          (int)bytes, pixels);
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
        CHECK(ci_gl_receiver_release(rx, frame, 30.0));
        if (n == 1) {
            EXPECT(ci_gl_receiver_release(rx, frame, 30.0), CI_WRONG_HANDLE);
            EXPECT(ci_gl_receiver_texture(rx, frame, 30.0, &texture), CI_WRONG_HANDLE);
        }
    }
    ci_frame *none = NULL;
    EXPECT(ci_gl_receiver_next(rx, 0.2, &none), CI_TIMEOUT);
    CHECK(ci_gl_receiver_free(rx));
    EXPECT(ci_gl_receiver_free(rx), CI_WRONG_HANDLE);
    EXPECT(ci_gl_receiver_next(rx, 0.0, &none), CI_WRONG_HANDLE);
    EXPECT(ci_gl_receiver_get_wait_mode(rx, &wait_mode), CI_WRONG_HANDLE);
    free(pixels);
    if (wrong_texels != 0) {
        fprintf(stderr, "%" PRIu64 " texels were not the app's\n", wrong_texels);
        failures++;
    }
    printf("gl_recv: wait: %s\n", wait_name);
    printf("gl_recv: %" PRIu64 " frames of %ux%u checked texel for texel through GL textures (%"
           PRIu64 " wrong), %d failures\n",
           frames, RING_W, RING_H, wrong_texels, failures);
    return failures == 0 ? 0 : 1;
}
