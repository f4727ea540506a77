// RMSNorm, LayerNorm, rotary embedding and embedding: shape checks and vjp/jvp written with other ops.
// Norm gradients are computed in f32 from the saved input and the saved per-row statistics.
#include "core/ops/nn.h"

#include <cmath>

#include "core/autodiff.h"
#include "core/error.h"

namespace lmtune {
namespace {


// Per-row statistic [...] as [..., 1] so it broadcasts against rows.
Tensor col(const Tensor& stat) {
  Shape s = stat.shape();
  s.push_back(1);
  return ops::reshape(stat, s);
}

Shape rows_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

void check_norm_args(const char* op, const Tensor& x, const Tensor& w) {
  if (x.ndim() < 1 || !is_float(x.dtype()))
    throw ShapeError(std::string(op) + ": input must be a float tensor with at least 1 dim, got " + to_string(x.shape()));
  if (w.ndim() != 1 || w.dim(0) != x.dim(-1) || !is_float(w.dtype()))
    throw ShapeError(std::string(op) + ": weight " + to_string(w.shape()) + " does not fit input " + to_string(x.shape()));
}

void check_ids(const char* op, const Tensor& ids, int64_t vocab) {
  if (ids.dtype() != DType::i32)
    throw ShapeError(std::string(op) + ": ids must be i32, got " + std::string(dtype_name(ids.dtype())) + " " +
                     to_string(ids.shape()));
  std::vector<int32_t> v = ids.to_ints();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] < 0 || v[i] >= vocab)
      throw ShapeError(std::string(op) + ": id " + std::to_string(v[i]) + " at flat index " + std::to_string(i) +
                       " of ids " + to_string(ids.shape()) + " is outside the vocabulary [0, " + std::to_string(vocab) +
                       ")");
}

}  // namespace

// ---- RMSNorm: y = x̂ w, x̂ = x rstd ----

std::vector<Tensor> RmsNorm::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  std::vector<bool> added(node.inputs.size());
  return vjp_into(node, cot, wanted, std::vector<Tensor>(node.inputs.size()), added);
}

std::vector<Tensor> RmsNorm::vjp_into(const Node& node, const std::vector<Tensor>& cot,
                                      const std::vector<bool>& wanted, const std::vector<Tensor>& into,
                                      std::vector<bool>& added) {
  using namespace ops;
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  Tensor rstd = col(node.outputs[1]);
  Tensor gx, gw;
  // The usual case (only y's cotangent, backward not itself recorded): one fused pass, no f32 temporaries.
  const bool fused = cot[0].defined() && !cot[1].defined() && !grad_enabled();
  if (fused && wanted[0]) {
    const std::vector<Tensor> in{x, w, node.outputs[1], contiguous(cot[0])};
    if (into[0].defined()) {  // added into x's collected gradient, in place
      std::vector<Tensor> dst{into[0]};
      RmsNormGrad op(/*accumulate=*/true);
      eval_on(x.device(), op, in, dst);
      gx = into[0];
      added[0] = true;
    } else {
      gx = apply(std::make_shared<RmsNormGrad>(), in, {{x.shape(), x.dtype()}})[0];
    }
  }
  if (fused && !wanted[1]) return {gx, gw};
  Tensor xhat = mul(ops::cast(x, DType::f32), rstd);
  if (cot[0].defined()) {
    Tensor g = ops::cast(cot[0], DType::f32);
    if (wanted[0] && !fused) {  // rstd (ĝ - x̂ mean(ĝ x̂)), ĝ = g w
      Tensor gh = mul(g, ops::cast(w, DType::f32));
      gx = mul(rstd, sub(gh, mul(xhat, mean(mul(gh, xhat), {-1}, true))));
    }
    if (wanted[1]) gw = ops::cast(sum_to_shape(mul(g, xhat), w.shape()), w.dtype());
  }
  if (cot[1].defined() && wanted[0]) {  // d rstd / dx = -rstd² x̂ / C
    Tensor c = scale(mul(col(cot[1]), mul(square(rstd), xhat)), -1.0f / float(x.dim(-1)));
    gx = gx.defined() ? add(gx, c) : c;
  }
  if (gx.defined()) gx = ops::cast(gx, x.dtype());
  return {gx, gw};
}

