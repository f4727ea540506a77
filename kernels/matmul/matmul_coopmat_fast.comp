#version 450
// Fast path of the cooperative-matrix GEMM (matmul_coopmat.comp), for problems where every tile is interior
// (M % BM == N % BN == 0, K % 32 == 0) and A, B and C take vector access (FLAG_A_VEC, FLAG_B_VEC, FLAG_C_VEC):
// no bounds checks, no element-wise staging, per-thread global addresses computed once, dtypes as specialization
// constants (0: A, 1: B, 2: C; DT_* codes). The main loop follows vkprobe's cm_gemm.comp (194 TFLOP/s on the
// H100): global -> registers prefetch of the next K tile while the tensor cores work on the shared one.
// Same push constants, bindings and tile defines (BM, BN, WM, WN, NSTAGE, TA, TB: matmul_coopmat_tile.glsl) as
// matmul_coopmat.comp.
// SH16 = 1: operands stored transposed in memory (TA / TB) are staged into a float16_t shared array and read with
// column-major coopMatLoadNV from it (SH16 = 0: from the uvec4 array, as the general kernel does).
// A low-rank addend alpha U V (pc.R > 0: 16-bit U and V laid out as A and B, with vector access, R a multiple of
// 8) runs as ceil(R / BK) more K tiles through the same staging, zero beyond R: a LoRA adapter's delta costs no
// [M, N] pass of its own.
// The epilogue writes f32 fragments straight to C; f16 / bf16 C goes through shared memory (reusing A's tile), as
// does any C with FLAG_C_ACC (C = C * scale[m] + A B: the fused loss's running sum, core/ops/matmul.h).
// FLAG_M_EDGE (A and U not transposed; decode steps of any row count): the last row tile reads row M - 1 in place
// of the rows past M, whose sums are then not written.
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable

#include "matmul/matmul_coopmat_tile.glsl"

#ifndef SH16
#define SH16 0
#endif
#ifndef BK
#define BK 32
#endif

layout(constant_id = 0) const uint ADT = 1;
layout(constant_id = 1) const uint BDT = 1;
layout(constant_id = 2) const uint CDT = 0;

// Shared tiles; strides in halves, padded by 8 halves.
#if TA
#define ASTRH (BM + 8)  // As[k][m]
#define ASZH (BK * ASTRH)
#else
#define ASTRH (BK + 8)  // As[m][k]
#define ASZH (BM * ASTRH)
#endif
#if TB
#define BSTRH (BK + 8)  // Bs[n][k]
#define BSZH (BN * BSTRH)
#else
#define BSTRH (BN + 8)  // Bs[k][n]
#define BSZH (BK * BSTRH)
#endif
#define A16 (TA != 0 && SH16 != 0)
#define B16 (TB != 0 && SH16 != 0)
// 8-element chunks of a K tile per operand, and per thread (skinny tiles have fewer chunks than threads).
#define A_CH (BM * BK / 8)
#define B_CH (BK * BN / 8)
#define A_LD ((A_CH + NT - 1) / NT)
#define B_LD ((B_CH + NT - 1) / NT)
#define A_HAS(i) (A_CH % NT == 0 || tid + (i) * NT < A_CH)
#define B_HAS(i) (B_CH % NT == 0 || tid + (i) * NT < B_CH)

