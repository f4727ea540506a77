#version 450
// Merges the split forward passes of flash_attention_fwd.comp (decoding): split s left a normalized partial
// O_s (f32 [splits, B, T, H, D]) and LSE_s (f32 [splits, B, H, T]); then LSE = log Σ_s exp(LSE_s) and
// O = Σ_s exp(LSE_s - LSE) O_s (0 with LSE -inf where no split saw a key). One invocation per element of O.
#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, PART)   // f32 partial outputs
TENSOR(1, PLSE)   // f32 partial LSE
TENSOR(2, O)
TENSOR(3, LSE)

layout(push_constant) uniform Push {
  uint n, T, H, D, splits;  // n = B * T * H * D
  uint part_off, plse_off, o_off, lse_off;
  uint o_dtype;
} p;

#define NEG_INF uintBitsToFloat(0xff800000u)

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint rows = p.n / p.D;  // B * H * T
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    uint d = i % p.D, h = (i / p.D) % p.H, t = (i / (p.D * p.H)) % p.T, b = i / (p.D * p.H * p.T);
    uint at = (b * p.H + h) * p.T + t;
    float m = NEG_INF;
    for (uint s = 0; s < p.splits; ++s) m = max(m, LD_F32(PLSE, p.plse_off + s * rows + at));
    float o = 0.0, w = 0.0;
    if (m != NEG_INF) {
      for (uint s = 0; s < p.splits; ++s) {
        float l = LD_F32(PLSE, p.plse_off + s * rows + at);
        float e = l == NEG_INF ? 0.0 : exp(l - m);
        w += e;
        o += e * LD_F32(PART, p.part_off + s * p.n + i);
      }
      o /= w;
    }
    O_st(p.o_dtype, p.o_off + i, o);
    if (d == 0u) ST_F32(LSE, p.lse_off + at, m == NEG_INF ? NEG_INF : m + log(w));
  }
}