std::vector<Tensor> RmsNorm::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  Tensor rstd = col(node.outputs[1]);
  Tensor xhat = mul(ops::cast(x, DType::f32), rstd);
  Tensor ty, trstd;
  if (t[0].defined()) {  // ty = w rstd (tx - x̂ m), trstd = -rstd² m, m = mean(x̂ tx)
    Tensor tx = ops::cast(t[0], DType::f32);
    Tensor m = mean(mul(xhat, tx), {-1}, true);
    ty = mul(ops::cast(w, DType::f32), mul(rstd, sub(tx, mul(xhat, m))));
    trstd = reshape(neg(mul(square(rstd), m)), node.output_shapes[1]);
  }
  if (t[1].defined()) {
    Tensor tw = mul(xhat, ops::cast(t[1], DType::f32));
    ty = ty.defined() ? add(ty, tw) : tw;
  }
  if (ty.defined()) ty = ops::cast(ty, node.output_dtypes[0]);
  return {ty, trstd};
}

// ---- LayerNorm: y = x̂ w + b, x̂ = (x - mean) rstd ----

std::vector<Tensor> LayerNorm::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  const Tensor& b = node.inputs[2];
  Tensor mu = col(node.outputs[1]);
  Tensor rstd = col(node.outputs[2]);
  Tensor xhat = mul(sub(ops::cast(x, DType::f32), mu), rstd);
  float inv_c = 1.0f / float(x.dim(-1));
  Tensor gx, gw, gb;
  if (cot[0].defined()) {
    Tensor g = ops::cast(cot[0], DType::f32);
    if (wanted[0]) {  // rstd (ĝ - mean(ĝ) - x̂ mean(ĝ x̂)), ĝ = g w
      Tensor gh = mul(g, ops::cast(w, DType::f32));
      gx = mul(rstd, sub(sub(gh, mean(gh, {-1}, true)), mul(xhat, mean(mul(gh, xhat), {-1}, true))));
    }
    if (wanted[1]) gw = ops::cast(sum_to_shape(mul(g, xhat), w.shape()), w.dtype());
    if (wanted[2]) gb = ops::cast(sum_to_shape(g, b.shape()), b.dtype());
  }
  if (wanted[0]) {  // the statistics outputs: d mean/dx = 1/C, d rstd/dx = -rstd² x̂ / C
    Tensor extra;
    if (cot[1].defined()) extra = expand(scale(col(cot[1]), inv_c), x.shape());
    if (cot[2].defined()) {
      Tensor c = scale(mul(col(cot[2]), mul(square(rstd), xhat)), -inv_c);
      extra = extra.defined() ? add(extra, c) : c;
    }
    if (extra.defined()) gx = gx.defined() ? add(gx, extra) : contiguous(extra);
  }
  if (gx.defined()) gx = ops::cast(gx, x.dtype());
  return {gx, gw, gb};
}

