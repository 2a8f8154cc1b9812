/* A native rendering plugin written in C (a shared object the engine loads
 * with dlopen), publishing the engine's render texture by name through the
 * C ABI: what a "Spout for Linux" plugin for a game engine does. See
 * engine_harness.h for the engine interface and how it maps to Unity's.
 *
 * At load: a context over the engine's own instance, device and graphics
 * queue (ci_context_new_from_vulkan; nothing of the engine's is rebound or
 * recreated), an image ring of the render texture's size and format
 * (ci_image_sender_new), the publish event configured, and a wait for the
 * first receiver. At each publish event, either
 *
 *  - record mode (the engine's command buffer is open, the plugin may not
 *    submit): access_texture records the render texture's transition to
 *    TRANSFER_SRC_OPTIMAL into the frame's command buffer, and
 *    ci_sender_record_copy records the slot's acquire, the copy and the
 *    release there; frames whose command buffer completed (the recording
 *    state's safe_frame_number) are presented with
 *    ci_sender_present_recorded, oldest first; or
 *  - own-commands mode (the command buffer open, as record mode): the
 *    plugin records its own vkCmdCopyImage of the render texture into the
 *    slot's image through ci_sender_record_into's callback (what a plugin
 *    that renders into the slot itself does), presented as record mode's;
 *  - submit mode (the engine flushed its command buffers, the plugin may
 *    submit): the texture observed in the layout the engine left it in,
 *    ci_sender_present_copy copies it on the engine's queue, after the
 *    engine's submission, and leaves it in that layout.
 *
 * In record mode a second sender (NAME-twin, no receiver) also records
 * frame 1 into the same command buffer: each sender refuses the other's
 * token, and the twin presents its own once frame 1 completed.
 *
 * At unload (the engine has waited for its device), the frames still
 * pending are presented, the plugin serves until the receiver has left,
 * and frees its sender and context. Frame n must get sequence number n.
 * Anything wrong is counted and printed; unload returns 1 then.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vulkan/vulkan.h>

#include "cuda_interop.h"
#include "engine_harness.h"

#define SLOTS 4
#define MAX_PENDING 8

static const harness_vulkan_interface *vk;
static void *texture;
static int mode;
static PFN_vkCmdCopyImage cmd_copy_image;
static ci_context *ctx;
static ci_sender *sender;
static ci_sender *twin;
static uint64_t twin_token, twin_frame;
static uint32_t family;
static struct {
    uint64_t token;
    uint64_t frame;
} pending[MAX_PENDING];
static int npending;
static uint64_t published, recorded, failures;

#define CHECK(call)                                                                        \
    do {                                                                                   \
        ci_status s_ = (call);                                                             \
        if (s_ != CI_OK) {                                                                 \
            failures++;                                                                    \
            fprintf(stderr, "engine_plugin: %s -> %d: %s (line %d)\n", #call, (int)s_,    \
                    ci_last_error_message(), __LINE__);                                    \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

static int expect(int ok, const char *what) {
    if (!ok) {
        failures++;
        fprintf(stderr, "engine_plugin: %s\n", what);
    }
    return ok;
}

static ci_source_image source_of(const harness_image *img) {
    ci_source_image src;
    memset(&src, 0, sizeof src);
    src.struct_size = sizeof src;
    src.vk_format = img->format;
    src.layout = img->layout;
    src.sharing = CI_SHARING_EXCLUSIVE;
    src.queue_family = family;
    src.width = img->width;
    src.height = img->height;
    src.image = img->image;
    return src;
}

/* Presents the pending frames whose command buffer completed (frame number
 * at or before `safe`), oldest first. */
static int present_completed(uint64_t safe) {
    if (twin_token && twin_frame <= safe) {
        uint64_t sequence = 0;
        CHECK(ci_sender_present_recorded(twin, twin_token, 0, &sequence));
        twin_token = 0;
        if (!expect(sequence == 1, "the twin's frame got another sequence number")) return 1;
    }
    while (npending > 0 && pending[0].frame <= safe) {
        uint64_t sequence = 0;
        CHECK(ci_sender_present_recorded(sender, pending[0].token, 0, &sequence));
        published++;
        if (!expect(sequence == published, "a recorded frame got another sequence number"))
            return 1;
        memmove(&pending[0], &pending[1], sizeof pending[0] * (size_t)(npending - 1));
        npending--;
    }
    return 0;
}

/* ci_record_image_fn: the plugin's own commands, a copy of the render
 * texture (in TRANSFER_SRC_OPTIMAL: access_texture's barrier) into the
 * slot's image (GENERAL). */
