// A product whose epilogue takes a gated activation: out = act(y[:, :F]) * y[:, F:] for y = a b (+ e) (+ α u v)
// [M, 2F], the decoder's gate and up projections as one product (models::LinearGroup::gated) and its MLP's
// activation. Where Vulkan's decode gemv takes the product (kernels/matmul/matmul_gemv.comp) a subgroup writes
// act(gate) * up from the two sums, rounded as the separate product would have stored them: one dispatch and the
// same values as the product followed by ops::gated_activation, which is what it is elsewhere (the CPU too).
#pragma once
#include "core/ops.h"
#include "core/ops/elementwise.h"
#include "core/primitive.h"

namespace lmtune {

// Inputs: a [M, K], b [K, 2F], then optionally e [2F] (a bias), then optionally u [M, R] and v [R, 2F] (a LoRA
// adapter's s x Aᵀ and Bᵀ) scaled by alpha. Output [M, F] in the dtype given to the op; gate and up are rounded
// to it before the activation (f32 math).
class MatmulGated final : public Primitive {
 public:
  MatmulGated(UnaryOp act, bool bias, bool low_rank, float alpha)
      : act(act), bias(bias), low_rank(low_rank), alpha(alpha) {}
  const char* name() const override { return "matmul_gated"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { compose(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  LMTUNE_PRIMITIVE_VJP_JVP();
  // The fallback of both backends: the product into [M, 2F], then the gated activation of its halves.
  void compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const;

  const UnaryOp act;
  const bool bias, low_rank;
  const float alpha;  // the low-rank term's scale

 private:
  // y = a b (+ e) (+ α u v) [M, 2F] of the node's inputs, in `dtype`.
  Tensor product(const std::vector<Tensor>& in, DType dtype) const;
};

namespace ops {

// act(y[:, :F]) * y[:, F:] for y = a [M, K] b [K, 2F] (+ bias [2F]) (+ alpha u [M, R] v [R, 2F]); bias, u and v
// may be undefined. -> [M, F] of out_dtype.
Tensor matmul_gated(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& u, const Tensor& v,
                    float alpha, GateActivation act, DType out_dtype);

}  // namespace ops
}  // namespace lmtune
