#version 450
// RMSNorm and LayerNorm over dense rows of length c (one workgroup per row), statistics in f32.
//   rms:   rstd = 1/sqrt(mean(x^2) + eps); y = x * rstd * w                  outputs y, rstd
//   layer: mean, rstd = 1/sqrt(mean((x-mean)^2) + eps); y = (x-mean) * rstd * w + b   outputs y, mean, rstd
#include "common/common.glsl"
layout(local_size_x_id = 0) in;
#include "common/rows.glsl"

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
TENSOR4(0, X)
TENSOR4(1, W)
TENSOR4(2, Y)
#endif

layout(push_constant) uniform Push {
  uint c, rows;
  uint x_off, w_off, b_off, y_off, mean_off, rstd_off;
  uint dtypes;  // x | w << 4 | b << 8 | y << 12
  float eps;
  uint has_bias;
  uint vec;     // rms: 1: c and the x, w, y offsets are multiples of 4 (vector path); 2: of 8, x 16-bit
} p;

// RMSNorm's dtypes and vector path as specialization constants 1 and 2 (the host passes the push constants'
// values): a pipeline per combination, compiled without the dtype switches and the other paths. LayerNorm reads
// the push constants.
layout(constant_id = 1) const uint DTYPES = 0u;
layout(constant_id = 2) const uint VEC = 0u;

#ifndef LAYER
// RMSNorm of a row with 4-element loads, the row held in registers (up to RC vec4 per invocation) so that x is
// read from memory once.
#define RC 8
void rms_vec(uint row, uint tid, uint wg, uint dx, uint dw, uint dy) {
  uint xo = p.x_off + row * p.c, yo = p.y_off + row * p.c, n4 = p.c >> 2;
  vec4 cache[RC];
  float q = 0.0;
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    cache[j] = k < n4 ? X_ld4(dx, xo + 4u * k) : vec4(0.0);
    q += dot(cache[j], cache[j]);
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) {
    vec4 v = X_ld4(dx, xo + 4u * k);
    q += dot(v, v);
  }
  float rstd = 1.0 / sqrt(wg_sum(q) / float(p.c) + p.eps);
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    if (k < n4) Y_st4(dy, yo + 4u * k, cache[j] * rstd * W_ld4(dw, p.w_off + 4u * k));
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) Y_st4(dy, yo + 4u * k, X_ld4(dx, xo + 4u * k) * rstd * W_ld4(dw, p.w_off + 4u * k));
  if (tid == 0u) ST_F32(RSTD, p.rstd_off + row, rstd);
}

// The same with 8-element loads (16-bit x, c and the offsets multiples of 8): one 16-byte access per 8 elements.
void rms_wide(uint row, uint tid, uint wg, uint dx, uint dw, uint dy) {
  uint xo = p.x_off + row * p.c, yo = p.y_off + row * p.c, n8 = p.c >> 3;
  vec4 lo[RC / 2], hi[RC / 2];
  float q = 0.0;
  [[unroll]] for (uint j = 0u; j < RC / 2; ++j) {
    uint k = tid + j * wg;
    lo[j] = vec4(0.0);
    hi[j] = vec4(0.0);
    if (k < n8) X_ld8(dx, xo + 8u * k, lo[j], hi[j]);
    q += dot(lo[j], lo[j]) + dot(hi[j], hi[j]);
  }
  for (uint k = tid + (RC / 2) * wg; k < n8; k += wg) {
    vec4 a, b;
    X_ld8(dx, xo + 8u * k, a, b);
    q += dot(a, a) + dot(b, b);
  }
  float rstd = 1.0 / sqrt(wg_sum(q) / float(p.c) + p.eps);
  [[unroll]] for (uint j = 0u; j < RC / 2; ++j) {
    uint k = tid + j * wg;
    if (k >= n8) continue;
    vec4 wl, wh;
    W_ld8(dw, p.w_off + 8u * k, wl, wh);
    Y_st8(dy, yo + 8u * k, lo[j] * rstd * wl, hi[j] * rstd * wh);
  }
  for (uint k = tid + (RC / 2) * wg; k < n8; k += wg) {
    vec4 a, b, wl, wh;
    X_ld8(dx, xo + 8u * k, a, b);
    W_ld8(dw, p.w_off + 8u * k, wl, wh);
    Y_st8(dy, yo + 8u * k, a * rstd * wl, b * rstd * wh);
  }
  if (tid == 0u) ST_F32(RSTD, p.rstd_off + row, rstd);
}
#endif

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
#ifdef LAYER
  const uint dts = p.dtypes, vec = 0u;
#else
  const uint dts = DTYPES, vec = VEC;
#endif
  uint dx = dts & 15u, dw = (dts >> 4) & 15u, db = (dts >> 8) & 15u, dy = (dts >> 12) & 15u;
#ifndef LAYER
  if (vec == 2u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) rms_wide(row, tid, wg, dx, dw, dy);
    return;
  }
  if (vec != 0u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) rms_vec(row, tid, wg, dx, dw, dy);
    return;
  }
#endif
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
