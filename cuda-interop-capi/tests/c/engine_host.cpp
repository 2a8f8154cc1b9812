/* The engine of the engine-plugin harness (engine_harness.h): plays a game
 * engine's side of its native-plugin Vulkan interface exactly, and loads a
 * rendering plugin (a shared object) that publishes its render texture.
 *
 *   engine_host PLUGIN.so NAME WIDTH HEIGHT FRAMES record|submit|own
 *
 * It owns everything: its instance, device and graphics queue (vk_app.hpp),
 * an RGBA8 render texture WITHOUT external memory, two frames in flight
 * (a command buffer, a fence and a staging buffer each). Each frame n it
 * waits for the fence of frame n-2 (that frame is then "safe"), renders
 * into the texture (a clear in frame n's colour, frame n's pattern copied
 * over the top half: vk_app::texel), leaves it in COLOR_ATTACHMENT_OPTIMAL
 * as a render pass would, and issues the plugin's publish event:
 *
 *  - record (and own: the plugin's own commands write the slot): the event
 *    is configured with graphics_queue_access DONT_CARE: the plugin gets
 *    the frame's command buffer, still recording, and the engine ends and
 *    submits it (with the frame's fence) after the event;
 *  - submit: FLUSH_COMMAND_BUFFERS and ALLOW: the engine submits the frame's
 *    command buffer first, and the plugin may submit to the queue.
 *
 * access_texture tracks the texture's layout as the engine does: a
 * PIPELINE_BARRIER access records the transition into the frame's command
 * buffer and the engine's next frame starts from that layout. Every
 * submission is on this (the render) thread. After the last frame the
 * engine waits for its device, unloads the plugin, destroys everything and
 * prints "engine: N frames rendered, K validation errors"; exit status 0
 * only if the plugin's unload returned 0 and there was no validation error.
 */
#include <dlfcn.h>

#include <cinttypes>

#include "engine_harness.h"
#include "vk_app.hpp"

