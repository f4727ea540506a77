// Compute pipelines, created on first use from the SPIR-V embedded at build time (kernels/variants.txt names them)
// and kept for the life of the context. One ABI for every kernel: set 0 holds N storage buffers (bindings 0..N-1),
// one push-constant block of at most 128 bytes, specialization constants 0..k-1 as uint32 (tile sizes, workgroup
// size via local_size_x_id = 0, ...). Driver compilations are cached on disk in a VkPipelineCache
// ($XDG_CACHE_HOME/lmtune or ~/.cache/lmtune, one file per device UUID and driver version).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/vulkan/vk_api.h"

namespace lmtune::vk {

// Defined in the generated lmtune_kernels.cpp; an empty span for an unknown name.
std::span<const uint32_t> embedded_spirv(std::string_view name);

class Context;

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t bindings = 0;
};

constexpr uint32_t kPushConstantBytes = 128;

class Pipelines {
 public:
  explicit Pipelines(Context& ctx);
  ~Pipelines();  // saves the pipeline cache

  // The pipeline of `kernel` with `bindings` storage buffers and these specialization constants.
  // Throws DeviceError if the kernel is unknown or the driver rejects it.
  const Pipeline& get(const std::string& kernel, uint32_t bindings, const std::vector<uint32_t>& spec);
  size_t size() const { return pipelines_.size(); }
  const std::string& cache_path() const { return cache_path_; }
  void save_cache();

 private:
  VkDescriptorSetLayout set_layout(uint32_t bindings);

  Context& ctx_;
  VkPipelineCache cache_ = VK_NULL_HANDLE;
  std::string cache_path_;
  size_t saved_count_ = 0;
  std::map<uint32_t, std::pair<VkDescriptorSetLayout, VkPipelineLayout>> layouts_;
  std::map<std::string, VkShaderModule> modules_;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
};

}  // namespace lmtune::vk
