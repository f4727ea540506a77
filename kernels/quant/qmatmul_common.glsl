// Shared by the products with a block-quantized weight W (qmatmul.comp, qmatmul_gemv.comp, qmatmul_coopmat.comp):
// the push constants (mirrored by QMatmulParams in src/backend/vulkan/quant_matmul.cpp) and W's 8-element groups.
//   C [M, N] = X [M, K] Wᵀ with W [N, K] (QFLAG_NT: a linear layer's forward), or
//   C [M, N] = X [M, K] W  with W [K, N] (the input gradient dY W).
// X: any float dtype, unit column stride; C: contiguous. W's rows are w_rb bytes apart from byte w_off of binding 1.
// Include after declaring qw (quant_block.glsl).
#ifndef LMTUNE_QMATMUL_COMMON_GLSL
#define LMTUNE_QMATMUL_COMMON_GLSL

#include "quant/quant_block.glsl"

layout(push_constant) uniform QMatmulParams {
  uint M, N, K;
  uint x_off, x_rs;  // X's element offset and row stride
  uint w_off, w_rb;  // W's byte offset and bytes per row
  uint c_off;        // C's element offset
  uint dtypes;       // X | C << 8 (DT_* codes)
  uint flags;        // QFLAG_*
} pc;

#define QFLAG_NT 1u     // C = X Wᵀ; else C = X W
#define QFLAG_X_VEC 2u  // X's offset and row stride are multiples of 8 (16-byte loads of 8 elements)

uint x_dtype() { return pc.dtypes & 15u; }
uint c_dtype() { return (pc.dtypes >> 8) & 15u; }

// Elements (r, c .. c + 7) of W (c a multiple of 8; rows of W are the blocks' rows whatever the product's layout).
void w_group(uint r, uint c, out vec4 lo, out vec4 hi) {
  dequant8(pc.w_off + r * pc.w_rb + (c / QK) * QB, (c % QK) >> 3, lo, hi);
}

#endif
