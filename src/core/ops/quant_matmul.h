// Products with a frozen block-quantized weight (QLoRA's base layers): y = x Wᵀ (forward) and dx = dy W (its input
// gradient), W a QuantizedTensor [N, K] (core/quant.h) decoded block by block inside the kernels, never as a
// full-size dense copy. Kernels: backend/cpu/quant_matmul.cpp (panels of rows dequantized into small f32 scratch,
// one OpenBLAS GEMM per panel), backend/vulkan/quant_matmul.cpp (kernels/quant/: gemv for decode, tiled kernels).
#pragma once
#include "core/primitive.h"
#include "core/quant.h"

namespace lmtune {

// The most of a weight a backend decodes at once (the Vulkan panel route's buffer, backend/vulkan/quant_matmul.h):
// one 8B projection (14336 x 4096 bf16 is 112 MiB) in one panel. The memory estimate counts it (models/memory.cpp).
constexpr uint64_t kQuantizedPanelBytes = uint64_t(128) << 20;

// x [M, K_x] (rows; any float dtype, unit column stride) -> out [M, N_out] in the output dtype, f32 sums.
// transposed: out = x Wᵀ (K_x = W's cols, N_out = W's rows); else out = x W (K_x = W's rows, N_out = W's cols).
// An optional second input d [M, N_out] (any float dtype) is added as the result is stored: a LoRA delta without
// an add pass of its own. W is frozen: the vjp gives x's gradient (the other layout of the same weight) and d's
// (the cotangent itself), the jvp the same product of x's tangent plus d's.
class QuantizedMatmul final : public Primitive {
 public:
  QuantizedMatmul(quant::QuantizedTensor weight, bool transposed)
      : weight(std::move(weight)), transposed(transposed) {}
  const char* name() const override { return "quantized_matmul"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return false; }  // linear in x

  const quant::QuantizedTensor weight;
  const bool transposed;
};

namespace ops {
// x [..., K] Wᵀ + addend [..., N] in x's dtype, the addend added in the product's epilogue (models::Linear adds its
// LoRA deltas to a quantized base this way).
Tensor quantized_linear_add(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& addend);
}  // namespace ops

}  // namespace lmtune
