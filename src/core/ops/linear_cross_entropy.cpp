// Fused linear + cross-entropy over vocabulary chunks (see linear_cross_entropy.h). Notation: N rows, C hidden,
// V vocabulary, a chunk is the weight rows [s, e); z = softcap(h · W[s:e]ᵀ) are the chunk's f32 logits.
//
//   forward:  lse = logsumexp over chunks of logsumexp(z), loss = lse - z[target]  (z[target] = a row dot product
//             of h with the gathered weight row, not a pass over the logits)
//   vjp:      dz = (exp(z - lse) - onehot(target)) · g      (the CrossEntropyGrad kernel, chunk-local targets)
//             draw = dz · (1 - (z / softcap)²)                (softcap only)
//             dh += draw · W[s:e],  dW[s:e] = drawᵀ · h       (dW only when the weight wants a gradient)
//   jvp:      dlse = Σ_chunks Σ_V softmax · dz,  dloss = dlse - dz[target]
//
// Training with a frozen weight (LoRA): dh is linear in g row by row, dh = g[:, None] ⊙ U with
// U = Σ_chunks (softmax(z) ⊙ slope(z)) · W[s:e] - slope(z[target]) W[target], so the forward computes U while it
// holds each chunk's logits, with a running lse (U is rescaled by exp(lse_old - lse_new) as lse grows), and the
// vjp is one row scale: the logits are never recomputed.
// Peak extra memory is a few [N, chunk] f32 tensors (and U, [N, C] f32), instead of [N, V] logits plus their
// gradient.
#include "core/ops/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/backend.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/softmax.h"
#include "core/ops/view.h"
#include "core/tape.h"

