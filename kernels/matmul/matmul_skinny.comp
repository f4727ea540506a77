#version 450
// Skinny products on tensor cores: C [M, N] = alpha A [M, K] B [K, N] for N <= 16 NF (LoRA's rank side: x Aᵀ and
// g (s B)), A 16-bit with rows of 16-byte-aligned K, K a multiple of 32. Every element of A takes part in one
// product only, so nothing is staged in shared memory: each subgroup streams its own 32 rows of A from memory
// into f16 A fragments, 16 bytes per lane per row, with the register prefetch of the next K step in flight.
// Fragments are built element by element in NVIDIA's mma.sync layout (frag_row / frag_col of mma_layout.glsl, checked on the
// device: backend/vulkan/fragment_layout.cpp). Within each 32-wide K step the order of k is permuted: lane l's
// 8 consecutive elements of a row (k = 8 (l % 4) + j) are its elements of both 16-wide fragments, so that one
// 16-byte load fills them (j = 4 f + q: fragment f, the lane's q-th column of it); B's fragments, built from
// element loads (B is small and stays in cache), take k in the same order, which leaves the sum unchanged.
// A workgroup's 8 subgroups share 32 rows and split K eight ways (interleaved or contiguous steps, see below);
// they add their sums through shared memory at the end. No barrier in the main loop and no split-K pass.
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable

#define MATMUL_NO_PARAMS
#include "matmul/matmul_common.glsl"
#include "matmul/mma_layout.glsl"

#ifndef NF
#define NF 1  // 16-wide fragments across N
#endif
#ifndef INTERLEAVE
#define INTERLEAVE 0
#endif
#define NP (16 * NF)
#define NSG 8
#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

layout(local_size_x = NSG * 32) in;
layout(constant_id = 0) const uint ADT = DT_F16;  // DT_F16 or DT_BF16
layout(constant_id = 1) const uint BDT = DT_F16;
layout(constant_id = 2) const uint CDT = DT_F32;

// Mirrored by SkinnyParams in src/backend/vulkan/matmul_skinny.cpp; offsets and strides in elements.
layout(push_constant) uniform SkinnyParams {
  uint M, N, K;
  uint a_off, a_rs;        // A (m, k) at a_off + m a_rs + k (a_off, a_rs multiples of 8)
  uint b_off, b_ks, b_ns;  // B (k, n) at b_off + k b_ks + n b_ns
  uint c_off, c_rs;        // C (m, n) at c_off + m c_rs + n (c_off, c_rs even)
  float alpha;             // C = alpha A B
} p;

