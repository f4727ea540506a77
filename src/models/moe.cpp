// Mixture-of-experts MLP and the router's load-balancing loss (see moe.h).
#include "models/moe.h"

#include <cmath>
#include <string>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/gather_rows.h"
#include "core/ops/grouped_matmul.h"
#include "models/linear.h"

namespace lmtune::models {

ExpertRouting route_tokens(const std::vector<int32_t>& chosen, int64_t tokens, int64_t k, int64_t experts) {
  if (int64_t(chosen.size()) != tokens * k)
    throw ShapeError("moe: " + std::to_string(chosen.size()) + " expert choices for " + std::to_string(tokens) +
                     " tokens of " + std::to_string(k));
  ExpertRouting r;
  r.offsets.assign(size_t(experts + 1), 0);
  for (int32_t e : chosen) {
    if (e < 0 || e >= experts) throw ShapeError("moe: expert index " + std::to_string(e) + " out of range");
    ++r.offsets[size_t(e) + 1];
  }
  for (int64_t e = 0; e < experts; ++e) r.offsets[size_t(e + 1)] += r.offsets[size_t(e)];
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.token_of_row.resize(chosen.size());
  r.row_of_choice.resize(chosen.size());
  // Tokens in order within each expert: the rows of expert e fill in as the tokens are visited.
  for (int64_t n = 0; n < tokens; ++n)
    for (int64_t s = 0; s < k; ++s) {
      const size_t i = size_t(n * k + s);
      const int64_t row = next[size_t(chosen[i])]++;
      r.token_of_row[size_t(row)] = int32_t(n);
      r.row_of_choice[i] = int32_t(row);
    }
  return r;
}

namespace {

// The routing weights [N, k] in f32: the top-k probabilities, renormalized when the config says so.
Tensor routing_weights(const Tensor& probs, int64_t k, bool normalize, Tensor* chosen) {
  auto [top, idx] = ops::topk(probs, int(k));
  *chosen = idx;
  return normalize ? ops::div(top, ops::sum(top, {-1}, true)) : top;
}

// Which adapters reach which grouped rows: all of them everywhere, or with RowAdapters (serving) each adapter only
// the rows of tokens whose batch row is in one of its groups, as Linear does.
struct AdapterRows {
  const RowAdapters* groups = nullptr;
  const std::vector<int32_t>* token_of_row = nullptr;
  int64_t tokens_per_row = 1;

