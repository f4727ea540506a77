// The Vulkan product's plan: which kernel takes C = A B (+ a low-rank addend, or + an accumulation into C), its
// tile, split-K and how batch dims reach the kernel. Computed from the operands' shapes, strides and dtypes, the
// device's features and the context's KernelChoice, without recording anything: record_matmul (matmul.cpp)
// dispatches a plan, tests check the choice, `lmtune bench ops` prints it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/matmul.h"

namespace lmtune::vk {

enum class MatmulRoute {
  gemv,          // at most 4 rows against a weight [N, K] (matmul_gemv.comp): decode, bound by the weights' bytes
  coopmat2,      // workgroup-scope cooperative matrices (matmul_cm2.comp): large 16-bit products
  skinny,        // N <= 32 with a 16-bit A (matmul_skinny.comp): LoRA's rank side
  coopmat_fast,  // VK_NV_cooperative_matrix, every tile interior and every operand vector-aligned
  coopmat,       // VK_NV_cooperative_matrix, any layout with a unit stride (matmul_coopmat.comp)
  scalar,        // tiled f32 arithmetic on every device (matmul.comp)
};

// One batch dim after folding: size and the element strides of A and B (C is contiguous).
struct BatchDim {
  int64_t size = 1, sa = 0, sb = 0;
};

struct MatmulPlan {
  MatmulRoute route = MatmulRoute::scalar;
  std::string kernel;  // the SPIR-V module
  uint64_t M = 0, N = 0, K = 0;
  bool ta = false, tb = false;        // A / B stored transposed (unit row stride)
  char tile = 0;                      // the planner's tile letter (KernelChoice::matmul_tile)
  uint32_t bm = 0, bn = 0, bk = 0;    // workgroup tile and K step
  std::vector<uint32_t> spec;         // scalar kernel's specialization: NT, BM, BN, BK, TM, TN
  uint32_t nsplit = 1;                // split-K: f32 partials in a workspace, then matmul_splitk
  uint64_t k_split = 0;               // K per split (a multiple of bk)
  BatchDim d0, d1;                    // the two batch dims the kernel takes (outer, inner)
  std::vector<BatchDim> outer;        // more batch dims: one dispatch each
  bool low_rank = false, accumulate = false;
  uint64_t gemv_rows = 0, gemv_row_stride = 0;  // gemv: A's rows (batch dims folded in) and their stride

  // "coopmat 128x256 nt splitk 2 fast", "coopmat2 128x256 nn", "coopmat skinny nn", "scalar 64x64", "gemv 1 nt".
  std::string describe() const;
};

// The plan for c = a b (+ lr) (or c = c * row_scale + a b with acc); M, N and K > 0. nullopt where the low-rank
// addend or the accumulation cannot go into the kernel that takes the product (the caller composes them).
// Throws for what no kernel takes: negative strides, an operand past 4 GiB, a kernel forced where the device
// lacks it.
std::optional<MatmulPlan> plan_matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                                      const LowRankTerm* lr = nullptr, const Accumulate* acc = nullptr);

}  // namespace lmtune::vk
