// LoRA training memory estimate (see memory.h and docs/models.md, "Memory estimate").
#include "models/memory.h"

#include <algorithm>

#include "core/ops/linear_cross_entropy.h"
#include "core/ops/quant_matmul.h"
#include "models/weights.h"

namespace lmtune::models {

TrainingMemoryEstimate estimate_training_memory(const ModelConfig& c, const TrainingMemoryOptions& o) {
  TrainingMemoryEstimate e;
  const int64_t C = c.hidden_size, L = c.num_hidden_layers, V = c.vocab_size, H = c.num_attention_heads;
  // Per-layer sizes averaged over the layers (Gemma 4's full layers have wider heads, its shared layers no keys or
  // values of their own, its last layers double-wide MLPs); the same as the config's for other models.
  int64_t I = 0, HD = 0, KVD = 0;
  for (const LayerConfig& l : c.layers) {
    I += l.intermediate_size;
    HD += H * l.head_dim;
    KVD += l.kv_source < 0 ? l.kv_heads * l.head_dim : 0;
  }
  const int64_t layers_or_1 = std::max<int64_t>(L, 1);
  I /= layers_or_1;
  HD /= layers_or_1;
  KVD /= layers_or_1;
  const uint64_t N = uint64_t(o.batch * o.seq);  // tokens per step
  const uint64_t act = dtype_size(o.compute_dtype);

  // Mixture-of-experts layers have no dense MLP (its projections, adapters and activations): their experts stay
  // unquantized (targeted by LoRA only with expert_lora), and per token they keep the router's logits and k
  // experts' activations.
  // (Gemma 4's expert layers keep their dense MLP beside the experts.)
  int64_t dense = 0, sparse = 0;
  for (const LayerConfig& l : c.layers) {
    dense += !l.moe || c.experts_beside_mlp;
    sparse += l.moe;
  }
  const int64_t k = c.experts_per_token, EI = c.moe_intermediate_size;
  e.weights = uint64_t(parameter_count(c)) * dtype_size(o.weight_dtype);
  if (o.quantize) {  // the projections of every layer at the format's bytes per element
    const quant::FormatInfo& f = quant::info(*o.quantize);
    const uint64_t projections = uint64_t(L) * uint64_t(C * HD * 2 + C * KVD * 2) + uint64_t(dense * 3 * C * I);
    e.weights -= projections * dtype_size(o.weight_dtype);
    e.weights += projections * f.block_bytes / uint64_t(f.block_elems);
    // plus the one panel the products decode at a time (the largest projection, or the backend's cap)
    const uint64_t largest = uint64_t(std::max({C * HD, C * KVD, C * I}));
    e.weights += std::min(kQuantizedPanelBytes, largest * act);
  }
  // LoRA on q, k, v, o, gate, up, down: R * (in + out) each.
  const int64_t attention = o.rank * ((C + HD) + (C + KVD) * 2 + (HD + C)), mlp = o.rank * ((C + I) * 2 + (I + C));
  e.lora_param_count = attention * L + mlp * dense;
  // On the experts: gate_up_proj and down_proj of each, R * (C + 2 EI) + R * (EI + C).
  if (o.expert_lora) e.lora_param_count += sparse * c.num_experts * o.rank * (2 * C + 3 * EI);
  e.lora_params = uint64_t(e.lora_param_count) * 4;
  e.lora_grads = e.lora_params;
  e.optimizer = 2 * e.lora_params;

  // Values one layer keeps for its backward, per token (compute dtype): input and normed input (2C); q, k, v
  // before and after rope (2 (HD + 2 KVD)); attention output (HD); o_proj output and residual (2C); pre-MLP
  // norm (C); gate, up, product (3I: the fused gated activation saves no act(gate); the composition would
  // add I); down output (C); sandwich norms add their inputs (2C); LoRA intermediates (7R).
  // Expert layers: router logits (f32), the k gathered inputs, gate-up, product and outputs, and the gathered
  // outputs (k (3 C + 3 EI)), averaged over the layers.
  const int64_t mlp_token = (dense * (3 * I + 3 * o.rank) + sparse * (2 * c.num_experts + k * (3 * C + 3 * EI))) /
                            std::max<int64_t>(L, 1);
  uint64_t per_token = uint64_t(6 * C + 2 * (HD + 2 * KVD) + HD + 4 * o.rank + mlp_token);
  // Gated DeltaNet layers (the chunked rule composed of ops, models/gated_deltanet.h) keep per token, in f32, about
  // 22 chunk-wide rows per value head (pairwise decays, the squarings of (I + A)^-1, intra-chunk scores), the heads'
  // queries, keys and values in several forms, the convolution's shifted inputs, and a [Dk, Dv] state per chunk;
  // counted in bytes and averaged over the layers like the rest (attention's share stays: an over-estimate).
  uint64_t delta_bytes = 0;
  if (int64_t linear = std::count_if(c.layers.begin(), c.layers.end(), [](auto& l) { return l.linear_attention; })) {
    const LinearAttentionConfig& la = c.linear_attention;
    const int64_t Hv = la.value_heads, Dk = la.key_head_dim, Dv = la.value_head_dim, ch = la.conv_channels();
    const int64_t f32 = Hv * (22 * 64 + 6 * Dk + 8 * Dv + Dk * Dv / 64) + (2 * la.conv_kernel + 3) * ch;
    const int64_t projected = 2 * la.key_heads * Dk + 2 * Hv * Dv + 2 * Hv;
    delta_bytes = uint64_t(linear * (4 * f32 + int64_t(act) * projected) / std::max<int64_t>(L, 1));
  }
  if (c.sandwich_norms) per_token += uint64_t(2 * C);
  // Gemma 4's per-layer input: its slice, the gate's output and product, the projection and its norm's input.
  if (c.per_layer_input_size > 0) per_token += uint64_t(3 * c.per_layer_input_size + 2 * C);
  // The fused attention keeps no [T, T] scores, only each query row's log-sum-exp (f32 [B, H, T]).
  const uint64_t lse = N * uint64_t(H) * 4;
  const uint64_t layer = N * (per_token * act + delta_bytes) + lse;
  // The fused loss (ops::linear_cross_entropy) holds one vocabulary chunk at a time: its f32 logits, their
  // gradient and about one more temporary of that size (soft-capping) — not [N, V] logits and their gradient —
  // and d loss / d hidden (f32 [N, C], computed in the forward) with one rescaled copy of it.
  e.logits = 3 * N * uint64_t(default_vocab_chunk(int64_t(N), V)) * 4 + 2 * N * uint64_t(C) * 4;
  e.activations = uint64_t(L) * layer + e.logits;
  e.layers = L;
  e.layer_activations = layer;
  e.layer_input = N * uint64_t(C) * act;
  // Checkpointing keeps each layer's input, and recomputes one layer at a time during backward.
  e.activations_checkpointed = uint64_t(L) * N * uint64_t(C) * act + layer + e.logits;
  const uint64_t reference_logits = N * uint64_t(V) * (act + 2 * 4);
  e.reference_floor = e.fixed() + uint64_t(L) * N * uint64_t(C) * act + layer + reference_logits;
  e.reference_floor_unchecked = e.fixed() + e.activations - e.logits + reference_logits;
  return e;
}

int64_t layers_to_leave_unchecked(const TrainingMemoryEstimate& e, uint64_t available) {
  int64_t n = 0;
  for (; n < e.layers; ++n) {
    const uint64_t peak = e.total_checkpointing_all_but(n + 1);
    if (peak > e.floor(true)) break;
    if (available && peak + (peak - e.weights) / 2 > available) break;
  }
  return n;
}

}  // namespace lmtune::models
