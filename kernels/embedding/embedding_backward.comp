#version 450
// Embedding backward: scatter-add of grad rows [N, C] into an f32 accumulator [V, C] at rows ids[N] (ids outside
// [0, V) are skipped). Float atomic add (GL_EXT_shader_atomic_float) where the device has it; built with -DCAS, a
// compare-and-swap loop on the uint bits instead.
#include "common/common.glsl"
#ifndef CAS
#extension GL_EXT_shader_atomic_float : require
#endif
layout(local_size_x_id = 0) in;

TENSOR(0, G)
TENSOR(1, IDS)
#ifdef CAS
layout(std430, set = 0, binding = 2) buffer Acc { uint acc[]; };
#else
layout(std430, set = 0, binding = 2) buffer Acc { float acc[]; };
#endif

layout(push_constant) uniform Push {
  uint total, c, v;
  uint g_off, ids_off, acc_off;
  uint dtypes;  // g
} p;

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += stride) {
    uint row = e / p.c, col = e - row * p.c;
    int id = LD_I32(IDS, p.ids_off + row);
    if (id < 0 || uint(id) >= p.v) continue;
    float g = G_ld(p.dtypes & 15u, p.g_off + e);
    uint a = p.acc_off + uint(id) * p.c + col;
#ifdef CAS
    uint old = acc[a];
    for (;;) {
      uint seen = atomicCompSwap(acc[a], old, floatBitsToUint(uintBitsToFloat(old) + g));
      if (seen == old) break;
      old = seen;
    }
#else
    atomicAdd(acc[a], g);
#endif
  }
}
