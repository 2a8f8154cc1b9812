/* Every error path of the C ABI: NULL pointers, freed handles, handles of
 * another kind, values that never were handles, bad names and arguments,
 * timeouts, a missing name, a taken name, a too small buffer. Each call's
 * status is checked, and its message: non-empty after an error, empty
 * after CI_OK. `errors NAME`; exit status 0 when every check passed. Built
 * with -fsanitize=address,undefined where the compiler has them. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_interop.h"

static int failures = 0;
static int checks = 0;

static void expect(ci_status got, ci_status want, const char *what, int line) {
    const char *msg = ci_last_error_message();
    checks++;
    if (msg == NULL) {
        fprintf(stderr, "line %d: %s: ci_last_error_message() is NULL\n", line, what);
        failures++;
        return;
    }
    if (got != want) {
        fprintf(stderr, "line %d: %s -> %d, expected %d (%s)\n", line, what, (int)got, (int)want,
                msg);
        failures++;
    } else if (want == CI_OK && msg[0] != '\0') {
        fprintf(stderr, "line %d: %s -> CI_OK with message \"%s\"\n", line, what, msg);
        failures++;
    } else if (want != CI_OK && msg[0] == '\0') {
        fprintf(stderr, "line %d: %s -> %d with an empty message\n", line, what, (int)got);
        failures++;
    } else {
        printf("ok %d: %s -> %d%s%s\n", checks, what, (int)got, msg[0] ? ": " : "", msg);
    }
}

#define EXPECT(call, want) expect((call), (want), #call, __LINE__)

static int g_queue_calls;
static int g_nested;

/* ci_context_with_queue's callback: the queue is there, and a nested call
 * on the same context is refused instead of deadlocking. */
static void on_queue(void *user, void *queue) {
    g_queue_calls++;
    if (queue == NULL) failures++;
    ci_status s = ci_context_with_queue((ci_context *)user, CI_QUEUE_MAIN, on_queue, user);
    if (s != CI_OK && ci_last_error_message()[0] != '\0') g_nested++;
}

/* ci_sender_present_opened called from inside ci_context_with_queue of the
 * sender's context: refused before its token is spent. */
struct present_in_queue {
    ci_sender *sender;
    uint64_t token;
    ci_timeline *timeline;
    ci_status got;
    int said_why;
};

static void present_inside(void *user, void *queue) {
    struct present_in_queue *p = (struct present_in_queue *)user;
    (void)queue;
    p->got = ci_sender_present_opened(p->sender, p->token, p->timeline, 1, 0, NULL);
    p->said_why = strstr(ci_last_error_message(), "ci_context_with_queue") != NULL;
}

static void record_nothing(void *user, void *device, void *cmd, uint64_t buffer, uint64_t size) {
    (void)user;
    (void)device;
    (void)cmd;
    (void)buffer;
    (void)size;
}

/* A ci_record_fn that calls the library on its own sender (`user`): the
 * call must be refused (CI_INVALID_ARGUMENT, with a message), not wait for
 * itself. */
static int g_reentered = -1;
static void record_reenter(void *user, void *device, void *cmd, uint64_t buffer, uint64_t size) {
    (void)device;
    (void)cmd;
    (void)buffer;
    (void)size;
    ci_sender_stats stats;
    ci_status s = ci_sender_stats_get((ci_sender *)user, &stats);
    g_reentered = (s == CI_INVALID_ARGUMENT && ci_last_error_message()[0] != '\0') ? 1 : 0;
}

/* Never called: every ci_sender_record_into below is refused first. */
static void record_image_nothing(void *user, void *device, void *cmd, uint64_t image,
                                 uint32_t width, uint32_t height, uint32_t vk_format) {
    (void)user;
    (void)device;
    (void)cmd;
    (void)image;
    (void)width;
    (void)height;
    (void)vk_format;
    failures++;
}

static ci_sender *g_sender;
static atomic_int g_stop;

/* The sender's side: serve one receiver, present one frame, then serve
 * until told to stop (presenting nothing more). */
