/* A C++ Vulkan application that writes ring slots in ITS OWN submissions
 * (issue 33: open/present with its timeline):
 *
 *   app_open NAME FRAMES
 *
 * Its own instance and device (vk_app.hpp: Vulkan 1.2, the validation
 * layer where installed), ci_context_new_from_vulkan over them, an image
 * ring (ci_image_sender_new, RGBA8 96x56, 3 slots) and a timeline of its
 * own (ci_timeline_new, ci_timeline_vk_semaphore). Each frame it opens a
 * slot (ci_sender_open: the slot's VkImage, in GENERAL, acquired for its
 * queue family, and the ready semaphore and value), records its own
 * command buffer (a clear to the frame's colour, then the frame's pattern
 * copied from a staging buffer over the top PATTERN_ROWS rows), submits it
 * inside ci_context_with_queue waiting for the ready value and signalling
 * its timeline, and publishes the slot with ci_sender_present_opened after
 * that value. Every fourth frame two slots are open at once (written in
 * the reverse order, presented in order); every fifth, a third slot is
 * opened, written with junk, waited for and abandoned
 * (ci_sender_abandon_opened): it numbers nothing. Frame f must get sequence
 * number f (one lossless receiver: vk_recv.c, which checks every texel).
 *
 * Exit status 0: all good, no validation error; otherwise what failed is
 * on stderr.
 */
#include <cinttypes>

#include "vk_app.hpp"

