#version 450
// fp16 tensor-core GEMM through GL_NV_cooperative_matrix (16x16x16 fragments, f32 accumulators).
// Same push constants and addressing as matmul.comp (matmul_common.glsl). A and B may be f16, bf16 or f32:
// they are converted to f16 while being staged into shared memory, so the MMAs always see f16 operands.
// C: f32, f16 or bf16.
//
// Layout, per variant (kernels/variants.txt): workgroup tile BM x BN, K step BK = 32, subgroup tile WM x WN
// (FM x FN fragments), NT = 32 * (BM/WM) * (BN/WN) threads; subgroup size 32 is required (NVIDIA).
// TA / TB say which dim of A / B is contiguous in memory (TA = 1: A is stored [K, M], i.e. transposed;
// TB = 1: B is stored [N, K], the layout of a linear layer's weight). Operands are staged in their memory
// layout -- 8 contiguous halves (one uvec4) per load, rows padded by 8 halves against bank conflicts -- and
// transposed ones are read back with column-major coopMatLoadNV. Shared memory is uvec4, the fastest form
// for coopMatLoadNV on the H100 (~10% over float16_t).
//
// Pipeline per K step: the next tile is loaded from global memory into registers while the tensor cores
// work on the current shared tile; NSTAGE = 2 double-buffers shared memory (one barrier per step),
// NSTAGE = 1 (the 128x256 tile, which does not fit twice in 48 KiB) stores after a second barrier.
// Interior tiles of aligned operands take a vector path with no bounds checks; edge tiles and unaligned
// operands are staged element by element with zero fill. The epilogue stores f32 fragments straight to C
// when C is f32 and the tile is interior; otherwise each subgroup bounces a fragment through a 1 KiB shared
// scratch, converts it and writes what is in bounds.
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable

#include "matmul/matmul_coopmat_tile.glsl"

#define BK 32

// Specialization constants (matmul.cpp): element types of A, B, C (DT_*), folded by the driver. Problems whose
// tiles are all interior with vector access take matmul_coopmat_fast.comp instead.
layout(constant_id = 0) const uint ADT = 1;
layout(constant_id = 1) const uint BDT = 1;
layout(constant_id = 2) const uint CDT = 0;

// Shared tiles in uvec4 units (8 halves). Row strides carry 8 halves of padding.
#if TA
#define ASTR ((BM + 8) / 8)  // As[k][m]
#define ASZ (BK * ASTR)
#else
#define ASTR ((BK + 8) / 8)  // As[m][k]
#define ASZ (BM * ASTR)
#endif
#if TB
#define BSTR ((BK + 8) / 8)  // Bs[n][k]
#define BSZ (BN * BSTR)
#else
#define BSTR ((BN + 8) / 8)  // Bs[k][n]
#define BSZ (BK * BSTR)
#endif
#define A_LD (BM * BK / 8 / NT)  // uvec4 chunks staged per thread
#define B_LD (BK * BN / 8 / NT)

