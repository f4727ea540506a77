// Products with a block-quantized weight on Vulkan (QuantizedMatmul): which kernel of kernels/quant/ takes a
// product (a pure plan, printed by `lmtune bench ops`) and its dispatch. Routes, first that takes it:
//   gemv    at most 4 rows of x·Wᵀ on devices with subgroup arithmetic (qmatmul_gemv.comp): decode, W read once
//   panels  at least kQuantPanelMinRows rows of f16/bf16 x on devices with cooperative matrices: W decoded a panel
//           at a time (qdequant.comp) into a transient dense buffer of at most kQuantPanelBytes in x's dtype (one
//           weight's worth, freed after the product; never a dense copy of the model), then the device's fastest
//           dense product (matmul_cm2 on the H100) writes the panel's columns of the result:
//           training and prefill, where the products are compute-bound and decoding inside the tensor-core loop
//           ran at a fifth of the dense product's speed
//   coopmat f16/bf16 x on devices with VK_NV_cooperative_matrix (qmatmul_coopmat.comp): W's tiles decoded to f16 in
//           shared memory (f32 x takes the tiled kernel: f32 training stays exact in f32, as matmul's scalar route)
//   tiled   every device (qmatmul.comp): W's tiles decoded to f32 in shared memory, f32 arithmetic
// KernelChoice::matmul forces one: scalar = tiled, coopmat = coopmat (DeviceError where the device lacks it);
// KernelChoice::quant_panels forces panels (any rows, any float x; the panels decode to f32 for f32 x).
#pragma once
#include <cstdint>
#include <string>

#include "backend/vulkan/context.h"
#include "core/dtype.h"
#include "core/ops/quant_matmul.h"
#include "core/quant.h"

namespace lmtune::vk {

enum class QuantMatmulRoute { gemv, panels, coopmat, tiled };

struct QuantMatmulPlan {
  QuantMatmulRoute route = QuantMatmulRoute::tiled;
  std::string kernel;          // the SPIR-V module
  quant::Format format = quant::Format::q8_0;
  bool transposed = true;      // x · Wᵀ (nt) or x · W (nn)
  uint64_t M = 0, N = 0, K = 0;  // C [M, N] = X [M, K] · (Wᵀ or W)
  uint32_t bm = 0, bn = 0;     // output tile (gemv: rows of W per workgroup in bn)
  uint64_t panel = 0;          // panels: columns of the result per panel (W's rows for nt, its columns for nn)
  DType panel_dtype = DType::bf16;

  // "qgemv q4_k 3 nt", "qpanels q4_k 2x8192 nt", "qcoopmat q4_k 128x128 nn", "qtiled nf4 64x64 nt".
  std::string describe() const;
};

constexpr uint64_t kQuantGemvMaxRows = 4;
constexpr uint64_t kQuantPanelMinRows = 64;
// A panel holds kQuantizedPanelBytes (core/ops/quant_matmul.h): fewer, larger products (the H100's 2048-token
// down_proj in 2304-column panels ran at 152-174 TFLOP/s against 271 whole).
constexpr uint64_t kQuantPanelBytes = kQuantizedPanelBytes;

QuantMatmulPlan plan_quant_matmul(Context& ctx, quant::Format format, bool transposed, uint64_t M, uint64_t N,
                                  uint64_t K, DType x_dtype);

}  // namespace lmtune::vk
