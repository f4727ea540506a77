// Fused ("flash") attention: the forward pass and its FlashAttention-2 backward as two primitives that never
// store a [T, S] score matrix. Kernels: backend/cpu/flash_attention.cpp, backend/vulkan/flash_attention.cpp
// (kernels/attention/flash_attention_*.comp). The composition in core/ops/attention.cpp is the oracle.
#pragma once
#include "core/ops.h"
#include "core/primitive.h"

namespace lmtune {

// Everything the kernels need besides the tensors. Rows of the problem are (query t, head g of the kv group)
// pairs, row = t * G + g, so one block of rows shares its K/V tiles among the G query heads of a kv head.
struct FlashAttentionParams {
  int64_t B = 0, T = 0, S = 0, H = 0, KV = 0, D = 0;
  float scale = 0, softcap = 0;
  bool causal = true;
  int64_t window = 0, q_offset = 0;
  bool docs = false, key_mask = false;  // whether doc_ids [B, T] / key_mask [B, S] (i32) follow the tensors
  int64_t G() const { return H / KV; }
};

// Inputs: q [B, T, H, D], k, v [B, S, KV, D] (one float dtype, last dim dense), then doc_ids and key_mask when
// the params say so. Outputs: O [B, T, H, D] (q's dtype) and LSE f32 [B, H, T], the log-sum-exp of each query
// row's scaled, soft-capped, masked scores (-inf for a row that sees no key; its output is 0).
// vjp: FlashAttentionBackward. jvp: forward-mode through the reference composition (rarely used).
class FlashAttention final : public Primitive {
 public:
  explicit FlashAttention(FlashAttentionParams p) : p(p) {}
  const char* name() const override { return "flash_attention"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_outputs() const override { return true; }
  FlashAttentionParams p;
};

// Inputs: q, k, v, O, dO [B, T, H, D] (any float dtype, last dim dense), LSE f32 [B, H, T], dLSE f32 [B, H, T],
// then doc_ids / key_mask as for FlashAttention. Outputs: dQ (q's dtype), dK, dV (k's dtype).
// With Δ = rowsum(dO ∘ O) - dLSE, P = exp(s - LSE) recomputed blockwise, dP = dO Vᵀ and dS = P ∘ (dP - Δ)
// (times 1 - tanh² where soft-capped): dV = Σ Pᵀ dO, dQ = scale dS K, dK = scale dSᵀ Q; dK, dV summed over the
// query heads of a kv group. Not differentiable itself.
class FlashAttentionBackward final : public Primitive {
 public:
  explicit FlashAttentionBackward(FlashAttentionParams p) : p(p) {}
  const char* name() const override { return "flash_attention_backward"; }
  LMTUNE_PRIMITIVE_EVAL();
  FlashAttentionParams p;
};

namespace ops {
// Checks q, k, v and the options (ShapeError naming the shapes) and returns the kernels' parameters.
FlashAttentionParams attention_params(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt);
// The masked, soft-capped, scaled scores of the reference composition, [B, KV, G, T, S] (-inf where masked).
Tensor attention_scores(const Tensor& q, const Tensor& k, const AttentionOptions& opt);
// softmax(scores) v for scores [B, KV, G, T, S] and v [B, S, KV, D] -> [B, T, H, D].
Tensor attention_from_scores(const Tensor& scores, const Tensor& v);
}  // namespace ops

}  // namespace lmtune
