// Attention: the argument checks shared by both paths, the reference composition (scores = scale q kᵀ, optional
// softcap, an additive -inf mask built on the host, softmax, probs v; materializes [B, H, T, S]) and the choice
// between it and the fused primitive (core/ops/flash_attention.cpp), which is the default.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/flash_attention.h"

namespace lmtune::ops {
namespace {

// The additive mask: [T, S] without documents or key masks, [B, 1, 1, T, S] with them (it broadcasts over the
// [B, KV, G, T, S] scores). Undefined when nothing is masked.
Tensor build_mask(const AttentionOptions& opt, int64_t B, int64_t T, int64_t S, DType dtype, Device device) {
  bool docs = opt.doc_ids.defined(), keys = opt.key_mask.defined();
  if (!opt.causal && opt.window <= 0 && !docs && !keys) return Tensor();
  std::vector<int32_t> doc = docs ? opt.doc_ids.to_ints() : std::vector<int32_t>();
  std::vector<int32_t> key = keys ? opt.key_mask.to_ints() : std::vector<int32_t>();
  int64_t nb = docs || keys ? B : 1;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> m(size_t(nb * T * S), neg_inf);
  // Each row's causal / window range is filled at once; documents and key masks are checked only inside it (a
  // [2048, 2048] mask per layer, element by element, took a tenth of a Gemma 4 training step).
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t qpos = i + opt.q_offset;  // the query's position among the keys
      const int64_t lo = opt.window > 0 ? std::max<int64_t>(0, qpos - opt.window + 1) : 0;
      const int64_t hi = opt.causal ? std::min(qpos + 1, S) : S;  // keys [lo, hi) are in range
      float* row = m.data() + (b * T + i) * S;
      for (int64_t j = lo; j < hi; ++j)
        if ((!docs || doc[size_t(b * T + i)] == doc[size_t(b * T + j)]) && (!keys || key[size_t(b * S + j)] != 0))
          row[j] = 0.0f;
    }
  Shape shape = docs || keys ? Shape{B, 1, 1, T, S} : Shape{T, S};
  return Tensor::from_floats(m, shape, dtype, device);
}

}  // namespace

FlashAttentionParams attention_params(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  auto shapes = [&] { return "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape()); };
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw ShapeError("attention: expected q [B, T, H, D] and k, v [B, S, KV, D], got " + shapes());
  if (k.shape() != v.shape() || q.dim(0) != k.dim(0) || q.dim(3) != k.dim(3))
    throw ShapeError("attention: shapes do not fit: " + shapes());
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || !is_float(q.dtype()))
    throw ShapeError("attention: q, k and v must share one float dtype: " + shapes());
  FlashAttentionParams p;
  p.B = q.dim(0), p.T = q.dim(1), p.H = q.dim(2), p.D = q.dim(3), p.S = k.dim(1), p.KV = k.dim(2);
  if (p.KV == 0 || p.H % p.KV != 0)
    throw ShapeError("attention: query heads must be a multiple of kv heads: " + shapes());
  if (opt.doc_ids.defined()) {
    if (opt.doc_ids.dtype() != DType::i32 || opt.doc_ids.shape() != Shape{p.B, p.T})
      throw ShapeError("attention: doc_ids " + to_string(opt.doc_ids.shape()) + " do not fit " + shapes() +
                       " (expected i32 [B, T])");
    if (p.S != p.T || opt.q_offset != 0)
      throw ShapeError("attention: packed documents need S == T and q_offset 0: " + shapes());
  }
  if (opt.key_mask.defined() && (opt.key_mask.dtype() != DType::i32 || opt.key_mask.shape() != Shape{p.B, p.S}))
    throw ShapeError("attention: key_mask " + to_string(opt.key_mask.shape()) + " does not fit " + shapes() +
                     " (expected i32 [B, S])");
  p.scale = opt.scale > 0 ? opt.scale : 1.0f / std::sqrt(float(p.D));
  p.softcap = opt.softcap > 0 ? opt.softcap : 0;
  p.causal = opt.causal;
  p.window = opt.window > 0 ? opt.window : 0;
  p.q_offset = opt.q_offset;
  p.docs = opt.doc_ids.defined();
  p.key_mask = opt.key_mask.defined();
  return p;
}

Tensor attention_scores(const Tensor& q, const Tensor& k, const AttentionOptions& opt) {
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), D = q.dim(3), S = k.dim(1), KV = k.dim(2), G = H / KV;
  const float scale = opt.scale > 0 ? opt.scale : 1.0f / std::sqrt(float(D));
  // Grouped-query attention: query head h = kv * G + g uses kv head kv. Group the G query heads of one kv head
  // into the rows of one matrix: q [B, T, KV, G, D] -> [B, KV, G*T, D], against k [B, KV, S, D].
  Tensor qg = reshape(permute(reshape(q, {B, T, KV, G, D}), {0, 2, 3, 1, 4}), {B, KV, G * T, D});
  Tensor kt = permute(k, {0, 2, 3, 1});  // [B, KV, D, S], a transposed view
  Tensor scores = ops::scale(matmul(qg, kt), scale);
  if (opt.softcap > 0) scores = ops::scale(tanh(ops::scale(scores, 1.0f / opt.softcap)), opt.softcap);
  scores = reshape(scores, {B, KV, G, T, S});
  if (Tensor mask = build_mask(opt, B, T, S, scores.dtype(), q.device()); mask.defined()) scores = add(scores, mask);
  return scores;
}

Tensor attention_from_scores(const Tensor& scores, const Tensor& v) {
  const int64_t B = scores.dim(0), KV = scores.dim(1), G = scores.dim(2), T = scores.dim(3), S = scores.dim(4);
  const int64_t D = v.dim(3);
  // Rows with every key masked are all -inf: softmax gives 0 there, so they output 0 (and no NaN).
  Tensor probs = reshape(softmax(scores, -1), {B, KV, G * T, S});
  Tensor out = matmul(probs, permute(v, {0, 2, 1, 3}));  // [B, KV, G*T, D]
  return reshape(permute(reshape(out, {B, KV, G, T, D}), {0, 3, 1, 2, 4}), {B, T, KV * G, D});
}

Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  attention_params(q, k, v, opt);
  return attention_from_scores(attention_scores(q, k, opt), v);
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  const bool backward = grad_enabled() && (on_tape(q) || on_tape(k) || on_tape(v));
  if (!backend(q.device()).runs_fused_attention(attention_params(q, k, v, opt), q.dtype(), backward))
    return attention_reference(q, k, v, opt);
  return flash_attention(q, k, v, opt).first;
}

}  // namespace lmtune::ops