layout(local_size_x = NT) in;
layout(set = 0, binding = 0) readonly buffer ABuf { uint a32[]; };
layout(set = 0, binding = 0) readonly buffer ABuf4 { uvec4 a128[]; };
layout(set = 0, binding = 1) readonly buffer BBuf { uint b32[]; };
layout(set = 0, binding = 1) readonly buffer BBuf4 { uvec4 b128[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf { float c32[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf4 { vec4 cf128[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf16 { uint16_t c16[]; };
layout(set = 0, binding = 2) writeonly buffer CBufH4 { uvec4 ch128[]; };

shared uvec4 As[NSTAGE * ASZ];
shared uvec4 Bs[NSTAGE * BSZ];
shared float Cs[NSG * 256];  // epilogue scratch, one 16x16 fragment per subgroup

uvec4 ra[A_LD];
uvec4 rb[B_LD];

// 8 consecutive elements starting at element e, as f16 pairs; e aligned (FLAG_*_VEC).
#define VEC8(buf32, buf128, dt, e, out_)                                                              \
  {                                                                                                   \
    if (dt == DT_F16) {                                                                               \
      out_ = buf128[(e) >> 3];                                                                        \
    } else if (dt == DT_BF16) {                                                                       \
      uvec4 w_ = buf128[(e) >> 3];                                                                    \
      [[unroll]] for (uint q_ = 0; q_ < 4; ++q_)                                                      \
        out_[q_] = packHalf2x16(vec2(uintBitsToFloat(w_[q_] << 16), uintBitsToFloat(w_[q_] & 0xffff0000u))); \
    } else {                                                                                          \
      uvec4 w0_ = buf128[(e) >> 2], w1_ = buf128[((e) >> 2) + 1u];                                     \
      out_ = uvec4(packHalf2x16(uintBitsToFloat(w0_.xy)), packHalf2x16(uintBitsToFloat(w0_.zw)),      \
                   packHalf2x16(uintBitsToFloat(w1_.xy)), packHalf2x16(uintBitsToFloat(w1_.zw)));     \
    }                                                                                                 \
  }

float load_elem_a(uint e) {
  const uint dt = ADT;
  if (dt == DT_F32) return uintBitsToFloat(a32[e]);
  uint h = half_bits(a32[e >> 1], e);
  return dt == DT_F16 ? f16_bits_to_float(h) : bf16_bits_to_float(h);
}
float load_elem_b(uint e) {
  const uint dt = BDT;
  if (dt == DT_F32) return uintBitsToFloat(b32[e]);
  uint h = half_bits(b32[e >> 1], e);
  return dt == DT_F16 ? f16_bits_to_float(h) : bf16_bits_to_float(h);
}

#include "matmul/matmul_coopmat_chunks.glsl"

void global_load(uint a_base, uint b_base, uint m0, uint n0, uint k0, uint kend, uint tid) {
  bool k_full = k0 + BK <= kend;
  bool a_fast = k_full && m0 + BM <= pc.M && (pc.flags & FLAG_A_VEC) != 0u;
  bool b_fast = k_full && n0 + BN <= pc.N && (pc.flags & FLAG_B_VEC) != 0u;
  const uint adt = ADT, bdt = BDT;
  [[unroll]] for (uint i = 0; i < A_LD; ++i) {
    uint m, k;
    a_chunk(tid + i * NT, m, k);
    uint e = a_base + (m0 + m) * pc.a_rs + (k0 + k) * pc.a_cs;
    if (a_fast) {
      VEC8(a32, a128, adt, e, ra[i]);
    } else {
      float v[8];
      [[unroll]] for (uint j = 0; j < 8; ++j) {
#if TA
        uint mm = m0 + m + j, kk = k0 + k;
#else
        uint mm = m0 + m, kk = k0 + k + j;
#endif
        v[j] = (mm < pc.M && kk < kend) ? load_elem_a(a_base + mm * pc.a_rs + kk * pc.a_cs) : 0.0;
      }
      ra[i] = uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])),
                    packHalf2x16(vec2(v[4], v[5])), packHalf2x16(vec2(v[6], v[7])));
    }
  }
  [[unroll]] for (uint i = 0; i < B_LD; ++i) {
    uint k, n;
    b_chunk(tid + i * NT, k, n);
    uint e = b_base + (k0 + k) * pc.b_rs + (n0 + n) * pc.b_cs;
    if (b_fast) {
      VEC8(b32, b128, bdt, e, rb[i]);
    } else {
      float v[8];
      [[unroll]] for (uint j = 0; j < 8; ++j) {
#if TB
        uint kk = k0 + k + j, nn = n0 + n;
#else
        uint kk = k0 + k, nn = n0 + n + j;
#endif
        v[j] = (nn < pc.N && kk < kend) ? load_elem_b(b_base + kk * pc.b_rs + nn * pc.b_cs) : 0.0;
      }
      rb[i] = uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])),
                    packHalf2x16(vec2(v[4], v[5])), packHalf2x16(vec2(v[6], v[7])));
    }
  }
}

void shared_store(uint buf, uint tid) {
  [[unroll]] for (uint i = 0; i < A_LD; ++i) {
    uint m, k;
    a_chunk(tid + i * NT, m, k);
#if TA
    As[buf * ASZ + k * ASTR + m / 8] = ra[i];
#else
    As[buf * ASZ + m * ASTR + k / 8] = ra[i];
#endif
  }
  [[unroll]] for (uint i = 0; i < B_LD; ++i) {
    uint k, n;
    b_chunk(tid + i * NT, k, n);
#if TB
    Bs[buf * BSZ + n * BSTR + k / 8] = rb[i];
#else
    Bs[buf * BSZ + k * BSTR + n / 8] = rb[i];
#endif
  }
}