std::vector<Tensor> LayerNorm::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& x = node.inputs[0];
  const Tensor& w = node.inputs[1];
  Tensor mu = col(node.outputs[1]);
  Tensor rstd = col(node.outputs[2]);
  Tensor xhat = mul(sub(ops::cast(x, DType::f32), mu), rstd);
  Tensor ty, tmean, trstd;
  if (t[0].defined()) {  // txc = tx - mean(tx); trstd = -rstd² mean(x̂ txc); tx̂ = rstd (txc - x̂ mean(x̂ txc))
    Tensor tx = ops::cast(t[0], DType::f32);
    Tensor tm = mean(tx, {-1}, true);
    Tensor txc = sub(tx, tm);
    Tensor m = mean(mul(xhat, txc), {-1}, true);
    ty = mul(ops::cast(w, DType::f32), mul(rstd, sub(txc, mul(xhat, m))));
    tmean = reshape(tm, node.output_shapes[1]);
    trstd = reshape(neg(mul(square(rstd), m)), node.output_shapes[2]);
  }
  if (t[1].defined()) {
    Tensor tw = mul(xhat, ops::cast(t[1], DType::f32));
    ty = ty.defined() ? add(ty, tw) : tw;
  }
  if (t[2].defined()) {
    Tensor tb = ops::cast(t[2], DType::f32);
    ty = ty.defined() ? add(ty, tb) : contiguous(expand(tb, node.output_shapes[0]));
  }
  if (ty.defined()) ty = ops::cast(ty, node.output_dtypes[0]);
  return {ty, tmean, trstd};
}

// ---- rotary embedding: a scaled orthogonal map, so its vjp is the inverse rotation with the same scale ----

std::vector<Tensor> Rope::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  if (!cot[0].defined() || !wanted[0]) return {Tensor(), Tensor(), Tensor()};
  // Kernels take contiguous x (cotangents arrive as arbitrary views).
  Tensor g = apply1(std::make_shared<Rope>(layout, !inverse, scale),
                    {ops::contiguous(cot[0]), node.inputs[1], node.inputs[2]}, {cot[0].shape(), cot[0].dtype()});
  return {g, Tensor(), Tensor()};
}

std::vector<Tensor> Rope::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  return {apply1(std::make_shared<Rope>(layout, inverse, scale),
                 {ops::contiguous(t[0]), node.inputs[1], node.inputs[2]}, {t[0].shape(), node.output_dtypes[0]})};
}

// ---- embedding and its scatter-add (each is the other's transpose) ----

std::vector<Tensor> Embedding::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  if (!cot[0].defined() || !wanted[0]) return {Tensor(), Tensor()};
  const Tensor& w = node.inputs[0];
  return {ops::cast(ops::embedding_backward(cot[0], node.inputs[1], w.dim(0)), w.dtype()), Tensor()};
}

std::vector<Tensor> Embedding::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  return {ops::cast(ops::embedding(t[0], node.inputs[1]), node.output_dtypes[0])};
}

std::vector<Tensor> EmbeddingBackward::vjp(const Node& node, const std::vector<Tensor>& cot,
                                           const std::vector<bool>& wanted) {
  if (!cot[0].defined() || !wanted[0]) return {Tensor(), Tensor()};
  return {ops::cast(ops::embedding(cot[0], node.inputs[1]), node.input_dtypes[0]), Tensor()};
}

std::vector<Tensor> EmbeddingBackward::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  return {ops::cast(ops::embedding_backward(t[0], node.inputs[1], vocab), node.output_dtypes[0])};
}

// Dropout is linear in x with a fixed mask: cotangents and tangents go through the same mask (same key).
std::vector<Tensor> Dropout::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  return jvp(node, cot);
}

std::vector<Tensor> Dropout::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  return {ops::cast(ops::dropout(t[0], p, key), node.output_dtypes[0])};
}

