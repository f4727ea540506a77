// Mixture-of-experts MLP (Mixtral, Qwen3-MoE, Gemma 4) as transformers computes it, built from differentiable ops:
//   logits = h Wrᵀ (router), p = softmax(logits) in f32, (w, e) = top-k of p, w /= Σ w when norm_topk_prob,
//   y[n] = Σ_s w[n, s] · expert_{e[n, s]}(h[n]),   expert(x) = down(act(x Gᵀ) * (x Uᵀ))
// (with LoRA on the experts, each stacked weight W[e] is used as W[e] + scale · B[e] A[e]: decoder.h ExpertAdapter)
// Only the chosen experts run, each over the tokens routed to it (dropless): the routing is read back to the host,
// the tokens are gathered into rows grouped by expert (one gather), each expert runs its two products on its block
// of rows (ops::grouped_matmul: one op for all experts), and each token gathers back its k outputs (one gather) for
// the weighted sum. Both gathers' gradients are gathers too, so forward and backward are free of atomic
// scatter-adds (deterministic on every device), and no gradient is larger than the rows it belongs to. Padding the
// experts' blocks to one size (one batched product) was dropped: a random router sends a frequent token's copies to
// the same experts, and the busiest expert had 8 times the mean rows (bench/RESULTS.md).
#pragma once
#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "io/hf_config.h"
#include "models/decoder.h"

namespace lmtune::models {

// Which rows of the grouped activations belong to which expert and token, for one call: rows are ordered by expert,
// then token, then slot (transformers' order).
struct ExpertRouting {
  std::vector<int32_t> token_of_row;   // [N k]: the token each grouped row holds
  std::vector<int32_t> row_of_choice;  // [N k]: row of token n's s-th choice at n k + s
  std::vector<int64_t> offsets;        // [E + 1]: expert e's rows are [offsets[e], offsets[e + 1])
};
// chosen: token n's experts at n k + s, each in [0, experts).
ExpertRouting route_tokens(const std::vector<int32_t>& chosen, int64_t tokens, int64_t k, int64_t experts);

// h [..., C] (compute dtype) -> [..., C]. router_logits, when given, receives the f32 logits [N, E]. With
// row_adapters (h [B, T, C]), each expert adapter reaches only the batch rows of its groups (models/linear.h).
// Gemma 4's router (w.router_scale defined) routes router_input [..., C] instead of h: normalized without a
// weight, times router_scale · C^-1/2; the chosen experts' weights are multiplied by w.per_expert_scale.
Tensor moe_mlp(const MoeWeights& w, const Tensor& h, const ModelConfig& config, ops::GateActivation act,
               Tensor* router_logits = nullptr, const RowAdapters* row_adapters = nullptr,
               const Tensor& router_input = Tensor());

// W [E, out, in] + Σ scale · B[e] A[e] over the adapters, in W's dtype (merged export).
Tensor merged_expert_weight(const Tensor& w, const std::vector<ExpertAdapter>& adapters);

// transformers' load_balancing_loss_func over the layers' router logits (each f32 [N, E]): with p = softmax of all
// rows and the one-hot of each row's top-k choices, E · Σ_{s,e} mean_rows(onehot[:, s, e]) · mean_rows(p[:, e]).
// token_mask (optional, [N] of 0/1, the same rows in every layer) restricts both means to its rows, as the
// attention mask does there. A scalar f32; its gradient reaches the logits through p only.
Tensor router_aux_loss(const std::vector<Tensor>& router_logits, int64_t top_k,
                       const std::vector<float>& token_mask = {});

}  // namespace lmtune::models
