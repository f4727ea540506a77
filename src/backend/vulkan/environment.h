// The Vulkan backend's settings from the environment (docs/cli.md lists them), read once at first use: the one
// place below the CLI where the backend reads environment variables.
#pragma once
#include <string>
#include <string_view>

namespace lmtune::vk {

struct VulkanEnvironment {
  bool profile = false;         // LMTUNE_PROFILE=1: per-kernel GPU times (recorder.h)
  bool profile_grid = false;    // LMTUNE_PROFILE=grid: also per grid size
  bool pipeline_stats = false;  // LMTUNE_PIPELINE_STATS=1: the driver's statistics of each compiled kernel
  bool validation = false;      // LMTUNE_VK_VALIDATION=1: VK_LAYER_KHRONOS_validation
  std::string disabled;         // LMTUNE_VK_DISABLE: comma-separated features treated as absent (fallback tests)
  bool pipeline_cache = true;   // off with LMTUNE_VK_NO_PIPELINE_CACHE
  std::string spv_dir;          // LMTUNE_SPV_DIR: <dir>/<kernel>.spv replaces the embedded module where present
  std::string cache_dir;        // $XDG_CACHE_HOME/lmtune, else $HOME/.cache/lmtune; empty without either

  bool is_disabled(std::string_view feature) const;
};

const VulkanEnvironment& vulkan_environment();

}  // namespace lmtune::vk
