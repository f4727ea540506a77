// The fused gated activation act(gate) * up (SwiGLU / GeGLU) against a double reference and against the
// composition of separate ops (ops::gated_activation_reference), forward and gradients, on every device.
#include <chrono>
#include <cstdio>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops/matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/matmul_gated.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

struct GateCase {
  const char* name;
  ops::GateActivation act;
  double (*ref)(double);
};

const std::vector<GateCase>& gate_cases() {
  static const std::vector<GateCase> cases{
      {"silu", ops::GateActivation::silu, [](double x) { return x / (1 + std::exp(-x)); }},
      {"gelu_tanh", ops::GateActivation::gelu_tanh,
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }},
      {"gelu_erf", ops::GateActivation::gelu_erf, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
  };
  return cases;
}

TEST_P(OpTest, GatedActivationForward) {
  for (const auto& c : gate_cases())
    for (DType dt : float_dtypes())
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided})
        for (const Shape& s : {Shape{7, 33}, Shape{1}, Shape{3, 5, 65}}) {
          LMTUNE_CASE(c.name << " " << dtype_name(dt) << " " << layout_name(l) << " " << to_string(s));
          Tensor gate = make_input(s, dt, dev(), 31, l, 0.1f, 3.0f);
          Tensor up = make_input(s, dt, dev(), 32, Layout::contiguous, 0.1f, 2.0f);
          Tensor y = ops::gated_activation(gate, up, c.act);
          EXPECT_EQ(y.dtype(), dt);
          EXPECT_EQ(y.device(), dev());
          auto want = ref::binary(ref::unary(ref::of(gate), c.ref), ref::of(up), [](double a, double b) { return a * b; });
          EXPECT_TRUE(close(y, want, dt));
          // The composition rounds act(gate) to the dtype once more; both are within the dtype's tolerance.
          EXPECT_TRUE(close(y, ref::of(ops::gated_activation_reference(gate, up, c.act)), dt));
          // Views of both operands (the up operand strided too).
          Tensor up_view = make_input(s, dt, dev(), 32, Layout::strided, 0.1f, 2.0f);
          EXPECT_TRUE(close(ops::gated_activation(gate, up_view, c.act),
                            ref::binary(ref::unary(ref::of(gate), c.ref), ref::of(up_view),
                                        [](double a, double b) { return a * b; }),
                            dt));
        }
}

// vjp (one fused backward kernel) and jvp of the fused op against those of the composition, with a transposed
// cotangent, in f32 and bf16.
TEST_P(OpTest, GatedActivationGradientsMatchComposition) {
  const Shape s{5, 37};
  for (const auto& c : gate_cases())
    for (DType dt : {DType::f32, DType::bf16}) {
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      Tensor gate = make_input(s, dt, dev(), 41, Layout::transposed, 0.1f, 3.0f);
      Tensor up = make_input(s, dt, dev(), 42, Layout::strided, 0.1f, 2.0f);
      Tensor cot = make_input(s, dt, dev(), 43, Layout::transposed);
      auto fused = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::gated_activation(in[0], in[1], c.act)};
      };
      auto composed = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::gated_activation_reference(in[0], in[1], c.act)};
      };
      auto [yf, gf] = lmtune::vjp(fused, {gate, up}, {cot});
      auto [yc, gc] = lmtune::vjp(composed, {gate, up}, {cot});
      ASSERT_EQ(gf.size(), 2u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(gf[i].dtype(), dt);
        EXPECT_EQ(gf[i].device(), dev());
        EXPECT_TRUE(close(gf[i], ref::of(gc[i]), dt)) << "vjp for input " << i;
      }
      Tensor tg = make_input(s, dt, dev(), 44), tu = make_input(s, dt, dev(), 45, Layout::strided);
      auto [yf2, tf] = lmtune::jvp(fused, {gate, up}, {tg, tu});
      auto [yc2, tc] = lmtune::jvp(composed, {gate, up}, {tg, tu});
      EXPECT_TRUE(close(tf[0], ref::of(tc[0]), dt)) << "jvp";
    }
}

// The decoder's gate and up as one product with the activation in its epilogue (ops::matmul_gated), against a
// double reference and against the product followed by ops::gated_activation on the same device, which it must
// equal bit for bit: decode shapes (at most 4 rows, K a multiple of 8: Vulkan's gemv takes them, the activation
// in its epilogue), with a bias and a low-rank term (f32 factors beside 16-bit operands, as LinearGroup::gated
// passes them), gate and up widths under and over a workgroup's columns, and shapes the composition takes.
struct GatedProductCase {
  int64_t M, K, F, R;
  DType dt;
  bool bias;
};

