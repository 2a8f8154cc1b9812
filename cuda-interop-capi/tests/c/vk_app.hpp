/* What the C++ Vulkan programs of these tests share (app_publish.cpp,
 * engine_host.cpp): failing with a message, checked calls, the validation
 * layer and its messenger (errors counted), an instance and a device made
 * as ci_context_new_from_vulkan's contract asks (Vulkan 1.2, timeline
 * semaphores, VK_KHR_external_memory_fd, VK_KHR_external_semaphore_fd where
 * offered, one graphics+compute queue), memory types and image barriers.
 * Header-only: each program is one translation unit.
 */
#pragma once

#if defined(__has_include)
#if !__has_include(<vulkan/vulkan.h>)
#error "<vulkan/vulkan.h> is missing: install the Vulkan headers (Debian/Ubuntu: apt-get install libvulkan-dev)"
#endif
#endif
#include <vulkan/vulkan.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_interop.h"

namespace vk_app {

// The program's name in its messages.
inline const char *program = "vk_app";

inline int validation_errors = 0;
// As the library's own messenger: warnings that are only performance advice
// (the ring's GENERAL slots as a copy's destination, every frame) are
// written only with CUDA_INTEROP_VALIDATION_PERF=1; errors always.
inline bool show_performance = false;

inline VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                 VkDebugUtilsMessageTypeFlagsEXT types,
                                                 const VkDebugUtilsMessengerCallbackDataEXT *data,
                                                 void *) {
    const char *text = data && data->pMessage ? data->pMessage : "(no message)";
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        validation_errors++;
        std::fprintf(stderr, "[vulkan validation error] %s\n", text);
    } else if (types != VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT || show_performance) {
        std::fprintf(stderr, "[vulkan validation warning] %s\n", text);
    }
    return VK_FALSE;
}

[[noreturn]] inline void fail(const std::string &what) {
    std::fprintf(stderr, "%s: %s\n", program, what.c_str());
    std::fflush(stderr);
    std::exit(1);
}

inline void vk_check(VkResult r, const char *call, int line) {
    if (r != VK_SUCCESS)
        fail(std::string(call) + " -> VkResult " + std::to_string(r) + " (line " +
             std::to_string(line) + ")");
}

inline void ci_check(ci_status s, const char *call, int line) {
    if (s != CI_OK)
        fail(std::string(call) + " -> ci_status " + std::to_string(static_cast<int>(s)) + ": " +
             ci_last_error_message() + " (line " + std::to_string(line) + ")");
}

#define VK(call) ::vk_app::vk_check((call), #call, __LINE__)
#define CI(call) ::vk_app::ci_check((call), #call, __LINE__)

inline bool has_layer(const char *name) {
    uint32_t n = 0;
    VK(vkEnumerateInstanceLayerProperties(&n, nullptr));
    std::vector<VkLayerProperties> layers(n);
    VK(vkEnumerateInstanceLayerProperties(&n, layers.data()));
    for (const auto &l : layers)
        if (std::strcmp(l.layerName, name) == 0) return true;
    return false;
}

inline bool has_instance_extension(const char *layer, const char *name) {
    uint32_t n = 0;
    VK(vkEnumerateInstanceExtensionProperties(layer, &n, nullptr));
    std::vector<VkExtensionProperties> exts(n);
    VK(vkEnumerateInstanceExtensionProperties(layer, &n, exts.data()));
    for (const auto &e : exts)
        if (std::strcmp(e.extensionName, name) == 0) return true;
    return false;
}

inline bool has_device_extension(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    VK(vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, nullptr));
    std::vector<VkExtensionProperties> exts(n);
    VK(vkEnumerateDeviceExtensionProperties(pd, nullptr, &n, exts.data()));
    for (const auto &e : exts)
        if (std::strcmp(e.extensionName, name) == 0) return true;
    return false;
}

inline uint32_t memory_type(VkPhysicalDevice pd, uint32_t bits, VkMemoryPropertyFlags want) {
    VkPhysicalDeviceMemoryProperties props;
    vkGetPhysicalDeviceMemoryProperties(pd, &props);
    for (uint32_t i = 0; i < props.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (props.memoryTypes[i].propertyFlags & want) == want) return i;
    fail("no memory type with properties " + std::to_string(want) + " among bits " +
         std::to_string(bits));
}

inline void image_barrier(VkCommandBuffer cmd, VkImage image, VkImageLayout from,
                          VkImageLayout to, VkPipelineStageFlags src_stage,
                          VkAccessFlags src_access, VkPipelineStageFlags dst_stage,
                          VkAccessFlags dst_access) {
    VkImageMemoryBarrier b{};
    b.sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER;
    b.srcAccessMask = src_access;
    b.dstAccessMask = dst_access;
    b.oldLayout = from;
    b.newLayout = to;
    b.srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
    b.dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED;
    b.image = image;
    b.subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
    vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, nullptr, 0, nullptr, 1, &b);
}

