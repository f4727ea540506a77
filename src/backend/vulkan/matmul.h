// Vulkan matmul: the entry point that records a product (matmul.cpp) on the kernel its plan chooses
// (matmul_plan.h); Matmul::eval_vulkan is in matmul.cpp. Tests force kernels through Context::kernel_choice().
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace lmtune::vk {

// Whether an operand takes the coopmat kernels' vector staging (FLAG_A_VEC / FLAG_B_VEC, 16-byte loads): element
// (r, c) at off + r * rs + c * cs (A: r = m, c = k; B: r = k, c = n), batch strides bs0 and bs1; `transposed`
// means r is the contiguous dim (rs == 1), else c is (cs == 1). Everything but that unit stride must be a
// multiple of 8 elements (4 for f32, loaded as vec4). Every tile interior and both operands vector: the fast
// kernel (matmul_coopmat_fast.comp).
bool vector_staging(DType t, bool transposed, int64_t rs, int64_t cs, int64_t off, int64_t bs0, int64_t bs1);

// Records C = A B (+ alpha U V with `lr`: U [M, R], V [R, N], unbatched) on C's device. Returns false, recording
// nothing, when the addend cannot go into the kernel this product takes (batched, K = 0, or the general coopmat
// kernel); the caller then composes it.
struct LowRankTerm {
  const Tensor* u;
  const Tensor* v;
  float alpha;
};
// With `acc`: C = C * row_scale[m] (none: 1) + A B, in the fast coopmat kernel's epilogue only (unbatched, no
// split-K, no addend); false, recording nothing, where the product takes another kernel.
struct Accumulate {
  const Tensor* row_scale;  // f32 [M], contiguous; or null
};
// alpha scales the product (without lr or acc): in the skinny kernel's sums, else by a pass over C afterwards.
bool record_matmul(const Tensor& a, const Tensor& b, Tensor& c, const LowRankTerm* lr,
                   const Accumulate* acc = nullptr, float alpha = 1.0f);

// Whether device `index` can run the VK_NV_cooperative_matrix kernels.
bool coopmat_available(int index);

}  // namespace lmtune::vk
