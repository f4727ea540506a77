#version 450
// Pre-pass of the fused attention backward: delta[b, h, t] = rowsum(dO * O) - dLSE (f32 [B, H, T]), one
// invocation per (b, t, h) row. O is dense [B, T, H, D]; dO has batch and time strides (heads and dims dense).
#include "common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, O)
TENSOR(1, X)     // dO
TENSOR(2, DLSE)  // f32 [B, H, T]
TENSOR(3, DELTA)

layout(push_constant) uniform Push {
  uint n, T, H, D;  // n = B * T * H rows
  uint o_off, x_off, x_sb, x_st, dlse_off, delta_off;
  uint dtypes;      // O | dO << 4
} p;

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    uint h = i % p.H, t = (i / p.H) % p.T, b = i / (p.H * p.T);
    uint o_at = p.o_off + i * p.D, x_at = p.x_off + b * p.x_sb + t * p.x_st + h * p.D;
    float sum = 0.0;
    for (uint d = 0; d < p.D; ++d) sum += O_ld(p.dtypes & 15u, o_at + d) * X_ld(p.dtypes >> 4, x_at + d);
    uint at = (b * p.H + h) * p.T + t;
    ST_F32(DELTA, p.delta_off + at, sum - LD_F32(DLSE, p.dlse_off + at));
  }
}
