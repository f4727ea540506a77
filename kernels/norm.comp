#version 450
// RMSNorm and LayerNorm over dense rows of length c (one workgroup per row), statistics in f32.
//   rms:   rstd = 1/sqrt(mean(x^2) + eps); y = x * rstd * w                  outputs y, rstd
//   layer: mean, rstd = 1/sqrt(mean((x-mean)^2) + eps); y = (x-mean) * rstd * w + b   outputs y, mean, rstd
#include "common.glsl"
layout(local_size_x_id = 0) in;
#include "rows.glsl"

TENSOR(0, X)
TENSOR(1, W)
#ifdef LAYER
TENSOR(2, B)
TENSOR(3, Y)
TENSOR(4, MEAN)
TENSOR(5, RSTD)
#else
TENSOR(2, Y)
TENSOR(3, RSTD)
#endif

layout(push_constant) uniform Push {
  uint c, rows;
  uint x_off, w_off, b_off, y_off, mean_off, rstd_off;
  uint dtypes;  // x | w << 4 | b << 8 | y << 12
  float eps;
  uint has_bias;
} p;

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint dx = p.dtypes & 15u, dw = (p.dtypes >> 4) & 15u, db = (p.dtypes >> 8) & 15u, dy = (p.dtypes >> 12) & 15u;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    uint xo = p.x_off + row * p.c, yo = p.y_off + row * p.c;
#ifdef LAYER
    float s = 0.0;
    for (uint k = tid; k < p.c; k += wg) s += X_ld(dx, xo + k);
    float mean = wg_sum(s) / float(p.c);
    float q = 0.0;
    for (uint k = tid; k < p.c; k += wg) {
      float d = X_ld(dx, xo + k) - mean;
      q += d * d;
    }
    float rstd = 1.0 / sqrt(wg_sum(q) / float(p.c) + p.eps);
    for (uint k = tid; k < p.c; k += wg) {
      float v = (X_ld(dx, xo + k) - mean) * rstd * W_ld(dw, p.w_off + k);
      if (p.has_bias != 0u) v += B_ld(db, p.b_off + k);
      Y_st(dy, yo + k, v);
    }
    if (tid == 0u) {
      ST_F32(MEAN, p.mean_off + row, mean);
      ST_F32(RSTD, p.rstd_off + row, rstd);
    }
#else
    float q = 0.0;
    for (uint k = tid; k < p.c; k += wg) {
      float v = X_ld(dx, xo + k);
      q += v * v;
    }
    float rstd = 1.0 / sqrt(wg_sum(q) / float(p.c) + p.eps);
    for (uint k = tid; k < p.c; k += wg) Y_st(dy, yo + k, X_ld(dx, xo + k) * rstd * W_ld(dw, p.w_off + k));
    if (tid == 0u) ST_F32(RSTD, p.rstd_off + row, rstd);
#endif
  }
}
