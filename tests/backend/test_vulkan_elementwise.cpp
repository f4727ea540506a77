// Vulkan elementwise and copy kernels against the CPU backend: every op, f32/f16/bf16, odd sizes, broadcasts,
// transposed and stepped views, casts between all dtypes.
#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/view.h"
#include "vk_test_util.h"

namespace lmtune {
namespace {

using test::gpu;
const DType kFloats[] = {DType::f32, DType::f16, DType::bf16};

// The same random tensor on the CPU and the GPU.
struct Pair {
  Tensor cpu, dev;
};
Pair randn(const Shape& s, uint64_t seed, DType dt, float stddev = 1.0f) {
  return {Tensor::randn(s, seed, stddev, dt, Device::cpu()), Tensor::randn(s, seed, stddev, dt, gpu())};
}
Pair uniform(const Shape& s, uint64_t seed, DType dt, float lo, float hi) {
  return {Tensor::uniform(s, seed, lo, hi, dt, Device::cpu()), Tensor::uniform(s, seed, lo, hi, dt, gpu())};
}
template <class F>
Pair map(const Pair& p, F f) {
  return {f(p.cpu), f(p.dev)};
}

// Views exercised for every op: dense, transposed, stepped slice.
std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> views() {
  return {{"dense", [](const Tensor& t) { return t; }},
          {"transpose", [](const Tensor& t) { return ops::transpose(t, 0, 1); }},
          {"slice", [](const Tensor& t) { return ops::slice(ops::slice(t, 1, 1, t.dim(1), 3), 0, 2, t.dim(0), 1); }}};
}

TEST(VulkanElementwise, UnaryOpsMatchCpu) {
  REQUIRE_VULKAN();
  using F = Tensor (*)(const Tensor&);
  std::vector<std::pair<const char*, F>> fns = {
      {"neg", ops::neg},   {"exp", ops::exp},         {"log", ops::log},           {"sqrt", ops::sqrt},
      {"rsqrt", ops::rsqrt}, {"square", ops::square}, {"tanh", ops::tanh},         {"sigmoid", ops::sigmoid},
      {"silu", ops::silu}, {"gelu_tanh", ops::gelu_tanh}, {"gelu_erf", ops::gelu_erf}, {"erf", ops::erf}};
  for (DType dt : kFloats)
    for (auto& [name, fn] : fns) {
      bool positive = std::string(name) == "log" || std::string(name).find("sqrt") != std::string::npos;
      Pair x = positive ? uniform({33, 41}, 3, dt, 0.05f, 4.0f) : randn({33, 41}, 3, dt, 2.0f);
      for (auto& [vname, v] : views()) {
        SCOPED_TRACE(std::string(name) + " " + vname);
        Pair y = map(x, [&](const Tensor& t) { return fn(v(t)); });
        EXPECT_CLOSE(y.dev.to_floats(), y.cpu.to_floats(), dt);
      }
    }
  for (DType dt : kFloats) {
    Pair x = randn({1031}, 5, dt);
    EXPECT_CLOSE(ops::scale(x.dev, -1.5f).to_floats(), ops::scale(x.cpu, -1.5f).to_floats(), dt);
    EXPECT_CLOSE(ops::add_scalar(x.dev, 0.25f).to_floats(), ops::add_scalar(x.cpu, 0.25f).to_floats(), dt);
  }
  // Large magnitudes: no NaN from tanh/sigmoid/silu overflow.
  Pair big = randn({257}, 9, DType::f32, 80.0f);
  for (F fn : {F(ops::tanh), F(ops::sigmoid), F(ops::silu), F(ops::gelu_tanh), F(ops::gelu_erf), F(ops::erf)})
    EXPECT_CLOSE(fn(big.dev).to_floats(), fn(big.cpu).to_floats(), DType::f32);
}

TEST(VulkanElementwise, BinaryOpsBroadcastAndStrides) {
  REQUIRE_VULKAN();
  using F = Tensor (*)(const Tensor&, const Tensor&);
  std::vector<std::pair<const char*, F>> fns = {{"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul},
                                                {"div", ops::div}, {"maximum", ops::maximum},
                                                {"greater_equal", ops::greater_equal}};
  for (DType dt : kFloats)
    for (auto& [name, fn] : fns) {
      SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)));
      Pair a = randn({7, 5, 33}, 1, dt);
      Pair b = uniform({5, 1}, 2, dt, 0.5f, 2.0f);         // broadcast over dims 0 and 2
      Pair c = uniform({33}, 4, dt, -2.0f, 2.0f);          // broadcast row
      Pair at = randn({33, 5, 7}, 6, dt);                  // permuted to [7, 5, 33]
      auto y = [&](const Tensor& a_, const Tensor& b_) { return fn(a_, b_); };
      EXPECT_CLOSE(y(a.dev, b.dev).to_floats(), y(a.cpu, b.cpu).to_floats(), dt);
      EXPECT_CLOSE(y(b.dev, a.dev).to_floats(), y(b.cpu, a.cpu).to_floats(), dt);
      EXPECT_CLOSE(y(a.dev, c.dev).to_floats(), y(a.cpu, c.cpu).to_floats(), dt);
      Pair p = map(at, [](const Tensor& t) { return ops::permute(t, {2, 1, 0}); });
      EXPECT_CLOSE(y(p.dev, a.dev).to_floats(), y(p.cpu, a.cpu).to_floats(), dt);
      Pair s = map(a, [](const Tensor& t) { return ops::slice(t, 2, 1, 33, 4); });
      Pair s2 = map(at, [](const Tensor& t) { return ops::slice(ops::permute(t, {2, 1, 0}), 2, 0, 32, 4); });
      EXPECT_CLOSE(y(s.dev, s2.dev).to_floats(), y(s.cpu, s2.cpu).to_floats(), dt);
      Pair one = randn({1}, 8, dt);
      EXPECT_CLOSE(y(one.dev, one.dev).to_floats(), y(one.cpu, one.cpu).to_floats(), dt);
    }
}

