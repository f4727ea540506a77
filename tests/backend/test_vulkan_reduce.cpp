// Vulkan reductions and top-k against the CPU backend: every axis, strided inputs, both kernel modes, ties.
#include <gtest/gtest.h>

#include <cmath>

#include "core/ops.h"
#include "vk_test_util.h"

namespace lmtune {
namespace {

using test::gpu;
const DType kFloats[] = {DType::f32, DType::f16, DType::bf16};

void check_all_reductions(const Tensor& xc, const Tensor& xg, DType dt) {
  for (int axis = 0; axis < xc.ndim(); ++axis) {
    SCOPED_TRACE("axis " + std::to_string(axis) + " shape " + to_string(xc.shape()));
    EXPECT_CLOSE(ops::sum(xg, {axis}).to_floats(), ops::sum(xc, {axis}).to_floats(), dt);
    EXPECT_EQ(ops::max(xg, axis).to_floats(), ops::max(xc, axis).to_floats());
    EXPECT_CLOSE(ops::logsumexp(xg, axis).to_floats(), ops::logsumexp(xc, axis).to_floats(), dt);
    EXPECT_EQ(ops::argmax(xg, axis).to_ints(), ops::argmax(xc, axis).to_ints());
  }
}

TEST(VulkanReduce, EveryAxisAndDtype) {
  REQUIRE_VULKAN();
  for (DType dt : kFloats) {
    auto xc = Tensor::randn({5, 33, 41}, 1, 2.0f, dt, Device::cpu());
    auto xg = Tensor::randn({5, 33, 41}, 1, 2.0f, dt, gpu());
    check_all_reductions(xc, xg, dt);
    check_all_reductions(ops::transpose(xc, 0, 2), ops::transpose(xg, 0, 2), dt);
    check_all_reductions(ops::slice(xc, 2, 1, 41, 3), ops::slice(xg, 2, 1, 41, 3), dt);
  }
  for (int64_t n : {1, 7, 257, 1031}) {
    auto xc = Tensor::randn({3, n}, 2, 1.0f, DType::f32, Device::cpu());
    auto xg = Tensor::randn({3, n}, 2, 1.0f, DType::f32, gpu());
    check_all_reductions(xc, xg, DType::f32);
  }
}

TEST(VulkanReduce, LongAxesAndManyColumns) {
  REQUIRE_VULKAN();
  // Row mode over 100k elements (compensated sum), and the invocation-per-row mode (4100 strided columns).
  auto ac = Tensor::uniform({2, 100003}, 3, 0.0f, 1.0f, DType::f32, Device::cpu());
  auto ag = Tensor::uniform({2, 100003}, 3, 0.0f, 1.0f, DType::f32, gpu());
  EXPECT_CLOSE(ops::sum(ag, {1}).to_floats(), ops::sum(ac, {1}).to_floats(), DType::f32);
  EXPECT_CLOSE(ops::logsumexp(ag, 1).to_floats(), ops::logsumexp(ac, 1).to_floats(), DType::f32);
  auto bc = Tensor::randn({37, 4100}, 4, 1.0f, DType::bf16, Device::cpu());
  auto bg = Tensor::randn({37, 4100}, 4, 1.0f, DType::bf16, gpu());
  check_all_reductions(bc, bg, DType::bf16);
}

TEST(VulkanReduce, MaxAndArgmaxOfFewLongRowsInStretches) {
  REQUIRE_VULKAN();
  // Rows of at least 16384 take stretches of 4096 on workgroups of their own, then each row's best stretch:
  // odd lengths (scalar loads), multiples of 4 (vector loads), a strided view, ties across stretches, -inf rows.
  for (int64_t n : {16384, 151937}) {
    auto xc = Tensor::randn({3, n}, 5, 1.0f, DType::f32, Device::cpu());
    auto xg = Tensor::randn({3, n}, 5, 1.0f, DType::f32, gpu());
    EXPECT_EQ(ops::max(xg, 1).to_floats(), ops::max(xc, 1).to_floats());
    EXPECT_EQ(ops::argmax(xg, 1).to_ints(), ops::argmax(xc, 1).to_ints());
  }
  auto bc = Tensor::randn({2, 3, 40000}, 6, 1.0f, DType::bf16, Device::cpu());
  auto bg = Tensor::randn({2, 3, 40000}, 6, 1.0f, DType::bf16, gpu());
  EXPECT_EQ(ops::argmax(bg, 2).to_ints(), ops::argmax(bc, 2).to_ints());
  EXPECT_EQ(ops::argmax(ops::slice(bg, 2, 1, 40000, 2), 2).to_ints(),
            ops::argmax(ops::slice(bc, 2, 1, 40000, 2), 2).to_ints());
  const int64_t n = 20000;
  std::vector<float> v(4 * n, 0.0f);
  for (int64_t i = 0; i < n; ++i) v[n + i] = -INFINITY;  // row 1: all -inf
  v[2 * n + 9000] = v[2 * n + 4095] = v[2 * n + 19999] = 3.0f;  // row 2: ties in three stretches
  v[3 * n + 19999] = 1.0f;                                       // row 3: the last element
  auto tc = Tensor::from_floats(v, {4, n}, DType::f32, Device::cpu());
  auto tg = Tensor::from_floats(v, {4, n}, DType::f32, gpu());
  EXPECT_EQ(ops::argmax(tg, 1).to_ints(), (std::vector<int32_t>{0, 0, 4095, 19999}));
  EXPECT_EQ(ops::argmax(tg, 1).to_ints(), ops::argmax(tc, 1).to_ints());
  EXPECT_EQ(ops::max(tg, 1).to_floats(), ops::max(tc, 1).to_floats());
}

TEST(VulkanReduce, TiesAndInfinities) {
  REQUIRE_VULKAN();
  std::vector<float> v(6 * 40);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 7) % 5);  // many ties
  for (int i = 0; i < 40; ++i) v[40 + i] = -INFINITY;            // a row of -inf
  v[80] = INFINITY;
  auto xc = Tensor::from_floats(v, {6, 40}, DType::f32, Device::cpu());
  auto xg = Tensor::from_floats(v, {6, 40}, DType::f32, gpu());
  check_all_reductions(xc, xg, DType::f32);
  for (int k : {1, 3, 40}) {
    auto [vc, ic] = ops::topk(xc, k);
    auto [vg, ig] = ops::topk(xg, k);
    EXPECT_EQ(vg.to_floats(), vc.to_floats());
    EXPECT_EQ(ig.to_ints(), ic.to_ints());
  }
}

TEST(VulkanReduce, TopKMatchesCpu) {
  REQUIRE_VULKAN();
  for (DType dt : kFloats)
    for (int64_t n : {1, 7, 33, 1031}) {
      auto xc = Tensor::randn({3, 5, n}, 9, 1.0f, dt, Device::cpu());
      auto xg = Tensor::randn({3, 5, n}, 9, 1.0f, dt, gpu());
      for (int k : {1, 5}) {
        if (k > n) continue;
        SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k));
        auto [vc, ic] = ops::topk(xc, k);
        auto [vg, ig] = ops::topk(xg, k);
        EXPECT_EQ(vg.to_floats(), vc.to_floats());
        EXPECT_EQ(ig.to_ints(), ic.to_ints());
        auto [tvc, tic] = ops::topk(ops::transpose(xc, 0, 2), std::min<int>(k, 3));
        auto [tvg, tig] = ops::topk(ops::transpose(xg, 0, 2), std::min<int>(k, 3));
        EXPECT_EQ(tvg.to_floats(), tvc.to_floats());
        EXPECT_EQ(tig.to_ints(), tic.to_ints());
      }
    }
}

}  // namespace
}  // namespace lmtune
