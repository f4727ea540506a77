// Row gathers with inverses (how a mixture-of-experts layer lays tokens out by expert and gathers the results
// back): forward and gradient against double references on every device, all float dtypes.
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/gather_rows.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

// y[r] = x[index[r]].
ref::Array gather_ref(const ref::Array& x, const std::vector<int32_t>& index) {
  const int64_t C = x.shape[1];
  ref::Array y(Shape{int64_t(index.size()), C});
  for (size_t r = 0; r < index.size(); ++r)
    for (int64_t c = 0; c < C; ++c) y[int64_t(r) * C + c] = x[index[r] * C + c];
  return y;
}

// d/dx[n] = Σ over the rows r that took n of g[r].
ref::Array gather_grad_ref(const ref::Array& g, const std::vector<int32_t>& index, int64_t N) {
  const int64_t C = g.shape[1];
  ref::Array dx(Shape{N, C});
  for (size_t r = 0; r < index.size(); ++r)
    for (int64_t c = 0; c < C; ++c) dx[index[r] * C + c] += g[int64_t(r) * C + c];
  return dx;
}

TEST_P(OpTest, GatherRowsAndItsGradient) {
  struct Case {
    std::vector<int32_t> index;
    int64_t uses;
  };
  const std::vector<Case> cases{
      {{4, 0, 2, 1, 4, 3, 0, 2, 3, 1}, 2},  // each of 5 rows twice (a token to k = 2 experts)
      {{4, 1, 0, 2, 3}, 1}};                // a permutation (expert rows back to their tokens)
  for (const Case& c : cases)
    for (DType dt : float_dtypes()) {
      LMTUNE_CASE(c.index.size() << " rows, uses " << c.uses << " " << dtype_name(dt));
      const int64_t R = int64_t(c.index.size());
      Tensor x = make_input({5, 33}, dt, dev(), 31, Layout::transposed);
      Tensor y = ops::gather_rows(x, c.index, c.uses);
      EXPECT_TRUE(close(y, gather_ref(ref::of(x), c.index), 0.0));
      Tensor probe = make_input({R, 33}, dt, dev(), 32);
      auto loss = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::sum_all(ops::mul(ops::gather_rows(in[0], c.index, c.uses), probe))};
      };
      auto [value, grads] = value_and_grad(loss)({x});
      EXPECT_EQ(grads[0].dtype(), dt);
      EXPECT_TRUE(close(grads[0], gather_grad_ref(ref::of(probe), c.index, 5), dt));
    }
}

TEST_P(OpTest, GatherRowsRefusesBadIndices) {
  Tensor x = make_input({4, 3}, DType::f32, dev(), 41);
  EXPECT_THROW(ops::gather_rows(x, {0, 1, 2, 4}, 1), ShapeError);   // row 4 of 4
  EXPECT_THROW(ops::gather_rows(x, {0, 1, -1, 3}, 1), ShapeError);  // negative
  EXPECT_THROW(ops::gather_rows(x, {0, 1, 1, 2}, 1), ShapeError);   // row 1 twice, row 3 never
  EXPECT_THROW(ops::gather_rows(x, {0, 1, 2}, 1), ShapeError);      // 3 indices for 4 rows
}

}  // namespace
}  // namespace lmtune::test
