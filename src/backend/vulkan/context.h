// A Vulkan device as lmtune uses it: the process-wide instance, physical-device discovery, and one Context per
// device (logical device, compute queue, enabled features, and the allocator / recorder / pipelines built on them).
// Op files reach a context through vk::context_for(tensor.device()) and record work with Context::dispatch
// (see dispatch.h).
#pragma once
#include <array>
#include <cstdint>
#include <type_traits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/vulkan/kernel_choice.h"
#include "backend/vulkan/vk_api.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/backend.h"
#include "core/device.h"

namespace lmtune::vk {

class Allocator;
class Recorder;
class Pipelines;

// One storage-buffer binding of a dispatch: the whole device allocation behind a tensor (binding offset = the
// allocation's start, so kernels index it with the tensor's element offset), and whether the kernel writes it.
struct Binding {
  std::shared_ptr<Buffer> buffer;
  bool write = false;
};
using Groups = std::array<uint32_t, 3>;

// What the logical device was created with. A kernel that needs a missing feature uses its fallback variant.
struct Features {
  bool fp16_arithmetic = false;     // shaderFloat16
  bool storage_16bit = false;       // storageBuffer16BitAccess (f16/bf16 tensors as 16-bit arrays)
  bool int16 = false;               // shaderInt16
  bool cooperative_matrix = false;  // VK_NV_cooperative_matrix with f16 x f16 -> f32 16x16x16 (subgroup scope)
  // VK_NV_cooperative_matrix2 (workgroup scope, flexible dimensions, tensor addressing) over VK_KHR_cooperative_
  // matrix, on a Vulkan 1.3 device (the kernels are SPIR-V 1.6); bf16: also VK_KHR_shader_bfloat16's bf16 types
  // and cooperative matrices.
  bool cooperative_matrix2 = false;
  bool bf16_cooperative_matrix = false;
  bool vulkan_memory_model = false;
  bool push_descriptor = false;     // VK_KHR_push_descriptor
  bool memory_budget = false;       // VK_EXT_memory_budget
  bool atomic_float_add = false;    // VK_EXT_shader_atomic_float shaderBufferFloat32AtomicAdd
  bool subgroup_size_control = false;
  bool subgroup_arithmetic = false; // compute shaders may use subgroupAdd (GL_KHR_shader_subgroup_arithmetic)
  bool timestamps = false;          // compute queue supports timestamp queries
  bool host_mapping = true;         // host-visible device memory is mapped (off: every transfer is staged)
  bool pipeline_stats = false;      // LMTUNE_PIPELINE_STATS=1 and VK_KHR_pipeline_executable_properties
  uint32_t timestamp_bits = 0;
  uint32_t subgroup_size = 0;

  // What the VK_NV_cooperative_matrix kernels (matmul, flash attention) need.
  bool coopmat_kernels() const { return cooperative_matrix && storage_16bit && subgroup_size == 32; }
};

// Throws DeviceError (OutOfMemoryError for the OOM codes) naming `what` when r is not VK_SUCCESS.
void check(VkResult r, const char* what);

class Context {
 public:
  explicit Context(int index);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int index() const { return index_; }
  Device lmtune_device() const { return Device::vulkan(index_); }
  const std::string& name() const { return name_; }  // "vulkan:0 (NVIDIA H100 80GB HBM3)"
  const Features& features() const { return features_; }
  const VkPhysicalDeviceProperties& properties() const { return props_; }
  const VkPhysicalDeviceMemoryProperties& memory_properties() const { return mem_props_; }
  VkPhysicalDevice physical_device() const { return phys_; }
  VkDevice device() const { return device_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }

  Allocator& allocator() { return *allocator_; }
  Recorder& recorder() { return *recorder_; }
  Pipelines& pipelines() { return *pipelines_; }
  // Which kernels run where an op has several (automatic unless a test forces one).
  KernelChoice& kernel_choice() { return kernel_choice_; }
  // Guards the allocator, recorder and pipelines: every entry point into a context takes it.
  std::recursive_mutex& mutex() { return mu_; }

  // Records one compute dispatch: see dispatch.h for the contract.
  template <class Push>
  void dispatch(const std::string& kernel, const std::vector<Binding>& bindings, const Push& push, Groups groups,
                const std::vector<uint32_t>& spec = {}) {
    static_assert(sizeof(Push) <= 128, "push constants are limited to 128 bytes (the Vulkan minimum)");
    static_assert(std::is_trivially_copyable_v<Push>);
    dispatch_raw(kernel, bindings, &push, sizeof(Push), groups, spec);
  }
  void dispatch_raw(const std::string& kernel, const std::vector<Binding>& bindings, const void* push,
                    size_t push_bytes, Groups groups, const std::vector<uint32_t>& spec);
  // Fills every byte of the tensor's whole buffer with the 32-bit pattern `value` (0 for zeros), in queue order.
  void fill_buffer(const Binding& b, uint32_t value);
  // Waits for all queued work on this device.
  void synchronize();

 private:
  int index_;
  std::string name_;
  Features features_;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props_{};
  VkPhysicalDeviceMemoryProperties mem_props_{};
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  KernelChoice kernel_choice_;
  std::recursive_mutex mu_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<Pipelines> pipelines_;
};

// The process-wide instance (created on first use; null when Vulkan is unavailable, after one warning).
VkInstance instance();
std::vector<VkPhysicalDevice> physical_devices();

// The context of a Vulkan device (creating its backend on first use). Throws DeviceError for a CPU device.
Context& context_for(Device d);

}  // namespace lmtune::vk
