// Vulkan matmul: kernel selection that tests and `lmtune bench ops` can override, and which kernel ran last.
// The kernels themselves are kernels/matmul.comp (tiled scalar, every device) and kernels/matmul_coopmat.comp
// (f16 tensor cores through VK_NV_cooperative_matrix); Matmul::eval_vulkan is in matmul.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace lmtune::vk {

enum class MatmulKernel { automatic, scalar, coopmat };

// Overrides for Matmul::eval_vulkan. The defaults come from the environment:
//   LMTUNE_NO_COOPMAT=1             never use the cooperative-matrix kernel
//   LMTUNE_MATMUL_KERNEL=scalar|coopmat|auto
//   LMTUNE_MATMUL_F32=exact|fp16    f32 inputs on the scalar kernel (full f32 products, the default: an f32
//                                   model asks for f32 precision) or on the coopmat kernel (rounded to f16)
//   LMTUNE_MATMUL_SPLITK=N          force N-way split-K (0 = choose)
//   LMTUNE_MATMUL_TILE=l|m|s        force a coopmat tile (l 128x256, m 128x128, s 64x64) or scalar tile
//                                   (l 128x128, m 64x64, s 32x32)
struct MatmulOptions {
  MatmulKernel kernel = MatmulKernel::automatic;
  bool f32_exact = true;
  int splitk = 0;
  char tile = 0;  // 0 = choose, else 'l', 'm' or 's'
};
// Process-wide; not thread-safe to change while matmuls run. With kernel = coopmat, a matmul on a device
// without cooperative matrices throws DeviceError instead of falling back.
MatmulOptions& matmul_options();

// Description of the last Vulkan matmul's kernel choice, e.g. "coopmat 128x256 nt split 1" (for benchmarks).
std::string last_matmul_kernel();
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

// Whether device `index` can run the cooperative-matrix kernel (ignores the options above).
bool coopmat_available(int index);

}  // namespace lmtune::vk
