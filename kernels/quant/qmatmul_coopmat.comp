#version 450
// Tensor-core product with a block-quantized weight (qmatmul_common.glsl) through GL_NV_cooperative_matrix:
// 16x16x16 f16 fragments, f32 accumulators. Each K step stages a 128 x 32 tile of X (converted to f16) and
// decodes a 32 x 128 tile of W to f16 in shared memory (two 8-element groups per invocation, through the
// format's dequant8 — the code lavapipe's tests run in qmatmul.comp); the next step's values are loaded into
// registers while the tensor cores multiply this one. TB = 1 (the `_nt` builds): W's tile is stored [n][k] and
// loaded column-major as Bᵀ; TB = 0: stored [k][n]. 128x128 tiles, 8 subgroups of 32 with 64x32 each.
// Edges are zero-filled when staging and masked when storing (through a per-subgroup scratch fragment).
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : enable
#include "common/common.glsl"

#define BM 128u
#define BN 128u
#define BK 32u
#define WM 64u
#define WN 32u
#define NWN (BN / WN)
#define FM (WM / 16u)
#define FN (WN / 16u)

layout(local_size_x = 256) in;
TENSOR(0, X)
TENSOR4(0, X)
layout(std430, set = 0, binding = 1) readonly buffer QBuf { uint qw[]; };
TENSOR(2, C)
TENSOR(3, D)
#include "quant/qmatmul_common.glsl"

// Shared tiles in uvec4 units (8 halves), rows padded by 8 halves against bank conflicts.
#define ASTR ((BK + 8u) / 8u)  // As[m][k]
#if TB
#define BSTR ((BK + 8u) / 8u)  // Bs[n][k]
#define BSZ (BN * BSTR)
#else
#define BSTR ((BN + 8u) / 8u)  // Bs[k][n]
#define BSZ (BK * BSTR)
#endif
shared uvec4 As[BM * ASTR];
shared uvec4 Bs[BSZ];
shared float Cs[8u * 256u];  // epilogue: one 16x16 fragment per subgroup

uvec4 ra[2], rb[2];

uvec4 pack8(vec4 lo, vec4 hi) {
  return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}

// Chunk c of the tiles: X row c / 4, k (c % 4) * 8; W group as qmatmul.comp stages it.
void global_load(uint m0, uint n0, uint k0, uint tid) {
  const uint xdt = x_dtype();
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint c = tid + i * 256u, m = m0 + c / 4u, k = k0 + (c % 4u) * 8u;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (m < pc.M && k + 8u <= pc.K && (pc.flags & QFLAG_X_VEC) != 0u) {
      X_ld8(xdt, pc.x_off + m * pc.x_rs + k, lo, hi);
    } else if (m < pc.M) {
      float v[8];
      [[unroll]] for (uint j = 0u; j < 8u; ++j) v[j] = k + j < pc.K ? X_ld(xdt, pc.x_off + m * pc.x_rs + k + j) : 0.0;
      lo = vec4(v[0], v[1], v[2], v[3]);
      hi = vec4(v[4], v[5], v[6], v[7]);
    }
    ra[i] = pack8(lo, hi);
#if TB
    const uint n = n0 + c / 4u;  // W [N, K]: 8 values along k of row n
    const bool ok = n < pc.N && k < pc.K;
    if (ok) w_group(n, k, lo, hi);
#else
    const uint kr = k0 + c / 16u, n = n0 + (c % 16u) * 8u;  // W [K, N]: 8 values along n of row kr
    const bool ok = kr < pc.K && n < pc.N;
    if (ok) w_group(kr, n, lo, hi);
#endif
    rb[i] = ok ? pack8(lo, hi) : uvec4(0u);
  }
}

void shared_store(uint tid) {
  [[unroll]] for (uint i = 0u; i < 2u; ++i) {
    const uint c = tid + i * 256u;
    As[(c / 4u) * ASTR + c % 4u] = ra[i];
#if TB
    Bs[(c / 4u) * BSTR + c % 4u] = rb[i];
#else
    Bs[(c / 16u) * BSTR + c % 16u] = rb[i];
#endif
  }
}

void main() {
  Q_PREPARE();
  const uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint wm = sg / NWN, wn = sg % NWN;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
  [[unroll]] for (uint i = 0u; i < FM; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

  const uint ntiles = (pc.K + BK - 1u) / BK;
  global_load(m0, n0, 0u, tid);
  for (uint t = 0u; t < ntiles; ++t) {
    barrier();  // the previous step's fragments are loaded
    shared_store(tid);
    barrier();
    if (t + 1u < ntiles) global_load(m0, n0, (t + 1u) * BK, tid);
    [[unroll]] for (uint ks = 0u; ks < BK / 16u; ++ks) {
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[FM];
      fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b[FN];
      [[unroll]] for (uint i = 0u; i < FM; ++i)
        coopMatLoadNV(a[i], As, (wm * WM + i * 16u) * ASTR + ks * 2u, ASTR, false);
      [[unroll]] for (uint j = 0u; j < FN; ++j) {
#if TB
        coopMatLoadNV(b[j], Bs, (wn * WN + j * 16u) * BSTR + ks * 2u, BSTR, true);
#else
        coopMatLoadNV(b[j], Bs, ks * 16u * BSTR + (wn * WN + j * 16u) / 8u, BSTR, false);
#endif
      }
      [[unroll]] for (uint i = 0u; i < FM; ++i)
        [[unroll]] for (uint j = 0u; j < FN; ++j) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
    }
  }

  [[unroll]] for (uint i = 0u; i < FM; ++i)
    [[unroll]] for (uint j = 0u; j < FN; ++j) {
      const uint row = m0 + wm * WM + i * 16u, col = n0 + wn * WN + j * 16u;
      if (row >= pc.M || col >= pc.N) continue;  // uniform per subgroup
      coopMatStoreNV(acc[i][j], Cs, sg * 256u, 16u, false);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      const uint r = row + lane / 2u, c = col + (lane % 2u) * 8u;
      const uint s = sg * 256u + (lane / 2u) * 16u + (lane % 2u) * 8u;
      if (r < pc.M)
        [[unroll]] for (uint q = 0u; q < 8u; ++q)
          if (c + q < pc.N) store_result(r, c + q, Cs[s + q]);
      subgroupBarrier();
    }
}
