// Products by groups of rows (the experts of a mixture-of-experts layer): forward and gradients against double
// references on every device, odd sizes, empty groups, all float dtypes.
#include <cmath>
#include <optional>

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

// Row r = x[r / x_div] W[ids[r]]ᵀ, or act(gate) * up of its halves: the products of a mixture of experts routed on
// the device. K = 24 and 136 are the sizes the one-dispatch Vulkan kernel takes (multiples of 8), K = 21 the
// fallback's; ids repeat, and cover the first and last matrix.
ref::Array by_id_ref(const ref::Array& x, const ref::Array& w, const std::vector<int32_t>& ids, int64_t x_div,
                     std::optional<ops::GateActivation> act) {
  const int64_t P = w.shape[1], K = w.shape[2], R = int64_t(ids.size()), cols = act ? P / 2 : P;
  auto product = [&](int64_t r, int64_t c) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += x[(r / x_div) * K + k] * w[int64_t(ids[size_t(r)]) * P * K + c * K + k];
    return s;
  };
  ref::Array y(Shape{R, cols});
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      if (!act) {
        y[r * cols + c] = product(r, c);
        continue;
      }
      const double g = product(r, c), u = product(r, c + cols);
      const double a = *act == ops::GateActivation::silu
                           ? g / (1 + std::exp(-g))
                           : 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
      y[r * cols + c] = a * u;
    }
  return y;
}

TEST_P(OpTest, MatmulByIdForward) {
  struct Case {
    int64_t X, x_div, E, P, K;
  };
  for (const Case& c : {Case{1, 4, 6, 40, 24}, Case{3, 2, 5, 18, 136}, Case{2, 1, 3, 10, 21}, Case{5, 3, 9, 64, 32}})
    for (std::optional<ops::GateActivation> act :
         {std::optional<ops::GateActivation>(), std::optional(ops::GateActivation::silu),
          std::optional(ops::GateActivation::gelu_tanh)})
      for (DType dt : float_dtypes()) {
        LMTUNE_CASE("x [" << c.X << ", " << c.K << "] x_div " << c.x_div << " w [" << c.E << ", " << c.P << ", "
                          << c.K << "] " << (act ? "gated " : "") << dtype_name(dt));
        const int64_t R = c.X * c.x_div;
        std::vector<int32_t> ids(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) ids[size_t(r)] = int32_t((r * 7 + r / 2) % c.E);
        ids.front() = 0, ids.back() = int32_t(c.E - 1);
        Tensor x = make_input({c.X, c.K}, dt, dev(), 21), w = make_input({c.E, c.P, c.K}, dt, dev(), 22);
        Tensor y = ops::matmul_by_id(x, w, Tensor::from_ints(ids, {R}, dev()), c.x_div, act);
        EXPECT_EQ(y.shape(), (Shape{R, act ? c.P / 2 : c.P}));
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(close(y, by_id_ref(ref::of(x), ref::of(w), ids, c.x_div, act), dt));
      }
}

TEST_P(OpTest, MatmulByIdRefusesBadArguments) {
  Tensor x = make_input({2, 8}, DType::f32, dev(), 41), w = make_input({3, 6, 8}, DType::f32, dev(), 42);
  const Tensor ids = Tensor::from_ints({0, 1, 2, 0}, {4}, dev());
  EXPECT_THROW(ops::matmul_by_id(x, w, ids, 1), ShapeError);  // 4 ids for 2 rows of x
  EXPECT_THROW(ops::matmul_by_id(x, make_input({3, 6, 7}, DType::f32, dev(), 43), ids, 2), ShapeError);  // K
  EXPECT_THROW(ops::matmul_by_id(x, make_input({3, 5, 8}, DType::f32, dev(), 44), ids, 2, ops::GateActivation::silu),
               ShapeError);  // P odd with a gate
  EXPECT_THROW(ops::matmul_by_id(x, w, make_input({4}, DType::f32, dev(), 45), 2), ShapeError);  // float ids
  EXPECT_NO_THROW(ops::matmul_by_id(x, w, ids, 2));
}

}  // namespace
}  // namespace lmtune::test
