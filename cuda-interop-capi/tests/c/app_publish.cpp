/* A C++ Vulkan application that publishes its own render target through the
 * C ABI (issue 33's success path of ci_context_new_from_vulkan):
 *
 *   app_publish NAME FRAMES
 *
 * It creates its OWN VkInstance (Vulkan 1.2, the Khronos validation layer
 * and a debug messenger where the layer is installed), picks a physical
 * device with VK_KHR_external_memory_fd and timeline semaphores, creates a
 * VkDevice with what ci_context_new_from_vulkan's contract asks for
 * (VK_KHR_external_semaphore_fd too where offered), and a render target: an
 * RGBA8 OPTIMAL image WITHOUT external memory (transfer src/dst and
 * colour-attachment usage), bigger than the ring so that a region at an
 * offset is copied. Each frame it renders into it (vkCmdClearColorImage of
 * a per-frame colour, then a per-frame pattern copied from a host-visible
 * staging buffer over the top half), leaves it as an engine would (odd
 * frames COLOR_ATTACHMENT_OPTIMAL, even ones TRANSFER_SRC_OPTIMAL), submits
 * inside ci_context_with_queue, and publishes it with
 * ci_sender_present_copy on a ring made by ci_image_sender_new: frames
 * f % 4 in {2, 3} wait for the rendering's fence first, the others only
 * submit it before the copy (on the same queue). Frame f must get sequence
 * number f (one lossless receiver). Then it serves until the receiver has
 * left, frees everything and destroys its device and instance.
 *
 * The receiver (c_programs.rs, a Vulkan receiver in the test's process)
 * checks every texel of every frame against texel() below.
 *
 * Exit status 0: all good, no validation error; otherwise what failed is on
 * stderr (validation errors as "[vulkan validation error] ...").
 */
#include <cinttypes>

#include "vk_app.hpp"

