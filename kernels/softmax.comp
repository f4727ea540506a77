#version 450
// Softmax / log-softmax over dense rows of length n (one workgroup per row). Rows that are all -inf give 0
// (softmax) or -inf (log-softmax), as the CPU kernel does.
#include "common.glsl"
layout(local_size_x_id = 0) in;
#include "rows.glsl"

TENSOR(0, X)
TENSOR(1, Y)
TENSOR4(0, X)
TENSOR4(1, Y)

layout(push_constant) uniform Push {
  uint n, rows, x_off, y_off, dtypes;  // dtypes: x | y << 4
  uint log_softmax;
  uint vec;  // n and both offsets are multiples of 4: the vector path
} p;

// A row with 4-element loads, held in registers (up to RC vec4 per invocation): x is read from memory once.
#define RC 8
void row_vec(uint row, uint tid, uint wg, uint dx, uint dy) {
  uint xo = p.x_off + row * p.n, yo = p.y_off + row * p.n, n4 = p.n >> 2;
  vec4 cache[RC];
  float m = NEG_INF;
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    cache[j] = k < n4 ? X_ld4(dx, xo + 4u * k) : vec4(NEG_INF);
    m = max(m, max(max(cache[j].x, cache[j].y), max(cache[j].z, cache[j].w)));
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) {
    vec4 v = X_ld4(dx, xo + 4u * k);
    m = max(m, max(max(v.x, v.y), max(v.z, v.w)));
  }
  m = wg_max(m);
  if (isinf(m) && m < 0.0) {
    for (uint k = tid; k < n4; k += wg) Y_st4(dy, yo + 4u * k, vec4(p.log_softmax != 0u ? NEG_INF : 0.0));
    return;
  }
  float s = 0.0;
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    if (k < n4) {
      vec4 e = exp(cache[j] - m);
      s += (e.x + e.y) + (e.z + e.w);
    }
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) {
    vec4 e = exp(X_ld4(dx, xo + 4u * k) - m);
    s += (e.x + e.y) + (e.z + e.w);
  }
  s = wg_sum(s);
  float ls = log(s);
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    if (k < n4) {
      vec4 v = cache[j] - m;
      Y_st4(dy, yo + 4u * k, p.log_softmax != 0u ? v - ls : exp(v) / s);
    }
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) {
    vec4 v = X_ld4(dx, xo + 4u * k) - m;
    Y_st4(dy, yo + 4u * k, p.log_softmax != 0u ? v - ls : exp(v) / s);
  }
}

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
  if (p.vec != 0u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) row_vec(row, tid, wg, dx, dy);
    return;
  }
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    uint xo = p.x_off + row * p.n, yo = p.y_off + row * p.n;
    float m = NEG_INF;
    for (uint k = tid; k < p.n; k += wg) m = max(m, X_ld(dx, xo + k));
    m = wg_max(m);
    if (isinf(m) && m < 0.0) {
      for (uint k = tid; k < p.n; k += wg) Y_st(dy, yo + k, p.log_softmax != 0u ? NEG_INF : 0.0);
      continue;
    }
    float s = 0.0;
    for (uint k = tid; k < p.n; k += wg) s += exp(X_ld(dx, xo + k) - m);
    s = wg_sum(s);
    float ls = log(s);
    for (uint k = tid; k < p.n; k += wg) {
      float v = X_ld(dx, xo + k) - m;
      Y_st(dy, yo + k, p.log_softmax != 0u ? v - ls : exp(v) / s);
    }
  }
}