namespace {

constexpr int IN_FLIGHT = 2;

struct Engine {
    vk_app::Device device;
    vk_app::Image texture;
    uint32_t width = 0, height = 0;
    VkImageLayout layout = VK_IMAGE_LAYOUT_UNDEFINED;
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cmd[IN_FLIGHT] = {};
    VkFence fence[IN_FLIGHT] = {};
    uint64_t frame_of[IN_FLIGHT] = {};  // 0: nothing submitted
    vk_app::Buffer staging[IN_FLIGHT];
    harness_event_config config{};
    bool configured = false;
    // The event being issued, and its command buffer (record mode).
    bool in_event = false;
    VkCommandBuffer event_cmd = VK_NULL_HANDLE;
    uint64_t current = 0, safe = 0;
};

Engine engine;

harness_vulkan_instance instance() {
    harness_vulkan_instance i{};
    i.get_instance_proc_addr = reinterpret_cast<void *>(&vkGetInstanceProcAddr);
    i.instance = engine.device.instance;
    i.physical_device = engine.device.physical;
    i.device = engine.device.device;
    i.graphics_queue = engine.device.queue;
    i.queue_family_index = engine.device.family;
    i.semaphore_fd_enabled = engine.device.semaphore_fd ? 1 : 0;
    return i;
}

void configure_event(int event_id, const harness_event_config *config) {
    if (event_id == HARNESS_PUBLISH_EVENT && config) {
        engine.config = *config;
        engine.configured = true;
    }
}

int command_recording_state(harness_recording_state *state, uint32_t queue_access) {
    if (!state) return 0;
    if (engine.in_event && queue_access != engine.config.graphics_queue_access) return 0;
    state->command_buffer = engine.in_event ? engine.event_cmd : VK_NULL_HANDLE;
    state->current_frame_number = engine.current;
    state->safe_frame_number = engine.safe;
    return 1;
}

int access_texture(void *texture, uint32_t layout, uint32_t stage, uint32_t access, uint32_t mode,
                   harness_image *out) {
    if (texture != &engine.texture || !out) return 0;
    if (mode == HARNESS_ACCESS_PIPELINE_BARRIER) {
        // Only into an open command buffer of an event.
        if (!engine.in_event || engine.event_cmd == VK_NULL_HANDLE) return 0;
        vk_app::image_barrier(engine.event_cmd, engine.texture.image, engine.layout,
                              static_cast<VkImageLayout>(layout),
                              VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT |
                                  VK_PIPELINE_STAGE_TRANSFER_BIT,
                              VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                              stage, access);
        engine.layout = static_cast<VkImageLayout>(layout);
    }
    out->image = reinterpret_cast<uint64_t>(engine.texture.image);
    out->layout = static_cast<uint32_t>(engine.layout);
    out->format = VK_FORMAT_R8G8B8A8_UNORM;
    out->width = engine.width;
    out->height = engine.height;
    return 1;
}

const harness_vulkan_interface interface_table = {instance, configure_event,
                                                  command_recording_state, access_texture};

// Frame n's rendering into `cmd`: the texture cleared to frame n's colour,
// the pattern rows copied from `staging` (filled here), left in
// COLOR_ATTACHMENT_OPTIMAL.
void render(VkCommandBuffer cmd, vk_app::Buffer &staging, uint64_t n) {
    const uint32_t pattern_rows = engine.height / 2;
    auto *bytes = static_cast<uint8_t *>(staging.mapped);
    for (uint32_t y = 0; y < pattern_rows; y++)
        for (uint32_t x = 0; x < engine.width; x++)
            vk_app::texel(n, x, y, pattern_rows, bytes + (size_t{y} * engine.width + x) * 4);
    vk_app::image_barrier(cmd, engine.texture.image, engine.layout,
                          VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                          VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT,
                          VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    uint8_t clear[4];
    vk_app::texel(n, 0, engine.height - 1, pattern_rows, clear);
    VkClearColorValue colour{};
    for (int i = 0; i < 4; i++) colour.float32[i] = static_cast<float>(clear[i]) / 255.0f;
    VkImageSubresourceRange range = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
    vkCmdClearColorImage(cmd, engine.texture.image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, &colour,
                         1, &range);
    vk_app::image_barrier(cmd, engine.texture.image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
                          VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_ACCESS_TRANSFER_WRITE_BIT);
    VkBufferImageCopy region{};
    region.bufferRowLength = engine.width;
    region.bufferImageHeight = pattern_rows;
    region.imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
    region.imageExtent = {engine.width, pattern_rows, 1};
    vkCmdCopyBufferToImage(cmd, staging.buffer, engine.texture.image,
                           VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, &region);
    vk_app::image_barrier(cmd, engine.texture.image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
                          VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL, VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_ACCESS_TRANSFER_WRITE_BIT,
                          VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT |
                              VK_PIPELINE_STAGE_TRANSFER_BIT,
                          VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    engine.layout = VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL;
}

void submit(int slot, uint64_t n) {
    VK(vkEndCommandBuffer(engine.cmd[slot]));
    VkSubmitInfo info{};
    info.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    info.commandBufferCount = 1;
    info.pCommandBuffers = &engine.cmd[slot];
    VK(vkQueueSubmit(engine.device.queue, 1, &info, engine.fence[slot]));
    engine.frame_of[slot] = n;
}

// Waits for the frame last submitted in `slot`; it is then safe.
void retire(int slot) {
    if (engine.frame_of[slot] == 0) return;
    VK(vkWaitForFences(engine.device.device, 1, &engine.fence[slot], VK_TRUE,
                       60ull * 1000 * 1000 * 1000));
    VK(vkResetFences(engine.device.device, 1, &engine.fence[slot]));
    if (engine.frame_of[slot] > engine.safe) engine.safe = engine.frame_of[slot];
    engine.frame_of[slot] = 0;
}

int run(const char *plugin_path, const char *name, uint32_t width, uint32_t height,
        uint64_t frames, int mode) {
    engine.device = vk_app::make_device("engine_host");
    engine.width = width;
    engine.height = height;
    engine.texture = vk_app::make_render_target(engine.device, width, height);
    VkDevice device = engine.device.device;
    for (auto &s : engine.staging)
        s = vk_app::make_staging(engine.device, VkDeviceSize{width} * (height / 2) * 4);
    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = engine.device.family;
    VK(vkCreateCommandPool(device, &pci, nullptr, &engine.pool));
    VkCommandBufferAllocateInfo cbai{};
    cbai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cbai.commandPool = engine.pool;
    cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cbai.commandBufferCount = IN_FLIGHT;
    VK(vkAllocateCommandBuffers(device, &cbai, engine.cmd));
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    for (auto &f : engine.fence) VK(vkCreateFence(device, &fci, nullptr, &f));

    // The plugin, as an engine loads a native plugin.
    void *plugin = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    if (!plugin) vk_app::fail(std::string("dlopen: ") + dlerror());
    auto load = reinterpret_cast<harness_plugin_load_fn>(dlsym(plugin, "harness_plugin_load"));
    auto event = reinterpret_cast<harness_render_event_fn>(dlsym(plugin, "harness_render_event"));
    auto unload =
        reinterpret_cast<harness_plugin_unload_fn>(dlsym(plugin, "harness_plugin_unload"));
    if (!load || !event || !unload) vk_app::fail("the plugin lacks a harness_* export");
    harness_plugin_args args{&interface_table, &engine.texture, name, mode};
    if (load(&args) != 0) vk_app::fail("the plugin's load failed");
    if (!engine.configured) vk_app::fail("the plugin never configured its event");
    // This engine records no render pass; a plugin that records barriers
    // and copies must ask to be outside one, as it would of the real engine.
    if (engine.config.render_pass_precondition != HARNESS_RENDER_PASS_ENSURE_OUTSIDE)
        vk_app::fail("the plugin's event does not ask to be outside a render pass");
    const bool flush = (engine.config.flags & HARNESS_EVENT_FLUSH_COMMAND_BUFFERS) != 0;
    std::printf("engine_host: %ux%u, %" PRIu64 " frames, the publish event %s\n", width, height,
                frames,
                flush ? "after the frame's command buffer was submitted (FLUSH_COMMAND_BUFFERS)"
                      : "inside the frame's command buffer (recording)");
    std::fflush(stdout);

    for (uint64_t n = 1; n <= frames; n++) {
        const int slot = static_cast<int>(n % IN_FLIGHT);
        retire(slot);
        engine.current = n;
        VkCommandBuffer cmd = engine.cmd[slot];
        VK(vkResetCommandBuffer(cmd, 0));
        VkCommandBufferBeginInfo begin{};
        begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        VK(vkBeginCommandBuffer(cmd, &begin));
        render(cmd, engine.staging[slot], n);
        if (flush) submit(slot, n);
        engine.in_event = true;
        engine.event_cmd = flush ? VK_NULL_HANDLE : cmd;
        event(HARNESS_PUBLISH_EVENT);
        engine.in_event = false;
        engine.event_cmd = VK_NULL_HANDLE;
        if (!flush) submit(slot, n);
    }
    for (int slot = 0; slot < IN_FLIGHT; slot++) retire(slot);
    VK(vkDeviceWaitIdle(device));
    engine.safe = engine.current;
    const int unloaded = unload();
    dlclose(plugin);

    vkDestroyCommandPool(device, engine.pool, nullptr);
    for (auto &f : engine.fence) vkDestroyFence(device, f, nullptr);
    for (auto &s : engine.staging) s.destroy(device);
    engine.texture.destroy(device);
    engine.device.destroy();
    std::printf("engine_host: %" PRIu64 " frames rendered, %d validation errors\n", frames,
                vk_app::validation_errors);
    return unloaded == 0 && vk_app::validation_errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    vk_app::program = "engine_host";
    int mode = -1;
    if (argc == 7) {
        if (std::strcmp(argv[6], "record") == 0) mode = HARNESS_PLUGIN_RECORD;
        if (std::strcmp(argv[6], "submit") == 0) mode = HARNESS_PLUGIN_SUBMIT;
        if (std::strcmp(argv[6], "own") == 0) mode = HARNESS_PLUGIN_OWN_COMMANDS;
    }
    if (mode < 0) {
        std::fprintf(stderr,
                     "usage: engine_host PLUGIN.so NAME WIDTH HEIGHT FRAMES record|submit|own\n");
        return 2;
    }
    const uint32_t width = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    const uint32_t height = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
    const uint64_t frames = std::strtoull(argv[5], nullptr, 10);
    if (width == 0 || height < 2 || frames == 0) {
        std::fprintf(stderr, "WIDTH, HEIGHT (at least 2) and FRAMES must be positive\n");
        return 2;
    }
    return run(argv[1], argv[2], width, height, frames, mode);
}
