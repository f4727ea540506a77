// The fused gated activation act(gate) * up (SwiGLU / GeGLU) against a double reference and against the
// composition of separate ops (ops::gated_activation_reference), forward and gradients, on every device.
#include <chrono>
#include <cstdio>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
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
