// softmax / log_softmax over any axis (including -inf entries and all -inf rows), cross-entropy, and the fused
// loss's one-pass chunk softmax (SoftmaxChunk) against a double-precision reference.
#include <cmath>

#include "core/ops/softmax.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

TEST_P(OpTest, SoftmaxAnyAxis) {
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided})
      for (int axis : {-1, 0, 1}) {
        LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l) << " axis " << axis);
        Tensor x = make_input({3, 7, 33}, dt, dev(), 81, l, 0.1f, 4.0f);
        ref::Array rx = ref::of(x);
        int a = axis < 0 ? 2 : axis;
        EXPECT_TRUE(close(ops::softmax(x, axis), ref::softmax(rx, a, false), dt));
        EXPECT_TRUE(close(ops::log_softmax(x, axis), ref::softmax(rx, a, true), dt));
      }
}

TEST_P(OpTest, SoftmaxInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    std::vector<float> v = random_values(3 * 5, 82);
    v[1] = -inf;                                         // one masked entry
    for (int i = 5; i < 10; ++i) v[size_t(i)] = -inf;    // a fully masked row
    Tensor x = Tensor::from_floats(v, {3, 5}, dt, dev());
    ref::Array rx = ref::of(x);
    EXPECT_TRUE(close(ops::softmax(x), ref::softmax(rx, 1, false), dt));
    EXPECT_TRUE(close(ops::log_softmax(x), ref::softmax(rx, 1, true), dt));
    std::vector<double> p = ops::softmax(x).to_doubles();
    for (int i = 5; i < 10; ++i) EXPECT_EQ(p[size_t(i)], 0.0);
  }
}

TEST_P(OpTest, CrossEntropy) {
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l));
      Tensor logits = make_input({7, 65}, dt, dev(), 83, l, 0.1f, 5.0f);
      Tensor targets = Tensor::from_ints({3, -100, 64, 0, 17, -100, 5}, {7}, dev());
      Tensor loss = ops::cross_entropy(logits, targets);
      EXPECT_EQ(loss.dtype(), DType::f32);
      // Loss is computed in f32 from the dtype's logits: only f32 rounding remains.
      EXPECT_TRUE(close(loss, ref::cross_entropy(ref::of(logits), ref::ints_of(targets), -100), 1e-10));
      Tensor t2 = Tensor::from_ints({1, 2, 3, 4, 5, 6, 0}, {7}, dev());
      EXPECT_TRUE(close(ops::cross_entropy(logits, t2, 6), ref::cross_entropy(ref::of(logits), ref::ints_of(t2), 6), 1e-10));
    }
}

// SoftmaxChunk: lse = logaddexp(prev, logsumexp(z)), p = exp(z - lse) · slope(z), zero ignored rows; rows short
// (scalar path), a multiple of 4 (vector path), and longer than the registers hold (its tail loop).
TEST_P(OpTest, SoftmaxChunk) {
  for (int64_t C : {int64_t(37), int64_t(64), int64_t(8196)})
    for (bool has_prev : {false, true})
      for (float softcap : {0.0f, 2.5f})
        for (DType dt : float_dtypes()) {
          LMTUNE_CASE("C " << C << " prev " << has_prev << " softcap " << softcap << " " << dtype_name(dt));
          const int64_t N = 5;
          std::vector<float> zv = random_values(N * C, 84, 0.1f, 4.0f);
          if (softcap > 0)
            for (float& f : zv) f = softcap * std::tanh(f / softcap);
          Tensor z = Tensor::from_floats(zv, {N, C}, DType::f32, dev());
          Tensor ignored = Tensor::from_ints({0, 1, 0, 0, 0}, {N}, dev());
          std::vector<float> prev_v = random_values(N, 85, 3.0f, 12.0f, true);
          std::vector<Tensor> in{z, ignored};
          if (has_prev) in.push_back(Tensor::from_floats(prev_v, {N}, DType::f32, dev()));
          std::vector<Tensor> out = apply(std::make_shared<SoftmaxChunk>(softcap, has_prev), in,
                                          {{{N, C}, dt}, {{N}, DType::f32}});
          ref::Array want_p({N, C}), want_lse({N});
          for (int64_t r = 0; r < N; ++r) {
            double m = -INFINITY, s = 0;
            for (int64_t i = 0; i < C; ++i) m = std::max(m, double(zv[size_t(r * C + i)]));
            for (int64_t i = 0; i < C; ++i) s += std::exp(double(zv[size_t(r * C + i)]) - m);
            double l = m + std::log(s);
            if (has_prev) {
              double a = prev_v[size_t(r)], hi = std::max(a, l);
              l = hi + std::log(std::exp(a - hi) + std::exp(l - hi));
            }
            want_lse[r] = l;
            for (int64_t i = 0; i < C; ++i) {
              double x = zv[size_t(r * C + i)], slope = softcap > 0 ? 1 - (x / softcap) * (x / softcap) : 1;
              want_p[r * C + i] = r == 1 ? 0.0 : std::exp(x - l) * slope;
            }
          }
          EXPECT_TRUE(close(out[1], want_lse, 1e-10)) << "lse";
          EXPECT_TRUE(close(out[0], want_p, dt)) << "p";
          std::vector<double> p = out[0].to_doubles();
          for (int64_t i = 0; i < C; ++i) EXPECT_EQ(p[size_t(C + i)], 0.0) << "ignored row, column " << i;
        }
}

}  // namespace
}  // namespace lmtune::test
