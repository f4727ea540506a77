// Linear layer under autocast: 16-bit activations times an f32 weight (a trainable master copy, e.g. a LoRA
// factor), with the product on the 16-bit (tensor-core) path and the weight's gradient kept in f32.
//
// Casting the weight with ops::cast would give its gradient the 16-bit dtype of the cast (cotangents travel in the
// dtype of their value) and round it before it reaches the f32 master. This composite primitive instead computes
// d weight = gᵀ x straight into f32 (16-bit operands, f32 accumulation and result). Its forward runs the Matmul
// primitive's kernel straight into the output; its vjp and jvp are written with other ops, so it runs on every
// backend as it is.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Inputs: x [..., K] (f16 or bf16), weight [N, K] (f32). Output: y [..., N] in x's dtype, y = x · cast(weight)ᵀ.
class AutocastLinear final : public Primitive {
 public:
  const char* name() const override { return "autocast_linear"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  LMTUNE_PRIMITIVE_VJP_JVP();

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
  // The weight in x's dtype, cast by the forward pass and reused by the vjp (one cast per factor and step, not two:
  // LoRA's factors are small, but each cast is a dispatch).
  Tensor weight_16;
};

}  // namespace lmtune
