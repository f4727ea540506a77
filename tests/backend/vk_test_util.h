// Helpers for the Vulkan backend tests: the device under test, random inputs on CPU and Vulkan from the same
// seed, and comparison by normalized mean squared error.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "core/tensor.h"

namespace lmtune::test {

// Vulkan tests fail without a device (CI installs lavapipe) unless LMTUNE_ALLOW_NO_VULKAN=1, which skips them.
#define REQUIRE_VULKAN()                                                                              \
  do {                                                                                                \
    if (::lmtune::vk::list_devices().empty()) {                                                       \
      const char* allow = std::getenv("LMTUNE_ALLOW_NO_VULKAN");                                      \
      if (allow && std::string(allow) == "1") GTEST_SKIP() << "no Vulkan device (LMTUNE_ALLOW_NO_VULKAN=1)"; \
      FAIL() << "no Vulkan device found (install mesa-vulkan-drivers for lavapipe, or set LMTUNE_ALLOW_NO_VULKAN=1)"; \
    }                                                                                                 \
  } while (0)

inline Device gpu() { return Device::vulkan(0); }

// sum((a-b)^2) / sum(b^2) (b the reference), with NaN/inf positions required to match.
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i]) || std::isinf(b[i])) {
      if (!(std::isnan(b[i]) ? std::isnan(a[i]) : a[i] == b[i])) return 1e30;
      continue;
    }
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? num / den : num;
}

inline double threshold(DType t) {
  switch (t) {
    case DType::f32: return 1e-10;
    case DType::f16: return 1e-5;
    case DType::bf16: return 1e-4;
    case DType::i32: return 0;
  }
  return 0;
}

#define EXPECT_CLOSE(got, ref, dtype)                                                          \
  do {                                                                                         \
    double e_ = ::lmtune::test::nmse((got), (ref));                                            \
    EXPECT_LE(e_, ::lmtune::test::threshold(dtype)) << "NMSE " << e_ << " for " << dtype_name(dtype); \
  } while (0)

}  // namespace lmtune::test
