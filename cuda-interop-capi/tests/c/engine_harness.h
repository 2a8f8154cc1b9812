/* The engine-plugin harness's interface: what engine_host.cpp (the engine)
 * gives a native rendering plugin, and what the plugin (engine_plugin.c)
 * exports. It is modelled call for call on a game engine's native-plugin
 * Vulkan interface (Unity's IUnityGraphicsVulkan, in IUnityGraphicsVulkan.h
 * of its plugin API), so that a plugin written against it maps one to one:
 *
 *   harness                                 Unity
 *   ------------------------------------    ----------------------------------------------
 *   harness_plugin_load(interfaces)         UnityPluginLoad(IUnityInterfaces*)
 *   harness_plugin_unload()                 UnityPluginUnload()
 *   harness_render_event(event_id)          the UnityRenderingEvent that
 *                                           GL.IssuePluginEvent / CommandBuffer.IssuePluginEvent
 *                                           calls on the render thread
 *   vk->instance()                          IUnityGraphicsVulkan::Instance() -> UnityVulkanInstance
 *                                           (instance, physicalDevice, device, graphicsQueue,
 *                                           queueFamilyIndex, getInstanceProcAddr)
 *   vk->configure_event(id, &config)        IUnityGraphicsVulkan::ConfigureEvent(id, UnityVulkanPluginEventConfig*)
 *     .flags FLUSH_COMMAND_BUFFERS            kUnityVulkanEventConfigFlag_FlushCommandBuffers
 *     .graphics_queue_access ALLOW/DONT_CARE  kUnityVulkanGraphicsQueueAccess_Allow / _DontCare
 *     .render_pass_precondition               .renderPassPrecondition: ENSURE_OUTSIDE =
 *                                             kUnityVulkanRenderPass_EnsureOutside (barriers and
 *                                             copies are not allowed inside a render pass)
 *   vk->command_recording_state(&s, access) IUnityGraphicsVulkan::CommandRecordingState(UnityVulkanRecordingState*, access)
 *     s.command_buffer                        .commandBuffer (the frame's, recording)
 *     s.current_frame_number                  .currentFrameNumber
 *     s.safe_frame_number                     .safeFrameNumber (frames at or before it completed on the GPU)
 *   vk->access_texture(tex, layout, stage,  IUnityGraphicsVulkan::AccessTexture(nativeTexture, UnityVulkanWholeImage,
 *       access, mode, &image)                 layout, pipelineStageFlags, accessFlags, accessMode, UnityVulkanImage*)
 *     mode PIPELINE_BARRIER / OBSERVE_ONLY    kUnityVulkanResourceAccess_PipelineBarrier / _ObserveOnly
 *   texture                                 Texture.GetNativeTexturePtr() of the render texture
 *
 * The engine's rules, as the real one's: the plugin is called on the render
 * thread only; with graphics_queue_access DONT_CARE it records into the
 * frame's command buffer (open) and must not submit to the queue; with
 * FLUSH_COMMAND_BUFFERS and ALLOW the engine submits its command buffer
 * before the event and the plugin may submit its own work to the graphics
 * queue from the event; every engine submission is on the render thread.
 * The render texture was created without external memory (its layout is
 * the driver's, not an exportable image's).
 *
 * What the harness does not play: a real engine's device may lack what the
 * library needs (VK_KHR_external_memory_fd, timeline semaphores; for CUDA
 * receivers VK_KHR_external_semaphore_fd): a Unity plugin adds them by
 * intercepting Vulkan initialization (IUnityGraphicsVulkanV2's
 * AddInterceptInitialization, changing vkCreateDevice's arguments); here the
 * engine creates its device with them, standing for that step. The
 * engine's command buffer is a primary one (Unity may hand a secondary one
 * inside a render pass; ENSURE_OUTSIDE asks for the primary). The engine
 * records no render pass, and refuses a plugin that does not ask to be
 * outside one. UnityVulkanInstance has no queue index: the plugin checks
 * that queue 0 of the family is the graphics queue it was given.
 */
