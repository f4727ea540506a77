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

// 16-bit activations times an f32 master weight: the product on the 16-bit path, the weight's gradient in f32
// (as accurate as f32 arithmetic on the same 16-bit operands, not rounded to bf16).
TEST_P(OpTest, AutocastLinear) {
  for (DType dt : {DType::bf16, DType::f16}) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({3, 13, 33}, dt, dev(), 76);
    Tensor w = make_input({17, 33}, DType::f32, dev(), 77);
    Tensor c = ops::cast(make_input({3, 13, 17}, DType::f32, dev(), 78), dt);  // the cotangent, in x's dtype
    Tensor y = ops::autocast_linear(x, w);
    EXPECT_EQ(y.dtype(), dt);
    ref::Array w16 = ref::of(ops::cast(w, dt));
    EXPECT_TRUE(close(y, ref::linear(ref::of(x), w16, nullptr), dt));
    auto loss = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::sum_all(ops::cast(ops::mul(ops::autocast_linear(in[0], in[1]), c), DType::f32))};
    };
    auto [value, grads] = value_and_grad(loss)({x, w});
    ASSERT_EQ(grads[1].dtype(), DType::f32);
    ref::Array x2 = ref::reshape(ref::of(x), {39, 33}), c2 = ref::reshape(ref::of(c), {39, 17});
    EXPECT_TRUE(close(grads[1], ref::matmul(ref::transpose(c2, 0, 1), x2), DType::f32));
    EXPECT_TRUE(close(grads[0], ref::reshape(ref::matmul(c2, w16), {3, 13, 33}), dt));
    // Forward-mode agrees with the reverse-mode gradient: <J t, c> = <t, Jᵀ c>.
    Tensor tw = make_input({17, 33}, DType::f32, dev(), 79);
    auto f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::autocast_linear(in[0], in[1])}; };
    Tensor jt = jvp(f, {x, w}, {Tensor::zeros(x.shape(), dt, dev()), tw}).second[0];
    double lhs = ops::sum_all(ops::mul(ops::cast(jt, DType::f32), ops::cast(c, DType::f32))).item();
    double rhs = ops::sum_all(ops::mul(grads[1], tw)).item();
    EXPECT_NEAR(lhs, rhs, 2e-2 * std::abs(rhs) + 1e-3);
  }
  EXPECT_THROW(ops::autocast_linear(make_input({2, 3}, DType::f32, dev(), 80), make_input({4, 3}, DType::f32, dev(), 81)),
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
