#version 450
// Softmax / log-softmax over dense rows of length n (one workgroup per row). Rows that are all -inf give 0
// (softmax) or -inf (log-softmax), as the CPU kernel does.
#include "common.glsl"
layout(local_size_x_id = 0) in;
#include "rows.glsl"

TENSOR(0, X)
TENSOR(1, Y)

layout(push_constant) uniform Push {
  uint n, rows, x_off, y_off, dtypes;  // dtypes: x | y << 4
  uint log_softmax;
} p;

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
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
