// Where tensors live and ops run: the CPU backend or a Vulkan device.
#pragma once
#include <string>
#include <string_view>

namespace lmtune {

struct Device {
  enum class Kind : unsigned char { cpu, vulkan };
  Kind kind = Kind::cpu;
  int index = 0;  // Vulkan physical-device index as listed by `lmtune info`

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device vulkan(int i = 0) { return {Kind::vulkan, i}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_vulkan() const { return kind == Kind::vulkan; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "vulkan:" + std::to_string(index); }
};

// Parses "cpu", "vulkan", "vulkan:N" or "auto" (auto = choose_device()); throws ConfigError.
Device parse_device(std::string_view spec);
// Best discrete GPU, else integrated, else another Vulkan device, else CPU (with a one-line warning).
// Honours LMTUNE_DEVICE when set.
Device choose_device();
// The device new tensors go to when none is named. Starts as choose_device() on first use.
Device default_device();
void set_default_device(Device d);

}  // namespace lmtune
