// Lazy compute pipelines and the on-disk pipeline cache (see pipelines.h).
#include "backend/vulkan/pipelines.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "backend/vulkan/context.h"
#include "backend/vulkan/environment.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

// LMTUNE_PIPELINE_STATS=1: the driver's statistics of each compiled kernel (on NVIDIA 580: registers per thread,
// shared memory, binary size; its "Local Memory Size" read 2^36 for every kernel, so it tells nothing about
// spills) in one log line, for tuning kernels without a profiler.
void log_pipeline_statistics(VkDevice device, VkPipeline pipeline, const std::string& kernel) {
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  pi.pipeline = pipeline;
  uint32_t n = 0;
  if (vkGetPipelineExecutablePropertiesKHR(device, &pi, &n, nullptr) != VK_SUCCESS) return;
  for (uint32_t e = 0; e < n; ++e) {
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    ei.pipeline = pipeline;
    ei.executableIndex = e;
    uint32_t ns = 0;
    if (vkGetPipelineExecutableStatisticsKHR(device, &ei, &ns, nullptr) != VK_SUCCESS) continue;
    std::vector<VkPipelineExecutableStatisticKHR> st(ns, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    if (vkGetPipelineExecutableStatisticsKHR(device, &ei, &ns, st.data()) != VK_SUCCESS) continue;
    std::string line;
    for (const auto& s : st) {
      line += std::string(line.empty() ? "" : ", ") + s.name + "=";
      switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: line += s.value.b32 ? "true" : "false"; break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: line += std::to_string(s.value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: line += std::to_string(s.value.u64); break;
        default: line += std::to_string(s.value.f64); break;
      }
    }
    spdlog::info("vulkan: kernel {} statistics: {}", kernel, line);
  }
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

Pipelines::Pipelines(Context& ctx) : ctx_(ctx) {
  const std::string& dir = vulkan_environment().cache_dir;
  std::vector<char> data;
  if (!dir.empty() && vulkan_environment().pipeline_cache) {
    const auto& p = ctx.properties();
    char name[128];
    std::snprintf(name, sizeof name, "pipelines-%04x-%04x-", p.vendorID, p.deviceID);
    std::string uuid;
    for (uint8_t b : p.pipelineCacheUUID) {
      char h[3];
      std::snprintf(h, sizeof h, "%02x", b);
      uuid += h;
    }
    cache_path_ = dir + "/" + name + uuid + "-" + std::to_string(p.driverVersion) + ".bin";
    data = read_file(cache_path_);
  }
  VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  ci.initialDataSize = data.size();
  ci.pInitialData = data.empty() ? nullptr : data.data();
  if (vkCreatePipelineCache(ctx.device(), &ci, nullptr, &cache_) != VK_SUCCESS) {
    spdlog::warn("{}: pipeline cache {} is unusable; starting an empty one", ctx.name(), cache_path_);
    ci.initialDataSize = 0;
    ci.pInitialData = nullptr;
    check(vkCreatePipelineCache(ctx.device(), &ci, nullptr, &cache_), "vkCreatePipelineCache");
  }
}

Pipelines::~Pipelines() {
  save_cache();
  VkDevice d = ctx_.device();
  for (auto& [k, p] : pipelines_) vkDestroyPipeline(d, p->pipeline, nullptr);
  for (auto& [k, m] : modules_) vkDestroyShaderModule(d, m, nullptr);
  for (auto& [n, l] : layouts_) {
    vkDestroyPipelineLayout(d, l.second, nullptr);
    vkDestroyDescriptorSetLayout(d, l.first, nullptr);
  }
  vkDestroyPipelineCache(d, cache_, nullptr);
}

void Pipelines::save_cache() {
  if (cache_path_.empty() || pipelines_.size() == saved_count_) return;
  size_t n = 0;
  if (vkGetPipelineCacheData(ctx_.device(), cache_, &n, nullptr) != VK_SUCCESS || n == 0) return;
  std::vector<char> data(n);
  if (vkGetPipelineCacheData(ctx_.device(), cache_, &n, data.data()) != VK_SUCCESS) return;
  // Atomic replace: write a temporary file next to the cache, then rename it over.
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cache_path_).parent_path(), ec);
  std::string tmp = cache_path_ + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) f.write(data.data(), std::streamsize(n));
    if (!f) {
      spdlog::warn("{}: cannot write the pipeline cache {}", ctx_.name(), tmp);
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, cache_path_, ec);
  if (ec) {
    spdlog::warn("{}: cannot write the pipeline cache {}: {}", ctx_.name(), cache_path_, ec.message());
    std::filesystem::remove(tmp, ec);
    return;
  }
  saved_count_ = pipelines_.size();
}

