#version 450
// Matrix-vector product with a block-quantized weight for decode: C [rows, N] = X [rows, K] Wᵀ, W [N, K], at most
// 4 rows (QFLAG_NT only). Bound by W's bytes, so each weight row is read once: one subgroup per row of W at a time,
// its lanes taking consecutive 8-element groups (dequant8; neighbouring lanes read neighbouring bytes of a block),
// the sums met in a subgroupAdd (no shared memory, no barrier). A workgroup of 4 subgroups (its size is
// specialization constant 0) takes COLS rows of W. The host takes it on devices with subgroup arithmetic
// (src/backend/vulkan/quant_matmul.cpp); elsewhere qmatmul.comp does. An addend D is added as C is stored.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common/common.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint COLS = 4u;  // rows of W per workgroup
TENSOR(0, X)
TENSOR4(0, X)
layout(std430, set = 0, binding = 1) readonly buffer QBuf { uint qw[]; };
TENSOR(2, C)
TENSOR(3, D)
#define QSPEC
#include "quant/qmatmul_common.glsl"

const uint MAXR = 4u;  // the most rows the host sends (kQGemvMaxRows)

void x_group(uint r, uint k, out vec4 lo, out vec4 hi) {
  const uint xdt = x_dtype(), e = pc.x_off + r * pc.x_rs + k;
  if ((q_flags() & QFLAG_X_VEC) != 0u) {
    X_ld8(xdt, e, lo, hi);
    return;
  }
  lo = vec4(X_ld(xdt, e), X_ld(xdt, e + 1u), X_ld(xdt, e + 2u), X_ld(xdt, e + 3u));
  hi = vec4(X_ld(xdt, e + 4u), X_ld(xdt, e + 5u), X_ld(xdt, e + 6u), X_ld(xdt, e + 7u));
}

void main() {
  Q_PREPARE();
  const uint lane = gl_SubgroupInvocationID, nr = min(MAXR, pc.M), groups = pc.K / 8u;
  const uint n_end = min(pc.N, (gl_WorkGroupID.x + 1u) * COLS);
  for (uint n = gl_WorkGroupID.x * COLS + gl_SubgroupID; n < n_end; n += gl_NumSubgroups) {
    float acc[MAXR];
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = 0.0;
    for (uint g = lane; g < groups; g += gl_SubgroupSize) {
      vec4 wlo, whi;
      w_group(n, g * 8u, wlo, whi);
      [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
        if (r >= nr) break;
        vec4 xlo, xhi;
        x_group(r, g * 8u, xlo, xhi);
        acc[r] += dot(xlo, wlo) + dot(xhi, whi);
      }
    }
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
      if (r >= nr) break;
      const float sum = subgroupAdd(acc[r]);
      if (lane == 0u) store_result(r, n, sum);
    }
  }
}
