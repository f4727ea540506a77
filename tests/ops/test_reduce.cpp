// Reductions: sum (several axes, keepdims), mean, max, logsumexp, argmax and top-k.
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

}  // namespace
}  // namespace lmtune::test