#ifndef ENGINE_HARNESS_H
#define ENGINE_HARNESS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum harness_queue_access {
    HARNESS_QUEUE_ACCESS_DONT_CARE = 0,
    HARNESS_QUEUE_ACCESS_ALLOW = 1,
};

enum harness_event_flags {
    HARNESS_EVENT_FLUSH_COMMAND_BUFFERS = 1,
};

enum harness_resource_access {
    HARNESS_ACCESS_OBSERVE_ONLY = 0,
    HARNESS_ACCESS_PIPELINE_BARRIER = 1,
};

typedef struct harness_vulkan_instance {
    void *get_instance_proc_addr; /* PFN_vkGetInstanceProcAddr */
    void *instance;               /* VkInstance */
    void *physical_device;        /* VkPhysicalDevice */
    void *device;                 /* VkDevice */
    void *graphics_queue;         /* VkQueue */
    uint32_t queue_family_index;
    uint32_t semaphore_fd_enabled; /* VK_KHR_external_semaphore_fd enabled */
} harness_vulkan_instance;

enum harness_render_pass {
    HARNESS_RENDER_PASS_DONT_CARE = 0,
    HARNESS_RENDER_PASS_ENSURE_INSIDE = 1,
    HARNESS_RENDER_PASS_ENSURE_OUTSIDE = 2,
};

typedef struct harness_event_config {
    uint32_t render_pass_precondition; /* harness_render_pass */
    uint32_t graphics_queue_access;    /* harness_queue_access */
    uint32_t flags;                    /* harness_event_flags */
} harness_event_config;

typedef struct harness_recording_state {
    void *command_buffer; /* VkCommandBuffer, recording; NULL outside a frame */
    uint64_t current_frame_number;
    uint64_t safe_frame_number;
} harness_recording_state;

typedef struct harness_image {
    uint64_t image;  /* VkImage */
    uint32_t layout; /* VkImageLayout, after the access */
    uint32_t format; /* VkFormat */
    uint32_t width;
    uint32_t height;
} harness_image;

typedef struct harness_vulkan_interface {
    harness_vulkan_instance (*instance)(void);
    void (*configure_event)(int event_id, const harness_event_config *config);
    /* 1 and *state filled; 0 when the queue access asked for is not what
     * the current event was configured with. */
    int (*command_recording_state)(harness_recording_state *state, uint32_t queue_access);
    /* 1 and *image filled; 0 for a texture the engine does not know. With
     * PIPELINE_BARRIER, a barrier into `layout` for `stage`/`access` is
     * recorded into the frame's command buffer (open events only). */
    int (*access_texture)(void *texture, uint32_t layout, uint32_t stage, uint32_t access,
                          uint32_t mode, harness_image *image);
} harness_vulkan_interface;

/* What the engine passes the plugin at load: its Vulkan interface, and the
 * render texture and the name to publish it as (a plugin would get these
 * from a script: Texture.GetNativeTexturePtr, a property). */
typedef struct harness_plugin_args {
    const harness_vulkan_interface *vulkan;
    void *render_texture;
    const char *name;
    /* HARNESS_PLUGIN_*: how the plugin publishes. */
    int mode;
} harness_plugin_args;

/* The plugin records the library's copy into the engine's open command
 * buffer (ci_sender_record_copy). */
#define HARNESS_PLUGIN_RECORD 1
/* It asks for the command buffers flushed and has the library submit the
 * copy (ci_sender_present_copy). */
#define HARNESS_PLUGIN_SUBMIT 0
/* It records its own commands that write the slot into the engine's open
 * command buffer (ci_sender_record_into; here a vkCmdCopyImage of its
 * own). */
#define HARNESS_PLUGIN_OWN_COMMANDS 2

/* Exported by the plugin. The event id the engine issues each frame. */
#define HARNESS_PUBLISH_EVENT 1
typedef int (*harness_plugin_load_fn)(const harness_plugin_args *args);
typedef void (*harness_render_event_fn)(int event_id);
typedef int (*harness_plugin_unload_fn)(void);

#ifdef __cplusplus
}
#endif

#endif