// Dense operands take the vector paths: 8 elements per item where every offset is a multiple of 8, 4 where of 4,
// else one at a time; odd lengths leave a tail. Offsets 0, 8, 4 and 3 elements into the same buffers.
TEST(VulkanElementwise, DenseVectorPaths) {
  REQUIRE_VULKAN();
  using F = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, F> fns[] = {{"add", ops::add}, {"sub", ops::sub}, {"mul", ops::mul}, {"div", ops::div}};
  for (DType dt : kFloats)
    for (int64_t off : {0, 8, 4, 3})
      for (auto& [name, fn] : fns) {
        SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)) + " offset " + std::to_string(off));
        Pair a = randn({2000}, 1, dt), b = uniform({2000}, 2, dt, 0.5f, 2.0f);
        auto part = [&](const Tensor& t) { return ops::slice(t, 0, off, off + 1037); };
        EXPECT_CLOSE(fn(part(a.dev), part(b.dev)).to_floats(), fn(part(a.cpu), part(b.cpu)).to_floats(), dt);
        auto w = [&](const Tensor& a_, const Tensor& b_) {
          return ops::where(ops::greater_equal(part(a_), part(b_)), part(a_), part(b_));
        };
        EXPECT_CLOSE(w(a.dev, b.dev).to_floats(), w(a.cpu, b.cpu).to_floats(), dt);
        // A dense copy into a fresh tensor of the same dtype moves the bits as they are.
        Tensor copied = Tensor::empty({1037}, dt, gpu());
        copy_into(copied, part(a.dev));
        EXPECT_EQ(copied.to_floats(), part(a.cpu).to_floats());
      }
}

TEST(VulkanElementwise, WhereWithIntAndFloatConditions) {
  REQUIRE_VULKAN();
  for (DType dt : kFloats) {
    std::vector<int32_t> cv(7 * 33);
    for (size_t i = 0; i < cv.size(); ++i) cv[i] = (i * 7919) % 3 == 0 ? 0 : int32_t(i);
    Pair c{Tensor::from_ints(cv, {7, 1, 33}, Device::cpu()), Tensor::from_ints(cv, {7, 1, 33}, gpu())};
    Pair a = randn({7, 5, 33}, 1, dt), b = randn({5, 1}, 2, dt);
    EXPECT_CLOSE(ops::where(c.dev, a.dev, b.dev).to_floats(), ops::where(c.cpu, a.cpu, b.cpu).to_floats(), dt);
    Pair fc = map(randn({5, 33}, 3, DType::f32), [](const Tensor& t) {
      return ops::greater_equal(t, Tensor::zeros({}, DType::f32, t.device()));
    });
    EXPECT_CLOSE(ops::where(fc.dev, a.dev, b.dev).to_floats(), ops::where(fc.cpu, a.cpu, b.cpu).to_floats(), dt);
    EXPECT_CLOSE(ops::masked_fill(a.dev, c.dev, -1e4f).to_floats(), ops::masked_fill(a.cpu, c.cpu, -1e4f).to_floats(), dt);
  }
}

