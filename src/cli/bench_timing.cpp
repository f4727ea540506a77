// Timing shared by the `lmtune bench` commands (see bench_timing.h).
#include "cli/bench_timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/vulkan/recorder.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/backend.h"
#include "core/ops.h"

namespace lmtune::cli {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

double time_op(const std::function<Tensor()>& fn, Device dev, int reps, const TimingOptions& timing) {
  Backend& be = backend(dev);
  auto t0 = Clock::now();
  for (int i = 0; i < 20000 && (i < 2 || seconds_since(t0) < timing.warmup_s); ++i) {
    fn();
    if (i % 8 == 7) be.synchronize();  // keep the queue from running far ahead of the clock
  }
  be.synchronize();
  if (timing.stream) {
    auto t = Clock::now();
    for (int r = 0; r < reps; ++r) fn();
    be.synchronize();
    return seconds_since(t) * 1e3 / reps;
  }
  bool gpu_timer = dev.is_vulkan() && vk::context_for(dev).features().timestamps;
  bool was_profiling = vk::profiling();
  if (gpu_timer) vk::set_profiling(true);
  // GPU time of one call: growth of the profiler's total (no reset, so --profile keeps its full table).
  auto total_ns = [] {
    double ns = 0;
    for (const auto& [kernel, stats] : vk::profile_stats()) ns += stats.ns;
    return ns;
  };
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    if (gpu_timer) {
      double before = total_ns();
      fn();
      be.synchronize();
      ms.push_back((total_ns() - before) * 1e-6);
    } else {
      auto t = Clock::now();
      fn();
      be.synchronize();
      ms.push_back(seconds_since(t) * 1e3);
    }
  }
  if (gpu_timer) vk::set_profiling(was_profiling);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double matmul_tflops(Device dev, DType dtype, int64_t n, int reps) {
  Tensor a = Tensor::randn({n, n}, 1, 1.0f, dtype, dev);
  Tensor b = Tensor::randn({n, n}, 2, 1.0f, dtype, dev);
  const double ms = time_op([&] { return ops::matmul(a, b); }, dev, reps);
  return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
}

std::string device_description(Device dev) {
  if (dev.is_cpu()) return "cpu";
  for (const auto& d : vk::list_devices())
    if (d.index == dev.index) return dev.str() + " " + d.name + " (" + d.driver + ")";
  return dev.str();
}

bool is_cpu_class(Device dev) {
  if (dev.is_cpu()) return true;
  for (const auto& d : vk::list_devices())
    if (d.index == dev.index && d.type == "cpu") return true;  // lavapipe
  return false;
}

}  // namespace lmtune::cli
