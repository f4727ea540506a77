// Products over groups of rows (see grouped_matmul.h).
#include "core/ops/grouped_matmul.h"

#include <algorithm>
#include <string>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"

namespace lmtune {
namespace {

// Rows [begin, begin + n) of a contiguous [R, C] tensor.
Tensor row_block(const Tensor& t, int64_t begin, int64_t n) {
  const int64_t C = t.dim(1);
  return t.view_as({n, C}, {C, 1}, t.offset() + begin * C);
}

// Matrix g of a contiguous [G, P, Q] tensor, as [P, Q] or (transposed view) [Q, P].
Tensor matrix(const Tensor& w, int64_t g, bool transposed) {
  const int64_t P = w.dim(1), Q = w.dim(2);
  const int64_t at = w.offset() + g * P * Q;
  return transposed ? w.view_as({Q, P}, {1, Q}, at) : w.view_as({P, Q}, {Q, 1}, at);
}

void check_offsets(const std::vector<int64_t>& offsets, int64_t groups, int64_t rows) {
  bool ok = int64_t(offsets.size()) == groups + 1 && offsets.front() == 0 && offsets.back() == rows;
  for (size_t g = 1; ok && g < offsets.size(); ++g) ok = offsets[g] >= offsets[g - 1];
  if (!ok)
    throw ShapeError("grouped_matmul: the group offsets must rise from 0 to the " + std::to_string(rows) +
                     " rows in " + std::to_string(groups + 1) + " entries, got " + std::to_string(offsets.size()) +
                     " entries from " + (offsets.empty() ? "-" : std::to_string(offsets.front())) + " to " +
                     (offsets.empty() ? "-" : std::to_string(offsets.back())));
}

}  // namespace

void GroupedMatmul::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &x = in[0], &w = in[1];
  Matmul matmul;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t n = offsets[g + 1] - offsets[g];
    if (n == 0) continue;
    const std::vector<Tensor> operands{row_block(x, offsets[g], n), matrix(w, int64_t(g), transposed)};
    std::vector<Tensor> product{row_block(out[0], offsets[g], n)};
    eval_on(x.device(), matmul, operands, product);
  }
}

std::vector<Tensor> GroupedMatmul::vjp(const Node& node, const std::vector<Tensor>& cot,
                                       const std::vector<bool>& wanted) {
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor()};
  const Tensor &x = node.inputs[0], &w = node.inputs[1];
  Tensor dx, dw;
  // y = x op(W): dx = g op(W)ᵀ, and dW = gᵀ x (transposed) or xᵀ g, block by block.
  if (wanted[0]) dx = ops::grouped_matmul(g, w, offsets, !transposed);
  if (wanted[1]) {
    const Tensor gc = ops::contiguous(g);
    const Tensor& a = transposed ? gc : x;
    const Tensor& b = transposed ? x : gc;
    dw = apply1(std::make_shared<GroupedOuter>(offsets), {a, b}, {w.shape(), w.dtype()});
  }
  return {dx, dw};
}

std::vector<Tensor> GroupedMatmul::jvp(const Node& node, const std::vector<Tensor>& t) {
  const Tensor &x = node.inputs[0], &w = node.inputs[1];
  Tensor r;
  if (t[0].defined()) r = ops::grouped_matmul(t[0], w, offsets, transposed);
  if (t[1].defined()) {
    const Tensor rw = ops::grouped_matmul(x, t[1], offsets, transposed);
    r = r.defined() ? ops::add(r, rw) : rw;
  }
  return {r};
}

void GroupedOuter::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &a = in[0], &b = in[1];
  Tensor& y = out[0];
  Matmul matmul;
  Copy copy;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t n = offsets[g + 1] - offsets[g];
    std::vector<Tensor> block{matrix(y, int64_t(g), false)};
    if (n == 0) {
      const std::vector<Tensor> zero{Tensor::zeros(block[0].shape(), y.dtype(), y.device())};
      eval_on(y.device(), copy, zero, block);
      continue;
    }
    const std::vector<Tensor> operands{ops::transpose(row_block(a, offsets[g], n)), row_block(b, offsets[g], n)};
    eval_on(y.device(), matmul, operands, block);
  }
}

// Each row's product on its own, the ids read back (the CPU, and Vulkan devices the one-dispatch kernel does not
// take).
void MatmulById::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &x = in[0], &w = in[1];
  const std::vector<int32_t> ids = in[2].to_ints();
  const int64_t E = w.dim(0), P = w.dim(1), R = int64_t(ids.size());
  NoGrad no_grad;  // the products are temporaries of this evaluation
  Tensor y = act ? Tensor::empty({R, P}, out[0].dtype(), x.device()) : out[0];
  Matmul matmul;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t id = std::clamp<int64_t>(ids[size_t(r)], 0, E - 1);  // as the kernel: clamped to the stack
    const std::vector<Tensor> operands{row_block(x, r / x_div, 1), matrix(w, id, true)};
    std::vector<Tensor> product{row_block(y, r, 1)};
    eval_on(x.device(), matmul, operands, product);
  }
  if (!act) return;
  GatedActivation gated(*act);
  eval_on(x.device(), gated, {ops::slice(y, 1, 0, P / 2), ops::slice(y, 1, P / 2, P)}, out);
}

namespace ops {

Tensor matmul_by_id(const Tensor& x, const Tensor& w, const Tensor& ids, int64_t x_div,
                    std::optional<GateActivation> act, std::optional<DType> out_dtype) {
  if (x.ndim() != 2 || w.ndim() != 3 || !is_float(x.dtype()) || !is_float(w.dtype()) || x.dim(1) != w.dim(2) ||
      ids.ndim() != 1 || ids.dtype() != DType::i32 || x_div < 1 || ids.dim(0) != x.dim(0) * x_div ||
      (act && w.dim(1) % 2 != 0) || (out_dtype && !is_float(*out_dtype)))
    throw ShapeError("matmul_by_id: expected float x [X, K], w [E, P, K]" + std::string(act ? " (P even)" : "") +
                     " and i32 ids [X x_div], got x " + to_string(x.shape()) + ", w " + to_string(w.shape()) +
                     ", ids " + to_string(ids.shape()) + " " + std::string(dtype_name(ids.dtype())) + ", x_div " +
                     std::to_string(x_div));
  const int64_t R = ids.dim(0), cols = act ? w.dim(1) / 2 : w.dim(1);
  return apply1(std::make_shared<MatmulById>(x_div, act ? std::optional(gate_unary_op(*act)) : std::nullopt),
                {contiguous(x), contiguous(w), contiguous(ids)}, {{R, cols}, out_dtype.value_or(x.dtype())});
}

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets, bool transposed) {
  if (x.ndim() != 2 || w.ndim() != 3 || !is_float(x.dtype()) || !is_float(w.dtype()) ||
      x.dim(1) != (transposed ? w.dim(2) : w.dim(1)))
    throw ShapeError("grouped_matmul: expected float x [R, K] and w [G, P, Q] with K = " +
                     std::string(transposed ? "Q" : "P") + ", got x " + to_string(x.shape()) + " and w " +
                     to_string(w.shape()));
  check_offsets(offsets, w.dim(0), x.dim(0));
  const int64_t cols = transposed ? w.dim(1) : w.dim(2);
  return apply1(std::make_shared<GroupedMatmul>(offsets, transposed), {contiguous(x), contiguous(w)},
                {{x.dim(0), cols}, x.dtype()});
}

}  // namespace ops
}  // namespace lmtune