  // Undefined: every row; else [N k, 1] of 0 / 1 in `dtype`. Sets *none when no row uses the adapter.
  Tensor mask(const std::string& name, DType dtype, Device device, bool* none) const {
    *none = false;
    if (!groups) return Tensor();
    std::vector<float> m(token_of_row->size(), 0.0f);
    bool any = false;
    for (size_t i = 0; i < m.size(); ++i) {
      const int64_t row = (*token_of_row)[i] / tokens_per_row;
      for (const RowAdapters::Group& g : groups->groups)
        if (g.name == name && row >= g.begin && row < g.end) m[i] = 1.0f, any = true;
    }
    *none = !any;
    return Tensor::from_floats(m, {int64_t(m.size()), 1}, dtype, device);
  }
};

// Rows grouped by expert times each expert's W[e]ᵀ, plus each adapter's scale · (x A[e]ᵀ) B[e]ᵀ (factors in the
// rows' dtype, as Linear's adapters).
Tensor experts_product(const Tensor& rows, const Tensor& w, const std::vector<ExpertAdapter>& adapters,
                       const std::vector<int64_t>& offsets, const AdapterRows& reach) {
  Tensor y = ops::grouped_matmul(rows, w, offsets, true);
  for (const ExpertAdapter& a : adapters) {
    bool none = false;
    const Tensor mask = reach.mask(a.name, rows.dtype(), rows.device(), &none);
    if (none) continue;
    const Tensor u = ops::grouped_matmul(rows, ops::cast(a.A, rows.dtype()), offsets, true);
    Tensor delta = ops::scale(ops::grouped_matmul(u, ops::cast(a.B, rows.dtype()), offsets, true), a.scale);
    y = ops::add(y, mask.defined() ? ops::mul(delta, mask) : delta);
  }
  return y;
}

// Few tokens, no gradient, no adapter on the experts: each (token, choice) row's products by the chosen expert's
// id on the device (ops::matmul_by_id), so decoding never waits for the routing to reach the host.
constexpr int64_t kRoutedOnDeviceMaxTokens = 8;

bool routes_on_device(const MoeWeights& w, const Tensor& x) {
  if (x.dim(0) > kRoutedOnDeviceMaxTokens || !w.gate_up_adapters.empty() || !w.down_adapters.empty()) return false;
  return !grad_enabled() || !(on_tape(x) || on_tape(w.gate_up) || on_tape(w.down));
}

}  // namespace

Tensor merged_expert_weight(const Tensor& w, const std::vector<ExpertAdapter>& adapters) {
  Tensor sum = ops::cast(w, DType::f32);
  for (const ExpertAdapter& a : adapters) sum = ops::add(sum, ops::scale(ops::matmul(a.B, a.A), a.scale));
  return ops::cast(sum, w.dtype());
}

Tensor moe_mlp(const MoeWeights& w, const Tensor& h, const ModelConfig& config, ops::GateActivation act,
               Tensor* router_logits, const RowAdapters* row_adapters, const Tensor& router_input) {
  const int64_t C = h.dim(-1), N = h.numel() / C, E = config.num_experts, k = config.experts_per_token;
  const int64_t I = w.gate_up.dim(1) / 2;
  const Tensor x = ops::reshape(h, {N, C});
  Tensor routed = x;
  if (w.router_scale.defined()) {  // Gemma4TextRouter
    const Tensor r = ops::reshape(router_input.defined() ? router_input : h, {N, C});
    routed = ops::scale(ops::rms_norm(r, w.router_scale, float(config.rms_norm_eps)), float(1.0 / std::sqrt(C)));
  }
  const Tensor logits = ops::cast(Linear(w.router)(routed), DType::f32);
  if (router_logits) *router_logits = logits;
  Tensor chosen;
  Tensor weights = routing_weights(ops::softmax(logits, -1), k, config.norm_topk_prob, &chosen);
  if (w.per_expert_scale.defined()) {
    const Tensor table = ops::reshape(ops::cast(w.per_expert_scale, DType::f32), {E, 1});
    weights = ops::mul(weights, ops::reshape(ops::embedding(table, chosen, /*device_ids=*/true), {N, k}));
  }
  weights = ops::cast(weights, h.dtype());
  if (routes_on_device(w, x)) {
    const Tensor ids = ops::reshape(chosen, {N * k});
    const Tensor a = ops::matmul_by_id(x, w.gate_up, ids, k, act);  // [N k, I]
    const Tensor rows = ops::reshape(ops::matmul_by_id(a, w.down, ids, 1), {N, k, C});
    return ops::reshape(ops::sum(ops::mul(rows, ops::reshape(weights, {N, k, 1})), {1}), h.shape());
  }
  const ExpertRouting r = route_tokens(chosen.to_ints(), N, k, E);

  const AdapterRows reach{row_adapters, &r.token_of_row, h.ndim() == 3 ? h.dim(1) : 1};
  const Tensor grouped = ops::gather_rows(x, r.token_of_row, k);             // [N k, C]
  const Tensor gu = experts_product(grouped, w.gate_up, w.gate_up_adapters, r.offsets, reach);  // [N k, 2 I]
  const Tensor a = ops::gated_activation(ops::slice(gu, -1, 0, I), ops::slice(gu, -1, I, 2 * I), act);
  const Tensor rows = experts_product(a, w.down, w.down_adapters, r.offsets, reach);  // [N k, C]
  // Each token's k outputs gathered back [N, k, C], weighted and summed over k.
  const Tensor mine = ops::reshape(ops::gather_rows(rows, r.row_of_choice, 1), {N, k, C});
  const Tensor y = ops::sum(ops::mul(mine, ops::reshape(weights, {N, k, 1})), {1});
  return ops::reshape(y, h.shape());
}

Tensor router_aux_loss(const std::vector<Tensor>& router_logits, int64_t top_k,
                       const std::vector<float>& token_mask) {
  if (router_logits.empty()) throw ShapeError("router_aux_loss: no router logits (the model has no expert layers)");
  const Tensor logits = router_logits.size() == 1 ? router_logits[0] : ops::concat(router_logits, 0);
  const int64_t rows = logits.dim(0), E = logits.dim(1), per_layer = router_logits[0].dim(0);
  if (!token_mask.empty() && int64_t(token_mask.size()) != per_layer)
    throw ShapeError("router_aux_loss: token mask of " + std::to_string(token_mask.size()) + " for " +
                     std::to_string(per_layer) + " tokens");
  std::vector<float> mask(size_t(rows), 1.0f);
  if (!token_mask.empty())
    for (int64_t i = 0; i < rows; ++i) mask[size_t(i)] = token_mask[size_t(i % per_layer)];
  double counted = 0;
  for (float m : mask) counted += m;
  if (counted == 0) return Tensor::zeros({}, DType::f32, logits.device());

  const Tensor probs = ops::softmax(ops::cast(logits, DType::f32), -1);
  // The share of the counted rows that picked each expert, summed over the k choices (no gradient).
  const std::vector<int32_t> chosen = ops::topk(probs, int(top_k)).second.to_ints();
  std::vector<float> share(size_t(E), 0.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t s = 0; s < top_k; ++s) share[size_t(chosen[size_t(i * top_k + s)])] += mask[size_t(i)];
  for (float& v : share) v = float(v / counted);
  const Device d = logits.device();
  const Tensor row_mask = Tensor::from_floats(mask, {rows, 1}, DType::f32, d);
  const Tensor mean_probs = ops::scale(ops::sum(ops::mul(probs, row_mask), {0}), float(1.0 / counted));
  const Tensor shares = Tensor::from_floats(share, {E}, DType::f32, d);
  return ops::scale(ops::sum_all(ops::mul(mean_probs, shares)), float(E));
}

}  // namespace lmtune::models
