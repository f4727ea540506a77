// Backends by device, created on first use, and device selection (--device, LMTUNE_DEVICE, auto).
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/backend.h"
#include "core/error.h"

namespace lmtune {
namespace {

std::mutex g_backends_mu, g_default_mu;
std::optional<Device> g_default;

int type_rank(const std::string& type) {
  if (type == "discrete") return 0;
  if (type == "integrated") return 1;
  if (type == "virtual") return 2;
  if (type == "cpu") return 4;  // lavapipe and friends: still Vulkan, after real GPUs
  return 3;
}

}  // namespace

Backend& backend(Device d) {
  // Never destroyed: tensors in static storage may be freed after it would have been (see vulkan/backend.cpp).
  static auto& backends = *new std::map<std::pair<int, int>, std::unique_ptr<Backend>>();
  std::lock_guard lock(g_backends_mu);
  auto key = std::make_pair(int(d.kind), d.index);
  auto it = backends.find(key);
  if (it != backends.end()) return *it->second;
  auto b = d.is_cpu() ? cpu::make_backend() : vk::make_backend(d.index);
  return *backends.emplace(key, std::move(b)).first->second;
}

Device parse_device(std::string_view spec) {
  if (spec == "auto" || spec.empty()) return choose_device();
  if (spec == "cpu") return Device::cpu();
  if (spec == "vulkan") {
    auto devs = vk::list_devices();
    if (devs.empty()) throw DeviceError("device 'vulkan' requested but no Vulkan device was found");
    int best = 0;
    for (const auto& d : devs)
      if (type_rank(d.type) < type_rank(devs[best].type)) best = d.index;
    return Device::vulkan(best);
  }
  if (spec.starts_with("vulkan:")) {
    std::string num(spec.substr(7));
    char* end = nullptr;
    long i = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || i < 0)
      throw ConfigError("bad device '" + std::string(spec) + "' (expected cpu, vulkan, vulkan:N or auto)");
    auto devs = vk::list_devices();
    if (i >= long(devs.size()))
      throw DeviceError("device '" + std::string(spec) + "' does not exist (" + std::to_string(devs.size()) +
                        " Vulkan device(s) found; see `lmtune info`)");
    return Device::vulkan(int(i));
  }
  throw ConfigError("bad device '" + std::string(spec) + "' (expected cpu, vulkan, vulkan:N or auto)");
}

Device choose_device() {
  if (const char* env = std::getenv("LMTUNE_DEVICE"); env && *env && std::string_view(env) != "auto")
    return parse_device(env);
  auto devs = vk::list_devices();
  if (devs.empty()) {
    spdlog::warn("no Vulkan device found; running on the CPU");
    return Device::cpu();
  }
  int best = 0;
  for (const auto& d : devs)
    if (type_rank(d.type) < type_rank(devs[best].type)) best = d.index;
  // A CPU-emulated Vulkan device (lavapipe) is slower than the native CPU backend for real work.
  if (devs[best].type == "cpu") return Device::cpu();
  return Device::vulkan(best);
}

Device default_device() {
  {
    std::lock_guard lock(g_default_mu);
    if (g_default) return *g_default;
  }
  Device d = choose_device();  // may enumerate Vulkan devices: not under the lock
  std::lock_guard lock(g_default_mu);
  if (!g_default) g_default = d;
  return *g_default;
}

void set_default_device(Device d) {
  std::lock_guard lock(g_default_mu);
  g_default = d;
}

}  // namespace lmtune