static void *serve(void *arg) {
    (void)arg;
    ci_status s = ci_sender_wait_for_receivers(g_sender, 1, 60.0);
    if (s != CI_OK) {
        fprintf(stderr, "sender thread: wait -> %d: %s\n", (int)s, ci_last_error_message());
        return (void *)1;
    }
    s = ci_sender_present_fill(g_sender, 0x11223344u, 0, 30.0, NULL);
    if (s != CI_OK) {
        fprintf(stderr, "sender thread: present -> %d: %s\n", (int)s, ci_last_error_message());
        return (void *)1;
    }
    while (!atomic_load(&g_stop)) ci_sender_serve(g_sender, 0.01);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: errors NAME\n");
        return 2;
    }
    const char *name = argv[1];
    ci_context *ctx = NULL;
    ci_sender *sender = NULL;
    ci_receiver *rx = NULL;
    ci_frame *frame = NULL;
    ci_frame_info info;
    ci_sender_stats stats;
    int not_a_handle = 0;
    ci_context *bogus = (ci_context *)(void *)&not_a_handle; /* never a handle */
    ci_context *odd = (ci_context *)(uintptr_t)0x12345;     /* never a handle */

    /* The message exists before any call. */
    if (ci_last_error_message() == NULL) return 1;

    /* Contexts: NULL out, bad options, then a good one. */
    EXPECT(ci_context_new_headless(NULL, NULL), CI_NULL_POINTER);
    ci_context_options options;
    memset(&options, 0, sizeof options);
    EXPECT(ci_context_new_headless(&options, &ctx), CI_INVALID_ARGUMENT); /* struct_size 0 */
    options.struct_size = sizeof options;
    options.validation = 7;
    EXPECT(ci_context_new_headless(&options, &ctx), CI_INVALID_ARGUMENT);
    options.validation = CI_VALIDATION_OFF;
    EXPECT(ci_context_new_headless(&options, &ctx), CI_OK);
    if (ctx == NULL) return 1;

    /* Senders: NULL and non-handles, bad names and sizes. */
    EXPECT(ci_sender_new(NULL, name, 16, 16, 2, &sender), CI_NULL_POINTER);
    EXPECT(ci_sender_new(bogus, name, 16, 16, 2, &sender), CI_WRONG_HANDLE);
    EXPECT(ci_sender_new(odd, name, 16, 16, 2, &sender), CI_WRONG_HANDLE);
    EXPECT(ci_sender_new(ctx, NULL, 16, 16, 2, &sender), CI_NULL_POINTER);
    EXPECT(ci_sender_new(ctx, name, 16, 16, 2, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_new(ctx, "bad name!", 16, 16, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, ".hidden", 16, 16, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, "", 16, 16, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, "\xff\xfe", 16, 16, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, name, 0, 16, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, name, 16, 16, 1, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, name, 0xFFFFFFFFu, 0xFFFFFFFFu, 2, &sender), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_new(ctx, name, 16, 16, 1000, &sender), CI_INVALID_ARGUMENT);
    if (sender != NULL) return 1; /* written only on CI_OK */
    EXPECT(ci_sender_new(ctx, name, 16, 16, 2, &sender), CI_OK);
    ci_sender *second = NULL;
    EXPECT(ci_sender_new(ctx, name, 16, 16, 2, &second), CI_NAME_TAKEN);

    /* Handles of another kind. */
    EXPECT(ci_sender_new((ci_context *)sender, "other", 16, 16, 2, &second), CI_WRONG_HANDLE);
    EXPECT(ci_sender_free((ci_sender *)ctx), CI_WRONG_HANDLE);
    EXPECT(ci_context_free((ci_context *)sender), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_next((ci_receiver *)sender, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_frame_get_info((ci_frame *)ctx, &info), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_free((ci_receiver *)ctx), CI_WRONG_HANDLE);
    EXPECT(ci_sender_serve((ci_sender *)bogus, 0.0), CI_WRONG_HANDLE);

    /* Sender calls: bad timeouts, a timeout, NULL out-pointers. */
    EXPECT(ci_sender_wait_for_receivers(sender, 1, -1.0), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_wait_for_receivers(sender, 1, NAN), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_wait_for_receivers(sender, 1, INFINITY), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_wait_for_receivers(sender, 1, 0.0), CI_TIMEOUT);
    EXPECT(ci_sender_wait_for_receivers(NULL, 1, 0.0), CI_NULL_POINTER);
    EXPECT(ci_sender_stats_get(sender, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_stats_get(sender, &stats), CI_OK);
    EXPECT(ci_sender_present_fill(NULL, 0, 0, 0.0, NULL), CI_NULL_POINTER);

    /* The application's own device: NULL, a short struct, NULL handles
     * (checked before anything is loaded through them). */
    ci_context *app_ctx = NULL;
    ci_vulkan_device vdev;
    memset(&vdev, 0, sizeof vdev);
    EXPECT(ci_context_new_from_vulkan(NULL, &app_ctx), CI_NULL_POINTER);
    EXPECT(ci_context_new_from_vulkan(&vdev, &app_ctx), CI_INVALID_ARGUMENT);
    vdev.struct_size = sizeof vdev;
    EXPECT(ci_context_new_from_vulkan(&vdev, NULL), CI_NULL_POINTER);
    EXPECT(ci_context_new_from_vulkan(&vdev, &app_ctx), CI_NULL_POINTER);
    if (app_ctx != NULL) failures++;
    /* The queue lock: bad role, NULL function, wrong handles, a nested call. */
    EXPECT(ci_context_with_queue(ctx, 7, on_queue, ctx), CI_INVALID_ARGUMENT);
    EXPECT(ci_context_with_queue(ctx, CI_QUEUE_MAIN, NULL, ctx), CI_NULL_POINTER);
    EXPECT(ci_context_with_queue(NULL, CI_QUEUE_MAIN, on_queue, ctx), CI_NULL_POINTER);
    EXPECT(ci_context_with_queue((ci_context *)sender, CI_QUEUE_MAIN, on_queue, ctx),
           CI_WRONG_HANDLE);
    EXPECT(ci_context_with_queue(ctx, CI_QUEUE_MAIN, on_queue, ctx), CI_OK);
    EXPECT(ci_context_with_queue(ctx, CI_QUEUE_TRANSFER, on_queue, ctx), CI_OK);
    if (g_queue_calls != 2 || g_nested != 2) {
        fprintf(stderr, "with_queue: %d calls, %d nested refusals\n", g_queue_calls, g_nested);
        failures++;
    }

    /* Image rings and present_copy: wrong ring kinds, bad sources (all
     * refused before any Vulkan call; the image handle is never used). */
    ci_sender *images = NULL;
    ci_source_image src;
    memset(&src, 0, sizeof src);
    char image_name[96];
    snprintf(image_name, sizeof image_name, "%s-images", name);
    EXPECT(ci_image_sender_new(ctx, image_name, 16, 16, 1234, 2, &images), CI_INVALID_ARGUMENT);
    EXPECT(ci_image_sender_new(ctx, image_name, 16, 16, 37, 2, NULL), CI_NULL_POINTER);
    EXPECT(ci_image_sender_new(NULL, image_name, 16, 16, 37, 2, &images), CI_NULL_POINTER);
    EXPECT(ci_image_sender_new(ctx, image_name, 0, 16, 37, 2, &images), CI_INVALID_ARGUMENT);
    EXPECT(ci_image_sender_new(ctx, name, 16, 16, 37, 2, &images), CI_NAME_TAKEN);
    EXPECT(ci_sender_present_copy(sender, &src, 0, 0.0, NULL), CI_UNSUPPORTED);
    EXPECT(ci_sender_present_copy(NULL, &src, 0, 0.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_present_copy((ci_sender *)ctx, &src, 0, 0.0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_image_sender_new(ctx, image_name, 16, 16, 37, 2, &images), CI_OK);
    EXPECT(ci_sender_present_fill(images, 0, 0, 0.0, NULL), CI_UNSUPPORTED);
    EXPECT(ci_sender_present_record(images, record_nothing, NULL, 0, 0.0, NULL), CI_UNSUPPORTED);
    EXPECT(ci_sender_present_copy(images, NULL, 0, 0.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.struct_size = sizeof src;
    src.vk_format = 44; /* B8G8R8A8: not the ring's */
    src.layout = 6;     /* TRANSFER_SRC_OPTIMAL */
    src.sharing = CI_SHARING_EXCLUSIVE;
    src.width = 16;
    src.height = 16;
    src.image = 0x1234;
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.vk_format = 37;
    src.sharing = 9;
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.sharing = CI_SHARING_EXCLUSIVE;
    src.layout = 0; /* UNDEFINED */
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.layout = 6;
    src.image = 0; /* VK_NULL_HANDLE */
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.image = 0x1234;
    src.width = 8; /* smaller than the ring: refused before recording */
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_INVALID_ARGUMENT);
    src.width = 16;
    EXPECT(ci_sender_present_copy(images, &src, 0, NAN, NULL), CI_INVALID_ARGUMENT);
    /* Recording into the application's command buffer: the same checks of
     * the source, and a source the main family cannot copy (released to
     * another family), all before anything is recorded (the command buffer
     * handle is never used); tokens that never were. */
    void *cmd = (void *)(uintptr_t)0x5678;
    uint64_t token = 0;
    EXPECT(ci_sender_record_copy(images, NULL, &src, 1.0, &token), CI_NULL_POINTER);
    EXPECT(ci_sender_record_copy(images, cmd, &src, 1.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_record_copy(images, cmd, NULL, 1.0, &token), CI_NULL_POINTER);
    EXPECT(ci_sender_record_copy(NULL, cmd, &src, 1.0, &token), CI_NULL_POINTER);
    EXPECT(ci_sender_record_copy((ci_sender *)ctx, cmd, &src, 1.0, &token), CI_WRONG_HANDLE);
    EXPECT(ci_sender_record_copy(sender, cmd, &src, 1.0, &token), CI_UNSUPPORTED);
    EXPECT(ci_sender_record_copy(images, cmd, &src, -1.0, &token), CI_INVALID_ARGUMENT);
    src.width = 8;
    EXPECT(ci_sender_record_copy(images, cmd, &src, 1.0, &token), CI_INVALID_ARGUMENT);
    src.width = 16;
    src.sharing = CI_SHARING_RELEASED_TO_TRANSFER;
    src.queue_family = 5;
    EXPECT(ci_sender_record_copy(images, cmd, &src, 1.0, &token), CI_INVALID_ARGUMENT);
    src.sharing = CI_SHARING_EXCLUSIVE;
    src.queue_family = 0;
    EXPECT(ci_sender_record_into(images, cmd, NULL, NULL, 1.0, &token), CI_NULL_POINTER);
    EXPECT(ci_sender_record_into(images, NULL, record_image_nothing, NULL, 1.0, &token),
           CI_NULL_POINTER);
    EXPECT(ci_sender_record_into(images, cmd, record_image_nothing, NULL, 1.0, NULL),
           CI_NULL_POINTER);
    EXPECT(ci_sender_record_into(sender, cmd, record_image_nothing, NULL, 1.0, &token),
           CI_UNSUPPORTED);
    EXPECT(ci_sender_record_into(images, cmd, record_image_nothing, NULL, NAN, &token),
           CI_INVALID_ARGUMENT);
    if (token != 0) failures++; /* written only on CI_OK */
    EXPECT(ci_sender_present_recorded(images, 0, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_recorded(images, 12345, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_recorded(sender, 1, 0, NULL), CI_UNSUPPORTED);
    EXPECT(ci_sender_present_recorded(NULL, 1, 0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_abandon_recorded(images, 1), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_recorded(sender, 1), CI_UNSUPPORTED);
    EXPECT(ci_sender_abandon_recorded((ci_sender *)ctx, 1), CI_WRONG_HANDLE);

    /* Timelines and opened slots (ci_sender_open): NULL, freed, wrong-kind
     * and never-handles; bad arguments; unknown, spent and another sender's
     * tokens; a timeline of another context and a value of 0, refused
     * before the token is spent (it is abandoned after); an opened slot
     * out of the ring. Nothing writes the slots: abandoning is safe. */
    ci_timeline *tl = NULL;
    uint64_t vk_sem = 0, tl_value = 7;
    EXPECT(ci_timeline_new(NULL, &tl), CI_NULL_POINTER);
    EXPECT(ci_timeline_new(ctx, NULL), CI_NULL_POINTER);
    EXPECT(ci_timeline_new((ci_context *)sender, &tl), CI_WRONG_HANDLE);
    EXPECT(ci_timeline_new(bogus, &tl), CI_WRONG_HANDLE);
    if (tl != NULL) failures++; /* written only on CI_OK */
    EXPECT(ci_timeline_new(ctx, &tl), CI_OK);
    EXPECT(ci_timeline_vk_semaphore(tl, NULL), CI_NULL_POINTER);
    EXPECT(ci_timeline_vk_semaphore(NULL, &vk_sem), CI_NULL_POINTER);
    EXPECT(ci_timeline_vk_semaphore((ci_timeline *)ctx, &vk_sem), CI_WRONG_HANDLE);
    EXPECT(ci_timeline_vk_semaphore((ci_timeline *)odd, &vk_sem), CI_WRONG_HANDLE);
    if (vk_sem != 0) failures++;
    EXPECT(ci_timeline_vk_semaphore(tl, &vk_sem), CI_OK);
    if (vk_sem == 0) failures++;
    EXPECT(ci_timeline_value(tl, NULL), CI_NULL_POINTER);
    EXPECT(ci_timeline_value((ci_timeline *)sender, &tl_value), CI_WRONG_HANDLE);
    EXPECT(ci_timeline_value(tl, &tl_value), CI_OK);
    if (tl_value != 0) failures++;
    EXPECT(ci_timeline_free((ci_timeline *)ctx), CI_WRONG_HANDLE);
    EXPECT(ci_context_free((ci_context *)tl), CI_WRONG_HANDLE);
    EXPECT(ci_sender_serve((ci_sender *)tl, 0.0), CI_WRONG_HANDLE);
    ci_context *ctx2 = NULL;
    ci_timeline *tl2 = NULL;
    EXPECT(ci_context_new_headless(&options, &ctx2), CI_OK);
    EXPECT(ci_timeline_new(ctx2, &tl2), CI_OK);

    ci_opened_slot op, op2, op_img, spare;
    memset(&op, 0, sizeof op);
    memset(&spare, 0, sizeof spare);
    spare.struct_size = sizeof spare;
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 1.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 1.0, &op), CI_INVALID_ARGUMENT); /* size 0 */
    op.struct_size = sizeof op - 8;
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 1.0, &op), CI_INVALID_ARGUMENT); /* short */
    op.struct_size = sizeof op;
    EXPECT(ci_sender_open(sender, 7, 1.0, &op), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, NAN, &op), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, -1.0, &op), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_open(NULL, CI_QUEUE_MAIN, 1.0, &op), CI_NULL_POINTER);
    EXPECT(ci_sender_open((ci_sender *)ctx, CI_QUEUE_MAIN, 1.0, &op), CI_WRONG_HANDLE);
    EXPECT(ci_sender_open((ci_sender *)tl, CI_QUEUE_MAIN, 1.0, &op), CI_WRONG_HANDLE);
    EXPECT(ci_sender_open((ci_sender *)bogus, CI_QUEUE_MAIN, 1.0, &op), CI_WRONG_HANDLE);
    if (op.token != 0) failures++; /* written only on CI_OK */
    /* A buffer ring's slot: its buffer, no image. */
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 1.0, &op), CI_OK);
    if (op.token == 0 || op.kind != CI_SLOTS_BUFFERS || op.buffer == 0 || op.image != 0 ||
        op.buffer_size < 16 * 16 * 4 || op.row_pitch != 64 || op.ready_semaphore == 0 ||
        op.ready_value == 0 || op.width != 16 || op.height != 16 || op.vk_format != 37 ||
        op.slot >= 2 || op.struct_size != sizeof op) {
        fprintf(stderr, "ci_sender_open described a buffer slot wrongly\n");
        failures++;
    }
    memset(&op2, 0, sizeof op2);
    op2.struct_size = sizeof op2;
    EXPECT(ci_sender_open(sender, CI_QUEUE_TRANSFER, 1.0, &op2), CI_OK);
    if (op2.slot == op.slot || op2.token == op.token) failures++;
    /* Both slots opened: out of the ring, nothing to hand out. */
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 0.0, &spare), CI_SKIPPED);
    /* An image ring's slot: its image, no buffer. */
    memset(&op_img, 0, sizeof op_img);
    op_img.struct_size = sizeof op_img;
    EXPECT(ci_sender_open(images, CI_QUEUE_MAIN, 1.0, &op_img), CI_OK);
    if (op_img.kind != CI_SLOTS_IMAGES || op_img.image == 0 || op_img.buffer != 0 ||
        op_img.buffer_size != 0 || op_img.row_pitch != 0 || op_img.vk_format != 37 ||
        op_img.token == 0 || op_img.token == op.token || op_img.token == op2.token) {
        fprintf(stderr, "ci_sender_open described an image slot wrongly\n");
        failures++;
    }
    /* Refused, the tokens left valid. */
    EXPECT(ci_sender_present_opened(sender, op.token, NULL, 1, 0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_present_opened(sender, op.token, (ci_timeline *)ctx, 1, 0, NULL),
           CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_opened(sender, op.token, (ci_timeline *)odd, 1, 0, NULL),
           CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_opened(sender, op.token, tl, 0, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(sender, op.token, tl2, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(sender, 0, tl, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(sender, 0xdeadbeefull, tl, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(NULL, op.token, tl, 1, 0, NULL), CI_NULL_POINTER);
    EXPECT(ci_sender_present_opened((ci_sender *)tl, op.token, tl, 1, 0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_opened((ci_sender *)ctx, op.token, tl, 1, 0, NULL), CI_WRONG_HANDLE);
    /* From inside ci_context_with_queue: it would wait for its own lock. */
    {
        struct present_in_queue inside = {sender, op.token, tl, CI_OK, 0};
        EXPECT(ci_context_with_queue(ctx, CI_QUEUE_MAIN, present_inside, &inside), CI_OK);
        if (inside.got != CI_INVALID_ARGUMENT || !inside.said_why) {
            fprintf(stderr, "present_opened inside ci_context_with_queue: %d, reason named: %d\n",
                    (int)inside.got, inside.said_why);
            failures++;
        }
    }
    /* Another sender's token, both ways. */
    EXPECT(ci_sender_present_opened(sender, op_img.token, tl, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(images, op.token, tl, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_opened(sender, op_img.token), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_opened(images, op.token), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_opened(sender, 0), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_opened(NULL, op.token), CI_NULL_POINTER);
    EXPECT(ci_sender_abandon_opened((ci_sender *)ctx, op.token), CI_WRONG_HANDLE);
    EXPECT(ci_sender_abandon_opened((ci_sender *)tl, op.token), CI_WRONG_HANDLE);
    /* Opened tokens are not recorded frames' (and recorded ones' calls
     * refuse them). */
    EXPECT(ci_sender_present_recorded(images, op_img.token, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_recorded(images, op_img.token), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_stats_get(sender, &stats), CI_OK);
    if (stats.presented != 0) failures++;
    /* The refusals left the tokens valid: abandoned now, then spent. */
    EXPECT(ci_sender_abandon_opened(sender, op.token), CI_OK);
    EXPECT(ci_sender_abandon_opened(sender, op.token), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_present_opened(sender, op.token, tl, 1, 0, NULL), CI_INVALID_ARGUMENT);
    EXPECT(ci_sender_abandon_opened(images, op_img.token), CI_OK);
    /* Back in the ring: the abandoned slot is handed out again. */
    EXPECT(ci_sender_open(sender, CI_QUEUE_MAIN, 1.0, &spare), CI_OK);
    if (spare.slot != op.slot) failures++;
    /* A freed timeline: refused, the token still valid. */
    EXPECT(ci_timeline_free(tl), CI_OK);
    EXPECT(ci_timeline_free(tl), CI_WRONG_HANDLE);
    EXPECT(ci_timeline_free(NULL), CI_OK);
    EXPECT(ci_timeline_vk_semaphore(tl, &vk_sem), CI_WRONG_HANDLE);
    EXPECT(ci_timeline_value(tl, &tl_value), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_opened(sender, spare.token, tl, 1, 0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_abandon_opened(sender, spare.token), CI_OK);
    EXPECT(ci_sender_abandon_opened(sender, op2.token), CI_OK);
    EXPECT(ci_sender_stats_get(sender, &stats), CI_OK);
    if (stats.presented != 0) failures++;
    EXPECT(ci_timeline_free(tl2), CI_OK);
    EXPECT(ci_context_free(ctx2), CI_OK);

    EXPECT(ci_sender_stats_get(images, &stats), CI_OK);
    if (stats.presented != 0) failures++;
    EXPECT(ci_sender_free(images), CI_OK);
    EXPECT(ci_sender_open(images, CI_QUEUE_MAIN, 1.0, &spare), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_opened(images, op_img.token, tl2, 1, 0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_abandon_opened(images, op_img.token), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_copy(images, &src, 0, 0.0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_record_copy(images, cmd, &src, 1.0, &token), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_recorded(images, 1, 0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_abandon_recorded(images, 1), CI_WRONG_HANDLE);

    /* CUDA receivers before connecting, and of another kind. */
    ci_cuda_receiver *crx = NULL;
    ci_ring_layout layout;
    memset(&layout, 0, sizeof layout);
    ci_pitched_plane plane;
    void *array = NULL;
    int32_t ordinal = -1;
    EXPECT(ci_cuda_receiver_next(NULL, 0.0, &frame), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_next((ci_cuda_receiver *)sender, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_next((ci_cuda_receiver *)bogus, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_get_layout(NULL, &layout), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_device(NULL, &ordinal), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_wait_on(NULL, NULL, NULL), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_wait_produced(NULL, NULL, NULL), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_pitched(NULL, NULL, &plane), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_chroma(NULL, NULL, &plane), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_array(NULL, NULL, &array), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_release_after(NULL, NULL, NULL), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_release(NULL, NULL), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_free((ci_cuda_receiver *)ctx), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_free(NULL), CI_OK);
    EXPECT(ci_cuda_receiver_connect_named(NULL, CI_DELIVERY_LATEST, 0.0, &crx), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_connect_named(name, CI_DELIVERY_LATEST, 0.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_cuda_receiver_connect_named(name, 9, 0.0, &crx), CI_INVALID_ARGUMENT);
    EXPECT(ci_cuda_receiver_connect_named(name, CI_DELIVERY_LATEST, INFINITY, &crx),
           CI_INVALID_ARGUMENT);
    EXPECT(ci_cuda_receiver_connect_named("nobody-has-this-name", CI_DELIVERY_LATEST, 0.2, &crx),
           CI_NOT_FOUND);
    if (crx != NULL) failures++;

    /* Vulkan receivers before connecting, and of another kind. */
    ci_vulkan_receiver *vrx = NULL;
    ci_vulkan_image vimage;
    memset(&vimage, 0, sizeof vimage);
    vimage.struct_size = sizeof vimage;
    uint8_t vbytes[16];
    EXPECT(ci_vulkan_receiver_connect_named(NULL, name, CI_DELIVERY_LATEST, 0.0, &vrx),
           CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_connect_named((ci_context *)sender, name, CI_DELIVERY_LATEST, 0.0,
                                            &vrx),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_connect_named(bogus, name, CI_DELIVERY_LATEST, 0.0, &vrx),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, NULL, CI_DELIVERY_LATEST, 0.0, &vrx),
           CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, name, CI_DELIVERY_LATEST, 0.0, NULL),
           CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, name, 3, 0.0, &vrx), CI_INVALID_ARGUMENT);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, name, CI_DELIVERY_LATEST, NAN, &vrx),
           CI_INVALID_ARGUMENT);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, "bad/name", CI_DELIVERY_LATEST, 0.0, &vrx),
           CI_INVALID_ARGUMENT);
    EXPECT(ci_vulkan_receiver_connect_named(ctx, "nobody-has-this-name", CI_DELIVERY_LATEST, 0.2,
                                            &vrx),
           CI_NOT_FOUND);
    EXPECT(ci_vulkan_receiver_next(NULL, 0.0, &frame), CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_next((ci_vulkan_receiver *)sender, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_next((ci_vulkan_receiver *)bogus, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_next((ci_vulkan_receiver *)odd, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_get_layout(NULL, &layout), CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_get_layout((ci_vulkan_receiver *)ctx, &layout), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_image(NULL, NULL, 0.0, &vimage), CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_image((ci_vulkan_receiver *)sender, NULL, 0.0, &vimage),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_read(NULL, NULL, vbytes, sizeof vbytes, 0.0), CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_read((ci_vulkan_receiver *)bogus, NULL, vbytes, sizeof vbytes, 0.0),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_release(NULL, NULL), CI_NULL_POINTER);
    EXPECT(ci_vulkan_receiver_release((ci_vulkan_receiver *)ctx, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_free((ci_vulkan_receiver *)ctx), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_free((ci_vulkan_receiver *)bogus), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_free(NULL), CI_OK);
    if (vrx != NULL) failures++;

    /* Receivers: bad arguments, a missing name. */
    EXPECT(ci_receiver_connect_named(NULL, CI_DELIVERY_LATEST, 0.0, &rx), CI_NULL_POINTER);
    EXPECT(ci_receiver_connect_named(name, CI_DELIVERY_LATEST, 0.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_receiver_connect_named(name, 5, 0.0, &rx), CI_INVALID_ARGUMENT);
    EXPECT(ci_receiver_connect_named(name, CI_DELIVERY_LATEST, -3.0, &rx), CI_INVALID_ARGUMENT);
    EXPECT(ci_receiver_connect_named("bad/name", CI_DELIVERY_LATEST, 0.0, &rx),
           CI_INVALID_ARGUMENT);
    EXPECT(ci_receiver_connect_named("nobody-has-this-name", CI_DELIVERY_LATEST, 0.2, &rx),
           CI_NOT_FOUND);
    if (rx != NULL) return 1;

    /* Listing: NULL pointers; then the sender is there. */
    size_t count = 0;
    ci_sender_info listed[4];
    EXPECT(ci_list_senders(listed, 4, NULL), CI_NULL_POINTER);
    EXPECT(ci_list_senders(NULL, 4, &count), CI_NULL_POINTER);
    EXPECT(ci_list_senders(NULL, 0, &count), CI_OK);
    EXPECT(ci_list_senders(listed, 4, &count), CI_OK);
    if (count != 1 || strcmp(listed[0].name, name) != 0) {
        fprintf(stderr, "ci_list_senders: %zu senders, expected %s alone\n", count, name);
        failures++;
    }

    /* A live connection: the sender served by a thread. */
    g_sender = sender;
    pthread_t thread;
    if (pthread_create(&thread, NULL, serve, NULL) != 0) return 1;
    EXPECT(ci_receiver_connect_named(name, CI_DELIVERY_LOSSLESS, 60.0, &rx), CI_OK);
    if (!rx) {
        /* Nothing below can run (a device-local ring: no host receiver). */
        fprintf(stderr, "no receiver: the checks that need one did not run\n");
        return 1;
    }
    EXPECT(ci_receiver_next(rx, 30.0, NULL), CI_NULL_POINTER);
    EXPECT(ci_receiver_next(rx, NAN, &frame), CI_INVALID_ARGUMENT);
    EXPECT(ci_receiver_next(rx, 30.0, &frame), CI_OK);
    EXPECT(ci_frame_get_info(frame, NULL), CI_NULL_POINTER);
    EXPECT(ci_frame_get_info(NULL, &info), CI_NULL_POINTER);
    EXPECT(ci_frame_get_info(frame, &info), CI_OK);
    uint8_t small[4];
    EXPECT(ci_receiver_read(rx, frame, small, sizeof small, 30.0), CI_BUFFER_TOO_SMALL);
    EXPECT(ci_receiver_read(rx, frame, NULL, 4096, 30.0), CI_NULL_POINTER);
    EXPECT(ci_receiver_read(rx, (ci_frame *)rx, small, sizeof small, 30.0), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_read((ci_receiver *)frame, frame, small, sizeof small, 30.0),
           CI_WRONG_HANDLE);
    uint8_t *pixels = calloc(1, (size_t)info.frame_bytes);
    if (!pixels) return 1;
    EXPECT(ci_receiver_read(rx, frame, pixels, (size_t)info.frame_bytes, 30.0), CI_OK);
    uint32_t w;
    memcpy(&w, pixels, 4);
    if (w != 0x11223344u) {
        fprintf(stderr, "the frame's first word is %08x\n", w);
        failures++;
    }
    free(pixels);
    /* Layouts: a short struct_size, NULL, the host receiver's ring. */
    EXPECT(ci_receiver_get_layout(rx, &layout), CI_INVALID_ARGUMENT);
    EXPECT(ci_receiver_get_layout(rx, NULL), CI_NULL_POINTER);
    EXPECT(ci_receiver_get_layout(NULL, &layout), CI_NULL_POINTER);
    layout.struct_size = sizeof layout;
    EXPECT(ci_receiver_get_layout((ci_receiver *)sender, &layout), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_get_layout((ci_cuda_receiver *)rx, &layout), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_get_layout(rx, &layout), CI_OK);
    if (layout.width != 16 || layout.height != 16 || layout.format != CI_FORMAT_RGBA8_BUFFER ||
        layout.frame_bytes != info.frame_bytes || strcmp(layout.format_name, "r8g8b8a8_unorm")) {
        fprintf(stderr, "unexpected layout %ux%u %s\n", layout.width, layout.height,
                layout.format_name);
        failures++;
    }
    /* A host receiver's frame through the CUDA receiver's functions: the
     * receiver is of another kind. */
    EXPECT(ci_cuda_receiver_pitched((ci_cuda_receiver *)rx, frame, &plane), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_array((ci_cuda_receiver *)rx, frame, &array), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_wait_on((ci_cuda_receiver *)rx, frame, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_wait_produced((ci_cuda_receiver *)rx, frame, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_release((ci_cuda_receiver *)rx, frame), CI_WRONG_HANDLE);
    EXPECT(ci_cuda_receiver_release_after((ci_cuda_receiver *)frame, frame, NULL),
           CI_WRONG_HANDLE);
    /* A CUDA receiver of this ring: lavapipe shares no timelines, so it is
     * refused (CI_PROTOCOL, saying why); with a GPU it may connect. */
    ci_status cs = ci_cuda_receiver_connect_named(name, CI_DELIVERY_LATEST, 10.0, &crx);
    checks++;
    if (cs == CI_OK) {
        EXPECT(ci_cuda_receiver_free(crx), CI_OK);
    } else if (ci_last_error_message()[0] == '\0') {
        fprintf(stderr, "CUDA receiver refused (%d) without a message\n", (int)cs);
        failures++;
    } else {
        printf("ok %d: a CUDA receiver of a lavapipe ring -> %d: %s\n", checks, (int)cs,
               ci_last_error_message());
    }
    /* A Vulkan receiver of this buffer ring: refused (CI_UNSUPPORTED),
     * saying what takes buffer rings; a host receiver's handle and frame
     * through the Vulkan receiver's functions: another kind. */
    EXPECT(ci_vulkan_receiver_connect_named(ctx, name, CI_DELIVERY_LATEST, 10.0, &vrx),
           CI_UNSUPPORTED);
    if (vrx != NULL) failures++;
    EXPECT(ci_vulkan_receiver_read((ci_vulkan_receiver *)rx, frame, vbytes, sizeof vbytes, 0.0),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_image((ci_vulkan_receiver *)rx, frame, 0.0, &vimage),
           CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_release((ci_vulkan_receiver *)rx, frame), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_get_layout((ci_vulkan_receiver *)rx, &layout), CI_WRONG_HANDLE);
    EXPECT(ci_vulkan_receiver_free((ci_vulkan_receiver *)rx), CI_WRONG_HANDLE);
    EXPECT(ci_frame_release((ci_receiver *)ctx, frame), CI_WRONG_HANDLE);
    EXPECT(ci_frame_release(rx, NULL), CI_NULL_POINTER);
    EXPECT(ci_frame_release(rx, frame), CI_OK);
    /* The frame handle is freed now. */
    EXPECT(ci_frame_release(rx, frame), CI_WRONG_HANDLE);
    EXPECT(ci_frame_get_info(frame, &info), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_read(rx, frame, small, sizeof small, 30.0), CI_WRONG_HANDLE);
    /* Lossless, and the sender presents nothing more: a timeout. */
    ci_frame *none = NULL;
    EXPECT(ci_receiver_next(rx, 0.2, &none), CI_TIMEOUT);
    if (none != NULL) failures++;

    /* Frees: NULL is a no-op, a second free is a freed handle. */
    EXPECT(ci_receiver_free(rx), CI_OK);
    EXPECT(ci_receiver_free(rx), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_next(rx, 0.0, &frame), CI_WRONG_HANDLE);
    EXPECT(ci_receiver_free(NULL), CI_OK);
    atomic_store(&g_stop, 1);
    void *thread_result = NULL;
    pthread_join(thread, &thread_result);
    if (thread_result != NULL) failures++;
    /* A callback calling back into its own sender is refused, and the outer
     * call completes (no one waits for the receiver here: a latest-free
     * ring, a slot is free). */
    EXPECT(ci_sender_present_record(sender, record_reenter, sender, 0, 5.0, NULL), CI_OK);
    if (g_reentered != 1) {
        fprintf(stderr, "a callback's call on its own sender was not refused (%d)\n",
                g_reentered);
        failures++;
    }
    EXPECT(ci_sender_stats_get(sender, &stats), CI_OK); /* usable after */
    EXPECT(ci_sender_free(sender), CI_OK);
    EXPECT(ci_sender_free(sender), CI_WRONG_HANDLE);
    EXPECT(ci_sender_present_fill(sender, 0, 0, 0.0, NULL), CI_WRONG_HANDLE);
    EXPECT(ci_sender_free(NULL), CI_OK);
    /* Its name is gone with it. */
    EXPECT(ci_receiver_connect_named(name, CI_DELIVERY_LATEST, 0.0, &rx), CI_NOT_FOUND);
    EXPECT(ci_context_free(ctx), CI_OK);
    EXPECT(ci_context_free(ctx), CI_WRONG_HANDLE);
    EXPECT(ci_sender_new(ctx, name, 16, 16, 2, &sender), CI_WRONG_HANDLE);
    EXPECT(ci_context_free(NULL), CI_OK);

    printf("%d checks, %d failures\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