struct GatedProduct {
  Tensor a, b, bias, u, v;
};

GatedProduct gated_product_inputs(const GatedProductCase& c, const Device& d) {
  GatedProduct g;
  g.a = make_input({c.M, c.K}, c.dt, d, 51);
  g.b = make_input({c.K, 2 * c.F}, c.dt, d, 52, Layout::transposed, 0.0f, 0.3f);
  if (c.bias) g.bias = make_input({2 * c.F}, c.dt, d, 53);
  if (c.R > 0) {
    g.u = make_input({c.M, c.R}, DType::f32, d, 54);
    g.v = make_input({c.R, 2 * c.F}, DType::f32, d, 55, Layout::transposed);
  }
  return g;
}

TEST_P(OpTest, MatmulGated) {
  const std::vector<GatedProductCase> cases{
      {1, 64, 37, 0, DType::bf16, false}, {3, 104, 45, 16, DType::f32, true}, {4, 96, 130, 8, DType::bf16, false},
      {2, 40, 300, 0, DType::f16, true},  {1, 272, 20, 16, DType::bf16, true}, {5, 13, 9, 3, DType::f32, false},
      {19, 64, 40, 4, DType::bf16, true}};
  for (const auto& gc : gate_cases())
    for (const auto& c : cases) {
      LMTUNE_CASE(gc.name << " " << c.M << "x" << c.K << "x2*" << c.F << " R " << c.R << " " << dtype_name(c.dt)
                          << (c.bias ? " bias" : ""));
      const GatedProduct g = gated_product_inputs(c, dev());
      const Tensor y = ops::matmul_gated(g.a, g.b, g.bias, g.u, g.v, 0.6f, gc.act, c.dt);
      EXPECT_EQ(y.dtype(), c.dt);
      EXPECT_EQ(y.shape(), (Shape{c.M, c.F}));
      // The product in double, then act(gate) * up.
      ref::Array p = ref::matmul(ref::of(g.a), ref::of(g.b));
      if (c.bias) p = ref::binary(p, ref::of(g.bias), std::plus<double>());
      if (c.R > 0)
        p = ref::binary(p, ref::matmul(ref::of(g.u), ref::of(g.v)), [](double x, double q) { return x + 0.6 * q; });
      ref::Array want({c.M, c.F}, std::vector<double>(size_t(c.M * c.F)));
      for (int64_t m = 0; m < c.M; ++m)
        for (int64_t f = 0; f < c.F; ++f)
          want.v[size_t(m * c.F + f)] = gc.ref(p.v[size_t(m * 2 * c.F + f)]) * p.v[size_t(m * 2 * c.F + c.F + f)];
      EXPECT_TRUE(close(y, want, c.dt));
      // The separate ops on this device: the same values.
      const Tensor prod = c.R > 0 ? (c.bias ? ops::matmul_add(g.a, g.b, g.bias, g.u, g.v, 0.6f, c.dt)
                                            : ops::matmul_low_rank(g.a, g.b, g.u, g.v, 0.6f, c.dt))
                                  : (c.bias ? ops::matmul_add(g.a, g.b, g.bias, c.dt) : ops::matmul(g.a, g.b, c.dt));
      const Tensor gate = ops::slice(prod, 1, 0, c.F), up = ops::slice(prod, 1, c.F, 2 * c.F);
      const Tensor sep = ops::gated_activation(gate, up, gc.act);
      EXPECT_EQ(y.to_doubles(), sep.to_doubles());
    }
  Tensor a = make_input({2, 8}, DType::f32, dev(), 56);
  EXPECT_THROW(ops::matmul_gated(a, make_input({8, 5}, DType::f32, dev(), 57), Tensor(), Tensor(), Tensor(), 1.0f,
                                 ops::GateActivation::silu, DType::f32),
               lmtune::ShapeError);
  EXPECT_THROW(ops::matmul_gated(a, make_input({8, 6}, DType::f32, dev(), 57), make_input({3}, DType::f32, dev(), 58),
                                 Tensor(), Tensor(), 1.0f, ops::GateActivation::silu, DType::f32),
               lmtune::ShapeError);
}

