// Device gradient parity: a function's vjp and jvp computed on a Vulkan device against the same computation on
// the CPU (whose gradients test_op_grads.cpp and test_composite.cpp check against finite differences of the
// double references). Both sides get identical inputs, cotangents and tangents (host RNG, same seeds, same
// dtype and memory layout), and the results are compared by NMSE against the CPU's.
//
// The suite is parametrized by the device under test and instantiated on vulkan:0 (test_device_grads.cpp).
// Without a Vulkan device every test FAILS (CI installs lavapipe) unless LMTUNE_ALLOW_NO_VULKAN=1, which skips.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "autodiff/gradcheck.h"
#include "backend/vk_test_util.h"

namespace lmtune {
// gtest prints the parameter of a failing test as "vulkan:0".
inline void PrintTo(const Device& d, std::ostream* os) { *os << d.str(); }
}  // namespace lmtune

namespace lmtune::test {

class DeviceGrads : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override { REQUIRE_VULKAN(); }
  void TearDown() override { report(); }
  Device dev() const { return GetParam(); }

  // Largest NMSE seen per dtype in this test, printed at the end (to see the margin under the thresholds).
  std::map<DType, double> worst_;
  int cases_ = 0;
  void report() const {
    if (worst_.empty()) return;
    std::cout << "    " << cases_ << " cases; largest NMSE vs CPU:";
    for (auto [dt, e] : worst_) std::cout << " " << dtype_name(dt) << " " << e;
    std::cout << "\n";
  }

 public:
  // Thresholds on NMSE(vulkan, cpu) for values, gradients and tangents. Both sides compute in f32 (f16/bf16
  // inputs widened, results rounded to the dtype); they differ in reduction order and in where the rounding of
  // intermediates falls. f32: accumulation-order noise only. f16/bf16: a few ulps of the dtype per element,
  // compounded over the vjp's chain of rounded ops. A wrong derivative gives NMSE ~1e-2 or more.
  static double grad_tolerance(DType dt) {
    switch (dt) {
      case DType::f32: return 1e-10;
      case DType::f16: return 1e-5;
      case DType::bf16: return 2e-4;
      case DType::i32: return 0;
    }
    return 0;
  }

  // One side of a comparison: the function and its primals, built for a given device.
  struct Setup {
    Fn f;
    std::vector<Tensor> primals;
  };
  using Build = std::function<Setup(Device)>;

  ::testing::AssertionResult agree(const Tensor& got, const Tensor& want, double tol, bool nonzero) {
    if (!got.defined() || !want.defined())
      return ::testing::AssertionFailure() << "undefined (" << got.defined() << " vs " << want.defined() << ")";
    if (got.device() != dev())
      return ::testing::AssertionFailure() << "result on " << got.device().str() << ", expected " << dev().str();
    if (got.shape() != want.shape() || got.dtype() != want.dtype())
      return ::testing::AssertionFailure() << dtype_name(got.dtype()) << " " << to_string(got.shape()) << ", CPU has "
                                           << dtype_name(want.dtype()) << " " << to_string(want.shape());
    std::vector<double> w = want.to_doubles();
    if (nonzero) {
      double norm = 0;
      for (double x : w)
        if (std::isfinite(x)) norm += x * x;
      if (norm == 0) return ::testing::AssertionFailure() << "the CPU result is all zeros: the case checks nothing";
    }
    std::string problem;
    double e = nmse(got.to_doubles(), w, &problem);
    double& worst = worst_[want.dtype()];
    worst = std::max(worst, e);
    if (e <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "NMSE " << e << " > " << tol << " (" << dtype_name(want.dtype()) << " "
                                         << to_string(want.shape()) << ") " << problem;
  }

  // vjp and jvp of build(dev) against build(cpu). The tolerance is that of the lowest-precision primal.
  void compare(const Build& build, double tol = -1, uint64_t seed = 1) {
    ++cases_;
    Setup c = build(Device::cpu()), g = build(dev());
    ASSERT_EQ(c.primals.size(), g.primals.size());
    if (tol < 0) {
      tol = 0;
      for (const auto& p : c.primals) tol = std::max(tol, grad_tolerance(p.dtype()));
    }
    std::vector<Tensor> probe;
    {
      NoGrad no_grad;
      probe = c.f(c.primals);
    }
    std::vector<Tensor> uc, ug, vc, vg;
    for (size_t k = 0; k < probe.size(); ++k) {
      auto vals = random_values(probe[k].numel(), seed * 100 + k, 0.1f, 1.0f);
      uc.push_back(Tensor::from_floats(vals, probe[k].shape(), probe[k].dtype(), Device::cpu()));
      ug.push_back(Tensor::from_floats(vals, probe[k].shape(), probe[k].dtype(), dev()));
    }
    for (size_t i = 0; i < c.primals.size(); ++i) {
      auto vals = random_values(c.primals[i].numel(), seed * 1000 + i, 0.1f, 1.0f);
      vc.push_back(Tensor::from_floats(vals, c.primals[i].shape(), c.primals[i].dtype(), Device::cpu()));
      vg.push_back(Tensor::from_floats(vals, c.primals[i].shape(), c.primals[i].dtype(), dev()));
    }

    auto [oc, gc] = lmtune::vjp(c.f, c.primals, uc);
    auto [og, gg] = lmtune::vjp(g.f, g.primals, ug);
    ASSERT_EQ(oc.size(), og.size());
    for (size_t k = 0; k < oc.size(); ++k) EXPECT_TRUE(agree(og[k], oc[k], tol, false)) << "forward output " << k;
    ASSERT_EQ(gc.size(), gg.size());
    for (size_t i = 0; i < gc.size(); ++i) EXPECT_TRUE(agree(gg[i], gc[i], tol, true)) << "vjp for input " << i;

    auto [oc2, tc] = lmtune::jvp(c.f, c.primals, vc);
    auto [og2, tg] = lmtune::jvp(g.f, g.primals, vg);
    ASSERT_EQ(tc.size(), tg.size());
    for (size_t k = 0; k < tc.size(); ++k) EXPECT_TRUE(agree(tg[k], tc[k], tol, true)) << "jvp for output " << k;
  }

  // Shorthand: one float input built by make_input, one output.
  void compare1(const std::function<Tensor(const Tensor&)>& f, const Shape& s, DType dt, uint64_t seed,
                Layout l = Layout::contiguous, float lo = 0.1f, float hi = 1.0f, bool positive = false) {
    compare([&](Device d) {
      return Setup{[&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; },
                   {make_input(s, dt, d, seed, l, lo, hi, positive)}};
    });
  }
};

}  // namespace lmtune::test
