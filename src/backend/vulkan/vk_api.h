// The Vulkan API as lmtune uses it: libvulkan is opened at run time (dlopen) rather than linked, so that the
// lmtune binary starts, and runs on the CPU, on machines without a Vulkan loader. Every file of the Vulkan backend
// includes this header instead of <vulkan/vulkan.h>; inside namespace lmtune::vk the usual names (vkCreateBuffer,
// vkCmdDispatch, ...) are function pointers filled by load_vulkan_library() / load_instance_functions().
// Need another entry point? Add it to the right X-macro list below.
#pragma once
#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include <string>

// Vulkan structs are initialised as `VkFooInfo info{VK_STRUCTURE_TYPE_FOO_INFO};` (the rest zeroed), the idiom of
// the Vulkan samples; -Wextra's missing-field-initializers would flag every one of them.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace lmtune::vk {

#define LMTUNE_VK_GLOBAL_FUNCTIONS(X) \
  X(vkCreateInstance)                  \
  X(vkEnumerateInstanceVersion)        \
  X(vkEnumerateInstanceExtensionProperties) \
  X(vkEnumerateInstanceLayerProperties)

// Instance- and device-level functions, all loaded through vkGetInstanceProcAddr (loader trampolines work for every
// device of the instance).
#define LMTUNE_VK_INSTANCE_FUNCTIONS(X)            \
  X(vkDestroyInstance)                             \
  X(vkEnumeratePhysicalDevices)                    \
  X(vkGetPhysicalDeviceProperties)                 \
  X(vkGetPhysicalDeviceProperties2)                \
  X(vkGetPhysicalDeviceFeatures2)                  \
  X(vkGetPhysicalDeviceMemoryProperties)           \
  X(vkGetPhysicalDeviceMemoryProperties2)          \
  X(vkGetPhysicalDeviceQueueFamilyProperties)      \
  X(vkEnumerateDeviceExtensionProperties)          \
  X(vkCreateDevice)                                \
  X(vkDestroyDevice)                               \
  X(vkGetDeviceQueue)                              \
  X(vkDeviceWaitIdle)                              \
  X(vkQueueSubmit)                                 \
  X(vkAllocateMemory)                              \
  X(vkFreeMemory)                                  \
  X(vkMapMemory)                                   \
  X(vkUnmapMemory)                                 \
  X(vkCreateBuffer)                                \
  X(vkDestroyBuffer)                               \
  X(vkGetBufferMemoryRequirements)                 \
  X(vkBindBufferMemory)                            \
  X(vkCreateFence)                                 \
  X(vkDestroyFence)                                \
  X(vkResetFences)                                 \
  X(vkWaitForFences)                               \
  X(vkGetFenceStatus)                              \
  X(vkCreateCommandPool)                           \
  X(vkDestroyCommandPool)                          \
  X(vkResetCommandPool)                            \
  X(vkAllocateCommandBuffers)                      \
  X(vkBeginCommandBuffer)                          \
  X(vkEndCommandBuffer)                            \
  X(vkCmdBindPipeline)                             \
  X(vkCmdBindDescriptorSets)                       \
  X(vkCmdPushConstants)                            \
  X(vkCmdDispatch)                                 \
  X(vkCmdPipelineBarrier)                          \
  X(vkCmdCopyBuffer)                               \
  X(vkCmdFillBuffer)                               \
  X(vkCmdWriteTimestamp)                           \
  X(vkCmdResetQueryPool)                           \
  X(vkCreateQueryPool)                             \
  X(vkDestroyQueryPool)                            \
  X(vkGetQueryPoolResults)                         \
  X(vkCreateShaderModule)                          \
  X(vkDestroyShaderModule)                         \
  X(vkCreateComputePipelines)                      \
  X(vkDestroyPipeline)                             \
  X(vkCreatePipelineLayout)                        \
  X(vkDestroyPipelineLayout)                       \
  X(vkCreateDescriptorSetLayout)                   \
  X(vkDestroyDescriptorSetLayout)                  \
  X(vkCreateDescriptorPool)                        \
  X(vkDestroyDescriptorPool)                       \
  X(vkResetDescriptorPool)                         \
  X(vkAllocateDescriptorSets)                      \
  X(vkUpdateDescriptorSets)                        \
  X(vkCreatePipelineCache)                         \
  X(vkDestroyPipelineCache)                        \
  X(vkGetPipelineCacheData)

// Extension functions: may stay null (check before use).
#define LMTUNE_VK_OPTIONAL_FUNCTIONS(X)                  \
  X(vkCmdPushDescriptorSetKHR)                           \
  X(vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)    \
  X(vkGetPipelineExecutablePropertiesKHR)                \
  X(vkGetPipelineExecutableStatisticsKHR)

#define LMTUNE_VK_DECLARE(name) inline PFN_##name name = nullptr;
inline PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
LMTUNE_VK_GLOBAL_FUNCTIONS(LMTUNE_VK_DECLARE)
LMTUNE_VK_INSTANCE_FUNCTIONS(LMTUNE_VK_DECLARE)
LMTUNE_VK_OPTIONAL_FUNCTIONS(LMTUNE_VK_DECLARE)
#undef LMTUNE_VK_DECLARE

// Opens libvulkan and loads the global functions. Returns false (and sets `why`) when there is no loader.
bool load_vulkan_library(std::string& why);
// Loads the instance- and device-level functions for `instance`; returns the name of a missing one, or "".
std::string load_instance_functions(VkInstance instance);

// "VK_ERROR_DEVICE_LOST" etc.
const char* result_name(VkResult r);

}  // namespace lmtune::vk