static void copy_texture(void *user, void *device, void *command_buffer, uint64_t image,
                         uint32_t width, uint32_t height, uint32_t vk_format) {
    const harness_image *src = user;
    (void)device;
    if (width != src->width || height != src->height || vk_format != src->format) {
        failures++;
        fprintf(stderr, "engine_plugin: the slot is %ux%u VkFormat %u\n", width, height, vk_format);
        return;
    }
    VkImageCopy region;
    memset(&region, 0, sizeof region);
    region.srcSubresource.aspectMask = VK_IMAGE_ASPECT_COLOR_BIT;
    region.srcSubresource.layerCount = 1;
    region.dstSubresource = region.srcSubresource;
    region.extent.width = width;
    region.extent.height = height;
    region.extent.depth = 1;
    cmd_copy_image((VkCommandBuffer)command_buffer, (VkImage)(uintptr_t)src->image,
                   (VkImageLayout)src->layout, (VkImage)(uintptr_t)image, VK_IMAGE_LAYOUT_GENERAL,
                   1, &region);
}

static int publish(void) {
    harness_recording_state state;
    harness_image img;
    if (mode != HARNESS_PLUGIN_SUBMIT) {
        if (!expect(vk->command_recording_state(&state, HARNESS_QUEUE_ACCESS_DONT_CARE) == 1,
                    "no recording state"))
            return 1;
        if (present_completed(state.safe_frame_number)) return 1;
        if (!expect(npending < MAX_PENDING, "too many frames in flight")) return 1;
        if (!expect(vk->access_texture(texture, VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL,
                                       VK_PIPELINE_STAGE_TRANSFER_BIT,
                                       VK_ACCESS_TRANSFER_READ_BIT,
                                       HARNESS_ACCESS_PIPELINE_BARRIER, &img) == 1,
                    "access_texture refused the render texture"))
            return 1;
        ci_source_image src = source_of(&img);
        uint64_t token = 0;
        /* Lossless receiver: waits (bounded) for a slot it released. */
        if (mode == HARNESS_PLUGIN_RECORD)
            CHECK(ci_sender_record_copy(sender, state.command_buffer, &src, 30.0, &token));
        else
            CHECK(ci_sender_record_into(sender, state.command_buffer, copy_texture, &img, 30.0,
                                        &token));
        pending[npending].token = token;
        pending[npending].frame = state.current_frame_number;
        npending++;
        recorded++;
        if (twin && state.current_frame_number == 1) {
            /* Two senders' frames in one command buffer; tokens are never
             * another sender's. */
            CHECK(ci_sender_record_copy(twin, state.command_buffer, &src, 30.0, &twin_token));
            twin_frame = 1;
            if (!expect(ci_sender_present_recorded(twin, token, 0, NULL) == CI_INVALID_ARGUMENT &&
                            ci_sender_abandon_recorded(twin, token) == CI_INVALID_ARGUMENT &&
                            ci_sender_present_recorded(sender, twin_token, 0, NULL) ==
                                CI_INVALID_ARGUMENT &&
                            twin_token != token,
                        "a sender took another sender's token"))
                return 1;
        }
    } else {
        if (!expect(vk->command_recording_state(&state, HARNESS_QUEUE_ACCESS_ALLOW) == 1,
                    "no recording state"))
            return 1;
        if (!expect(vk->access_texture(texture, 0, 0, 0, HARNESS_ACCESS_OBSERVE_ONLY, &img) == 1,
                    "access_texture refused the render texture"))
            return 1;
        ci_source_image src = source_of(&img);
        uint64_t sequence = 0;
        CHECK(ci_sender_present_copy(sender, &src, 0, 30.0, &sequence));
        published++;
        if (!expect(sequence == published, "a copied frame got another sequence number"))
            return 1;
    }
    return 0;
}

