// A product with a gated activation in its epilogue (see matmul_gated.h): shape checks, the composition both
// backends fall back to, and the vjp/jvp written with the product's and the gated activation's.
#include "core/ops/matmul_gated.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/view.h"

namespace lmtune {

Tensor MatmulGated::product(const std::vector<Tensor>& in, DType dtype) const {
  const Tensor &a = in[0], &b = in[1];
  if (low_rank) {
    const Tensor &u = in[bias ? 3 : 2], &v = in[bias ? 4 : 3];
    return bias ? ops::matmul_add(a, b, in[2], u, v, alpha, dtype) : ops::matmul_low_rank(a, b, u, v, alpha, dtype);
  }
  return bias ? ops::matmul_add(a, b, in[2], dtype) : ops::matmul(a, b, dtype);
}

// The product rounded to the output's dtype, then the activation of its halves into out.
void MatmulGated::compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const {
  NoGrad no_grad;  // the product is a temporary of this evaluation, not a node of the tape
  const Tensor y = product(in, out[0].dtype());
  const int64_t F = out[0].dim(1);
  GatedActivation gated(act);
  eval_on(out[0].device(), gated, {ops::slice(y, 1, 0, F), ops::slice(y, 1, F, 2 * F)}, out);
}

// The product's cotangent is the gated activation's [d_gate | d_up] (at the recomputed product); from there the
// matmul gradients, the bias's summed over rows.
std::vector<Tensor> MatmulGated::vjp(const Node& node, const std::vector<Tensor>& cot,
                                     const std::vector<bool>& wanted) {
  using namespace ops;
  std::vector<Tensor> r(node.inputs.size());
  if (!cot[0].defined()) return r;
  const std::vector<Tensor>& in = node.inputs;
  const Tensor y = product(in, node.output_dtypes[0]);
  const int64_t F = node.output_shapes[0][1];
  const std::vector<Tensor> d = apply(std::make_shared<GatedActivationBackward>(act),
                                      {slice(y, 1, 0, F), slice(y, 1, F, 2 * F), cot[0]},
                                      {{{y.dim(0), F}, y.dtype()}, {{y.dim(0), F}, y.dtype()}});
  const Tensor g = concat({d[0], d[1]}, 1);
  const Tensor &a = in[0], &b = in[1];
  if (wanted[0]) r[0] = ops::cast(matmul(g, transpose(b)), a.dtype());
  if (wanted[1]) r[1] = ops::cast(matmul(transpose(ops::cast(a, g.dtype())), g), b.dtype());
  if (bias && wanted[2]) r[2] = ops::cast(sum_to_shape(g, in[2].shape()), in[2].dtype());
  if (low_rank) {
    const size_t iu = bias ? 3 : 2, iv = iu + 1;
    const Tensor &u = in[iu], &v = in[iv];
    if (wanted[iu]) r[iu] = ops::cast(matmul(g, transpose(v), g.dtype(), alpha), u.dtype());
    if (wanted[iv]) r[iv] = ops::cast(matmul(transpose(ops::cast(u, g.dtype())), g, g.dtype(), alpha), v.dtype());
  }
  return r;
}

// d(act(gate) up) = act'(gate) up ġ + act(gate) u̇ with [ġ | u̇] the product's tangent: the backward kernel's
// d_gate at g = ġ, plus the forward kernel at (gate, u̇).
std::vector<Tensor> MatmulGated::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const std::vector<Tensor>& in = node.inputs;
  const DType out = node.output_dtypes[0];
  const Tensor &a = in[0], &b = in[1];
  Tensor dy;
  auto acc = [&](const Tensor& term) { dy = dy.defined() ? add(dy, term) : term; };
  if (t[0].defined()) acc(matmul(ops::cast(t[0], a.dtype()), b, out));
  if (t[1].defined()) acc(matmul(a, ops::cast(t[1], b.dtype()), out));
  const int64_t M = a.dim(0), F = node.output_shapes[0][1];
  if (bias && t[2].defined()) acc(contiguous(expand(ops::cast(t[2], out), {M, 2 * F})));
  if (low_rank) {
    const size_t iu = bias ? 3 : 2, iv = iu + 1;
    if (t[iu].defined()) acc(matmul(ops::cast(t[iu], in[iu].dtype()), in[iv], out, alpha));
    if (t[iv].defined()) acc(matmul(in[iu], ops::cast(t[iv], in[iv].dtype()), out, alpha));
  }
  if (!dy.defined()) return {Tensor()};
  const Tensor y = product(in, out);
  const Tensor gate = slice(y, 1, 0, F), up = slice(y, 1, F, 2 * F);
  const Tensor from_gate = apply(std::make_shared<GatedActivationBackward>(act), {gate, up, slice(dy, 1, 0, F)},
                                 {{{M, F}, out}, {{M, F}, out}})[0];
  const Tensor from_up =
      apply1(std::make_shared<GatedActivation>(act), {gate, slice(dy, 1, F, 2 * F)}, {{M, F}, out});
  return {add(from_gate, from_up)};
}

namespace ops {

Tensor matmul_gated(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& u, const Tensor& v,
                    float alpha, GateActivation act, DType out_dtype) {
  const bool low_rank = u.defined() || v.defined();
  auto shapes = [&] {
    return to_string(a.shape()) + " x " + to_string(b.shape()) +
           (bias.defined() ? " + " + to_string(bias.shape()) : std::string()) +
           (low_rank ? " + " + to_string(u.shape()) + " x " + to_string(v.shape()) : std::string());
  };
  auto float_operand = [](const Tensor& t) { return t.defined() && is_float(t.dtype()); };
  if (!float_operand(a) || !float_operand(b) || (bias.defined() && !float_operand(bias)) ||
      (low_rank && (!float_operand(u) || !float_operand(v))))
    throw ShapeError("matmul_gated: expected float operands, got " + shapes());
  if (a.ndim() != 2 || b.ndim() != 2 || b.dim(0) != a.dim(1) || b.dim(1) % 2 != 0)
    throw ShapeError("matmul_gated: shapes do not fit a [M, K] x b [K, 2F]: " + shapes());
  const int64_t M = a.dim(0), N = b.dim(1);
  if (bias.defined() && !(bias.ndim() == 1 && bias.dim(0) == N))
    throw ShapeError("matmul_gated: the bias must be [2F]: " + shapes());
  if (low_rank && (u.ndim() != 2 || v.ndim() != 2 || u.dim(0) != M || v.dim(0) != u.dim(1) || v.dim(1) != N))
    throw ShapeError("matmul_gated: the low-rank term must be u [M, R] x v [R, 2F]: " + shapes());
  if (!is_float(out_dtype)) throw ShapeError("matmul_gated: the output dtype must be a float type");
  auto gemm_ready = [](const Tensor& t) { return t.strides()[0] == 1 || t.strides()[1] == 1 ? t : contiguous(t); };
  std::vector<Tensor> in{gemm_ready(a), gemm_ready(b)};
  if (bias.defined()) in.push_back(bias);
  if (low_rank) in.insert(in.end(), {gemm_ready(u), gemm_ready(v)});
  return apply1(std::make_shared<MatmulGated>(gate_unary_op(act), bias.defined(), low_rank, alpha), in,
                {{M, N / 2}, out_dtype});
}

}  // namespace ops
}  // namespace lmtune
