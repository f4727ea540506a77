// Products with a block-quantized weight on Vulkan (QuantizedMatmul): which kernel of kernels/quant/ takes a
// product (a pure plan, printed by `lmtune bench ops`) and its dispatch. Routes, first that takes it:
//   gemv    at most 4 rows of x·Wᵀ on devices with subgroup arithmetic (qmatmul_gemv.comp): decode, W read once
//   coopmat f16/bf16 x on devices with VK_NV_cooperative_matrix (qmatmul_coopmat.comp): W's tiles decoded to f16 in
//           shared memory (f32 x takes the tiled kernel: f32 training stays exact in f32, as matmul's scalar route)
//   tiled   every device (qmatmul.comp): W's tiles decoded to f32 in shared memory, f32 arithmetic
// KernelChoice::matmul forces one: scalar = tiled, coopmat = coopmat (DeviceError where the device lacks it).
#pragma once
#include <cstdint>
#include <string>

#include "backend/vulkan/context.h"
#include "core/quant.h"

namespace lmtune::vk {

enum class QuantMatmulRoute { gemv, coopmat, tiled };

struct QuantMatmulPlan {
  QuantMatmulRoute route = QuantMatmulRoute::tiled;
  std::string kernel;          // the SPIR-V module
  quant::Format format = quant::Format::q8_0;
  bool transposed = true;      // x · Wᵀ (nt) or x · W (nn)
  uint64_t M = 0, N = 0, K = 0;  // C [M, N] = X [M, K] · (Wᵀ or W)
  uint32_t bm = 0, bn = 0;     // output tile (gemv: rows of W per workgroup in bn)

  // "qgemv q4_k 3 nt", "qcoopmat q4_k 128x128 nn", "qtiled nf4 64x64 nt".
  std::string describe() const;
};

constexpr uint64_t kQuantGemvMaxRows = 4;

QuantMatmulPlan plan_quant_matmul(Context& ctx, quant::Format format, bool transposed, uint64_t M, uint64_t N,
                                  uint64_t K, DType x_dtype);

}  // namespace lmtune::vk
