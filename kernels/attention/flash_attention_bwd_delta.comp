#version 450
// Pre-pass of the fused attention backward: delta[b, h, t] = rowsum(dO * O) - dLSE (f32 [B, H, T]). Eight
// neighbouring lanes share a (b, t, h) row, reading it 4 elements at a time where dtypes bit 8 says D and every
// row start are multiples of 4 (else element by element), and add their parts by subgroup shuffles (subgroups
// hold whole groups of 8 lanes). O is dense [B, T, H, D]; dO has batch and time strides (heads and dims dense).
#extension GL_KHR_shader_subgroup_shuffle : enable
#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, O)
TENSOR4(0, O)
TENSOR(1, X)     // dO
TENSOR4(1, X)
TENSOR(2, DLSE)  // f32 [B, H, T]
TENSOR(3, DELTA)

layout(push_constant) uniform Push {
  uint n, T, H, D;  // n = B * T * H rows
  uint o_off, x_off, x_sb, x_st, dlse_off, delta_off;
  uint dtypes;      // O | dO << 4 | vec4 access << 8
} p;

const uint LANES = 8u;  // per row

void main() {
  const uint lane = gl_GlobalInvocationID.x % LANES, odt = p.dtypes & 15u, xdt = (p.dtypes >> 4) & 15u;
  const bool vec = (p.dtypes & 256u) != 0u;
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x / LANES;
  for (uint i = gl_GlobalInvocationID.x / LANES; i < p.n; i += stride) {
    uint h = i % p.H, t = (i / p.H) % p.T, b = i / (p.H * p.T);
    uint o_at = p.o_off + i * p.D, x_at = p.x_off + b * p.x_sb + t * p.x_st + h * p.D;
    float sum = 0.0;
    if (vec) {
      for (uint d = lane * 4u; d < p.D; d += 4u * LANES) sum += dot(O_ld4(odt, o_at + d), X_ld4(xdt, x_at + d));
    } else {
      for (uint d = lane; d < p.D; d += LANES) sum += O_ld(odt, o_at + d) * X_ld(xdt, x_at + d);
    }
    sum += subgroupShuffleXor(sum, 1u);
    sum += subgroupShuffleXor(sum, 2u);
    sum += subgroupShuffleXor(sum, 4u);
    if (lane == 0u) {
      uint at = (b * p.H + h) * p.T + t;
      ST_F32(DELTA, p.delta_off + at, sum - LD_F32(DLSE, p.dlse_off + at));
    }
  }
}
