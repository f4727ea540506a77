#version 450
// Sums the row-range splits of flash_attention_bwd_dkdv_cm.comp: split s left f32 partial dK and dV
// ([splits, B, S, KV, D] each, n = B * S * KV * D elements per split); dK = Σ_s dK_s and dV = Σ_s dV_s in the
// outputs' dtypes. One invocation per element of dK (and the same element of dV).
#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, PK)  // f32 partial dK
TENSOR(1, PV)  // f32 partial dV
TENSOR(2, DK)
TENSOR(3, DV)

layout(push_constant) uniform Push {
  uint n, splits, pk_off, pv_off, dk_off, dv_off;
  uint dtypes;  // dK | dV << 4
} p;

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    float k = 0.0, v = 0.0;
    for (uint s = 0; s < p.splits; ++s) {
      k += LD_F32(PK, p.pk_off + s * p.n + i);
      v += LD_F32(PV, p.pv_off + s * p.n + i);
    }
    DK_st(p.dtypes & 15u, p.dk_off + i, k);
    DV_st((p.dtypes >> 4) & 15u, p.dv_off + i, v);
  }
}
