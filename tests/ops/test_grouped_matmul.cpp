// Products by groups of rows (the experts of a mixture-of-experts layer): forward and gradients against double
// references on every device, odd sizes, empty groups, all float dtypes.
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/grouped_matmul.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

// y[r] = x[r] op(W_g) for the group g holding row r; op(W) = Wᵀ when transposed.
ref::Array grouped_ref(const ref::Array& x, const ref::Array& w, const std::vector<int64_t>& off, bool transposed) {
  const int64_t P = w.shape[1], Q = w.shape[2], K = x.shape[1], cols = transposed ? P : Q;
  ref::Array y(Shape{x.shape[0], cols});
  for (size_t g = 0; g + 1 < off.size(); ++g)
    for (int64_t r = off[g]; r < off[g + 1]; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += x[r * K + k] * (transposed ? w[int64_t(g) * P * Q + c * Q + k] : w[int64_t(g) * P * Q + k * Q + c]);
        y[r * cols + c] = s;
      }
  return y;
}

struct GroupCase {
  std::vector<int64_t> offsets;  // rows per group: empty groups, one row, many rows
  int64_t P, Q;
};

const std::vector<GroupCase>& group_cases() {
  static const std::vector<GroupCase> cases{
      {{0, 3, 3, 40, 41, 77}, 33, 20}, {{0, 0, 9}, 8, 65}, {{0, 5}, 16, 16}, {{0, 2, 4, 6, 8}, 7, 3},
      // sizes the one-dispatch kernel of cooperative-matrix-2 devices takes: several and partial row tiles
      {{0, 0, 130, 131, 300}, 40, 264}};
  return cases;
}

TEST_P(OpTest, GroupedMatmulForward) {
  for (const GroupCase& c : group_cases())
    for (bool t : {true, false})
      for (DType dt : float_dtypes()) {
        const int64_t G = int64_t(c.offsets.size()) - 1, R = c.offsets.back(), K = t ? c.Q : c.P;
        LMTUNE_CASE("rows " << R << " groups " << G << " w [" << c.P << ", " << c.Q << "] "
                            << (t ? "transposed " : "") << dtype_name(dt));
        Tensor x = make_input({R, K}, dt, dev(), 11, Layout::strided);
        Tensor w = make_input({G, c.P, c.Q}, dt, dev(), 12);
        Tensor y = ops::grouped_matmul(x, w, c.offsets, t);
        EXPECT_EQ(y.shape(), (Shape{R, t ? c.P : c.Q}));
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(close(y, grouped_ref(ref::of(x), ref::of(w), c.offsets, t), dt));
      }
}

// d/dx = g op(W_g)ᵀ and d/dW_g = (rows of g)ᵀ x or its transpose, zero for groups without rows.
TEST_P(OpTest, GroupedMatmulGradients) {
  for (const GroupCase& c : group_cases())
    for (bool t : {true, false}) {
      const int64_t G = int64_t(c.offsets.size()) - 1, R = c.offsets.back(), K = t ? c.Q : c.P;
      const int64_t cols = t ? c.P : c.Q;
      LMTUNE_CASE("rows " << R << " groups " << G << (t ? " transposed" : ""));
      Tensor x = make_input({R, K}, DType::f32, dev(), 21);
      Tensor w = make_input({G, c.P, c.Q}, DType::f32, dev(), 22);
      Tensor probe = make_input({R, cols}, DType::f32, dev(), 23);
      auto loss = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::sum_all(ops::mul(ops::grouped_matmul(in[0], in[1], c.offsets, t), probe))};
      };
      auto [value, grads] = value_and_grad(loss)({x, w});
      const ref::Array rx = ref::of(x), rw = ref::of(w), rp = ref::of(probe);
      ref::Array dx(Shape{R, K}), dw(Shape{G, c.P, c.Q});
      for (size_t g = 0; g + 1 < c.offsets.size(); ++g)
        for (int64_t r = c.offsets[g]; r < c.offsets[g + 1]; ++r)
          for (int64_t o = 0; o < cols; ++o)
            for (int64_t k = 0; k < K; ++k) {
              const int64_t wi = int64_t(g) * c.P * c.Q + (t ? o * c.Q + k : k * c.Q + o);
              dx[r * K + k] += rp[r * cols + o] * rw[wi];
              dw[wi] += rp[r * cols + o] * rx[r * K + k];
            }
      EXPECT_TRUE(close(grads[0], dx, DType::f32));
      EXPECT_TRUE(close(grads[1], dw, DType::f32));
    }
}

TEST_P(OpTest, GroupedMatmulRefusesBadArguments) {
  Tensor x = make_input({4, 3}, DType::f32, dev(), 41), w = make_input({2, 5, 3}, DType::f32, dev(), 42);
  EXPECT_THROW(ops::grouped_matmul(x, w, {0, 2, 3}, true), ShapeError);     // offsets end before the rows
  EXPECT_THROW(ops::grouped_matmul(x, w, {0, 3, 2, 4}, true), ShapeError);  // one offset too many, falling
  EXPECT_THROW(ops::grouped_matmul(x, w, {0, 2, 4}, false), ShapeError);    // K = 3 is not P = 5
}

}  // namespace
}  // namespace lmtune::test