namespace lmtune {
namespace {

Tensor col(const Tensor& v) { return ops::reshape(v, {v.dim(0), 1}); }  // [N] -> [N, 1]

Tensor rows_of(const Tensor& w, int64_t s, int64_t e) { return ops::slice(w, 0, s, e); }

Tensor cap(const Tensor& x, float softcap) {
  return softcap > 0 ? ops::scale(ops::tanh(ops::scale(x, 1.0f / softcap)), softcap) : x;
}

// d softcap(x) / dx = 1 - tanh²(x / c) = 1 - (z / c)², from the capped value z.
Tensor cap_slope(const Tensor& z, float softcap) {
  return ops::add_scalar(ops::neg(ops::square(ops::scale(z, 1.0f / softcap))), 1.0f);
}

// The hidden states as the logits products take them: as they are when they and the weight share a 16-bit dtype
// (the tensor-core path; products still accumulate and return f32), else widened to f32.
Tensor product_operand(const Tensor& hidden, const Tensor& weight) {
  bool half = hidden.dtype() == DType::f16 || hidden.dtype() == DType::bf16;
  return half && hidden.dtype() == weight.dtype() ? hidden : ops::cast(hidden, DType::f32);
}

// The chunk's logits z [N, e - s] in dtype zdt (the product accumulates in f32), from the transposed copy of the
// weight ([C, V]: columns s..e) when there is one.
Tensor chunk_logits(const Tensor& h, const Tensor& weight, const Tensor& weight_t, int64_t s, int64_t e,
                    float softcap, DType zdt = DType::f32) {
  Tensor wt = weight_t.defined() ? ops::slice(weight_t, 1, s, e) : ops::transpose(rows_of(weight, s, e));
  return cap(ops::matmul(h, wt, zdt), softcap);
}

// Σ_C a[n, c] b[n, c] in f32: [N].
Tensor row_dot(const Tensor& a, const Tensor& b) {
  return ops::sum(ops::mul(ops::cast(a, DType::f32), ops::cast(b, DType::f32)), {-1});
}

template <class F>
void for_each_chunk(int64_t V, int64_t chunk, F f) {
  for (int64_t s = 0; s < V; s += chunk) f(s, std::min(V, s + chunk));
}

}  // namespace

int64_t default_vocab_chunk(int64_t rows, int64_t vocab) {
  const int64_t budget = int64_t(256) << 20;  // bytes of f32 logits per chunk
  int64_t c = std::max<int64_t>(1, budget / (4 * std::max<int64_t>(rows, 1)));
  if (c >= 64) c -= c % 64;
  return std::min(c, std::max<int64_t>(vocab, 1));
}

namespace {

// Per-row target data on the device, from the host targets.
struct Targets {
  Tensor safe;     // i32 [N]: the target, 0 where ignored (a row that can be gathered)
  Tensor ignored;  // i32 [N]: 1 where ignored
};

Targets device_targets(const std::vector<int32_t>& t, int ignore_index, Device d) {
  std::vector<int32_t> safe(t.size()), ignored(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    ignored[i] = t[i] == ignore_index;
    safe[i] = ignored[i] ? 0 : t[i];
  }
  const Shape n{int64_t(t.size())};
  return {Tensor::from_ints(safe, n, d), Tensor::from_ints(ignored, n, d)};
}

// Targets local to the chunk [s, e) for CrossEntropyGrad(ignore_index = -1): -1 where ignored, t - s inside the
// chunk, -2 outside it (a target outside [0, e - s) gets the softmax term but no one-hot term).
Tensor chunk_targets(const std::vector<int32_t>& t, int ignore_index, int64_t s, int64_t e, Device d) {
  std::vector<int32_t> local(t.size());
  for (size_t i = 0; i < t.size(); ++i)
    local[i] = t[i] == ignore_index ? -1 : (t[i] >= s && t[i] < e ? int32_t(t[i] - s) : -2);
  return Tensor::from_ints(local, {int64_t(t.size())}, d);
}

// softcap(h · W[target]) per row [N] (rows with an ignored target use row 0; callers mask them).
Tensor target_logits(const Tensor& h32, const Tensor& weight, const Targets& tg, float softcap) {
  return cap(row_dot(h32, ops::embedding(weight, tg.safe)), softcap);
}

// The dtype of the chunks' logits when the forward computes d hidden: f16 where the products already take f16
// operands on tensor cores (16-bit hidden and weight, a backend that rounds bf16 products to f16) and there is no
// soft-cap, as autocast gives 16-bit logits (PyTorch + PEFT: bf16); they are written and read once per chunk, at
// half the bytes of f32 (H100, Llama-3.2-1B: bench/RESULTS.md). A caller's choice (tests) comes first.
DType forward_logits_dtype(const Tensor& hidden, const Tensor& weight, float softcap, bool grad_in_forward,
                           std::optional<DType> forced) {
  if (forced == DType::f32 || !grad_in_forward || softcap > 0) return DType::f32;
  if (forced) return *forced;
  bool half = hidden.dtype() != DType::f32 && hidden.dtype() == weight.dtype();
  return half && backend(hidden.device()).rounds_bf16_products_to_f16() ? DType::f16 : DType::f32;
}

}  // namespace

void LinearCrossEntropy::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  using namespace ops;
  const Tensor& hidden = in[0];
  const Tensor& weight = in[1];
  const int64_t N = hidden.dim(0), V = weight.dim(0);
  if (N == 0) return;
  const Device d = hidden.device();
  Tensor h32 = ops::cast(hidden, DType::f32), h = product_operand(hidden, weight);
  Targets tg = device_targets(host_targets, ignore_index, d);
  std::vector<Tensor> chunk_lse;  // [N, 1] each
  Tensor lse, unit;               // with the hidden gradient in the forward: the running lse and U
  for_each_chunk(V, chunk, [&](int64_t s, int64_t e) {
    Tensor z = chunk_logits(h, weight, weight_t, s, e, softcap, hidden_grad_in_forward ? logits_dtype : DType::f32);
    if (!hidden_grad_in_forward) {
      chunk_lse.push_back(logsumexp(z, -1, true));
      return;
    }
    // softmax(z) against the lse so far (times the soft-cap's slope), in the products' dtype, in one pass.
    Tensor prev = lse;
    std::vector<Tensor> args{contiguous(z), tg.ignored};
    if (prev.defined()) args.push_back(prev);
    std::vector<Tensor> pl = apply(std::make_shared<SoftmaxChunk>(softcap, prev.defined()), args,
                                   {{z.shape(), h.dtype()}, {{N}, DType::f32}});
    lse = pl[1];
    // U = U exp(lse_old - lse_new) + softmax W[s:e], the rescaling inside the product's epilogue where it can be.
    if (!prev.defined()) unit = matmul(pl[0], rows_of(weight, s, e), DType::f32);
    else matmul_accumulate(unit, pl[0], rows_of(weight, s, e), exp(sub(prev, lse)));
  });
  if (!hidden_grad_in_forward)
    lse = chunk_lse.size() == 1 ? reshape(chunk_lse[0], {N}) : logsumexp(concat(chunk_lse, 1), -1);
  Tensor zt = target_logits(h32, weight, tg, softcap);
  copy_into(out[0], masked_fill(sub(lse, zt), tg.ignored, 0.0f));
  copy_into(out[1], lse);
  if (!hidden_grad_in_forward) return;
  // The one-hot term: - slope(z[target]) W[target], none where ignored.
  Tensor coef = softcap > 0 ? cap_slope(zt, softcap) : Tensor::full({N}, 1.0f, DType::f32, d);
  coef = masked_fill(coef, tg.ignored, 0.0f);
  copy_into(out[2], sub(unit, mul(ops::cast(embedding(weight, tg.safe), DType::f32), col(coef))));
}

