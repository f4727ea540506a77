// Harness for the op tests: tests are parametrized by device (CPU always; the first Vulkan device when one is
// present), build random inputs in any dtype and layout on that device, and compare results with the
// double-precision references of ops/reference.h by normalized mean squared error with per-dtype thresholds.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "ops/reference.h"

namespace lmtune::test {

// Devices the op tests run on: the CPU, plus vulkan:0 when a Vulkan device exists. (Instantiated in ops/main.cpp.)
class OpTest : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
};

// How an input is laid out in memory; the logical values are the same either way.
enum class Layout { contiguous, transposed, strided, expanded };
inline const char* layout_name(Layout l) {
  static const char* n[] = {"contiguous", "transposed", "strided", "expanded"};
  return n[int(l)];
}

// Random values with |v| in [lo, hi] (random sign unless positive), never zero, so no op sees an all-zero input.
inline std::vector<float> random_values(int64_t n, uint64_t seed, float lo = 0.1f, float hi = 1.0f,
                                        bool positive = false) {
  Rng rng(seed * 7919 + 17);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = float(lo + (hi - lo) * rng.uniform());
    if (!positive && rng.uniform() < 0.5) x = -x;
  }
  return v;
}

// A tensor of logical shape `shape` holding random values, laid out as asked:
// transposed: last two dims stored swapped; strided: every other element of a wider last dim (stride 2, offset 1);
// expanded: dim 0 broadcast from size 1 (stride 0).
inline Tensor make_input(const Shape& shape, DType dtype, Device dev, uint64_t seed, Layout layout = Layout::contiguous,
                         float lo = 0.1f, float hi = 1.0f, bool positive = false) {
  Shape phys = shape;
  switch (layout) {
    case Layout::contiguous: break;
    case Layout::transposed:
      if (shape.size() < 2) return make_input(shape, dtype, dev, seed, Layout::strided, lo, hi, positive);
      std::swap(phys[phys.size() - 1], phys[phys.size() - 2]);
      break;
    case Layout::strided:
      if (shape.empty()) break;
      phys.back() = 2 * phys.back() + 1;
      break;
    case Layout::expanded:
      if (shape.empty()) break;
      phys[0] = 1;
      break;
  }
  Tensor t = Tensor::from_floats(random_values(numel(phys), seed, lo, hi, positive), phys, dtype, dev);
  switch (layout) {
    case Layout::contiguous: return t;
    case Layout::transposed: return ops::transpose(t, -2, -1);
    case Layout::strided: return shape.empty() ? t : ops::slice(t, -1, 1, phys.back(), 2);
    case Layout::expanded: return shape.empty() ? t : ops::expand(t, shape);
  }
  return t;
}

inline Tensor make_ids(const Shape& shape, int64_t vocab, uint64_t seed, Device dev) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(numel(shape)));
  for (auto& x : v) x = int32_t(rng.next_u64() % uint64_t(vocab));
  return Tensor::from_ints(v, shape, dev);
}

// Σ (got - want)² / Σ want², over entries where want is finite; infinities must match exactly.
inline double nmse(const std::vector<double>& got, const std::vector<double>& want, std::string* problem = nullptr) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      if (got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i]))) {
        if (problem) *problem = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
                                std::to_string(want[i]);
        return INFINITY;
      }
      continue;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return num / std::max(den, 1e-30);
}

// Thresholds on NMSE: a result rounded to the dtype, plus f32 accumulation error.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-10;
    case DType::f16: return 1e-5;
    case DType::bf16: return 2e-4;
    case DType::i32: return 0;
  }
  return 0;
}

inline ::testing::AssertionResult close(const Tensor& got, const ref::Array& want, double tol) {
  if (got.shape() != want.shape)
    return ::testing::AssertionFailure() << "shape " << to_string(got.shape()) << ", want " << to_string(want.shape);
  std::string problem;
  double e = nmse(got.to_doubles(), want.v, &problem);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "NMSE " << e << " > " << tol << " " << problem;
}
inline ::testing::AssertionResult close(const Tensor& got, const ref::Array& want, DType dtype) {
  return close(got, want, tolerance(dtype));
}

inline const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> d{DType::f32, DType::f16, DType::bf16};
  return d;
}

// Scoped trace naming the case, so a failure says which dtype/layout/shape broke.
#define LMTUNE_CASE(...) SCOPED_TRACE(::testing::Message() << __VA_ARGS__)

}  // namespace lmtune::test