// An instance (the validation layer and a messenger where installed, unless
// CUDA_INTEROP_VALIDATION=off), a physical device with what the library
// needs and a graphics+compute family, and a device with one queue of it.
struct Device {
    VkInstance instance = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
    PFN_vkDestroyDebugUtilsMessengerEXT destroy_messenger = nullptr;
    VkPhysicalDevice physical = VK_NULL_HANDLE;
    uint32_t family = 0;
    VkDevice device = VK_NULL_HANDLE;
    VkQueue queue = VK_NULL_HANDLE;
    bool semaphore_fd = false;
    bool validation = false;

    // The library's description of it (ci_context_new_from_vulkan).
    ci_vulkan_device describe() const {
        ci_vulkan_device desc;
        std::memset(&desc, 0, sizeof desc);
        desc.struct_size = sizeof desc;
        desc.main_queue_family = family;
        desc.main_queue_index = 0;
        desc.has_transfer_queue = 0;
        desc.semaphore_fd_enabled = semaphore_fd ? 1 : 0;
        desc.get_instance_proc_addr = reinterpret_cast<void *>(&vkGetInstanceProcAddr);
        desc.instance = instance;
        desc.physical_device = physical;
        desc.device = device;
        return desc;
    }

    // After everything made on the device was destroyed.
    void destroy() {
        vkDestroyDevice(device, nullptr);
        if (messenger != VK_NULL_HANDLE) destroy_messenger(instance, messenger, nullptr);
        vkDestroyInstance(instance, nullptr);
    }
};

inline Device make_device(const char *application) {
    Device d;
    const char *layer = "VK_LAYER_KHRONOS_validation";
    const char *env = std::getenv("CUDA_INTEROP_VALIDATION");
    d.validation = !(env && std::strcmp(env, "off") == 0) && has_layer(layer) &&
                   has_instance_extension(layer, VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    const char *perf = std::getenv("CUDA_INTEROP_VALIDATION_PERF");
    show_performance = perf && std::strcmp(perf, "1") == 0;
    std::printf("%s: validation layer %s\n", program,
                d.validation ? "on" : "off (not installed, or CUDA_INTEROP_VALIDATION=off)");
    VkApplicationInfo app{};
    app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
    app.pApplicationName = application;
    app.apiVersion = VK_API_VERSION_1_2;
    VkDebugUtilsMessengerCreateInfoEXT messenger_info{};
    messenger_info.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT;
    messenger_info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT |
                                     VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT;
    messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    messenger_info.pfnUserCallback = on_message;
    const char *instance_exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    VkInstanceCreateInfo ici{};
    ici.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ici.pApplicationInfo = &app;
    if (d.validation) {
        ici.enabledLayerCount = 1;
        ici.ppEnabledLayerNames = &layer;
        ici.enabledExtensionCount = 1;
        ici.ppEnabledExtensionNames = instance_exts;
        ici.pNext = &messenger_info;  // instance creation and destruction too
    }
    VK(vkCreateInstance(&ici, nullptr, &d.instance));
    if (d.validation) {
        auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
            vkGetInstanceProcAddr(d.instance, "vkCreateDebugUtilsMessengerEXT"));
        d.destroy_messenger = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
            vkGetInstanceProcAddr(d.instance, "vkDestroyDebugUtilsMessengerEXT"));
        if (!create || !d.destroy_messenger) fail("no vkCreateDebugUtilsMessengerEXT");
        VK(create(d.instance, &messenger_info, nullptr, &d.messenger));
    }

    uint32_t count = 0;
    VK(vkEnumeratePhysicalDevices(d.instance, &count, nullptr));
    std::vector<VkPhysicalDevice> devices(count);
    VK(vkEnumeratePhysicalDevices(d.instance, &count, devices.data()));
    std::string seen;
    for (VkPhysicalDevice pd : devices) {
        VkPhysicalDeviceProperties props;
        vkGetPhysicalDeviceProperties(pd, &props);
        VkPhysicalDeviceVulkan12Features f12{};
        f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
        VkPhysicalDeviceFeatures2 f2{};
        f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
        f2.pNext = &f12;
        vkGetPhysicalDeviceFeatures2(pd, &f2);
        seen += std::string(seen.empty() ? "" : ", ") + props.deviceName;
        if (props.apiVersion < VK_API_VERSION_1_2 || !f12.timelineSemaphore ||
            !has_device_extension(pd, VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME))
            continue;
        uint32_t nf = 0;
        vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, nullptr);
        std::vector<VkQueueFamilyProperties> families(nf);
        vkGetPhysicalDeviceQueueFamilyProperties(pd, &nf, families.data());
        for (uint32_t i = 0; i < nf; i++) {
            if ((families[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) &&
                (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
                d.physical = pd;
                d.family = i;
                break;
            }
        }
        if (d.physical != VK_NULL_HANDLE) {
            std::printf("%s: device %s, queue family %u\n", program, props.deviceName, d.family);
            break;
        }
    }
    if (d.physical == VK_NULL_HANDLE)
        fail("no physical device with Vulkan 1.2, timeline semaphores, " +
             std::string(VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME) +
             " and a graphics+compute family (found: " + seen + ")");

    std::vector<const char *> device_exts = {VK_KHR_EXTERNAL_MEMORY_FD_EXTENSION_NAME};
    d.semaphore_fd = has_device_extension(d.physical, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);
    if (d.semaphore_fd) device_exts.push_back(VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME);
    std::printf("%s: %s\n", program, d.semaphore_fd ? "semaphore fds enabled" : "no semaphore fds");
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci{};
    qci.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci.queueFamilyIndex = d.family;
    qci.queueCount = 1;
    qci.pQueuePriorities = &priority;
    VkPhysicalDeviceVulkan12Features f12{};
    f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    f12.timelineSemaphore = VK_TRUE;
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.pNext = &f12;
    dci.queueCreateInfoCount = 1;
    dci.pQueueCreateInfos = &qci;
    dci.enabledExtensionCount = static_cast<uint32_t>(device_exts.size());
    dci.ppEnabledExtensionNames = device_exts.data();
    VK(vkCreateDevice(d.physical, &dci, nullptr, &d.device));
    vkGetDeviceQueue(d.device, d.family, 0, &d.queue);
    return d;
}