int harness_plugin_load(const harness_plugin_args *args) {
    vk = args->vulkan;
    texture = args->render_texture;
    mode = args->mode;
    harness_vulkan_instance inst = vk->instance();
    PFN_vkGetInstanceProcAddr gipa = (PFN_vkGetInstanceProcAddr)inst.get_instance_proc_addr;
    PFN_vkGetDeviceProcAddr gdpa =
        (PFN_vkGetDeviceProcAddr)gipa((VkInstance)inst.instance, "vkGetDeviceProcAddr");
    if (!expect(gdpa != NULL, "no vkGetDeviceProcAddr")) return 1;
    cmd_copy_image = (PFN_vkCmdCopyImage)gdpa((VkDevice)inst.device, "vkCmdCopyImage");
    if (!expect(cmd_copy_image != NULL, "no vkCmdCopyImage")) return 1;
    /* The engine names its graphics queue, not its index: the library is
     * told queue 0 of the family, so check that it is that queue. */
    PFN_vkGetDeviceQueue get_queue =
        (PFN_vkGetDeviceQueue)gdpa((VkDevice)inst.device, "vkGetDeviceQueue");
    VkQueue queue0 = VK_NULL_HANDLE;
    if (get_queue) get_queue((VkDevice)inst.device, inst.queue_family_index, 0, &queue0);
    if (!expect(queue0 == (VkQueue)inst.graphics_queue,
                "the graphics queue is not queue 0 of its family"))
        return 1;
    family = inst.queue_family_index;
    ci_vulkan_device desc;
    memset(&desc, 0, sizeof desc);
    desc.struct_size = sizeof desc;
    desc.main_queue_family = inst.queue_family_index;
    desc.main_queue_index = 0;
    desc.semaphore_fd_enabled = inst.semaphore_fd_enabled;
    desc.get_instance_proc_addr = inst.get_instance_proc_addr;
    desc.instance = inst.instance;
    desc.physical_device = inst.physical_device;
    desc.device = inst.device;
    CHECK(ci_context_new_from_vulkan(&desc, &ctx));
    harness_image img;
    if (!expect(vk->access_texture(texture, 0, 0, 0, HARNESS_ACCESS_OBSERVE_ONLY, &img) == 1,
                "access_texture refused the render texture"))
        return 1;
    CHECK(ci_image_sender_new(ctx, args->name, img.width, img.height, img.format, SLOTS, &sender));
    if (mode == HARNESS_PLUGIN_RECORD) {
        char twin_name[256];
        snprintf(twin_name, sizeof twin_name, "%s-twin", args->name);
        CHECK(ci_image_sender_new(ctx, twin_name, img.width, img.height, img.format, 2, &twin));
    }
    harness_event_config config;
    memset(&config, 0, sizeof config);
    config.render_pass_precondition = HARNESS_RENDER_PASS_ENSURE_OUTSIDE;
    const int flush = mode == HARNESS_PLUGIN_SUBMIT;
    config.flags = flush ? (uint32_t)HARNESS_EVENT_FLUSH_COMMAND_BUFFERS : 0u;
    config.graphics_queue_access =
        flush ? HARNESS_QUEUE_ACCESS_ALLOW : HARNESS_QUEUE_ACCESS_DONT_CARE;
    vk->configure_event(HARNESS_PUBLISH_EVENT, &config);
    printf("engine_plugin: publishing %s (%ux%u, VkFormat %u) %s\n", args->name, img.width,
           img.height, img.format,
           mode == HARNESS_PLUGIN_RECORD
               ? "from inside the engine's command buffer (ci_sender_record_copy)"
           : mode == HARNESS_PLUGIN_OWN_COMMANDS
               ? "by its own commands in the engine's command buffer (ci_sender_record_into)"
               : "by its own submission after the engine's (ci_sender_present_copy)");
    fflush(stdout);
    CHECK(ci_sender_wait_for_receivers(sender, 1, 60.0));
    return 0;
}

void harness_render_event(int event_id) {
    if (event_id != HARNESS_PUBLISH_EVENT || !sender || failures) return;
    (void)publish();
}

int harness_plugin_unload(void) {
    if (sender) {
        harness_recording_state state;
        /* Outside a frame, after the engine waited for its device: every
         * frame completed. */
        if (expect(vk->command_recording_state(&state, HARNESS_QUEUE_ACCESS_DONT_CARE) == 1,
                   "no recording state at unload") &&
            expect(state.safe_frame_number == state.current_frame_number,
                   "frames still running at unload"))
            (void)present_completed(state.safe_frame_number);
        (void)expect(npending == 0, "recorded frames never presented");
        ci_sender_stats stats;
        memset(&stats, 0, sizeof stats);
        for (int i = 0; i < 6000; i++) {
            CHECK(ci_sender_serve(sender, 0.01));
            CHECK(ci_sender_stats_get(sender, &stats));
            if (stats.receivers == 0) break;
        }
        printf("engine_plugin: presented %" PRIu64 " (%" PRIu64
               " recorded in the engine's command buffers), skipped %" PRIu64
               ", receivers left %" PRIu64 "\n",
               stats.presented, recorded, stats.skipped, stats.receivers);
        (void)expect(stats.presented == published, "the sender's count differs");
        CHECK(ci_sender_free(sender));
        sender = NULL;
    }
    if (twin) {
        (void)expect(twin_token == 0, "the twin's frame was never presented");
        ci_sender_stats stats;
        CHECK(ci_sender_stats_get(twin, &stats));
        (void)expect(stats.presented == 1, "the twin presented other than one frame");
        CHECK(ci_sender_free(twin));
        twin = NULL;
    }
    if (ctx) {
        CHECK(ci_context_free(ctx));
        ctx = NULL;
    }
    fflush(stdout);
    return failures == 0 ? 0 : 1;
}
