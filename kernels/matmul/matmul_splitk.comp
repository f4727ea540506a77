#version 450
// Second pass of split-K matmul: out[i] = sum over s of part[s * count + i], converted to out's dtype.
// `part` is the f32 workspace written by matmul.comp / matmul_coopmat.comp with nsplit > 1.
#ifndef PACKED16
#extension GL_EXT_shader_16bit_storage : require
#endif

#define MATMUL_NO_PARAMS
#include "matmul/matmul_common.glsl"

layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer PBuf { float part[]; };
#ifdef PACKED16  // no 16-bit storage: 16-bit outputs via atomics on their 32-bit word (see matmul.comp)
layout(set = 0, binding = 1) buffer OBuf { float o32[]; };
layout(set = 0, binding = 1) buffer OBufW { uint ow[]; };
#else
layout(set = 0, binding = 1) writeonly buffer OBuf { float o32[]; };
layout(set = 0, binding = 1) writeonly buffer OBuf16 { uint16_t o16[]; };
#endif
layout(push_constant) uniform SplitKParams {
  uint count;   // elements of one slice (batch * M * N)
  uint nsplit;
  uint out_off;
  uint out_dtype;
  uint groups_x;  // workgroups along x (the grid is 2D when count needs more than 65535 groups)
} sp;

void main() {
  uint i = (gl_WorkGroupID.y * sp.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (i >= sp.count) return;
  float s = 0.0;
  for (uint k = 0; k < sp.nsplit; ++k) s += part[k * sp.count + i];
  uint e = sp.out_off + i;
  if (sp.out_dtype == DT_F32) {
    o32[e] = s;
    return;
  }
  uint bits = sp.out_dtype == DT_F16 ? float_to_f16_bits(s) : float_to_bf16_bits(s);
#ifdef PACKED16
  uint sh = (e & 1u) << 4;
  atomicAnd(ow[e >> 1], ~(0xffffu << sh));
  atomicOr(ow[e >> 1], bits << sh);
#else
  o16[e] = uint16_t(bits);
#endif
}
