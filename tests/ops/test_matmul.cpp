// matmul and linear: odd sizes, broadcast batch dims, transposed / strided / expanded operands, all dtypes.
#include "core/autodiff.h"
#include "core/error.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

// Matmul error grows with K: compare by NMSE, which is scale-free, with dtype thresholds.
TEST_P(OpTest, MatmulShapesAndLayouts) {
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{1, 1}, {1, 1}},     {{3, 7}, {7, 5}},         {{33, 65}, {65, 17}},     {{2, 3, 7}, {2, 7, 5}},
      {{2, 1, 7, 5}, {3, 5, 4}}, {{4, 33, 7}, {7, 65}}, {{1, 3, 65}, {5, 65, 1}}, {{7, 0}, {0, 3}}};
  for (DType dt : float_dtypes())
    for (Layout la : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded})
      for (Layout lb : {Layout::contiguous, Layout::transposed, Layout::strided})
        for (const auto& [sa, sb] : shapes) {
          LMTUNE_CASE(dtype_name(dt) << " a " << layout_name(la) << " " << to_string(sa) << " b " << layout_name(lb)
                                     << " " << to_string(sb));
          Tensor a = make_input(sa, dt, dev(), 61, la);
          Tensor b = make_input(sb, dt, dev(), 62, lb);
          Tensor c = ops::matmul(a, b);
          EXPECT_EQ(c.dtype(), dt);
          EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), dt));
        }
}

TEST_P(OpTest, MatmulMixedDtypesAndLargeBatch) {
  Tensor a = make_input({16, 9, 33}, DType::bf16, dev(), 63);
  Tensor b = make_input({16, 33, 17}, DType::f32, dev(), 64, Layout::transposed);
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), DType::bf16));
  // Big enough for OpenBLAS's own threading.
  Tensor x = make_input({130, 257}, DType::f32, dev(), 65);
  Tensor y = make_input({257, 129}, DType::f32, dev(), 66, Layout::transposed);
  EXPECT_TRUE(close(ops::matmul(x, y), ref::matmul(ref::of(x), ref::of(y)), DType::f32));
}

// f32 results of 16-bit operands (the logits of the fused loss): not rounded to the operands' dtype, and the
// gradients (a 16-bit cotangent, as under autocast) match f32 arithmetic on the same operand values.
TEST_P(OpTest, MatmulOutputDtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor a = make_input({37, 65}, dt, dev(), 71);
    Tensor b = make_input({65, 19}, dt, dev(), 72, Layout::transposed);
    Tensor c = ops::matmul(a, b, DType::f32);
    EXPECT_EQ(c.dtype(), DType::f32);
    EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), DType::f32));
    Tensor w = make_input({37, 19}, DType::f32, dev(), 73);
    auto loss = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::sum_all(ops::mul(ops::matmul(in[0], in[1], DType::f32), w))};
    };
    auto [value, grads] = value_and_grad(loss)({a, b});
    EXPECT_EQ(grads[0].dtype(), dt);
    // d/da = w bᵀ, d/db = aᵀ w (w rounded to dt first, as the 16-bit cotangent is).
    ref::Array w16 = ref::of(ops::cast(w, dt));
    EXPECT_TRUE(close(grads[0], ref::matmul(w16, ref::transpose(ref::of(b), 0, 1)), dt));
    EXPECT_TRUE(close(grads[1], ref::matmul(ref::transpose(ref::of(a), 0, 1), w16), dt));
  }
  EXPECT_THROW(ops::matmul(make_input({2, 3}, DType::f32, dev(), 74), make_input({3, 2}, DType::f32, dev(), 75),
                           DType::i32),
               lmtune::ShapeError);
}

TEST_P(OpTest, Linear) {
  for (DType dt : float_dtypes())
    for (Layout lx : {Layout::contiguous, Layout::transposed, Layout::strided}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(lx));
      Tensor x = make_input({2, 7, 33}, dt, dev(), 67, lx);
      Tensor w = make_input({5, 33}, dt, dev(), 68);
      Tensor b = make_input({5}, dt, dev(), 69);
      ref::Array rb = ref::of(b);
      EXPECT_TRUE(close(ops::linear(x, w), ref::linear(ref::of(x), ref::of(w), nullptr), dt));
      EXPECT_TRUE(close(ops::linear(x, w, b), ref::linear(ref::of(x), ref::of(w), &rb), dt));
      Tensor v = make_input({33}, dt, dev(), 70);
      EXPECT_TRUE(close(ops::linear(v, w, b),
                        ref::reshape(ref::linear(ref::reshape(ref::of(v), {1, 33}), ref::of(w), &rb), {5}), dt));
    }
}

}  // namespace
}  // namespace lmtune::test