layout(local_size_x = NT) in;
layout(set = 0, binding = 0) readonly buffer ABuf4 { uvec4 a128[]; };
layout(set = 0, binding = 1) readonly buffer BBuf4 { uvec4 b128[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf { float c32[]; };
layout(set = 0, binding = 2) buffer CBuf4 { vec4 c4[]; };
layout(set = 0, binding = 2) buffer CBufH4 { uvec4 ch128[]; };
layout(set = 0, binding = 3) readonly buffer UBuf4 { uvec4 u128[]; };
layout(set = 0, binding = 4) readonly buffer VBuf4 { uvec4 v128[]; };
layout(set = 0, binding = 5) readonly buffer SBuf { float rscale[]; };

#if A16
shared float16_t As[NSTAGE * ASZH];
#define AOFF(h) (h)
#define ASTR_L ASTRH
#else
shared uvec4 As[NSTAGE * ASZH / 8];
#define AOFF(h) ((h) / 8)
#define ASTR_L (ASTRH / 8)
#endif
#if B16
shared float16_t Bs[NSTAGE * BSZH];
#define BOFF(h) (h)
#define BSTR_L BSTRH
#else
shared uvec4 Bs[NSTAGE * BSZH / 8];
#define BOFF(h) ((h) / 8)
#define BSTR_L (BSTRH / 8)
#endif
#if !A16
// f16 / bf16 C: a 16x16 f32 fragment per subgroup, in A's tile after the main loop.
#define CS_FITS (NSG * 64 <= NSTAGE * ASZH / 8)
#else
#define CS_FITS 0
#endif
#if !CS_FITS
shared float Cs[NSG * 256];
#endif
// Vulkan's guaranteed 48 KiB (NVIDIA builds a pipeline over it but the dispatch loses the device).
#if NSTAGE * (ASZH + BSZH) * 2 + (1 - CS_FITS) * NSG * 1024 > 49152
#error "matmul_coopmat_fast: shared memory over 48 KiB"
#endif

uvec4 ra[A_LD];
uvec4 rb[B_LD];
uint a_e[A_LD];  // element offset of each staged chunk at k = 0 (add k0 * k-stride)
uint b_e[B_LD];

// 8 consecutive elements starting at element e (a multiple of 8; f32: of 4): f16 and bf16 as loaded (the raw
// words stay in registers while the tensor cores work; bf16 becomes f16 only in shared_store, so the load's
// latency is not waited for before the multiply-adds), f32 converted to f16 pairs here.
#define VEC8_FN(NAME, BUF)                                                                            \
  uvec4 NAME(uint dt, uint e) {                                                                       \
    if (dt != DT_F32) return BUF[e >> 3];                                                             \
    uvec4 w0 = BUF[e >> 2], w1 = BUF[(e >> 2) + 1u];                                                  \
    return uvec4(packHalf2x16(uintBitsToFloat(w0.xy)), packHalf2x16(uintBitsToFloat(w0.zw)),          \
                 packHalf2x16(uintBitsToFloat(w1.xy)), packHalf2x16(uintBitsToFloat(w1.zw)));         \
  }
VEC8_FN(vec8_a, a128)
VEC8_FN(vec8_b, b128)

#include "matmul/matmul_coopmat_chunks.glsl"

// A's (and U's) row m as read: past M (FLAG_M_EDGE), row M - 1, whose sums land in rows that are not written.
uint a_row(uint m) { return (pc.flags & FLAG_M_EDGE) != 0u ? min(m, pc.M - 1u) : m; }
bool row_written(uint m) { return (pc.flags & FLAG_M_EDGE) == 0u || m < pc.M; }

void global_load(uint k0, uint tid) {
  uint ak = k0 * pc.a_cs, bk = k0 * pc.b_rs;
  [[unroll]] for (uint i = 0; i < A_LD; ++i)
    if (A_HAS(i)) ra[i] = vec8_a(ADT, a_e[i] + ak);
  [[unroll]] for (uint i = 0; i < B_LD; ++i)
    if (B_HAS(i)) rb[i] = vec8_b(BDT, b_e[i] + bk);
}

// K tile r0 / BK of the addend into the staging registers as f16 (U scaled by alpha), zero where r >= R.
void lowrank_load(uint r0, uint tid, uint m0, uint n0) {
  [[unroll]] for (uint i = 0; i < A_LD; ++i) {
    if (!A_HAS(i)) continue;
    uint m, k;
    a_chunk(tid + i * NT, m, k);
#if TA
    uint e = pc.u_off + (r0 + k) * pc.u_cs + m0 + m;
#else
    uint e = pc.u_off + a_row(m0 + m) * pc.u_rs + r0 + k;
#endif
    ra[i] = uvec4(0);
    if (r0 + k < pc.R) {
      uvec4 w = as_f16(u_dtype(), u128[e >> 3]);
      [[unroll]] for (uint q = 0; q < 4; ++q) ra[i][q] = packHalf2x16(unpackHalf2x16(w[q]) * pc.alpha);
    }
  }
  [[unroll]] for (uint i = 0; i < B_LD; ++i) {
    if (!B_HAS(i)) continue;
    uint k, n;
    b_chunk(tid + i * NT, k, n);
#if TB
    uint e = pc.v_off + (n0 + n) * pc.v_cs + r0 + k;
#else
    uint e = pc.v_off + (r0 + k) * pc.v_rs + n0 + n;
#endif
    rb[i] = r0 + k < pc.R ? as_f16(v_dtype(), v128[e >> 3]) : uvec4(0);
  }
}

void shared_store(uint buf, uint tid, uint adt, uint bdt) {
  [[unroll]] for (uint i = 0; i < A_LD; ++i) {
    if (!A_HAS(i)) continue;
    uint m, k;
    a_chunk(tid + i * NT, m, k);
#if TA
    uint h = buf * ASZH + k * ASTRH + m;
#else
    uint h = buf * ASZH + m * ASTRH + k;
#endif
    uvec4 v16 = as_f16(adt, ra[i]);
#if A16
    [[unroll]] for (uint w = 0; w < 4; ++w) {
      f16vec2 v = unpackFloat2x16(v16[w]);
      As[h + 2 * w] = v.x; As[h + 2 * w + 1] = v.y;
    }
#else
    As[h / 8] = v16;
#endif
  }
  [[unroll]] for (uint i = 0; i < B_LD; ++i) {
    if (!B_HAS(i)) continue;
    uint k, n;
    b_chunk(tid + i * NT, k, n);
#if TB
    uint h = buf * BSZH + n * BSTRH + k;
#else
    uint h = buf * BSZH + k * BSTRH + n;
#endif
    uvec4 v16 = as_f16(bdt, rb[i]);
#if B16
    [[unroll]] for (uint w = 0; w < 4; ++w) {
      f16vec2 v = unpackFloat2x16(v16[w]);
      Bs[h + 2 * w] = v.x; Bs[h + 2 * w + 1] = v.y;
    }
#else
    Bs[h / 8] = v16;
#endif
  }
}

// The subgroup's products over the shared K tile in stage `cur` (a macro: acc, wm and wn are main()'s).
#if TA
#define LOAD_A_FRAG(i, cur, ks, r) coopMatLoadNV(a[i], As, AOFF(cur * ASZH + ks * 16 * ASTRH + r), ASTR_L, true)
#else
#define LOAD_A_FRAG(i, cur, ks, r) coopMatLoadNV(a[i], As, AOFF(cur * ASZH + r * ASTRH + ks * 16), ASTR_L, false)
#endif
#if TB
#define LOAD_B_FRAG(j, cur, ks, c) coopMatLoadNV(b[j], Bs, BOFF(cur * BSZH + c * BSTRH + ks * 16), BSTR_L, true)
#else
#define LOAD_B_FRAG(j, cur, ks, c) coopMatLoadNV(b[j], Bs, BOFF(cur * BSZH + ks * 16 * BSTRH + c), BSTR_L, false)
#endif
#define MULTIPLY_TILE(cur)                                                                         \
  [[unroll]] for (uint ks = 0; ks < BK / 16; ++ks) {                                               \
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[FM];                                                \
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b[FN];                                                \
    [[unroll]] for (uint i = 0; i < FM; ++i) LOAD_A_FRAG(i, (cur), ks, (wm * WM + i * 16));        \
    [[unroll]] for (uint j = 0; j < FN; ++j) LOAD_B_FRAG(j, (cur), ks, (wn * WN + j * 16));        \
    [[unroll]] for (uint i = 0; i < FM; ++i)                                                       \
      [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]); \
  }

void main() {
  uint tid = gl_LocalInvocationID.x;
  uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  uint wm = sg / NWN, wn = sg % NWN;
  TILE_ORIGIN

  [[unroll]] for (uint i = 0; i < A_LD; ++i) {
    uint m, k;
    a_chunk(tid + i * NT, m, k);
#if TA
    a_e[i] = a_base + (m0 + m) * pc.a_rs + k * pc.a_cs;
#else
    a_e[i] = a_base + a_row(m0 + m) * pc.a_rs + k * pc.a_cs;
#endif
  }
  [[unroll]] for (uint i = 0; i < B_LD; ++i) {
    uint k, n;
    b_chunk(tid + i * NT, k, n);
    b_e[i] = b_base + k * pc.b_rs + (n0 + n) * pc.b_cs;
  }

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

  uint ntiles = (kend - kbeg) / BK;
  global_load(kbeg, tid);
  shared_store(0u, tid, ADT, BDT);
  barrier();
  for (uint t = 0; t < ntiles; ++t) {
    uint cur = NSTAGE == 2 ? (t & 1u) : 0u;
    if (t + 1u < ntiles) global_load(kbeg + (t + 1u) * BK, tid);
    MULTIPLY_TILE(cur)
    if (t + 1u < ntiles) {
#if NSTAGE == 1
      barrier();
#endif
      shared_store(NSTAGE == 2 ? (cur ^ 1u) : 0u, tid, ADT, BDT);
    }
    barrier();
  }
  // The addend's tiles, one at a time (a separate loop: folding them into the one above cost its dtype-specialized
  // staging 8% of its speed).
  for (uint r0 = 0; r0 < pc.R; r0 += BK) {
    lowrank_load(r0, tid, m0, n0);
    shared_store(0u, tid, DT_F16, DT_F16);
    barrier();
    MULTIPLY_TILE(0u)
    barrier();
  }

  const bool acc_c = (pc.flags & FLAG_C_ACC) != 0u, m_edge = (pc.flags & FLAG_M_EDGE) != 0u;
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j) {
      uint row = m0 + wm * WM + i * 16, col = n0 + wn * WN + j * 16;
      if (CDT == DT_F32 && !acc_c && !m_edge) {
        coopMatStoreNV(acc[i][j], c32, c_base + row * pc.N + col, pc.N, false);
        continue;
      }
      uint r = row + lane / 2u, c = col + (lane % 2u) * 8u;
      uint s = (lane / 2u) * 16u + (lane % 2u) * 8u;
      vec4 lo, hi;
#if CS_FITS
      coopMatStoreNV(acc[i][j], As, sg * 64u, 4u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      lo = uintBitsToFloat(As[sg * 64u + s / 4u]);
      hi = uintBitsToFloat(As[sg * 64u + s / 4u + 1u]);
#else
      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      lo = vec4(Cs[sg * 256u + s], Cs[sg * 256u + s + 1u], Cs[sg * 256u + s + 2u], Cs[sg * 256u + s + 3u]);
      hi = vec4(Cs[sg * 256u + s + 4u], Cs[sg * 256u + s + 5u], Cs[sg * 256u + s + 6u], Cs[sg * 256u + s + 7u]);
#endif
      uint e = c_base + r * pc.N + c;
      const bool written = row_written(r);
      if (acc_c && written) {  // the old row, scaled
        float sc = (pc.flags & FLAG_ROW_SCALE) != 0u ? rscale[pc.s_off + r] : 1.0;
        vec4 olo, ohi;
        if (CDT == DT_F32) {
          olo = c4[e >> 2];
          ohi = c4[(e >> 2) + 1u];
        } else {
          uvec4 w = ch128[e >> 3];
          if (CDT == DT_F16) {
            olo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
            ohi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
          } else {
            olo = uintBitsToFloat(uvec4(w.x << 16, w.x & 0xffff0000u, w.y << 16, w.y & 0xffff0000u));
            ohi = uintBitsToFloat(uvec4(w.z << 16, w.z & 0xffff0000u, w.w << 16, w.w & 0xffff0000u));
          }
        }
        lo += sc * olo;
        hi += sc * ohi;
      }
      uvec4 h;
      if (CDT == DT_F32) {
        if (written) {
          c4[e >> 2] = lo;
          c4[(e >> 2) + 1u] = hi;
        }
        subgroupBarrier();
        continue;
      } else if (CDT == DT_F16) {
        h = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
      } else {
        h = uvec4(float_to_bf16_bits(lo.x) | (float_to_bf16_bits(lo.y) << 16),
                  float_to_bf16_bits(lo.z) | (float_to_bf16_bits(lo.w) << 16),
                  float_to_bf16_bits(hi.x) | (float_to_bf16_bits(hi.y) << 16),
                  float_to_bf16_bits(hi.z) | (float_to_bf16_bits(hi.w) << 16));
      }
      if (written) ch128[e >> 3] = h;
      subgroupBarrier();
    }
}
