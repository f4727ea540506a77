// A linear layer with one LoRA adapter under autocast, as one primitive: y = x Wᵀ + s (x Aᵀ) Bᵀ with the adapter's
// delta multiplied into the base product's accumulators (MatmulLowRank), and in the backward pass
// dx = g W + s (g B) A in one product the same way. Composed of ops::linear and ops::autocast_linear, the delta
// took its own [tokens, out] product and an add in the forward pass, and another product and add for dx.
//
// The factors stay f32 masters with f32 gradients (as in AutocastLinear); the products run on f16 copies, and the
// rank-R intermediates (s x Aᵀ, s g B) are kept in f16, the precision the tensor cores read them in.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Inputs: x [..., K] (f16 or bf16), weight [N, K] (any float dtype; frozen or not), a [R, K] and b [N, R] (f32),
// and optionally x_in (x after LoRA dropout: the adapter's input; dx is then two products). Output: y [..., N] in
// x's dtype. weight_t, where given, is the frozen weight stored transposed ([K, N]): the forward product then reads
// it as x · weight_t (the layout the tensor-core GEMM runs fastest) instead of x · weightᵀ; the backward keeps
// using weight (g · W is already that layout).
class LoraLinear final : public Primitive {
 public:
  LoraLinear(float scale, Tensor weight_t) : scale(scale), weight_t(std::move(weight_t)) {}
  const char* name() const override { return "lora_linear"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool may_defer() const override { return true; }
  void prepare_vjp(const std::vector<Tensor>& in) override;

  const float scale;
  const Tensor weight_t;  // [K, N] or undefined

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
  // Kept from the forward pass for the vjp: A and B in f16, and s x Aᵀ [tokens, R] in f16.
  Tensor a16, b16, down;
};

}  // namespace lmtune
