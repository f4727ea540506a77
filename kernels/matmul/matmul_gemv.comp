#version 450
// Matrix-vector products for decode: C [rows, N] = alpha A [rows, K] W [N, K]ᵀ for at most 4 rows, any float
// dtypes, f32 sums. A weight row is read once, as 16-byte loads (8 elements of a 16-bit type, two loads of f32):
// the product is bound by the weights' bytes, so tensor cores or shared-memory tiles would only add waste at
// rows <= 4. A workgroup of 4 subgroups (its size is specialization constant 0) takes COLS columns (weight rows),
// one subgroup per column at a time: its invocations stride K by 8 x the subgroup size, four loads in flight
// each, and meet in a subgroupAdd (no shared memory, no barrier). The host takes this kernel
// (matmul_plan.cpp) on devices with subgroup arithmetic when K, the row strides and offsets are multiples of 8.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common/common.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, A)
TENSOR4(0, A)
TENSOR(1, W)
TENSOR4(1, W)
TENSOR(2, C)

layout(push_constant) uniform GemvParams {
  uint N, K, rows;
  uint a_off, a_rs;  // A's element offset and row stride
  uint w_off, w_rs;  // W's element offset and row stride (unit stride along K)
  uint c_off;        // C is [rows, N], contiguous
  uint dtypes;       // A | W << 4 | C << 8
  float alpha;
} p;

layout(constant_id = 1) const uint COLS = 4u;  // columns per workgroup
const uint MAXR = 4u, UNROLL = 4u;  // MAXR: the most rows the host sends (matmul_plan.cpp's kGemvMaxRows)

void main() {
  const uint lane = gl_SubgroupInvocationID, step = gl_SubgroupSize * 8u, nr = min(MAXR, p.rows);
  const uint adt = p.dtypes & 15u, wdt = (p.dtypes >> 4) & 15u, cdt = (p.dtypes >> 8) & 15u;
  const uint n_end = min(p.N, (gl_WorkGroupID.x + 1u) * COLS);
  for (uint n = gl_WorkGroupID.x * COLS + gl_SubgroupID; n < n_end; n += gl_NumSubgroups) {
    float acc[MAXR];
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = 0.0;
    const uint wrow = p.w_off + n * p.w_rs, arow = p.a_off;
    for (uint k0 = lane * 8u; k0 < p.K; k0 += step * UNROLL) {
      vec4 lo[UNROLL], hi[UNROLL];
      [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {  // the loads first: UNROLL x 16 bytes in flight
        lo[u] = vec4(0.0);
        hi[u] = vec4(0.0);
        if (k0 + u * step < p.K) W_ld8(wdt, wrow + k0 + u * step, lo[u], hi[u]);
      }
      [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
        const uint k = k0 + u * step;
        if (k >= p.K) break;
        [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
          if (r >= nr) break;
          vec4 alo, ahi;
          A_ld8(adt, arow + r * p.a_rs + k, alo, ahi);
          acc[r] += dot(alo, lo[u]) + dot(ahi, hi[u]);
        }
      }
    }
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
      if (r >= nr) break;
      const float sum = subgroupAdd(acc[r]);
      if (lane == 0u) C_st(cdt, p.c_off + r * p.N + n, p.alpha * sum);
    }
  }
}
