// Skinny products on tensor cores without shared-memory staging (kernels/matmul/matmul_skinny.comp): C [M, N] = A [M,
// K] B [K, N] with N <= 32 and A 16-bit with 16-byte rows, LoRA's rank side (x Aᵀ, g (s B)). The general tiles run
// these at about half the memory bandwidth (barriers and staging for data that is used once).
#include "backend/vulkan/matmul_skinny.h"

#include <cstdint>
#include <string>

#include "backend/vulkan/fragment_layout.h"
#include "backend/vulkan/kernel_util.h"

namespace lmtune::vk {
namespace {

// Mirrors SkinnyParams in kernels/matmul/matmul_skinny.comp.
struct SkinnyParams {
  uint32_t M, N, K;
  uint32_t a_off, a_rs;
  uint32_t b_off, b_ks, b_ns;
  uint32_t c_off, c_rs;
  float alpha;
};

uint32_t code(DType t) { return t == DType::f32 ? 0 : t == DType::f16 ? 1 : 2; }

}  // namespace

bool skinny_takes(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2 || c.numel() == 0) return false;
  const int64_t M = c.dim(0), N = c.dim(1), K = a.dim(1);
  const int64_t a_rs = a.strides()[0], a_cs = a.strides()[1], c_rs = c.strides()[0], c_cs = c.strides()[1];
  const bool a16 = a.dtype() == DType::f16 || a.dtype() == DType::bf16;
  if (!a16 || N > 32 || N % 2 != 0 || K % 32 != 0 || K == 0 || M > int64_t(65535) * 32) return false;
  if (a_cs != 1 || a_rs % 8 != 0 || a.offset() % 8 != 0 || c_cs != 1 || c_rs % 2 != 0 || c.offset() % 2 != 0)
    return false;
  for (const Tensor* t : {&a, &b, &c})  // 32-bit element offsets in the kernel
    if (t->buffer()->bytes() > (uint64_t(1) << 32) - 1) return false;
  return fragment_layout_is_mma(ctx);
}

void record_skinny(Context& ctx, const Tensor& a, const Tensor& b, Tensor& c, float alpha) {
  const int64_t M = c.dim(0), N = c.dim(1), K = a.dim(1);
  SkinnyParams p{uint32_t(M), uint32_t(N), uint32_t(K), uint32_t(a.offset()), uint32_t(a.strides()[0]),
                 uint32_t(b.offset()), uint32_t(b.strides()[0]), uint32_t(b.strides()[1]), uint32_t(c.offset()),
                 uint32_t(c.strides()[0]), alpha};
  ctx.dispatch(N <= 16 ? "matmul_skinny_n1" : "matmul_skinny_n2", {in(a), in(b), out(c)}, p,
               {uint32_t((M + 31) / 32), 1, 1}, {code(a.dtype()), code(b.dtype()), code(c.dtype())});
}

}  // namespace lmtune::vk
