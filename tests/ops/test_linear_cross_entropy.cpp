// ops::linear_cross_entropy (fused over vocabulary chunks) against the unfused composition it replaces —
// linear on f32-widened hidden states -> f32 logits -> soft-cap -> cross_entropy — on the device under test:
// loss, d hidden and d weight (vjp with a non-uniform upstream gradient) and the jvp, with ignored rows, soft-capping
// on and off, a vocabulary that is not a multiple of the chunk, an odd row count, f32 / f16 / bf16 inputs. The
// forward is also checked against a double-precision reference.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/autodiff.h"
#include "core/error.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

using V = std::vector<Tensor>;

Tensor reference_loss(const Tensor& h, const Tensor& w, const Tensor& targets, float softcap) {
  Tensor z = ops::linear(h.dtype() == DType::f32 ? h : ops::cast(h, DType::f32), w);
  if (softcap > 0) z = ops::scale(ops::tanh(ops::scale(z, 1.0f / softcap)), softcap);
  return ops::cross_entropy(z, targets, -100);
}

ref::Array reference_double(const ref::Array& h, const ref::Array& w, const std::vector<int64_t>& t, double softcap) {
  ref::Array z = ref::linear(h, w, nullptr);
  if (softcap > 0) z = ref::unary(z, [softcap](double x) { return softcap * std::tanh(x / softcap); });
  return ref::cross_entropy(z, t, -100);
}

// N = 13 rows, V = 1000 (chunks of 384: 384 + 384 + 232), targets in every chunk and on its edges.
Tensor test_targets(Device d) {
  return Tensor::from_ints({0, 383, -100, 384, 999, 767, 768, 5, -100, 500, 231, 998, 1}, {13}, d);
}

// Tolerance on NMSE against the unfused path: both compute in f32 and differ in reduction order (and, for
// f16/bf16, in a last-bit rounding of the gradients to the dtype here and there).
double tolerance_vs_unfused(DType dt) { return dt == DType::f32 ? 1e-10 : tolerance(dt); }

