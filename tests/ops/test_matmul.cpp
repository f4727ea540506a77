// matmul and linear: odd sizes, broadcast batch dims, transposed / strided / expanded operands, all dtypes.
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
