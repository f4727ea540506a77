// Batched matrix product. Kernels: backend/cpu/matmul.cpp (OpenBLAS), backend/vulkan/matmul.cpp
// (tiled scalar kernel; cooperative-matrix kernel with f16 operands where the device has them).
#pragma once
#include "core/primitive.h"

namespace lmtune {

// alpha · a [..., M, K] x b [..., K, N] -> out [..., M, N]; batch dims broadcast (out has the broadcast batch
// shape). Each operand's last two dims may be row-major (stride of last dim 1) or transposed (stride of dim -2 is
// 1); anything else is made contiguous by the op function before the kernel sees it. Accumulates in f32.
class Matmul final : public Primitive {
 public:
  explicit Matmul(float alpha = 1.0f) : alpha(alpha) {}
  const char* name() const override { return "matmul"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool may_defer() const override { return true; }

  const float alpha;
};

// a [M, K] x b [K, N] + alpha * u [M, R] x v [R, N] -> [M, N]: a product with a low-rank addend (a LoRA
// adapter's delta, or its input gradient) in one pass over the output. The fast coopmat kernel runs the addend as
// more K tiles (16-bit U and V laid out as A and B, R a multiple of 8); the scalar kernel and OpenBLAS add it too,
// and elsewhere it is composed (backend/vulkan/matmul.cpp).
// Output dtype as given; f32 accumulation.
class MatmulLowRank final : public Primitive {
 public:
  explicit MatmulLowRank(float alpha) : alpha(alpha) {}
  const char* name() const override { return "matmul_low_rank"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool may_defer() const override { return true; }

  const float alpha;
};

// c [M, N] = c * scale[:, None] + a [M, K] x b [K, N], in place (scale f32 [M], optional: none multiplies by 1;
// a and b as Matmul takes them, f32 accumulation): a running sum of products, as the fused loss keeps its hidden
// gradient. No gradient (it runs inside other primitives' forward passes). Vulkan: the fast coopmat kernel's
// epilogue reads C where it takes the product (no [M, N] passes of their own), else composed, as on the CPU.
class MatmulAccumulate final : public Primitive {
 public:
  const char* name() const override { return "matmul_accumulate"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { compose(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  static void compose(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

}  // namespace lmtune