// vjp and jvp of the gated product against those of the composition (the product, then the gated activation).
TEST_P(OpTest, MatmulGatedGradientsMatchComposition) {
  for (const auto& gc : gate_cases())
    for (DType dt : {DType::f32, DType::bf16}) {
      LMTUNE_CASE(gc.name << " " << dtype_name(dt));
      const GatedProductCase c{3, 24, 11, 4, dt, true};
      const GatedProduct g = gated_product_inputs(c, dev());
      const std::vector<Tensor> in{g.a, g.b, g.bias, ops::cast(g.u, dt), ops::cast(g.v, dt)};
      auto fused = [&](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{ops::matmul_gated(x[0], x[1], x[2], x[3], x[4], 0.7f, gc.act, dt)};
      };
      auto composed = [&](const std::vector<Tensor>& x) {
        const Tensor p = ops::matmul_add(x[0], x[1], x[2], x[3], x[4], 0.7f, dt);
        return std::vector<Tensor>{ops::gated_activation(ops::slice(p, 1, 0, c.F), ops::slice(p, 1, c.F, 2 * c.F),
                                                         gc.act)};
      };
      const Tensor cot = make_input({c.M, c.F}, dt, dev(), 59, Layout::transposed);
      auto [yf, gf] = lmtune::vjp(fused, in, {cot});
      auto [yc, gcomp] = lmtune::vjp(composed, in, {cot});
      ASSERT_EQ(gf.size(), in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(gf[i].dtype(), in[i].dtype());
        EXPECT_TRUE(close(gf[i], ref::of(gcomp[i]), dt)) << "vjp for input " << i;
      }
      std::vector<Tensor> tangents;
      for (size_t i = 0; i < in.size(); ++i) tangents.push_back(make_input(in[i].shape(), dt, dev(), 60 + i));
      auto [yf2, tf] = lmtune::jvp(fused, in, tangents);
      auto [yc2, tc] = lmtune::jvp(composed, in, tangents);
      EXPECT_TRUE(close(tf[0], ref::of(tc[0]), dt)) << "jvp";
    }
}

// What the fused op saves for backward: gate and up only. Over forward + backward of a [T, I] block (inputs that
// require grad, a loss that keeps nothing), the composition also holds act(gate) — one more [T, I] tensor — at
// its peak. Prints both peaks and the wall time of each (a warm run, small; indicative only).
TEST_P(OpTest, GatedActivationSavesLessThanComposition) {
  const Shape s{96, 1031};
  const size_t block = size_t(numel(s)) * 4;
  size_t peaks[2];
  double ms[2];
  for (int run = 0; run < 4; ++run) {  // composed, fused, composed, fused: the second pair is reported (warm)
    const int fused = run % 2;
    Tensor gate = make_input(s, DType::f32, dev(), 51, Layout::contiguous, 0.1f, 3.0f);
    Tensor up = make_input(s, DType::f32, dev(), 52);
    gate.set_requires_grad(true);
    up.set_requires_grad(true);
    Backend& be = backend(dev());
    be.synchronize();
    size_t base = be.bytes_in_use();
    be.reset_peak();
    auto t0 = std::chrono::steady_clock::now();
    {
      Tensor y = fused ? ops::gated_activation(gate, up, ops::GateActivation::silu)
                       : ops::gated_activation_reference(gate, up, ops::GateActivation::silu);
      backward(y, Tensor::full(s, 0.5f, DType::f32, dev()));
    }
    be.synchronize();
    ms[fused] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    peaks[fused] = be.peak_bytes() - base;
    EXPECT_TRUE(gate.grad().defined() && up.grad().defined());
  }
  std::printf("  gated activation [96, 1031] f32 forward + backward on %s: peak %zu KiB fused, %zu KiB composed; "
              "%.2f ms fused, %.2f ms composed\n",
              dev().is_cpu() ? "cpu" : "vulkan", peaks[1] / 1024, peaks[0] / 1024, ms[1], ms[0]);
  EXPECT_LE(peaks[1] + block, peaks[0]);
}

TEST_P(OpTest, GatedActivationBadInputs) {
  Tensor a = make_input({3, 4}, DType::f32, dev(), 1);
  EXPECT_THROW(ops::gated_activation(a, make_input({3, 5}, DType::f32, dev(), 2), ops::GateActivation::silu),
               ShapeError);
  EXPECT_THROW(ops::gated_activation(a, make_input({3, 4}, DType::bf16, dev(), 2), ops::GateActivation::silu),
               ShapeError);
  Tensor ids = make_ids({3, 4}, 5, 3, dev());
  EXPECT_THROW(ops::gated_activation(ids, ids, ops::GateActivation::gelu_erf), ShapeError);
}

}  // namespace
}  // namespace lmtune::test
