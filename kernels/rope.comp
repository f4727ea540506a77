#version 450
// Rotary embedding of dense x [B, T, H, D] at positions i32 [B, T] with inv_freq f32 [R/2]; one invocation per
// output element. angle = float(pos) * inv_freq[i] in f32 (as HF computes it), reduced to [-pi, pi] in two steps
// before cos/sin so large positions stay accurate on GPUs whose sin/cos are only good near 0.
// half_split pairs (i, i + R/2); interleaved pairs (2i, 2i + 1); dims >= R pass through; inverse rotates by -angle.
#include "common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, X)
TENSOR(1, POS)
TENSOR(2, FREQ)
TENSOR(3, Y)

layout(push_constant) uniform Push {
  uint total, d, h, r;  // elements, head dim, heads, rotated dims
  uint x_off, pos_off, freq_off, y_off;
  uint dtypes;          // x | y << 4
  uint interleaved, inverse;
} p;

void sincos_reduced(float a, out float s, out float c) {
  float k = round(a * 0.15915494309189535);  // a / (2 pi)
  float r = (a - k * 6.28125) - k * 0.0019353071795864769;  // 2 pi = 6.28125 + 0.00193530717958647...
  s = sin(r);
  c = cos(r);
}

void main() {
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += stride) {
    uint j = e % p.d;
    uint token = e / (p.d * p.h);  // b * T + t
    uint xo = p.x_off + e;
    float v = X_ld(dx, xo);
    if (j < p.r) {
      uint half_r = p.r / 2u;
      uint i;
      int partner;
      float sgn;
      if (p.interleaved != 0u) {
        i = j / 2u;
        bool even = (j & 1u) == 0u;
        partner = even ? 1 : -1;
        sgn = even ? -1.0 : 1.0;
      } else {
        bool first = j < half_r;
        i = first ? j : j - half_r;
        partner = first ? int(half_r) : -int(half_r);
        sgn = first ? -1.0 : 1.0;
      }
      float angle = float(LD_I32(POS, p.pos_off + token)) * LD_F32(FREQ, p.freq_off + i);
      float s, c;
      sincos_reduced(angle, s, c);
      if (p.inverse != 0u) s = -s;
      float other = X_ld(dx, uint(int(xo) + partner));
      v = v * c + sgn * other * s;
    }
    Y_st(dy, p.y_off + e, v);
  }
}
