// Views and layout ops: reshape (viewable and copying), transpose, permute, slice with step, expand,
// contiguous, cast between dtypes, concat and sum_to_shape.
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

TEST_P(OpTest, ReshapeTransposePermute) {
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l));
      Tensor x = make_input({3, 7, 5}, dt, dev(), 41, l);
      ref::Array rx = ref::of(x);
      EXPECT_TRUE(close(ops::reshape(x, {7, -1}), ref::reshape(rx, {7, 15}), 0.0));
      EXPECT_TRUE(close(ops::reshape(x, {105}), ref::reshape(rx, {105}), 0.0));
      EXPECT_TRUE(close(ops::transpose(x, 0, 2), ref::transpose(rx, 0, 2), 0.0));
      EXPECT_TRUE(close(ops::permute(x, {1, 2, 0}), ref::permute(rx, {1, 2, 0}), 0.0));
      EXPECT_TRUE(close(ops::contiguous(ops::permute(x, {2, 0, 1})), ref::permute(rx, {2, 0, 1}), 0.0));
      EXPECT_TRUE(ops::contiguous(x).is_contiguous());
    }
}

TEST_P(OpTest, SliceExpandConcat) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({7, 33}, dt, dev(), 42, Layout::transposed);
    ref::Array rx = ref::of(x);
    EXPECT_TRUE(close(ops::slice(x, 1, 3, 30, 4), ref::slice(rx, 1, 3, 30, 4), 0.0));
    EXPECT_TRUE(close(ops::slice(x, 0, -3, 7), ref::slice(rx, 0, 4, 7, 1), 0.0));
    Tensor row = make_input({1, 33}, dt, dev(), 43);
    EXPECT_TRUE(close(ops::expand(row, {5, 33}), ref::expand(ref::of(row), {5, 33}), 0.0));
    EXPECT_TRUE(close(ops::contiguous(ops::expand(row, {2, 3, 33})), ref::expand(ref::of(row), {2, 3, 33}), 0.0));
    Tensor y = make_input({3, 33}, dt, dev(), 44, Layout::strided);
    EXPECT_TRUE(close(ops::concat({x, y, row}, 0), ref::concat({rx, ref::of(y), ref::of(row)}, 0), 0.0));
    Tensor z = make_input({7, 1}, dt, dev(), 45);
    EXPECT_TRUE(close(ops::concat({z, x}, -1), ref::concat({ref::of(z), rx}, 1), 0.0));
  }
}

TEST_P(OpTest, CastBetweenDtypes) {
  for (DType from : float_dtypes())
    for (DType to : float_dtypes()) {
      LMTUNE_CASE(dtype_name(from) << " -> " << dtype_name(to));
      Tensor x = make_input({7, 33}, from, dev(), 46, Layout::strided);
      Tensor y = ops::cast(x, to);
      EXPECT_EQ(y.dtype(), to);
      // Values already representable in `from`; the cast rounds once to `to`.
      EXPECT_TRUE(close(y, ref::of(x), std::max(tolerance(from), tolerance(to))));
    }
  Tensor i = Tensor::from_ints({1, -2, 16777217}, {3}, dev());
  EXPECT_EQ(ops::contiguous(ops::slice(i, 0, 0, 3, 2)).to_ints(), (std::vector<int32_t>{1, 16777217}));
}

TEST_P(OpTest, SumToShape) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({2, 7, 33}, dt, dev(), 47, Layout::transposed);
    ref::Array rx = ref::of(x);
    EXPECT_TRUE(close(ops::sum_to_shape(x, {33}), ref::reshape(ref::sum(rx, {0, 1}, true), {33}), dt));
    EXPECT_TRUE(close(ops::sum_to_shape(x, {7, 1}), ref::reshape(ref::sum(rx, {0, 2}, true), {7, 1}), dt));
  }
}

}  // namespace
}  // namespace lmtune::test

namespace lmtune::test {
namespace {

// The dim folding both backends' strided kernels start from: size-1 dims dropped, dims merged only where every
// tensor allows it, a broadcast (stride 0) dim kept apart from the dims it cannot merge with.
TEST(CollapseDims, MergesWhatEveryTensorAllows) {
  Shape s{2, 1, 3, 4};
  std::vector<Strides> st{{12, 12, 4, 1}, {12, 99, 4, 1}};
  collapse_dims(s, st);
  EXPECT_EQ(s, (Shape{24}));
  EXPECT_EQ(st, (std::vector<Strides>{{1}, {1}}));
  s = {2, 3, 4};
  st = {{12, 4, 1}, {0, 4, 1}};  // the second broadcast over dim 0
  collapse_dims(s, st);
  EXPECT_EQ(s, (Shape{2, 12}));
  EXPECT_EQ(st, (std::vector<Strides>{{12, 1}, {0, 1}}));
  s = {3, 4};
  st = {{1, 3}};  // transposed: nothing merges
  collapse_dims(s, st);
  EXPECT_EQ(s, (Shape{3, 4}));
  s = {1, 1};
  st = {{5, 5}};
  collapse_dims(s, st);
  EXPECT_TRUE(s.empty());
  EXPECT_TRUE(st[0].empty());
}

}  // namespace
}  // namespace lmtune::test
