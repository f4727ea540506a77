// Autocast linear (see autocast_linear.h).
#include "core/ops/autocast_linear.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/matmul.h"

namespace lmtune {
namespace {

bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }

// x [..., K] as the rows of a matrix [M, K].
Tensor rows(const Tensor& x) { return ops::reshape(x, {-1, x.dim(-1)}); }

}  // namespace

// The product goes straight into the output (a [M, N] view of it): computing ops::linear and copying the result
// in moved every LoRA up-product ([tokens, out features]) through memory twice more.
void AutocastLinear::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  weight_16 = ops::cast(in[1], x.dtype());
  std::vector<Tensor> product{ops::reshape(out[0], {-1, weight_16.dim(0)})};
  const std::vector<Tensor> operands{rows(x), ops::transpose(weight_16)};
  Matmul matmul;
  eval_on(x.device(), matmul, operands, product);
}

std::vector<Tensor> AutocastLinear::vjp(const Node& node, const std::vector<Tensor>& cot,
                                        const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor()};
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  Tensor dx, dw;
  if (wanted[0]) dx = matmul(g, weight_16.defined() ? weight_16 : cast(w, x.dtype()));  // [..., N] · [N, K]
  if (wanted[1]) dw = matmul(transpose(rows(g)), rows(x), DType::f32);  // [N, M] · [M, K], f32 result
  return {dx, dw};
}

std::vector<Tensor> AutocastLinear::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  Tensor r;
  if (t[0].defined()) r = linear(t[0], cast(w, x.dtype()));
  if (t[1].defined()) {
    Tensor rw = linear(x, cast(t[1], x.dtype()));
    r = r.defined() ? add(r, rw) : rw;
  }
  return {r};
}

namespace ops {

Tensor autocast_linear(const Tensor& x, const Tensor& weight) {
  if (!is_16bit(x.dtype()) || weight.dtype() != DType::f32 || weight.ndim() != 2 || x.ndim() < 1 ||
      x.dim(-1) != weight.dim(1))
    throw ShapeError("autocast_linear: expected f16/bf16 x [..., K] and f32 weight [N, K], got x " +
                     std::string(dtype_name(x.dtype())) + " " + to_string(x.shape()) + " and weight " +
                     std::string(dtype_name(weight.dtype())) + " " + to_string(weight.shape()));
  Shape out = x.shape();
  out.back() = weight.dim(0);
  return apply1(std::make_shared<AutocastLinear>(), {x, weight}, {out, x.dtype()});
}

}  // namespace ops
}  // namespace lmtune
