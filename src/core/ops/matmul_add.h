// A product with an addend taken in its epilogue: y = a b + e (+ α u v), e [M, N] or a row [N] added to every
// row (a bias, or the decoder's residual stream). Generation calls it through Linear (models/linear.cpp): where
// the kernel that takes the product can add e as it writes its sums (Vulkan's decode gemv,
// kernels/matmul/matmul_gemv.comp) the sum costs no pass of its own; elsewhere, on the CPU too, it is the
// product (MatmulLowRank with the low-rank term) and an add into its output, as the ops would compose it.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Inputs: a [M, K], b [K, N], e [M, N] or [N], and optionally u [M, R] and v [R, N] (a LoRA adapter's s x Aᵀ and
// Bᵀ) scaled by alpha. Output [M, N] in the dtype given to the op; sums in f32.
class MatmulAdd final : public Primitive {
 public:
  explicit MatmulAdd(float alpha) : alpha(alpha) {}
  const char* name() const override { return "matmul_add"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { compose(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool may_defer() const override { return true; }
  // The fallback of both backends, written with ops.
  void compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const;

  const float alpha;  // the low-rank term's scale
};

namespace ops {

// a [M, K] b [K, N] + e ([M, N] or [N]) -> [M, N] of out_dtype.
Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& e, DType out_dtype);
// a b + alpha u v + e, u [M, R], v [R, N].
Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& e, const Tensor& u, const Tensor& v, float alpha,
                  DType out_dtype);

}  // namespace ops
}  // namespace lmtune
