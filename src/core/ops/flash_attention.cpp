// Fused attention: the op function, the vjp (the FlashAttentionBackward primitive) and the jvp (forward mode
// through the reference composition of core/ops/attention.cpp, which is rarely used and not worth a kernel).
#include "core/ops/flash_attention.h"

#include <string>

#include "core/autodiff.h"
#include "core/error.h"

namespace lmtune {
namespace {

// The kernels index q/k/v/O/dO as [B, T, heads, D] with any batch and time strides but dense heads and dims.
Tensor heads_dense(const Tensor& t) {
  bool dims_ok = t.dim(3) == 1 || t.strides()[3] == 1;
  bool heads_ok = t.dim(2) == 1 || t.strides()[2] == t.dim(3);
  return dims_ok && heads_ok ? t : ops::contiguous(t);
}

// The options a FlashAttention node was built with (its mask tensors are its extra inputs).
ops::AttentionOptions options_of(const FlashAttentionParams& p, const std::vector<Tensor>& inputs) {
  ops::AttentionOptions o;
  o.scale = p.scale;
  o.causal = p.causal;
  o.window = p.window;
  o.softcap = p.softcap;
  o.q_offset = p.q_offset;
  size_t next = 3;
  if (p.docs) o.doc_ids = inputs[next++];
  if (p.key_mask) o.key_mask = inputs[next++];
  return o;
}

}  // namespace

std::vector<Tensor> FlashAttention::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  std::vector<Tensor> grads(node.inputs.size());
  if (!cot[0].defined() && !cot[1].defined()) return grads;
  const Tensor &q = node.inputs[0], &k = node.inputs[1], &v = node.inputs[2];
  const Tensor &o = node.outputs[0], &lse = node.outputs[1];
  Tensor d_o = cot[0].defined() ? heads_dense(cot[0]) : Tensor::zeros(o.shape(), o.dtype(), o.device());
  Tensor d_lse = cot[1].defined() ? ops::contiguous(ops::cast(cot[1], DType::f32))
                                  : Tensor::zeros(lse.shape(), DType::f32, lse.device());
  std::vector<Tensor> inputs{q, k, v, o, d_o, lse, d_lse};
  for (size_t i = 3; i < node.inputs.size(); ++i) inputs.push_back(node.inputs[i]);
  std::vector<Tensor> g = apply(std::make_shared<FlashAttentionBackward>(p), inputs,
                                {{q.shape(), q.dtype()}, {k.shape(), k.dtype()}, {v.shape(), v.dtype()}});
  for (size_t i = 0; i < 3; ++i)
    if (wanted[i]) grads[i] = g[i];
  return grads;
}

// Forward mode through the composition: O's tangent is the composite's; LSE's is Σ_j P_ij ṡ_ij (0 where masked).
std::vector<Tensor> FlashAttention::jvp(const Node& node, const std::vector<Tensor>& t) {
  ops::AttentionOptions opt = options_of(p, node.inputs);
  Fn composite = [opt](const std::vector<Tensor>& in) {
    Tensor scores = ops::attention_scores(in[0], in[1], opt);
    return std::vector<Tensor>{ops::attention_from_scores(scores, in[2]), scores};
  };
  auto [primal, tangent] = lmtune::jvp(composite, {node.inputs[0], node.inputs[1], node.inputs[2]}, {t[0], t[1], t[2]});
  Tensor probs = ops::softmax(ops::cast(primal[1], DType::f32), -1);
  Tensor t_lse = ops::sum(ops::mul(probs, ops::cast(tangent[1], DType::f32)), {-1});  // [B, KV, G, T]
  return {tangent[0], ops::reshape(t_lse, {p.B, p.H, p.T})};
}

namespace ops {

std::pair<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionOptions& opt) {
  FlashAttentionParams p = attention_params(q, k, v, opt);
  std::vector<Tensor> inputs{heads_dense(q), heads_dense(k), heads_dense(v)};
  if (p.docs) inputs.push_back(contiguous(opt.doc_ids));
  if (p.key_mask) inputs.push_back(contiguous(opt.key_mask));
  // Kept across gradient checkpointing: the backward then runs only the attention's backward kernels, not its
  // forward again.
  std::vector<OutputSpec> specs{{q.shape(), q.dtype()}, {{p.B, p.H, p.T}, DType::f32}};
  auto prim = std::make_shared<FlashAttention>(p);
  std::vector<Tensor> out = apply_kept(prim, inputs, specs);
  return {out[0], out[1]};
}

}  // namespace ops
}  // namespace lmtune