namespace ops {

Tensor dropout(const Tensor& x, float p, uint64_t key) {
  if (!is_float(x.dtype())) throw ShapeError("dropout: x must be a float tensor, got " + std::string(dtype_name(x.dtype())));
  if (!(p >= 0.0f && p < 1.0f)) throw ShapeError("dropout: p = " + std::to_string(p) + " is not in [0, 1)");
  if (x.numel() > int64_t(UINT32_MAX)) throw ShapeError("dropout: more than 2^32 elements in " + to_string(x.shape()));
  if (p == 0.0f) return x;
  return apply1(std::make_shared<Dropout>(p, key), {contiguous(x)}, {x.shape(), x.dtype()});
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  check_norm_args("rms_norm", x, weight);
  Tensor xc = contiguous(x);
  return apply(std::make_shared<RmsNorm>(eps), {xc, weight}, {{x.shape(), x.dtype()}, {rows_shape(x), DType::f32}})[0];
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  check_norm_args("layer_norm", x, weight);
  Tensor b = bias.defined() ? bias : Tensor::zeros(weight.shape(), weight.dtype(), weight.device());
  if (b.ndim() != 1 || b.dim(0) != x.dim(-1) || !is_float(b.dtype()))
    throw ShapeError("layer_norm: bias " + to_string(b.shape()) + " does not fit input " + to_string(x.shape()));
  Tensor xc = contiguous(x);
  Shape rows = rows_shape(x);
  return apply(std::make_shared<LayerNorm>(eps), {xc, weight, b},
               {{x.shape(), x.dtype()}, {rows, DType::f32}, {rows, DType::f32}})[0];
}

Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopeLayout layout, float scale) {
  if (x.ndim() != 4 || !is_float(x.dtype()))
    throw ShapeError("rope: x must be a float [B, T, H, D] tensor, got " + to_string(x.shape()));
  if (positions.dtype() != DType::i32 || positions.shape() != Shape{x.dim(0), x.dim(1)})
    throw ShapeError("rope: positions " + to_string(positions.shape()) + " (" +
                     std::string(dtype_name(positions.dtype())) + ") do not fit x " + to_string(x.shape()) +
                     " (expected i32 [B, T])");
  if (inv_freq.dtype() != DType::f32 || inv_freq.ndim() != 1 || 2 * inv_freq.dim(0) > x.dim(3))
    throw ShapeError("rope: inv_freq " + to_string(inv_freq.shape()) + " does not fit x " + to_string(x.shape()) +
                     " (expected f32 [R/2] with R <= D)");
  if (!std::isfinite(scale) || !(scale > 0))
    throw ShapeError("rope: scale must be positive and finite, got " + std::to_string(scale));
  Tensor xc = contiguous(x);
  return apply1(std::make_shared<Rope>(layout, false, scale), {xc, contiguous(positions), contiguous(inv_freq)},
                {x.shape(), x.dtype()});
}

Tensor embedding(const Tensor& weight, const Tensor& ids, bool device_ids) {
  if (weight.ndim() != 2 || !is_float(weight.dtype()))
    throw ShapeError("embedding: weight must be a float [V, C] tensor, got " + to_string(weight.shape()) +
                     " (ids " + to_string(ids.shape()) + ")");
  if (device_ids && ids.device().is_vulkan()) {
    if (ids.dtype() != DType::i32)
      throw ShapeError("embedding: ids must be i32, got " + std::string(dtype_name(ids.dtype())));
  } else {
    check_ids("embedding", ids, weight.dim(0));
  }
  Shape out = ids.shape();
  out.push_back(weight.dim(1));
  return apply1(std::make_shared<Embedding>(), {contiguous(weight), contiguous(ids)}, {out, weight.dtype()});
}

Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t vocab) {
  Shape expect = ids.shape();
  if (grad.ndim() != ids.ndim() + 1 || !is_float(grad.dtype()) ||
      !std::equal(expect.begin(), expect.end(), grad.shape().begin()))
    throw ShapeError("embedding_backward: grad " + to_string(grad.shape()) + " does not fit ids " +
                     to_string(ids.shape()) + " (expected float [..., C] with the ids' leading dims)");
  if (vocab <= 0) throw ShapeError("embedding_backward: vocab " + std::to_string(vocab) + " must be positive");
  check_ids("embedding_backward", ids, vocab);
  return apply1(std::make_shared<EmbeddingBackward>(vocab), {contiguous(grad), contiguous(ids)},
                {{vocab, grad.dim(-1)}, grad.dtype()});
}

}  // namespace ops
}  // namespace lmtune
