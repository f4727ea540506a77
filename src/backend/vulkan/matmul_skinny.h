// Skinny products C [M, N <= 32] = A [M, K] B on tensor cores, A streamed straight into fragments (see
// matmul_skinny.cpp and kernels/matmul/matmul_skinny.comp). Part of record_matmul's kernel choice.
#pragma once
#include "backend/vulkan/context.h"
#include "core/tensor.h"

namespace lmtune::vk {

// Whether the skinny kernel takes C = A B: unbatched; A f16 or bf16 with unit k stride and rows and offset
// multiples of 8 elements; K a multiple of 32; N even and at most 32; C with unit column stride and even row stride
// and offset; a device with the mma.sync fragment layout.
bool skinny_takes(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c);
// Records C = alpha A B on it (skinny_takes).
void record_skinny(Context& ctx, const Tensor& a, const Tensor& b, Tensor& c, float alpha = 1.0f);

}  // namespace lmtune::vk
