// In-place optimizer updates (not differentiable; run under NoGrad by the trainer). Hyper-parameters come in a
// small f32 device tensor so a recorded step can be replayed with new values. Kernels:
// backend/{cpu,vulkan}/optimizer.cpp.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Layout of the hyper-parameter tensor (f32 [kOptimHyperSize]).
enum OptimHyper : int {
  kLr = 0,           // learning rate for this step
  kBeta1,            // AdamW β1 / SGD momentum
  kBeta2,            // AdamW β2
  kEps,
  kWeightDecay,      // decoupled: p -= lr · wd · p
  kBiasCorrection1,  // 1 - β1^t
  kBiasCorrection2,  // 1 - β2^t
  kGradScale,        // multiplies the gradient first (1/loss_scale · clip factor)
  kOptimHyperSize
};

// Inputs: param f32, m f32, v f32 (same shape), grad (any float dtype, same shape), hyper f32 [8].
// Updates param, m and v in place (AdamW with decoupled weight decay and bias correction, as torch.optim.AdamW).
class AdamWUpdate final : public Primitive {
 public:
  const char* name() const override { return "adamw_update"; }
  LMTUNE_PRIMITIVE_EVAL();
};

// Inputs: param f32, momentum buffer f32 (may be undefined when β1 = 0), grad, hyper. SGD with momentum
// (torch.optim.SGD semantics: buf = μ·buf + g; p -= lr·buf) and decoupled weight decay.
class SgdUpdate final : public Primitive {
 public:
  const char* name() const override { return "sgd_update"; }
  LMTUNE_PRIMITIVE_EVAL();
};

// Inputs: any number of float tensors on one device (dense: contiguous, any offset). Output: f32 scalar, the sum of
// the squares of all their elements (f32 accumulation) — the gradient norm's square in a few dispatches instead of
// three per tensor. On Vulkan one dispatch covers the tensors of up to `max_buffers` device buffers (8; fewer in
// tests, to exercise the grouping), each tensor cut into chunks of 8192 elements, one workgroup per chunk.
class SumOfSquares final : public Primitive {
 public:
  explicit SumOfSquares(int max_buffers = 8) : max_buffers(max_buffers) {}
  const char* name() const override { return "sum_of_squares"; }
  LMTUNE_PRIMITIVE_EVAL();
  int max_buffers;
};

namespace ops {
// Σ over xs of Σ x² (f32 scalar on xs' device). Non-contiguous tensors are copied first.
Tensor sum_of_squares(const std::vector<Tensor>& xs, int max_buffers = 8);
void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad, const Tensor& hyper);
void sgd_update(const Tensor& param, const Tensor& momentum, const Tensor& grad, const Tensor& hyper);
}  // namespace ops

}  // namespace lmtune
