// The dispatches a piece of work records on a Vulkan device (through the GPU profile, so on devices with
// timestamps): tests that a fused path really runs fewer kernels.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "backend/vulkan/context.h"
#include "backend/vulkan/recorder.h"

namespace lmtune::test {

// All dispatches `run` records on ctx's device and those whose kernel name starts with `prefix`, with the profile
// report for failure messages.
struct DispatchCount {
  uint64_t matching = 0, all = 0;
  std::string report;
};
inline DispatchCount count_dispatches(vk::Context& ctx, const std::string& prefix, const std::function<void()>& run) {
  ctx.synchronize();
  vk::reset_profile();
  vk::set_profiling(true);
  run();
  DispatchCount c;
  c.report = vk::profile_report();
  vk::set_profiling(false);
  for (const auto& [name, st] : vk::profile_stats()) {
    c.all += st.calls;
    if (name.rfind(prefix, 0) == 0) c.matching += st.calls;
  }
  return c;
}

}  // namespace lmtune::test