layout(set = 0, binding = 0) readonly buffer ABuf { uvec4 a128[]; };
layout(set = 0, binding = 1) readonly buffer BBuf { float b32[]; };
layout(set = 0, binding = 1) readonly buffer BBufW { uint bw[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf { float c32[]; };
layout(set = 0, binding = 2) writeonly buffer CBufW { uint cw[]; };

shared float part[NSG * 32 * NP];  // each subgroup's sums over its slice of K

float16_t b_at(uint e) {
  if (BDT == DT_F32) return float16_t(b32[e]);
  const uint h = half_bits(bw[e >> 1], e);
  return float16_t(BDT == DT_F16 ? f16_bits_to_float(h) : bf16_bits_to_float(h));
}

void main() {
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, tid = gl_LocalInvocationID.x;
  const uint m0 = gl_WorkGroupID.x * 32u, g = lane / 4u, t = lane % 4u;
  // This subgroup's K steps. INTERLEAVE: steps sg, sg + 8, ... (the workgroup reads 512 contiguous bytes of each
  // row at a time; H100, 8192x16x8192: 60 us instead of 74, but 8192x32x8192 220-400 us instead of 117), else a
  // contiguous eighth of K.
#if INTERLEAVE
  const uint steps = p.K / 32u, s0 = sg, s1 = steps, ds = NSG;
#else
  const uint steps = p.K / 32u, per = (steps + NSG - 1u) / NSG, ds = 1u;
  const uint s0 = min(steps, sg * per), s1 = min(steps, s0 + per);
#endif

  // A: rows g + 8 i (i = 0..3: fragment i / 2, upper half i % 2), elements 8 t .. 8 t + 7 of each step.
  uint a_at[4];
  [[unroll]] for (uint i = 0; i < 4u; ++i)
    a_at[i] = (p.a_off + min(m0 + g + 8u * i, p.M - 1u) * p.a_rs + 8u * t) / 8u;
  // B: element e of this lane's fragment (f, nf) is (k, n) = (8 (g / 2) + 4 f + g % 2 + 2 (e / 4), nf 16 +
  // frag_col): the permuted k of fragment row frag_row(lane, e) = g + 8 (e / 4).
  uint b_at0[2][2];  // [f][e / 4]: offset of k at step 0
  [[unroll]] for (uint f = 0; f < 2u; ++f)
    [[unroll]] for (uint h = 0; h < 2u; ++h)
      b_at0[f][h] = p.b_off + (8u * (g / 2u) + 4u * f + g % 2u + 2u * h) * p.b_ks;
  uint b_n[NF][4];  // [nf][e % 4]: n offset, or ~0 past N
  [[unroll]] for (uint nf = 0; nf < NF; ++nf)
    [[unroll]] for (uint q = 0; q < 4u; ++q) {
      const uint n = nf * 16u + frag_col(lane, q);
      b_n[nf][q] = n < p.N ? n * p.b_ns : ~0u;
    }

  F32M acc[2][NF];
  [[unroll]] for (uint i = 0; i < 2u; ++i)
    [[unroll]] for (uint nf = 0; nf < NF; ++nf) acc[i][nf] = F32M(0.0);

  uvec4 ra[4], na[4];
  float16_t rb[NF][2][8], nb[NF][2][8];
#define LOAD_STEP(S, A, B)                                                                          \
  {                                                                                                 \
    const uint ka = (S) * 4u, kb = (S) * 32u * p.b_ks;                                              \
    [[unroll]] for (uint i = 0; i < 4u; ++i) A[i] = a128[a_at[i] + ka];                             \
    [[unroll]] for (uint nf = 0; nf < NF; ++nf)                                                     \
      [[unroll]] for (uint f = 0; f < 2u; ++f)                                                      \
        [[unroll]] for (uint e = 0; e < 8u; ++e) {                                                  \
          const uint n = b_n[nf][e % 4u];                                                           \
          B[nf][f][e] = n == ~0u ? float16_t(0.0) : b_at(b_at0[f][e / 4u] + kb + n);                \
        }                                                                                           \
  }
  if (s0 < s1) LOAD_STEP(s0, ra, rb)
  for (uint s = s0; s < s1; s += ds) {
    if (s + ds < s1) LOAD_STEP(s + ds, na, nb)
    F16M bf[NF][2];
    [[unroll]] for (uint nf = 0; nf < NF; ++nf)
      [[unroll]] for (uint f = 0; f < 2u; ++f)
        [[unroll]] for (uint e = 0; e < 8u; ++e) bf[nf][f][e] = rb[nf][f][e];
    [[unroll]] for (uint i = 0; i < 2u; ++i) {
      const uvec4 lo = as_f16(ADT, ra[2u * i]), hi = as_f16(ADT, ra[2u * i + 1u]);  // rows g and g + 8 of fragment i
      [[unroll]] for (uint f = 0; f < 2u; ++f) {
        // Element e: row g + 8 (e / 4), the lane's column e % 4, i.e. half 4 f + e % 4 of the row's 8.
        const f16vec2 l0 = unpackFloat2x16(lo[2u * f]), l1 = unpackFloat2x16(lo[2u * f + 1u]);
        const f16vec2 h0 = unpackFloat2x16(hi[2u * f]), h1 = unpackFloat2x16(hi[2u * f + 1u]);
        F16M a;
        a[0] = l0.x; a[1] = l0.y; a[2] = l1.x; a[3] = l1.y;
        a[4] = h0.x; a[5] = h0.y; a[6] = h1.x; a[7] = h1.y;
        [[unroll]] for (uint nf = 0; nf < NF; ++nf) acc[i][nf] = coopMatMulAddNV(a, bf[nf][f], acc[i][nf]);
      }
    }
    ra = na;
    rb = nb;
  }

  [[unroll]] for (uint i = 0; i < 2u; ++i)
    [[unroll]] for (uint nf = 0; nf < NF; ++nf)
      [[unroll]] for (uint e = 0; e < 8u; ++e)
        part[(sg * 32u + i * 16u + frag_row(lane, e)) * NP + nf * 16u + frag_col(lane, e)] = acc[i][nf][e];
  barrier();
  // Column pairs of the 32 rows: 2 adjacent outputs per item (one 32-bit word of a 16-bit C).
  for (uint q = tid; q < 16u * NP; q += NSG * 32u) {
    const uint r = q / (NP / 2u), c = 2u * (q % (NP / 2u)), m = m0 + r;
    if (m >= p.M || c >= p.N) continue;
    vec2 s = vec2(0.0);
    [[unroll]] for (uint w = 0; w < NSG; ++w)
      s += vec2(part[(w * 32u + r) * NP + c], part[(w * 32u + r) * NP + c + 1u]);
    s *= p.alpha;
    const uint at = p.c_off + m * p.c_rs + c;
    if (CDT == DT_F32) {
      c32[at] = s.x;
      c32[at + 1u] = s.y;
    } else if (CDT == DT_F16) {
      cw[at >> 1] = packHalf2x16(s);
    } else {
      cw[at >> 1] = float_to_bf16_bits(s.x) | (float_to_bf16_bits(s.y) << 16);
    }
  }
}
