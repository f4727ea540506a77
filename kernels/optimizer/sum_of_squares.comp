#version 450
// Sum of squares over many tensors in one dispatch (SumOfSquares in core/ops/optimizer.h: the gradient norm).
// Tensors live in up to 8 buffers (B0..B7, bound by the host); the table holds one entry per chunk of a dense
// tensor: slot | dtype << 8, element offset, element count, unused. Workgroup e sums the squares of entry
// p.first + e and writes them to partials[p.part_base + e] (f32); the host sums the partials.
#include "common/common.glsl"
layout(local_size_x_id = 0) in;
#include "common/rows.glsl"

TENSOR(0, B0)
TENSOR(1, B1)
TENSOR(2, B2)
TENSOR(3, B3)
TENSOR(4, B4)
TENSOR(5, B5)
TENSOR(6, B6)
TENSOR(7, B7)
TENSOR(8, TAB)   // u32 [entries][4]
TENSOR(9, PART)  // f32

layout(push_constant) uniform Push {
  uint first, count, part_base;
} p;

float load(uint slot, uint dt, uint i) {
  switch (slot) {
    case 0u: return B0_ld(dt, i);
    case 1u: return B1_ld(dt, i);
    case 2u: return B2_ld(dt, i);
    case 3u: return B3_ld(dt, i);
    case 4u: return B4_ld(dt, i);
    case 5u: return B5_ld(dt, i);
    case 6u: return B6_ld(dt, i);
    default: return B7_ld(dt, i);
  }
}

void main() {
  const uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  for (uint e = gl_WorkGroupID.x; e < p.count; e += gl_NumWorkGroups.x) {
    const uint at = (p.first + e) * 4u;
    const uint sd = TAB_w[at], off = TAB_w[at + 1u], n = TAB_w[at + 2u];
    const uint slot = sd & 255u, dt = sd >> 8;
    float s = 0.0;
    for (uint i = tid; i < n; i += wg) {
      float x = load(slot, dt, off + i);
      s += x * x;
    }
    s = wg_sum(s);
    if (tid == 0u) ST_F32(PART, p.part_base + e, s);
  }
}