// The lse output is internal (the op function returns only the loss), so cot[1] is always undefined.
std::vector<Tensor> LinearCrossEntropy::vjp(const Node& node, const std::vector<Tensor>& cot,
                                            const std::vector<bool>& wanted) {
  using namespace ops;
  if (!cot[0].defined() || (!wanted[0] && !wanted[1])) return {Tensor(), Tensor(), Tensor()};
  const Tensor& hidden = node.inputs[0];
  const Tensor& weight = node.inputs[1];
  const Tensor& lse = node.outputs[1];
  const Device d = hidden.device();
  const int64_t V = weight.dim(0);
  Tensor g = contiguous(ops::cast(cot[0], DType::f32));
  if (hidden_grad_in_forward && !wanted[1]) return {ops::cast(mul(node.outputs[2], col(g)), hidden.dtype()), {}, {}};
  Tensor h = product_operand(hidden, weight);
  Tensor dh, dw;
  if (wanted[1]) dw = Tensor::empty(weight.shape(), weight.dtype(), d);
  for_each_chunk(V, chunk, [&](int64_t s, int64_t e) {
    Tensor z = chunk_logits(h, weight, weight_t, s, e, softcap);
    // 16-bit products take the logits' gradient in their dtype (as autocast does) and return f32.
    DType dz_dtype = softcap > 0 ? DType::f32 : h.dtype();
    Tensor dz = apply1(std::make_shared<CrossEntropyGrad>(-1),
                       {z, chunk_targets(host_targets, ignore_index, s, e, d), lse, g}, {z.shape(), dz_dtype});
    if (softcap > 0) dz = ops::cast(mul(dz, cap_slope(z, softcap)), h.dtype());
    if (wanted[0]) {
      Tensor part = matmul(dz, rows_of(weight, s, e), DType::f32);
      dh = dh.defined() ? add(dh, part) : part;
    }
    if (wanted[1]) copy_into(rows_of(dw, s, e), matmul(transpose(dz), h, DType::f32));
  });
  if (dh.defined()) dh = ops::cast(dh, hidden.dtype());
  return {dh, dw, Tensor()};
}

std::vector<Tensor> LinearCrossEntropy::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& th = t[0];
  const Tensor& tw = t[1];
  const size_t n_out = node.output_shapes.size();
  if (!th.defined() && !tw.defined()) return std::vector<Tensor>(n_out);
  const Tensor& hidden = node.inputs[0];
  const Tensor& weight = node.inputs[1];
  const Tensor& lse = node.outputs[1];
  const int64_t V = weight.dim(0);
  Tensor h32 = ops::cast(hidden, DType::f32), th32 = th.defined() ? ops::cast(th, DType::f32) : Tensor();
  // The logits' tangent over a range of weight rows (or the gathered target rows): th · Wᵀ + h · twᵀ.
  auto raw_tangent = [&](const auto& product, const Tensor& w_rows, const Tensor& tw_rows) {
    Tensor r;
    if (th.defined()) r = product(th32, w_rows);
    if (tw.defined()) r = r.defined() ? add(r, product(h32, tw_rows)) : product(h32, tw_rows);
    return r;
  };
  auto mm = [](const Tensor& a, const Tensor& w) { return matmul(a, transpose(w)); };
  Tensor tlse;
  for_each_chunk(V, chunk, [&](int64_t s, int64_t e) {
    Tensor z = chunk_logits(h32, weight, Tensor(), s, e, softcap);
    Tensor tz = raw_tangent(mm, rows_of(weight, s, e), tw.defined() ? rows_of(tw, s, e) : Tensor());
    if (softcap > 0) tz = mul(tz, cap_slope(z, softcap));
    Tensor part = sum(mul(exp(sub(z, col(lse))), tz), {-1});
    tlse = tlse.defined() ? add(tlse, part) : part;
  });
  Targets tg = device_targets(host_targets, ignore_index, hidden.device());
  Tensor tzt = raw_tangent(row_dot, embedding(weight, tg.safe), tw.defined() ? embedding(tw, tg.safe) : Tensor());
  if (softcap > 0) tzt = mul(tzt, cap_slope(target_logits(h32, weight, tg, softcap), softcap));
  std::vector<Tensor> tangents{masked_fill(sub(tlse, tzt), tg.ignored, 0.0f), tlse};
  tangents.resize(n_out);  // U's tangent (a second-order term) is not computed
  return tangents;
}

