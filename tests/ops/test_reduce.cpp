// Reductions: sum (several axes, keepdims), mean, max, logsumexp, argmax and top-k.
#include "core/error.h"
#include "core/ops/optimizer.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

TEST_P(OpTest, SumMeanMaxLogsumexp) {
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l));
      Tensor x = make_input({3, 7, 65}, dt, dev(), 51, l);
      ref::Array rx = ref::of(x);
      EXPECT_TRUE(close(ops::sum(x, {-1}), ref::sum(rx, {2}, false), dt));
      EXPECT_TRUE(close(ops::sum(x, {0, 2}, true), ref::sum(rx, {0, 2}, true), dt));
      EXPECT_TRUE(close(ops::sum_all(x), ref::sum(rx, {0, 1, 2}, false), dt));
      ref::Array m = ref::unary(ref::sum(rx, {1}, false), [](double v) { return v / 7; });
      EXPECT_TRUE(close(ops::mean(x, {1}), m, dt));
      EXPECT_TRUE(close(ops::max(x, 1), ref::drop_axes(ref::reduce(rx, 1, ref::fold_max), {1}), dt));
      EXPECT_TRUE(close(ops::max(x, -1, true), ref::reduce(rx, 2, ref::fold_max), dt));
      EXPECT_TRUE(close(ops::logsumexp(x, 0), ref::drop_axes(ref::reduce(rx, 0, ref::fold_logsumexp), {0}), dt));
    }
}

TEST_P(OpTest, ArgmaxAndTopk) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({7, 33}, dt, dev(), 52, Layout::transposed);
    ref::Array rx = ref::of(x);
    std::vector<int32_t> am = ops::argmax(x, -1).to_ints();
    auto [vals, idx] = ops::topk(x, 5);
    std::vector<double> rv = vals.to_doubles();
    std::vector<int32_t> ri = idx.to_ints();
    for (int64_t r = 0; r < 7; ++r) {
      std::vector<std::pair<double, int>> row;
      for (int c = 0; c < 33; ++c) row.push_back({-rx[r * 33 + c], c});  // ascending = largest first, ties by index
      std::sort(row.begin(), row.end());
      EXPECT_EQ(am[size_t(r)], row[0].second);
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(ri[size_t(r * 5 + k)], row[size_t(k)].second);
        EXPECT_EQ(rv[size_t(r * 5 + k)], -row[size_t(k)].first);
      }
    }
  }
}

// The gradient norm's sum of squares over many tensors: mixed dtypes, a tensor longer than one 8192-element chunk,
// a view at an offset, a strided view (copied first), an empty tensor; on Vulkan also with one or two buffers per
// dispatch (the grouping by buffer).
TEST_P(OpTest, SumOfSquaresManyTensors) {
  Tensor big = make_input({20001}, DType::f32, dev(), 91);
  Tensor base = make_input({9, 33}, DType::f32, dev(), 92);
  std::vector<Tensor> xs = {make_input({7, 5}, DType::f32, dev(), 93),  big,
                            make_input({3, 65}, DType::bf16, dev(), 94), make_input({17}, DType::f16, dev(), 95),
                            ops::slice(base, 0, 4, 9),                   ops::transpose(make_input({6, 11}, DType::f32, dev(), 96)),
                            Tensor::zeros({0, 3}, DType::f32, dev())};
  double want = 0;
  for (const Tensor& x : xs)
    for (double v : x.to_doubles()) want += v * v;
  for (int max_buffers : {8, 2, 1}) {
    LMTUNE_CASE("max_buffers " << max_buffers);
    Tensor got = ops::sum_of_squares(xs, max_buffers);
    EXPECT_EQ(got.dtype(), DType::f32);
    EXPECT_EQ(got.shape(), Shape{});
    EXPECT_NEAR(double(got.item()), want, 1e-5 * want);
  }
  EXPECT_THROW(ops::sum_of_squares({}), ShapeError);
  EXPECT_THROW(ops::sum_of_squares({Tensor::from_ints({1, 2}, {2}, dev())}), ShapeError);
}

}  // namespace
}  // namespace lmtune::test
