// Entry points of the Vulkan backend that the rest of lmtune uses: device discovery and backend creation.
// Everything else (context, allocator, command recorder, pipelines) stays inside src/backend/vulkan.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace lmtune::vk {

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string type;            // "discrete", "integrated", "virtual", "cpu", "other"
  uint64_t memory_bytes = 0;   // device-local heap size
  uint32_t subgroup_size = 0;
  bool fp16_arithmetic = false;
  bool storage_16bit = false;
  bool cooperative_matrix = false;  // fp16 x fp16 -> fp32 16x16x16 subgroup matrices usable by our kernels
  std::string driver;          // driver name and version
};

// Lists Vulkan physical devices. Returns an empty list (after logging one warning) when no Vulkan loader or
// driver is present; never throws for that reason.
std::vector<DeviceInfo> list_devices();

// Creates the backend for physical device `index` (throws DeviceError if it does not exist).
std::unique_ptr<Backend> make_backend(int index);

}  // namespace lmtune::vk