namespace {

constexpr uint32_t RING_W = 96;
constexpr uint32_t RING_H = 56;
constexpr uint32_t PATTERN_ROWS = RING_H / 2;
constexpr uint32_t SLOTS = 3;
constexpr uint64_t NS = 30ull * 1000 * 1000 * 1000;

using vk_app::fail;
using vk_app::image_barrier;

// One write in flight: the application's command buffer, staging buffer
// and fence.
struct Writer {
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    vk_app::Buffer staging;
};

// What ci_context_with_queue calls: the application's submission, under
// the library's queue lock.
struct Submission {
    const VkSubmitInfo *info;
    VkFence fence;
    VkResult result;
    int calls;
};

extern "C" void submit_write(void *user, void *queue) {
    auto *job = static_cast<Submission *>(user);
    job->calls++;
    job->result = vkQueueSubmit(static_cast<VkQueue>(queue), 1, job->info, job->fence);
}

// Writes frame f's texels (f 0: junk) into the opened slot in the
// application's own submission: waits for the slot's ready value, signals
// `timeline` = `value`.
void write_slot(ci_context *ctx, const vk_app::Device &dev, Writer &w, const ci_opened_slot &slot,
                uint64_t f, VkSemaphore timeline, uint64_t value) {
    if (slot.kind != CI_SLOTS_IMAGES || slot.image == 0 || slot.buffer != 0 ||
        slot.queue_family != dev.family || slot.width != RING_W || slot.height != RING_H ||
        slot.vk_format != VK_FORMAT_R8G8B8A8_UNORM || slot.token == 0 ||
        slot.ready_semaphore == 0 || slot.ready_value == 0 || slot.slot >= SLOTS)
        fail("ci_sender_open described slot " + std::to_string(slot.slot) + " wrongly");
    VkImage image = reinterpret_cast<VkImage>(slot.image);
    auto *bytes = static_cast<uint8_t *>(w.staging.mapped);
    for (uint32_t y = 0; y < PATTERN_ROWS; y++)
        for (uint32_t x = 0; x < RING_W; x++) {
            uint8_t *t = bytes + (size_t{y} * RING_W + x) * 4;
            vk_app::texel(f, x, y, PATTERN_ROWS, t);
            if (f == 0) t[0] ^= 0x5a;
        }
    VK(vkResetCommandBuffer(w.cmd, 0));
    VkCommandBufferBeginInfo begin{};
    begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    VK(vkBeginCommandBuffer(w.cmd, &begin));
    uint8_t clear[4];
    vk_app::texel(f, 0, RING_H - 1, PATTERN_ROWS, clear);
    VkClearColorValue colour{};
    for (int i = 0; i < 4; i++) colour.float32[i] = static_cast<float>(clear[i]) / 255.0f;
    VkImageSubresourceRange range = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
    // The slot is in GENERAL, owned by this family (the library's acquire,
    // ordered before by the wait for the ready value); it stays in GENERAL.
    vkCmdClearColorImage(w.cmd, image, VK_IMAGE_LAYOUT_GENERAL, &colour, 1, &range);
    image_barrier(w.cmd, image, VK_IMAGE_LAYOUT_GENERAL, VK_IMAGE_LAYOUT_GENERAL,
                  VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                  VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    VkBufferImageCopy region{};
    region.bufferRowLength = RING_W;
    region.bufferImageHeight = PATTERN_ROWS;
    region.imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
    region.imageExtent = {RING_W, PATTERN_ROWS, 1};
    vkCmdCopyBufferToImage(w.cmd, w.staging.buffer, image, VK_IMAGE_LAYOUT_GENERAL, 1, &region);
    VK(vkEndCommandBuffer(w.cmd));

    VkSemaphore ready = reinterpret_cast<VkSemaphore>(slot.ready_semaphore);
    const uint64_t wait_value = slot.ready_value;
    const VkPipelineStageFlags stage = VK_PIPELINE_STAGE_TRANSFER_BIT;
    VkTimelineSemaphoreSubmitInfo values{};
    values.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
    values.waitSemaphoreValueCount = 1;
    values.pWaitSemaphoreValues = &wait_value;
    values.signalSemaphoreValueCount = 1;
    values.pSignalSemaphoreValues = &value;
    VkSubmitInfo info{};
    info.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    info.pNext = &values;
    info.waitSemaphoreCount = 1;
    info.pWaitSemaphores = &ready;
    info.pWaitDstStageMask = &stage;
    info.commandBufferCount = 1;
    info.pCommandBuffers = &w.cmd;
    info.signalSemaphoreCount = 1;
    info.pSignalSemaphores = &timeline;
    Submission job{&info, w.fence, VK_SUCCESS, 0};
    CI(ci_context_with_queue(ctx, CI_QUEUE_MAIN, submit_write, &job));
    if (job.calls != 1) fail("the queue callback ran " + std::to_string(job.calls) + " times");
    VK(job.result);
}

// Before a writer's command buffer and staging buffer are reused.
void finished(VkDevice device, Writer &w) {
    VK(vkWaitForFences(device, 1, &w.fence, VK_TRUE, NS));
    VK(vkResetFences(device, 1, &w.fence));
}

ci_opened_slot open_slot(ci_sender *sender) {
    ci_opened_slot slot;
    std::memset(&slot, 0, sizeof slot);
    slot.struct_size = sizeof slot;
    // Lossless: the slot's acquire waits for the receiver's releases.
    CI(ci_sender_open(sender, CI_QUEUE_MAIN, 30.0, &slot));
    return slot;
}

void present(ci_sender *sender, const ci_opened_slot &slot, ci_timeline *timeline, uint64_t value,
             uint64_t f) {
    uint64_t sequence = 0;
    CI(ci_sender_present_opened(sender, slot.token, timeline, value, 0, &sequence));
    if (sequence != f)
        fail("frame " + std::to_string(f) + " got sequence " + std::to_string(sequence));
}

int run(const char *name, uint64_t frames) {
    vk_app::Device dev = vk_app::make_device("app_open");
    VkDevice device = dev.device;

    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = dev.family;
    VkCommandPool pool = VK_NULL_HANDLE;
    VK(vkCreateCommandPool(device, &pci, nullptr, &pool));
    Writer writers[2];
    for (Writer &w : writers) {
        VkCommandBufferAllocateInfo cbai{};
        cbai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
        cbai.commandPool = pool;
        cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        cbai.commandBufferCount = 1;
        VK(vkAllocateCommandBuffers(device, &cbai, &w.cmd));
        VkFenceCreateInfo fci{};
        fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
        VK(vkCreateFence(device, &fci, nullptr, &w.fence));
        w.staging = vk_app::make_staging(dev, VkDeviceSize{RING_W} * PATTERN_ROWS * 4);
    }

    ci_vulkan_device desc = dev.describe();
    ci_context *ctx = nullptr;
    CI(ci_context_new_from_vulkan(&desc, &ctx));
    ci_sender *sender = nullptr;
    CI(ci_image_sender_new(ctx, name, RING_W, RING_H, VK_FORMAT_R8G8B8A8_UNORM, SLOTS, &sender));
    ci_timeline *timeline = nullptr;
    CI(ci_timeline_new(ctx, &timeline));
    uint64_t raw = 0;
    CI(ci_timeline_vk_semaphore(timeline, &raw));
    VkSemaphore written = reinterpret_cast<VkSemaphore>(raw);
    std::printf("app: sender %s up (%ux%u, slots written by the app's own submissions)\n", name,
                RING_W, RING_H);
    std::fflush(stdout);
    CI(ci_sender_wait_for_receivers(sender, 1, 60.0));

    uint64_t value = 0, pairs = 0, abandoned = 0, iteration = 0;
    for (uint64_t f = 1; f <= frames; iteration++) {
        if (iteration % 5 == 4) {
            // Opened, written with junk, waited for, abandoned: no number.
            ci_opened_slot junk = open_slot(sender);
            write_slot(ctx, dev, writers[0], junk, 0, written, ++value);
            VkSemaphoreWaitInfo wait{};
            wait.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO;
            wait.semaphoreCount = 1;
            wait.pSemaphores = &written;
            wait.pValues = &value;
            VK(vkWaitSemaphores(device, &wait, NS));
            finished(device, writers[0]);
            CI(ci_sender_abandon_opened(sender, junk.token));
            abandoned++;
        }
        if (f % 4 == 0 && f + 1 <= frames) {
            // Two open at once: b written first, a presented first.
            ci_opened_slot a = open_slot(sender);
            ci_opened_slot b = open_slot(sender);
            if (a.slot == b.slot) fail("two opened slots share slot " + std::to_string(a.slot));
            const uint64_t vb = ++value;
            write_slot(ctx, dev, writers[1], b, f + 1, written, vb);
            const uint64_t va = ++value;
            write_slot(ctx, dev, writers[0], a, f, written, va);
            present(sender, a, timeline, va, f);
            present(sender, b, timeline, vb, f + 1);
            finished(device, writers[0]);
            finished(device, writers[1]);
            pairs++;
            f += 2;
        } else {
            ci_opened_slot a = open_slot(sender);
            write_slot(ctx, dev, writers[0], a, f, written, ++value);
            present(sender, a, timeline, value, f);
            finished(device, writers[0]);
            f += 1;
        }
    }
    uint64_t reached = 0;
    CI(ci_timeline_value(timeline, &reached));
    if (reached != value) fail("the timeline is at " + std::to_string(reached));

    ci_sender_stats stats;
    for (int i = 0; i < 6000; i++) {
        CI(ci_sender_serve(sender, 0.01));
        CI(ci_sender_stats_get(sender, &stats));
        if (stats.receivers == 0) break;
    }
    CI(ci_sender_stats_get(sender, &stats));
    std::printf("app: presented %" PRIu64 " (%" PRIu64 " pairs open at once), abandoned %" PRIu64
                ", receivers left %" PRIu64 "\n",
                stats.presented, pairs, abandoned, stats.receivers);
    if (stats.presented != frames || stats.receivers != 0) fail("not every frame was taken");
    if (abandoned == 0 || pairs == 0) fail("no abandoned slot or no pair: too few frames");
    // Every submission that uses the timeline completed (fences waited).
    CI(ci_timeline_free(timeline));
    CI(ci_sender_free(sender));
    CI(ci_context_free(ctx));

    VK(vkDeviceWaitIdle(device));
    for (Writer &w : writers) {
        vkDestroyFence(device, w.fence, nullptr);
        w.staging.destroy(device);
    }
    vkDestroyCommandPool(device, pool, nullptr);
    dev.destroy();
    std::printf("app: %" PRIu64 " frames written in the app's own submissions, %d validation "
                "errors\n",
                frames, vk_app::validation_errors);
    return vk_app::validation_errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    vk_app::program = "app_open";
    if (argc != 3) {
        std::fprintf(stderr, "usage: app_open NAME FRAMES\n");
        return 2;
    }
    uint64_t frames = std::strtoull(argv[2], nullptr, 10);
    if (frames == 0) {
        std::fprintf(stderr, "FRAMES must be at least 1\n");
        return 2;
    }
    return run(argv[1], frames);
}
