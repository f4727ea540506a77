#version 450
// Rotary embedding of dense x [B, T, H, D] at positions i32 [B, T] with inv_freq f32 [R/2]; one invocation per
// rotated pair (one angle, its sin and cos, for both outputs) or per dim past the rotated ones. angle =
// float(pos) * inv_freq[i] in f32 (as HF computes it), its sin and cos reduced first (rope.glsl).
// half_split pairs (i, i + R/2); interleaved pairs (2i, 2i + 1); dims >= R pass through; inverse rotates by -angle;
// cos and sin are multiplied by scale (transformers' attention_scaling of yarn and longrope).
// vec (half_split with R/2 and D - R multiples of 4, offsets too): a unit is 4 pairs (or 4 pass-through dims), read
// and written 4 elements at a time.
#include "attention/rope.glsl"

TENSOR4(0, X)
TENSOR4(3, Y)

layout(push_constant) uniform Push {
  uint total, d, h, r;  // units (rows x (R/2 + D - R)), head dim, heads, rotated dims
  uint x_off, pos_off, freq_off, y_off;
  uint dtypes;          // x | y << 4
  uint interleaved, inverse;
  uint vec;
  float scale;
} p;

// A unit of the vec path: 4 pairs (k .. k + 3, k + half_r ..) or 4 pass-through dims.
void rope_vec4(uint u, uint dx, uint dy) {
  uint half_r = p.r / 2u, per_row = (half_r + (p.d - p.r)) / 4u;
  uint row = u / per_row, k = (u % per_row) * 4u;
  uint xo = p.x_off + row * p.d, yo = p.y_off + row * p.d;
  if (k >= half_r) {
    uint j = p.r + (k - half_r);
    Y_st4(dy, yo + j, X_ld4(dx, xo + j));
    return;
  }
  float pos = float(LD_I32(POS, p.pos_off + row / p.h));
  vec4 s, c;
  [[unroll]] for (uint i = 0u; i < 4u; ++i)
    sincos_reduced(pos * LD_F32(FREQ, p.freq_off + k + i), p.scale, s[i], c[i]);
  if (p.inverse != 0u) s = -s;
  vec4 a = X_ld4(dx, xo + k), b = X_ld4(dx, xo + k + half_r);
  Y_st4(dy, yo + k, a * c - b * s);
  Y_st4(dy, yo + k + half_r, b * c + a * s);
}

void main() {
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
  uint half_r = p.r / 2u, per_row = half_r + (p.d - p.r);  // units of one (token, head) row
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  if (p.vec != 0u) {
    for (uint u = gl_GlobalInvocationID.x; u < p.total; u += stride) rope_vec4(u, dx, dy);
    return;
  }
  for (uint u = gl_GlobalInvocationID.x; u < p.total; u += stride) {
    uint row = u / per_row, k = u % per_row;
    uint xo = p.x_off + row * p.d, yo = p.y_off + row * p.d;
    if (k >= half_r) {  // a dim past the rotated ones
      uint j = p.r + (k - half_r);
      Y_st(dy, yo + j, X_ld(dx, xo + j));
      continue;
    }
    uint j0 = p.interleaved != 0u ? 2u * k : k, j1 = p.interleaved != 0u ? j0 + 1u : k + half_r;
    float angle = float(LD_I32(POS, p.pos_off + row / p.h)) * LD_F32(FREQ, p.freq_off + k);
    float s, c;
    sincos_reduced(angle, p.scale, s, c);
    if (p.inverse != 0u) s = -s;
    float a = X_ld(dx, xo + j0), b = X_ld(dx, xo + j1);
    Y_st(dy, yo + j0, a * c - b * s);
    Y_st(dy, yo + j1, b * c + a * s);
  }
}