namespace {

// The ring, and the render target it is copied from (at an offset).
constexpr uint32_t RING_W = 96;
constexpr uint32_t RING_H = 56;
constexpr uint32_t SRC_W = 104;
constexpr uint32_t SRC_H = 64;
constexpr uint32_t OFF_X = 5;
constexpr uint32_t OFF_Y = 3;
// Rows [0, PATTERN_ROWS) of the render target hold the copied pattern, the
// rest the clear colour.
constexpr uint32_t PATTERN_ROWS = SRC_H / 2;
constexpr uint32_t SLOTS = 3;

// Frame f's texel at (x, y) of the render target: the receiver's reference
// (c_programs.rs has the same function).
void texel(uint64_t f, uint32_t x, uint32_t y, uint8_t out[4]) {
    vk_app::texel(f, x, y, PATTERN_ROWS, out);
}

using vk_app::fail;
using vk_app::image_barrier;

// What ci_context_with_queue calls: the application's submission, under
// the library's queue lock.
struct Submission {
    VkCommandBuffer cmd;
    VkFence fence;
    VkResult result;
    int calls;
};

extern "C" void submit_rendering(void *user, void *queue) {
    auto *job = static_cast<Submission *>(user);
    job->calls++;
    VkSubmitInfo info{};
    info.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    info.commandBufferCount = 1;
    info.pCommandBuffers = &job->cmd;
    job->result = vkQueueSubmit(static_cast<VkQueue>(queue), 1, &info, job->fence);
}

int run(const char *name, uint64_t frames) {
    // The instance, device and queue family: vk_app.hpp (Vulkan 1.2, the
    // validation layer where installed, what the library needs).
    vk_app::Device dev = vk_app::make_device("app_publish");
    VkDevice device = dev.device;
    const uint32_t family = dev.family;

    // The render target (no external memory, an engine's usage) and the
    // staging buffer of the pattern rows: vk_app.hpp.
    vk_app::Image target = vk_app::make_render_target(dev, SRC_W, SRC_H);
    VkImage image = target.image;
    vk_app::Buffer staging_buffer = vk_app::make_staging(dev, VkDeviceSize{SRC_W} * PATTERN_ROWS * 4);
    VkBuffer staging = staging_buffer.buffer;
    void *mapped = staging_buffer.mapped;

    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = family;
    VkCommandPool pool = VK_NULL_HANDLE;
    VK(vkCreateCommandPool(device, &pci, nullptr, &pool));
    VkCommandBufferAllocateInfo cbai{};
    cbai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cbai.commandPool = pool;
    cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cbai.commandBufferCount = 1;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VK(vkAllocateCommandBuffers(device, &cbai, &cmd));
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    VkFence fence = VK_NULL_HANDLE;
    VK(vkCreateFence(device, &fci, nullptr, &fence));

    // The library's context over all of it, and the image ring.
    ci_vulkan_device desc = dev.describe();
    ci_context *ctx = nullptr;
    CI(ci_context_new_from_vulkan(&desc, &ctx));
    ci_sender *sender = nullptr;
    CI(ci_image_sender_new(ctx, name, RING_W, RING_H, VK_FORMAT_R8G8B8A8_UNORM, SLOTS, &sender));
    std::printf("app: sender %s up (%ux%u of a %ux%u render target at [%u, %u])\n", name, RING_W,
                RING_H, SRC_W, SRC_H, OFF_X, OFF_Y);
    std::fflush(stdout);
    CI(ci_sender_wait_for_receivers(sender, 1, 60.0));

    VkImageLayout current = VK_IMAGE_LAYOUT_UNDEFINED;
    uint64_t waited_first = 0, color_frames = 0, transfer_frames = 0;
    for (uint64_t f = 1; f <= frames; f++) {
        const VkImageLayout layout = (f % 2 == 1) ? VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL
                                                  : VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL;
        const bool wait_first = (f % 4) >= 2;
        // The pattern rows (the previous frame's submission has completed:
        // its fence was waited for).
        auto *bytes = static_cast<uint8_t *>(mapped);
        for (uint32_t y = 0; y < PATTERN_ROWS; y++)
            for (uint32_t x = 0; x < SRC_W; x++) texel(f, x, y, bytes + (size_t{y} * SRC_W + x) * 4);

        VK(vkResetCommandBuffer(cmd, 0));
        VkCommandBufferBeginInfo begin{};
        begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
        begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        VK(vkBeginCommandBuffer(cmd, &begin));
        // After the library's copy of the previous frame (it completed:
        // present_copy waits for it) and anything before.
        image_barrier(cmd, image, current, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
                      VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                      VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
        uint8_t clear[4];
        texel(f, 0, SRC_H - 1, clear);
        VkClearColorValue colour{};
        for (int i = 0; i < 4; i++) colour.float32[i] = static_cast<float>(clear[i]) / 255.0f;
        VkImageSubresourceRange range = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
        vkCmdClearColorImage(cmd, image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, &colour, 1, &range);
        image_barrier(cmd, image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
                      VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, VK_PIPELINE_STAGE_TRANSFER_BIT,
                      VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                      VK_ACCESS_TRANSFER_WRITE_BIT);
        VkBufferImageCopy region{};
        region.bufferRowLength = SRC_W;
        region.bufferImageHeight = PATTERN_ROWS;
        region.imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
        region.imageExtent = {SRC_W, PATTERN_ROWS, 1};
        vkCmdCopyBufferToImage(cmd, staging, image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1,
                               &region);
        // Left as the engine would leave it: after its render pass, or
        // ready for a blit.
        image_barrier(cmd, image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, layout,
                      VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                      VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                      VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
        VK(vkEndCommandBuffer(cmd));
        current = layout;

        // Submitted under the library's queue lock.
        Submission job{cmd, fence, VK_SUCCESS, 0};
        CI(ci_context_with_queue(ctx, CI_QUEUE_MAIN, submit_rendering, &job));
        if (job.calls != 1) fail("the queue callback ran " + std::to_string(job.calls) + " times");
        VK(job.result);
        if (wait_first) {
            VK(vkWaitForFences(device, 1, &fence, VK_TRUE, 30ull * 1000 * 1000 * 1000));
            waited_first++;
        }

        ci_source_image src;
        std::memset(&src, 0, sizeof src);
        src.struct_size = sizeof src;
        src.vk_format = VK_FORMAT_R8G8B8A8_UNORM;
        src.layout = static_cast<uint32_t>(layout);
        src.sharing = CI_SHARING_EXCLUSIVE;
        src.queue_family = family;
        src.width = SRC_W;
        src.height = SRC_H;
        src.offset_x = OFF_X;
        src.offset_y = OFF_Y;
        src.image = reinterpret_cast<uint64_t>(image);
        uint64_t sequence = 0;
        // Lossless: the slot's acquire waits for the receiver's releases.
        CI(ci_sender_present_copy(sender, &src, 0, 30.0, &sequence));
        if (sequence != f)
            fail("frame " + std::to_string(f) + " got sequence " + std::to_string(sequence));
        if (layout == VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL)
            color_frames++;
        else
            transfer_frames++;
        // Before the command buffer and the staging buffer are reused.
        VK(vkWaitForFences(device, 1, &fence, VK_TRUE, 30ull * 1000 * 1000 * 1000));
        VK(vkResetFences(device, 1, &fence));
    }

    // Serve until the receiver has left (it releases everything first).
    ci_sender_stats stats;
    for (int i = 0; i < 6000; i++) {
        CI(ci_sender_serve(sender, 0.01));
        CI(ci_sender_stats_get(sender, &stats));
        if (stats.receivers == 0) break;
    }
    CI(ci_sender_stats_get(sender, &stats));
    std::printf("app: presented %" PRIu64 " (%" PRIu64 " from COLOR_ATTACHMENT_OPTIMAL, %" PRIu64
                " from TRANSFER_SRC_OPTIMAL; %" PRIu64 " after waiting for the rendering), "
                "skipped %" PRIu64 ", receivers left %" PRIu64 "\n",
                stats.presented, color_frames, transfer_frames, waited_first, stats.skipped,
                stats.receivers);
    if (stats.presented != frames || stats.receivers != 0) fail("not every frame was taken");
    CI(ci_sender_free(sender));
    CI(ci_context_free(ctx));

    // The application's own objects, after the library's.
    VK(vkDeviceWaitIdle(device));
    vkDestroyFence(device, fence, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
    staging_buffer.destroy(device);
    target.destroy(device);
    dev.destroy();
    std::printf("app: %" PRIu64 " frames published, %d validation errors\n", frames,
                vk_app::validation_errors);
    return vk_app::validation_errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    vk_app::program = "app_publish";
    if (argc != 3) {
        std::fprintf(stderr, "usage: app_publish NAME FRAMES\n");
        return 2;
    }
    uint64_t frames = std::strtoull(argv[2], nullptr, 10);
    if (frames == 0) {
        std::fprintf(stderr, "FRAMES must be at least 1\n");
        return 2;
    }
    return run(argv[1], frames);
}
