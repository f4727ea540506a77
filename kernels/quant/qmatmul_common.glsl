// Shared by the products with a block-quantized weight W (qmatmul.comp, qmatmul_gemv.comp, qmatmul_coopmat.comp):
// the push constants (mirrored by QMatmulParams in src/backend/vulkan/quant_matmul.cpp) and W's 8-element groups.
//   C [M, N] = X [M, K] Wᵀ with W [N, K] (QFLAG_NT: a linear layer's forward), or
//   C [M, N] = X [M, K] W  with W [K, N] (the input gradient dY W),
// plus D [M, N] with QFLAG_ADD (a LoRA delta added in the epilogue instead of a pass of its own).
// X: any float dtype, unit column stride; C and D: contiguous. W's rows are w_rb bytes apart from byte w_off of binding 1.
// Include after declaring qw (quant_block.glsl) and the tensors C and D (TENSOR(2, C), TENSOR(3, D)).
#ifndef LMTUNE_QMATMUL_COMMON_GLSL
#define LMTUNE_QMATMUL_COMMON_GLSL

#include "quant/quant_block.glsl"

layout(push_constant) uniform QMatmulParams {
  uint M, N, K;
  uint x_off, x_rs;  // X's element offset and row stride
  uint w_off, w_rb;  // W's byte offset and bytes per row
  uint c_off;        // C's element offset
  uint dtypes;       // X | C << 8 | D << 16 (DT_* codes)
  uint flags;        // QFLAG_*
  uint d_off;        // D's element offset (binding 3; QFLAG_ADD)
} pc;

#define QFLAG_NT 1u     // C = X Wᵀ; else C = X W
#define QFLAG_X_VEC 2u  // X's offset and row stride are multiples of 8 (16-byte loads of 8 elements)
#define QFLAG_ADD 4u    // C = ... + D

#ifdef QSPEC
// The dtypes and flags as specialization constants 2 and 3 (the host passes the push constants' values): a
// pipeline per combination, compiled without the dtype switches and the paths it does not take (qmatmul_gemv,
// whose decode steps are bound by their code's length as much as by their bytes).
layout(constant_id = 2) const uint QDTYPES = 0u;
layout(constant_id = 3) const uint QFLAGS = 0u;
uint q_dtypes() { return QDTYPES; }
uint q_flags() { return QFLAGS; }
#else
uint q_dtypes() { return pc.dtypes; }
uint q_flags() { return pc.flags; }
#endif

uint x_dtype() { return q_dtypes() & 15u; }
uint c_dtype() { return (q_dtypes() >> 8) & 15u; }

// Element (m, n) of the result: the product's sum v, plus D's element with QFLAG_ADD, stored in C's dtype.
void store_result(uint m, uint n, float v) {
  if ((q_flags() & QFLAG_ADD) != 0u) v += D_ld((q_dtypes() >> 16) & 15u, pc.d_off + m * pc.N + n);
  C_st(c_dtype(), pc.c_off + m * pc.N + n, v);
}

// Elements (r, c .. c + 7) of W (c a multiple of 8; rows of W are the blocks' rows whatever the product's layout).
void w_group(uint r, uint c, out vec4 lo, out vec4 hi) {
  dequant8(pc.w_off + r * pc.w_rb + (c / QK) * QB, (c % QK) >> 3, lo, hi);
}

#endif