VkDescriptorSetLayout Pipelines::set_layout(uint32_t bindings) {
  auto it = layouts_.find(bindings);
  if (it != layouts_.end()) return it->second.first;
  std::vector<VkDescriptorSetLayoutBinding> b(bindings);
  for (uint32_t i = 0; i < bindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = bindings;
  li.pBindings = b.data();
  if (ctx_.features().push_descriptor) li.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  VkDescriptorSetLayout sl;
  check(vkCreateDescriptorSetLayout(ctx_.device(), &li, nullptr, &sl), "vkCreateDescriptorSetLayout");
  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pi.setLayoutCount = 1;
  pi.pSetLayouts = &sl;
  pi.pushConstantRangeCount = 1;
  pi.pPushConstantRanges = &pr;
  VkPipelineLayout pl;
  check(vkCreatePipelineLayout(ctx_.device(), &pi, nullptr, &pl), "vkCreatePipelineLayout");
  layouts_[bindings] = {sl, pl};
  return sl;
}

const Pipeline& Pipelines::get(const std::string& kernel, uint32_t bindings, const std::vector<uint32_t>& spec) {
  std::string key = kernel + "/" + std::to_string(bindings);
  for (uint32_t s : spec) key += "," + std::to_string(s);
  auto it = pipelines_.find(key);
  if (it != pipelines_.end()) return *it->second;

  auto mit = modules_.find(kernel);
  if (mit == modules_.end()) {
    // LMTUNE_SPV_DIR=<dir>: take <dir>/<kernel>.spv instead of the embedded module where it exists (kernel
    // tuning on a device without rebuilding the binary).
    std::span<const uint32_t> code = embedded_spirv(kernel);
    std::vector<uint32_t> override_code;
    if (const std::string& d = vulkan_environment().spv_dir; !d.empty()) {
      std::vector<char> bytes = read_file(d + "/" + kernel + ".spv");
      if (!bytes.empty() && bytes.size() % 4 == 0) {
        override_code.resize(bytes.size() / 4);
        std::memcpy(override_code.data(), bytes.data(), bytes.size());
        code = override_code;
        spdlog::info("vulkan: kernel {} from {}/{}.spv", kernel, d, kernel);
      }
    }
    if (code.empty())
      throw DeviceError("vulkan: no kernel named '" + kernel + "' (is it listed in kernels/variants.txt?)");
    VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    mi.codeSize = code.size() * 4;
    mi.pCode = code.data();
    VkShaderModule m;
    check(vkCreateShaderModule(ctx_.device(), &mi, nullptr, &m), ("vkCreateShaderModule(" + kernel + ")").c_str());
    mit = modules_.emplace(kernel, m).first;
  }
  auto p = std::make_unique<Pipeline>();
  p->set_layout = set_layout(bindings);
  p->layout = layouts_[bindings].second;
  p->bindings = bindings;
  std::vector<VkSpecializationMapEntry> entries(spec.size());
  for (size_t i = 0; i < spec.size(); ++i) entries[i] = {uint32_t(i), uint32_t(i * 4), 4};
  VkSpecializationInfo si{uint32_t(spec.size()), entries.data(), spec.size() * 4, spec.data()};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mit->second;
  ci.stage.pName = "main";
  ci.stage.pSpecializationInfo = spec.empty() ? nullptr : &si;
  ci.layout = p->layout;
  const bool stats = ctx_.features().pipeline_stats;
  if (stats) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
  check(vkCreateComputePipelines(ctx_.device(), cache_, 1, &ci, nullptr, &p->pipeline),
        ("vkCreateComputePipelines(" + kernel + ")").c_str());
  if (stats) log_pipeline_statistics(ctx_.device(), p->pipeline, key);
  return *pipelines_.emplace(key, std::move(p)).first->second;
}

}  // namespace lmtune::vk