TEST(VulkanElementwise, CopyCastsBetweenAllDtypes) {
  REQUIRE_VULKAN();
  const DType all[] = {DType::f32, DType::f16, DType::bf16, DType::i32};
  for (DType from : all)
    for (DType to : all) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
      Pair x = uniform({33, 257}, 12, from, -300.0f, 300.0f);
      for (auto& [vname, v] : views()) {
        SCOPED_TRACE(vname);
        Pair y = map(x, [&](const Tensor& t) { return ops::cast(v(t), to); });
        EXPECT_EQ(y.dev.to_floats(), y.cpu.to_floats());  // conversions are exact and round identically
      }
    }
  // i32 copies stay exact above 2^24.
  std::vector<int32_t> big = {16777217, -16777219, 2147483647, -2147483647 - 1, 123456789, 7};
  Tensor t = Tensor::from_ints(big, {2, 3}, gpu());
  EXPECT_EQ(ops::contiguous(ops::transpose(t, 0, 1)).to_ints(),
            (std::vector<int32_t>{16777217, -2147483647 - 1, -16777219, 123456789, 2147483647, 7}));
}

TEST(VulkanElementwise, HalfSubnormalsRoundToNearestEven) {
  REQUIRE_VULKAN();
  const float u = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  std::vector<float> in = {std::ldexp(1.0f, -15), u, 3 * u / 2, u / 2, 1e-6f, -6e-8f, 65504.0f, 65520.0f};
  std::vector<float> want = {std::ldexp(1.0f, -15), u, 2 * u, 0.0f, 17 * u, -u, 65504.0f, INFINITY};
  for (Device d : {Device::cpu(), gpu()}) {
    SCOPED_TRACE(d.str());
    Tensor x = Tensor::from_floats(in, {int64_t(in.size())}, DType::f32, d);
    EXPECT_EQ(ops::cast(x, DType::f16).to_floats(), want);
  }
}

TEST(VulkanElementwise, CopyIntoStridedDestinationAndConcat) {
  REQUIRE_VULKAN();
  for (DType dt : kFloats) {
    Pair dst = randn({9, 40}, 1, dt), src = randn({9, 10}, 2, DType::f32);
    for (Tensor* d : {&dst.cpu, &dst.dev}) {
      const Tensor& s = d == &dst.cpu ? src.cpu : src.dev;
      copy_into(ops::slice(*d, 1, 3, 40, 4), s);  // every 4th column, converting f32 -> dt
    }
    EXPECT_CLOSE(dst.dev.to_floats(), dst.cpu.to_floats(), dt);
    Pair a = randn({3, 7, 5}, 3, dt), b = randn({3, 2, 5}, 4, dt);
    EXPECT_EQ(ops::concat({a.dev, b.dev}, 1).to_floats(), ops::concat({a.cpu, b.cpu}, 1).to_floats());
  }
}

TEST(VulkanElementwise, ManyDimsThatDoNotCollapse) {
  REQUIRE_VULKAN();
  // 6 dims permuted so no two neighbours merge: the launcher splits the outer dims.
  Pair x = randn({2, 3, 2, 3, 2, 5}, 7, DType::f32);
  Pair y = map(x, [](const Tensor& t) { return ops::contiguous(ops::permute(t, {5, 3, 1, 4, 2, 0})); });
  EXPECT_EQ(y.dev.to_floats(), y.cpu.to_floats());
  Pair z = map(x, [](const Tensor& t) { return ops::exp(ops::permute(t, {1, 0, 3, 2, 5, 4})); });
  EXPECT_CLOSE(z.dev.to_floats(), z.cpu.to_floats(), DType::f32);
}

TEST(VulkanElementwise, LargeTensorGridStride) {
  REQUIRE_VULKAN();
  // More elements than 65535 workgroups x 256 invocations cover in one pass.
  Pair x = randn({17000000 + 3}, 21, DType::f16);
  Pair y = map(x, [](const Tensor& t) { return ops::add_scalar(t, 1.0f); });
  EXPECT_CLOSE(y.dev.to_floats(), y.cpu.to_floats(), DType::f16);
}

}  // namespace
}  // namespace lmtune
