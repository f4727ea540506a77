// Softmax, log-softmax and cross-entropy: shape checks and vjp/jvp from the saved outputs.
#include "core/ops/softmax.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune {
namespace {


Tensor col(const Tensor& v) {  // [N] -> [N, 1]
  return ops::reshape(v, {v.dim(0), 1});
}

// Kernels see a contiguous tensor and reduce over its last axis; other axes are moved there and back.
Tensor softmax_any_axis(const Tensor& x, int axis, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  if (!is_float(x.dtype()) || x.ndim() == 0)
    throw ShapeError(std::string(op) + ": expected a float tensor with at least 1 dim, got " +
                     std::string(dtype_name(x.dtype())) + " " + to_string(x.shape()));
  int a = normalize_axis(axis, x.ndim(), op);
  int last = x.ndim() - 1;
  Tensor xt = ops::contiguous(a == last ? x : ops::transpose(x, a, last));
  Tensor y = apply1(std::make_shared<Softmax>(log), {xt}, {xt.shape(), x.dtype()});
  return a == last ? y : ops::transpose(y, a, last);
}

Tensor ce_grad(int ignore_index, const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g) {
  return apply1(std::make_shared<CrossEntropyGrad>(ignore_index),
                {logits, targets, ops::contiguous(lse), ops::contiguous(g)},
                {logits.shape(), logits.dtype()});
}

}  // namespace

// softmax: gx = y (g - Σ g y);  log_softmax: gx = g - exp(y) Σ g.
std::vector<Tensor> Softmax::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  using namespace ops;
  if (!cot[0].defined()) return {Tensor()};
  const Tensor& y = node.outputs[0];
  Tensor g = ops::cast(cot[0], y.dtype());
  Tensor gx = log ? sub(g, mul(exp(y), sum(g, {-1}, true))) : mul(y, sub(g, sum(mul(g, y), {-1}, true)));
  return {ops::cast(gx, node.input_dtypes[0])};
}

// The Jacobian is y-dependent but its structure matches the vjp's: J t = y (t - Σ y t), or t - Σ exp(y) t.
std::vector<Tensor> Softmax::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  if (!t[0].defined()) return {Tensor()};
  const Tensor& y = node.outputs[0];
  Tensor tx = ops::cast(t[0], y.dtype());
  Tensor ty = log ? sub(tx, sum(mul(exp(y), tx), {-1}, true)) : mul(y, sub(tx, sum(mul(y, tx), {-1}, true)));
  return {ty};
}

std::vector<Tensor> CrossEntropy::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  if (!wanted[0]) return {Tensor(), Tensor()};
  const Tensor& logits = node.inputs[0];
  const Tensor& targets = node.inputs[1];
  const Tensor& lse = node.outputs[1];
  Tensor gx;
  if (cot[0].defined()) gx = ce_grad(ignore_index, logits, targets, lse, ops::cast(cot[0], DType::f32));
  if (cot[1].defined()) {  // d lse / d logits = softmax(logits)
    Tensor p = mul(exp(sub(ops::cast(logits, DType::f32), col(lse))), col(ops::cast(cot[1], DType::f32)));
    gx = gx.defined() ? ops::cast(add(ops::cast(gx, DType::f32), p), logits.dtype()) : ops::cast(p, logits.dtype());
  }
  return {gx, Tensor()};
}

// t_loss = Σ_V CrossEntropyGrad(g = 1) t (rows ignored give 0), t_lse = Σ_V softmax(logits) t.
std::vector<Tensor> CrossEntropy::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  if (!t[0].defined()) return {Tensor(), Tensor()};
  const Tensor& logits = node.inputs[0];
  const Tensor& lse = node.outputs[1];
  Tensor ones = Tensor::full({logits.dim(0)}, 1.0f, DType::f32, logits.device());
  Tensor tx = ops::cast(t[0], DType::f32);
  Tensor dl = ops::cast(ce_grad(ignore_index, logits, node.inputs[1], lse, ones), DType::f32);
  Tensor tloss = sum(mul(dl, tx), {-1});
  Tensor tlse = sum(mul(exp(sub(ops::cast(logits, DType::f32), col(lse))), tx), {-1});
  return {tloss, tlse};
}

namespace ops {

Tensor softmax(const Tensor& x, int axis) { return softmax_any_axis(x, axis, false); }
Tensor log_softmax(const Tensor& x, int axis) { return softmax_any_axis(x, axis, true); }

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int ignore_index) {
  if (logits.ndim() != 2 || !is_float(logits.dtype()))
    throw ShapeError("cross_entropy: logits must be a float [N, V] tensor, got " + to_string(logits.shape()) +
                     " (targets " + to_string(targets.shape()) + ")");
  if (targets.dtype() != DType::i32 || targets.ndim() != 1 || targets.dim(0) != logits.dim(0))
    throw ShapeError("cross_entropy: targets " + to_string(targets.shape()) + " (" +
                     std::string(dtype_name(targets.dtype())) + ") do not fit logits " + to_string(logits.shape()) +
                     " (expected i32 [N])");
  int64_t V = logits.dim(1);
  std::vector<int32_t> tv = targets.to_ints();
  for (size_t i = 0; i < tv.size(); ++i)
    if (tv[i] != ignore_index && (tv[i] < 0 || tv[i] >= V))
      throw ShapeError("cross_entropy: target " + std::to_string(tv[i]) + " of row " + std::to_string(i) +
                       " is outside [0, " + std::to_string(V) + ") for logits " + to_string(logits.shape()) +
                       " (ignore_index " + std::to_string(ignore_index) + ")");
  Shape n{logits.dim(0)};
  return apply(std::make_shared<CrossEntropy>(ignore_index), {contiguous(logits), contiguous(targets)},
               {{n, DType::f32}, {n, DType::f32}})[0];
}

}  // namespace ops
}  // namespace lmtune