void store_elem(uint e, float v, uint dt) {
  if (dt == DT_F32) c32[e] = v;
  else c16[e] = uint16_t(dt == DT_F16 ? float_to_f16_bits(v) : float_to_bf16_bits(v));
}

void main() {
  uint tid = gl_LocalInvocationID.x;
  uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  uint wm = sg / NWN, wn = sg % NWN;
  TILE_ORIGIN

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

  uint ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0u;
  if (ntiles > 0u) {
    global_load(a_base, b_base, m0, n0, kbeg, kend, tid);
    shared_store(0u, tid);
  }
  barrier();
  for (uint t = 0; t < ntiles; ++t) {
    uint cur = NSTAGE == 2 ? (t & 1u) : 0u;
    if (t + 1u < ntiles) global_load(a_base, b_base, m0, n0, kbeg + (t + 1u) * BK, kend, tid);
    [[unroll]] for (uint ks = 0; ks < BK / 16; ++ks) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[FM];
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b[FN];
      [[unroll]] for (uint i = 0; i < FM; ++i) {
        uint r = wm * WM + i * 16;
#if TA
        coopMatLoadNV(a[i], As, cur * ASZ + ks * 16 * ASTR + r / 8, ASTR, true);
#else
        coopMatLoadNV(a[i], As, cur * ASZ + r * ASTR + ks * 2, ASTR, false);
#endif
      }
      [[unroll]] for (uint j = 0; j < FN; ++j) {
        uint c = wn * WN + j * 16;
#if TB
        coopMatLoadNV(b[j], Bs, cur * BSZ + c * BSTR + ks * 2, BSTR, true);
#else
        coopMatLoadNV(b[j], Bs, cur * BSZ + ks * 16 * BSTR + c / 8, BSTR, false);
#endif
      }
      [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
    }
    if (t + 1u < ntiles) {
#if NSTAGE == 1
      barrier();
#endif
      shared_store(NSTAGE == 2 ? (cur ^ 1u) : 0u, tid);
    }
    barrier();
  }

  const uint cdt = CDT;
  bool c_vec = (pc.flags & FLAG_C_VEC) != 0u;
  bool direct = cdt == DT_F32 && c_vec && m0 + BM <= pc.M && n0 + BN <= pc.N;
  [[unroll]] for (uint i = 0; i < FM; ++i)
    [[unroll]] for (uint j = 0; j < FN; ++j) {
      uint row = m0 + wm * WM + i * 16, col = n0 + wn * WN + j * 16;
      if (direct) {
        coopMatStoreNV(acc[i][j], c32, c_base + row * pc.N + col, pc.N, false);
        continue;
      }
      if (row >= pc.M || col >= pc.N) continue;  // uniform per subgroup
      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      uint r = row + lane / 2u, c = col + (lane % 2u) * 8u;
      uint s = sg * 256u + (lane / 2u) * 16u + (lane % 2u) * 8u;
      if (r < pc.M) {
        uint e = c_base + r * pc.N + c;
        if (c_vec && c + 8u <= pc.N && cdt != DT_F32) {
          uvec4 h;
          [[unroll]] for (uint q = 0; q < 4; ++q)
            h[q] = cdt == DT_F16 ? packHalf2x16(vec2(Cs[s + 2 * q], Cs[s + 2 * q + 1]))
                                 : float_to_bf16_bits(Cs[s + 2 * q]) | (float_to_bf16_bits(Cs[s + 2 * q + 1]) << 16);
          ch128[e >> 3] = h;
        } else if (c_vec && c + 8u <= pc.N) {
          cf128[e >> 2] = vec4(Cs[s], Cs[s + 1], Cs[s + 2], Cs[s + 3]);
          cf128[(e >> 2) + 1u] = vec4(Cs[s + 4], Cs[s + 5], Cs[s + 6], Cs[s + 7]);
        } else {
          [[unroll]] for (uint q = 0; q < 8; ++q)
            if (c + q < pc.N) store_elem(e + q, Cs[s + q], cdt);
        }
      }
      subgroupBarrier();
    }
}
