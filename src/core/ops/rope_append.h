// Decoding's rope and KV-cache append as one op: the queries and keys of the fused q, k, v product rotated
// (ops::rope, half_split), the queries returned, the keys and the values written into a KV cache's slots. On
// Vulkan one dispatch (kernels/attention/rope_append.comp) where the composition takes four: a dense copy of the
// strided product's queries and keys, the rope and two copies into the cache. Elsewhere (the CPU) it is that
// composition. Inference only: it writes into its destinations in place and records nothing for autodiff.
#pragma once
#include "core/primitive.h"
#include "core/tensor.h"

namespace lmtune {

// Inputs: qk [B, T, H + KV, D], v [B, T, KV, D], positions i32 [B, T], inv_freq f32 [R/2]. Outputs: q [B, T, H, D]
// (dense), then the keys' and the values' slots [B, T, KV, D] (views of a cache: heads and dims dense).
class RopeAppend final : public Primitive {
 public:
  explicit RopeAppend(float scale) : scale(scale) {}
  const char* name() const override { return "rope_append"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { compose(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  // The fallback: ops::rope of qk into a temporary, then copies of its query and key heads and of v.
  void compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const;

  const float scale;  // cos and sin times this (yarn's and longrope's attention factor)
};

namespace ops {

// The queries [B, T, H, D] of qk [B, T, H + KV, D] rotated at positions with inv_freq (as ops::rope, half_split,
// `scale`); its keys rotated into k_slots and v copied into v_slots (both [B, T, KV, D], heads and dims dense).
// qk and v must not be recorded for autodiff.
Tensor rope_append(const Tensor& qk, const Tensor& v, const Tensor& positions, const Tensor& inv_freq, float scale,
                   const Tensor& k_slots, const Tensor& v_slots);

}  // namespace ops
}  // namespace lmtune
