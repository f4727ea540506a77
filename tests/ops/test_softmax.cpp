// softmax / log_softmax over any axis (including -inf entries and all -inf rows) and cross-entropy.
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

}  // namespace
}  // namespace lmtune::test