::testing::AssertionResult agree(const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << dtype_name(got.dtype()) << " " << to_string(got.shape()) << " vs "
                                         << dtype_name(want.dtype()) << " " << to_string(want.shape());
  std::string problem;
  double e = nmse(got.to_doubles(), want.to_doubles(), &problem);
  if (e <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "NMSE " << e << " > " << tol << " " << problem;
}

TEST_P(OpTest, LinearCrossEntropyMatchesUnfused) {
  const int64_t N = 13, C = 19, Vocab = 1000;
  for (DType dt : float_dtypes())
    for (float softcap : {0.0f, 2.5f})
      for (int64_t chunk : {int64_t(384), int64_t(0)}) {
        LMTUNE_CASE(dtype_name(dt) << " softcap " << softcap << " chunk " << chunk);
        Tensor h = make_input({N, C}, dt, dev(), 91, Layout::transposed, 0.1f, 1.0f);
        Tensor w = make_input({Vocab, C}, dt, dev(), 92, Layout::contiguous, 0.1f, 1.0f);
        Tensor targets = test_targets(dev());
        auto fused = [&](const V& in) { return V{ops::linear_cross_entropy(in[0], in[1], targets, -100, softcap, chunk)}; };
        auto unfused = [&](const V& in) { return V{reference_loss(in[0], in[1], targets, softcap)}; };
        Tensor g = Tensor::from_floats(random_values(N, 93, 0.2f, 2.0f, true), {N}, DType::f32, dev());
        auto [fo, fg] = lmtune::vjp(fused, {h, w}, {g});
        auto [uo, ug] = lmtune::vjp(unfused, {h, w}, {g});
        const double tol = tolerance_vs_unfused(dt);
        EXPECT_EQ(fo[0].dtype(), DType::f32);
        EXPECT_TRUE(agree(fo[0], uo[0], 1e-10)) << "loss";
        EXPECT_TRUE(agree(fg[0], ug[0], tol)) << "d hidden";
        EXPECT_TRUE(agree(fg[1], ug[1], tol)) << "d weight";
        std::vector<float> loss = fo[0].to_floats();
        EXPECT_EQ(loss[2], 0.0f);
        EXPECT_EQ(loss[8], 0.0f);
        // The loss is f32 computed from the dtype's values: only f32 rounding against the double reference.
        EXPECT_TRUE(close(fo[0], reference_double(ref::of(h), ref::of(w), ref::ints_of(targets), softcap), 1e-10));

        if (dt != DType::f32) continue;
        V tangents{make_input({N, C}, dt, dev(), 94), make_input({Vocab, C}, dt, dev(), 95)};
        auto [fo2, ft] = lmtune::jvp(fused, {h, w}, tangents);
        auto [uo2, ut] = lmtune::jvp(unfused, {h, w}, tangents);
        EXPECT_TRUE(agree(ft[0], ut[0], 1e-10)) << "jvp";
      }
}

// A frozen weight (the LoRA case): d hidden is computed in the forward pass (running lse over the chunks) and
// equals the unfused one, for every dtype, soft-cap on and off, one chunk or several, with f32 logits and with
// f16 logits (what tensor-core backends take without a soft-cap; a soft-cap keeps f32).
TEST_P(OpTest, LinearCrossEntropyFrozenWeight) {
  const int64_t N = 13, C = 19, Vocab = 1000;
  for (DType logits : {DType::f32, DType::f16})
    for (DType dt : float_dtypes())
      for (float softcap : {0.0f, 2.5f})
        for (int64_t chunk : {int64_t(384), int64_t(0)}) {
          LMTUNE_CASE(dtype_name(logits) << " logits, " << dtype_name(dt) << " softcap " << softcap << " chunk " << chunk);
          const bool z16 = logits == DType::f16 && softcap == 0;
          const double loss_tol = z16 ? tolerance(DType::f16) : 1e-10;
          const double grad_tol =
              z16 ? std::max(tolerance(DType::f16), tolerance_vs_unfused(dt)) : tolerance_vs_unfused(dt);
          Tensor h = make_input({N, C}, dt, dev(), 96, Layout::transposed, 0.1f, 1.0f);
          // Large logits in some rows: the running lse must rescale what it has accumulated.
          Tensor w = make_input({Vocab, C}, dt, dev(), 97, Layout::contiguous, 0.1f, 3.0f);
          Tensor targets = test_targets(dev());
          Tensor g = Tensor::from_floats(random_values(N, 98, 0.5f, 1.5f, true), {N}, DType::f32, dev());
          auto fused = [&](const V& in) {
            return V{ops::linear_cross_entropy(in[0], w, targets, -100, softcap, chunk, Tensor(), logits)};
          };
          auto unfused = [&](const V& in) { return V{reference_loss(in[0], w, targets, softcap)}; };
          auto [fo, fg] = lmtune::vjp(fused, {h}, {g});
          auto [uo, ug] = lmtune::vjp(unfused, {h}, {g});
          EXPECT_TRUE(agree(fo[0], uo[0], loss_tol)) << "loss";
          EXPECT_TRUE(agree(fg[0], ug[0], grad_tol)) << "d hidden";
          // The weight's transposed copy for the logits products gives the same.
          Tensor wt = ops::contiguous(ops::transpose(w));
          auto [to, tgr] = lmtune::vjp(
              [&](const V& in) {
                return V{ops::linear_cross_entropy(in[0], w, targets, -100, softcap, chunk, wt, logits)};
              },
              {h}, {g});
          EXPECT_TRUE(agree(to[0], fo[0], loss_tol)) << "loss, transposed weight";
          EXPECT_TRUE(agree(tgr[0], fg[0], grad_tol)) << "d hidden, transposed weight";
          std::vector<float> d_ignored = ops::slice(fg[0], 0, 2, 3).to_floats();
          EXPECT_EQ(*std::max_element(d_ignored.begin(), d_ignored.end()), 0.0f);
          EXPECT_EQ(*std::min_element(d_ignored.begin(), d_ignored.end()), 0.0f);
        }
}

TEST_P(OpTest, LinearCrossEntropyErrors) {
  Tensor h = make_input({3, 8}, DType::f32, dev(), 99);
  Tensor w = make_input({10, 8}, DType::f32, dev(), 100);
  Tensor t = Tensor::from_ints({1, 2, 9}, {3}, dev());
  EXPECT_THROW(ops::linear_cross_entropy(h, make_input({10, 7}, DType::f32, dev(), 101), t), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, Tensor::from_ints({1, 2}, {2}, dev())), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, Tensor::from_ints({1, 10, 2}, {3}, dev())), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, make_input({3}, DType::f32, dev(), 102)), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, t, -100, -1.0f), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, t, -100, 0, -5), ShapeError);
  EXPECT_THROW(ops::linear_cross_entropy(h, w, t, -100, 0, 0, w), ShapeError);  // a transposed copy is [C, V]
  Tensor trained = make_input({10, 8}, DType::f32, dev(), 100).set_requires_grad();
  EXPECT_THROW(ops::linear_cross_entropy(h, trained, t, -100, 0, 0, ops::transpose(w)), AutodiffError);
  try {
    ops::linear_cross_entropy(h, w, Tensor::from_ints({1, 10, 2}, {3}, dev()));
    ADD_FAILURE() << "no error for target 10";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 of row 1 is outside [0, 10)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmtune::test