// A buffer of `size` bytes with `usage`, bound to memory with `want`.
struct Buffer {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    void *mapped = nullptr;

    void destroy(VkDevice device) {
        if (mapped) vkUnmapMemory(device, memory);
        vkDestroyBuffer(device, buffer, nullptr);
        vkFreeMemory(device, memory, nullptr);
    }
};

// A host-visible, host-coherent staging buffer, mapped.
inline Buffer make_staging(const Device &d, VkDeviceSize size) {
    Buffer b;
    VkBufferCreateInfo bci{};
    bci.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bci.size = size;
    bci.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT;
    bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VK(vkCreateBuffer(d.device, &bci, nullptr, &b.buffer));
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d.device, b.buffer, &req);
    VkMemoryAllocateInfo mai{};
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex =
        memory_type(d.physical, req.memoryTypeBits,
                    VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    VK(vkAllocateMemory(d.device, &mai, nullptr, &b.memory));
    VK(vkBindBufferMemory(d.device, b.buffer, b.memory, 0));
    VK(vkMapMemory(d.device, b.memory, 0, size, 0, &b.mapped));
    return b;
}

// An RGBA8 OPTIMAL render target WITHOUT external memory (an engine's:
// colour attachment, transfer source and destination), on device memory.
struct Image {
    VkImage image = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;

    void destroy(VkDevice device) {
        vkDestroyImage(device, image, nullptr);
        vkFreeMemory(device, memory, nullptr);
    }
};

inline Image make_render_target(const Device &d, uint32_t width, uint32_t height) {
    Image i;
    VkImageCreateInfo imci{};
    imci.sType = VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO;
    imci.imageType = VK_IMAGE_TYPE_2D;
    imci.format = VK_FORMAT_R8G8B8A8_UNORM;
    imci.extent = {width, height, 1};
    imci.mipLevels = 1;
    imci.arrayLayers = 1;
    imci.samples = VK_SAMPLE_COUNT_1_BIT;
    imci.tiling = VK_IMAGE_TILING_OPTIMAL;
    imci.usage = VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | VK_IMAGE_USAGE_TRANSFER_SRC_BIT |
                 VK_IMAGE_USAGE_TRANSFER_DST_BIT;
    imci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    imci.initialLayout = VK_IMAGE_LAYOUT_UNDEFINED;
    VK(vkCreateImage(d.device, &imci, nullptr, &i.image));
    VkMemoryRequirements req;
    vkGetImageMemoryRequirements(d.device, i.image, &req);
    VkMemoryAllocateInfo mai{};
    mai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    mai.allocationSize = req.size;
    mai.memoryTypeIndex = memory_type(d.physical, req.memoryTypeBits, 0);
    VK(vkAllocateMemory(d.device, &mai, nullptr, &i.memory));
    VK(vkBindImageMemory(d.device, i.image, i.memory, 0));
    return i;
}

// Frame f's texel at (x, y) of a render target whose rows [0, pattern_rows)
// hold a per-texel pattern (copied from staging) and the rest the frame's
// clear colour: the receivers' reference (c_programs.rs has the same).
inline void texel(uint64_t f, uint32_t x, uint32_t y, uint32_t pattern_rows, uint8_t out[4]) {
    if (y < pattern_rows) {
        out[0] = static_cast<uint8_t>(x * 3 + f);
        out[1] = static_cast<uint8_t>(y * 5 + 2 * f);
        out[2] = static_cast<uint8_t>(x ^ y);
        out[3] = static_cast<uint8_t>(7 * f + 1);
    } else {
        out[0] = static_cast<uint8_t>(f * 11);
        out[1] = static_cast<uint8_t>(255 - f);
        out[2] = static_cast<uint8_t>(f * 29 + 3);
        out[3] = 255;
    }
}

}  // namespace vk_app
