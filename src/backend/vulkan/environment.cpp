#include "backend/vulkan/environment.h"

#include <cstdlib>

namespace lmtune::vk {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

VulkanEnvironment read_environment() {
  VulkanEnvironment e;
  const std::string profile = env("LMTUNE_PROFILE");
  e.profile = !profile.empty() && profile != "0";
  e.profile_grid = profile == "grid";
  e.pipeline_stats = env("LMTUNE_PIPELINE_STATS") == "1";
  e.validation = env("LMTUNE_VK_VALIDATION") == "1";
  e.disabled = env("LMTUNE_VK_DISABLE");
  e.pipeline_cache = env("LMTUNE_VK_NO_PIPELINE_CACHE").empty();
  e.spv_dir = env("LMTUNE_SPV_DIR");
  if (const std::string x = env("XDG_CACHE_HOME"); !x.empty()) e.cache_dir = x + "/lmtune";
  else if (const std::string h = env("HOME"); !h.empty()) e.cache_dir = h + "/.cache/lmtune";
  return e;
}

}  // namespace

bool VulkanEnvironment::is_disabled(std::string_view feature) const {
  const std::string list = "," + disabled + ",";
  return list.find("," + std::string(feature) + ",") != std::string::npos;
}

const VulkanEnvironment& vulkan_environment() {
  static const VulkanEnvironment e = read_environment();
  return e;
}

}  // namespace lmtune::vk
