// Shared by matmul.comp (scalar) and matmul_coopmat.comp: the push-constant block (mirrored by MatmulParams
// in src/backend/vulkan/matmul.cpp), element-type codes, and float <-> f16/bf16 bit conversions.
//
// C[z][m][n] = sum_k A[z][m][k] * B[z][k][n] (+ alpha * sum_r U[m][r] * V[r][n] where R > 0: a low-rank
// addend such as a LoRA adapter's delta, unbatched and without split-K) for one output tile per workgroup. Element (m, k) of A lives at
// a_off + b0 * a_bs0 + b1 * a_bs1 + m * a_rs + k * a_cs (likewise B with rows k, cols n), so transposed
// operands are just swapped strides and broadcast batch dims have stride 0. gl_WorkGroupID.z = batch * nsplit
// + split: with split-K, split s sums k in [s * k_split, (s + 1) * k_split) and writes f32 partials to slice
// (s * nbatch + batch) of C, which a reduction pass adds up.
#ifndef MATMUL_COMMON_GLSL
#define MATMUL_COMMON_GLSL

#define DT_F32 0u
#define DT_F16 1u
#define DT_BF16 2u

#ifndef MATMUL_NO_PARAMS
layout(push_constant) uniform MatmulParams {
  uint M, N, K;
  uint a_off, a_rs, a_cs, a_bs0, a_bs1;
  uint b_off, b_rs, b_cs, b_bs0, b_bs1;
  uint c_off;
  uint nb1;      // size of the inner batch dim (batch index = b0 * nb1 + b1)
  uint dtypes;   // a | b << 4 | c << 8 (DT_* codes)
  uint k_split;  // K elements per split (a multiple of the kernel's K step); >= K without split-K
  uint nsplit;
  uint flags;    // FLAG_* below
  uint u_off, u_rs, u_cs;  // the low-rank addend: U [M, R] and V [R, N] at bindings 3 and 4, element offsets
  uint v_off, v_rs, v_cs;  // and strides as for A and B (dtypes: bits 12 and 16 of `dtypes`)
  uint R;                  // 0: no addend
  float alpha;
  uint s_off;              // FLAG_ROW_SCALE: element offset of the f32 row scales (binding 5)
} pc;

#define FLAG_A_VEC 1u  // A's contiguous dim, offset, other strides are multiples of 8 elements (f32: of 4)
#define FLAG_B_VEC 2u
#define FLAG_C_VEC 4u  // C offset and N are multiples of 8 elements
#define FLAG_C_ACC 8u  // fast kernel: C = C (* row scale) + A B, C read before it is written (no split-K)
#define FLAG_ROW_SCALE 16u  // with FLAG_C_ACC: C's old row m is multiplied by scale[s_off + m] first
#define FLAG_M_EDGE 32u  // fast kernel, A not transposed: M % BM != 0; rows past M read row M - 1, are not written

#endif  // MATMUL_NO_PARAMS

#ifndef MATMUL_NO_PARAMS
uint a_dtype() { return pc.dtypes & 15u; }
uint b_dtype() { return (pc.dtypes >> 4) & 15u; }
uint c_dtype() { return (pc.dtypes >> 8) & 15u; }
uint u_dtype() { return (pc.dtypes >> 12) & 15u; }
uint v_dtype() { return (pc.dtypes >> 16) & 15u; }

// Batch offsets of A and B, and the element offset of C's slice, for workgroup z.
void batch_offsets(uint z, out uint a_base, out uint b_base, out uint c_base, out uint split) {
  split = z % pc.nsplit;
  uint batch = z / pc.nsplit;
  uint b0 = batch / pc.nb1, b1 = batch % pc.nb1;
  a_base = pc.a_off + b0 * pc.a_bs0 + b1 * pc.a_bs1;
  b_base = pc.b_off + b0 * pc.b_bs0 + b1 * pc.b_bs1;
  uint nbatch = gl_NumWorkGroups.z / pc.nsplit;
  c_base = pc.c_off + (split * nbatch + batch) * pc.M * pc.N;
}

// The first statements of the tiled kernels' main() (matmul.comp, matmul_coopmat.comp, matmul_coopmat_fast.comp):
// declares m0, n0 (the workgroup's C tile origin, BM x BN tiles), a_base, b_base, c_base, split (batch_offsets) and
// the split's K range [kbeg, kend).
#define TILE_ORIGIN                                                                                   \
  uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;                                        \
  uint a_base, b_base, c_base, split;                                                                 \
  batch_offsets(gl_WorkGroupID.z, a_base, b_base, c_base, split);                                     \
  uint kbeg = split * pc.k_split;                                                                     \
  uint kend = min(pc.K, kbeg + pc.k_split);

#endif  // MATMUL_NO_PARAMS

// 16-bit element `e` of a buffer seen as 32-bit words.
uint half_bits(uint word, uint e) { return (word >> ((e & 1u) << 4)) & 0xffffu; }
float f16_bits_to_float(uint h) { return unpackHalf2x16(h).x; }
float bf16_bits_to_float(uint h) { return uintBitsToFloat(h << 16); }
uint float_to_f16_bits(float v) { return packHalf2x16(vec2(v, 0.0)) & 0xffffu; }
// 8 16-bit elements in registers as f16 pairs: bf16 words converted, f16 as they are.
uvec4 as_f16(uint dt, uvec4 w) {
  if (dt != DT_BF16) return w;
  return uvec4(packHalf2x16(vec2(uintBitsToFloat(w.x << 16), uintBitsToFloat(w.x & 0xffff0000u))),
               packHalf2x16(vec2(uintBitsToFloat(w.y << 16), uintBitsToFloat(w.y & 0xffff0000u))),
               packHalf2x16(vec2(uintBitsToFloat(w.z << 16), uintBitsToFloat(w.z & 0xffff0000u))),
               packHalf2x16(vec2(uintBitsToFloat(w.w << 16), uintBitsToFloat(w.w & 0xffff0000u))));
}
// Round to nearest even, NaN stays a quiet NaN (matches lmtune::f32_to_bf16).
uint float_to_bf16_bits(float v) {
  uint u = floatBitsToUint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

#endif