namespace ops {

Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets, int ignore_index,
                            float softcap, int64_t chunk, const Tensor& weight_t,
                            std::optional<DType> logits_dtype) {
  auto shapes = [&] {
    return "hidden " + std::string(dtype_name(hidden.dtype())) + " " + to_string(hidden.shape()) + ", weight " +
           std::string(dtype_name(weight.dtype())) + " " + to_string(weight.shape()) + ", targets " +
           std::string(dtype_name(targets.dtype())) + " " + to_string(targets.shape());
  };
  if (hidden.ndim() != 2 || weight.ndim() != 2 || !is_float(hidden.dtype()) || !is_float(weight.dtype()) ||
      hidden.dim(1) != weight.dim(1) || weight.dim(0) == 0)
    throw ShapeError("linear_cross_entropy: expected float hidden [N, C] and weight [V, C] with V > 0, got " +
                     shapes());
  if (targets.dtype() != DType::i32 || targets.ndim() != 1 || targets.dim(0) != hidden.dim(0))
    throw ShapeError("linear_cross_entropy: targets must be i32 [N] with N = hidden rows, got " + shapes());
  if (!(softcap >= 0) || !std::isfinite(softcap))
    throw ShapeError("linear_cross_entropy: softcap must be >= 0 (0 = none), got " + std::to_string(softcap));
  if (weight_t.defined() && (weight_t.dtype() != weight.dtype() || weight_t.ndim() != 2 ||
                             weight_t.dim(0) != weight.dim(1) || weight_t.dim(1) != weight.dim(0)))
    throw ShapeError("linear_cross_entropy: the transposed weight must be [C, V] = [" +
                     std::to_string(weight.dim(1)) + ", " + std::to_string(weight.dim(0)) + "] of the weight's dtype, got " +
                     std::string(dtype_name(weight_t.dtype())) + " " + to_string(weight_t.shape()));
  if (weight_t.defined() && on_tape(weight))
    throw AutodiffError("linear_cross_entropy: a transposed copy of the weight is for a frozen weight; this one "
                        "requires grad");
  if (chunk < 0) throw ShapeError("linear_cross_entropy: chunk must be >= 0 (0 = automatic), got " +
                                  std::to_string(chunk));
  const int64_t N = hidden.dim(0), V = weight.dim(0);
  std::vector<int32_t> tv = targets.to_ints();
  for (size_t i = 0; i < tv.size(); ++i)
    if (tv[i] != ignore_index && (tv[i] < 0 || tv[i] >= V))
      throw ShapeError("linear_cross_entropy: target " + std::to_string(tv[i]) + " of row " + std::to_string(i) +
                       " is outside [0, " + std::to_string(V) + ") (ignore_index " + std::to_string(ignore_index) +
                       "; " + shapes() + ")");
  if (chunk == 0) chunk = default_vocab_chunk(N, V);
  // Reverse mode will want d hidden but not d weight (a frozen head): compute it in the forward (see the top).
  bool grad_in_forward = grad_enabled() && !tape::saving_everything() && on_tape(hidden) && !on_tape(weight);
  auto prim = std::make_shared<LinearCrossEntropy>(std::move(tv), ignore_index, softcap, std::min(chunk, V),
                                                   grad_in_forward, weight_t);
  prim->logits_dtype = forward_logits_dtype(hidden, weight, softcap, grad_in_forward, logits_dtype);
  std::vector<OutputSpec> outs{{{N}, DType::f32}, {{N}, DType::f32}};
  if (grad_in_forward) outs.push_back({{N, hidden.dim(1)}, DType::f32});
  return apply(prim, {hidden, weight, contiguous(targets)}, outs)[0];
}

}  // namespace ops
}  // namespace lmtune
