#version 450
// Cross-entropy over dense logits [N, V] with i32 targets [N]. Forward (one workgroup per row): lse[r] (f32) and
// loss[r] = lse - logits[r, t] (0 where t == ignore_index; NaN for a target outside [0, V), which the op rejects
// before launching). Built with -DGRAD: dlogits = (exp(logits - lse) - onehot(t)) * g[r], zero rows where ignored,
// one invocation per element; a target outside [0, V) has no one-hot term (vocabulary chunks of
// linear_cross_entropy).
#include "common/common.glsl"
layout(local_size_x_id = 0) in;
#include "common/rows.glsl"

TENSOR(0, L)   // logits
TENSOR(1, T)   // targets i32
#ifndef GRAD
TENSOR(2, LOSS)
TENSOR(3, LSE)
#else
TENSOR(2, LSE)
TENSOR(3, G)
TENSOR(4, D)   // dlogits
#endif

layout(push_constant) uniform Push {
  uint n, v;           // rows, vocabulary
  uint l_off, t_off, a_off, b_off, d_off;  // forward: a = loss, b = lse; grad: a = lse, b = g
  uint dtypes;         // logits | dlogits << 4
  int ignore_index;
} p;

void main() {
  uint dl = p.dtypes & 15u;
#ifndef GRAD
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.n; row += gl_NumWorkGroups.x) {
    uint lo = p.l_off + row * p.v;
    float m = NEG_INF;
    for (uint k = tid; k < p.v; k += wg) m = max(m, L_ld(dl, lo + k));
    m = wg_max(m);
    float s = 0.0;
    if (!isinf(m)) for (uint k = tid; k < p.v; k += wg) s += exp(L_ld(dl, lo + k) - m);
    s = wg_sum(s);
    if (tid == 0u) {
      float lse = isinf(m) ? m : m + log(s);
      int t = LD_I32(T, p.t_off + row);
      float loss = 0.0;
      if (t != p.ignore_index) loss = (t >= 0 && uint(t) < p.v) ? lse - L_ld(dl, lo + uint(t)) : POS_NAN;
      ST_F32(LOSS, p.a_off + row, loss);
      ST_F32(LSE, p.b_off + row, lse);
    }
  }
#else
  uint total = p.n * p.v;
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
    uint row = i / p.v, k = i - row * p.v;
    int t = LD_I32(T, p.t_off + row);
    float d = 0.0;
    if (t != p.ignore_index) {
      float prob = exp(L_ld(dl, p.l_off + i) - LD_F32(LSE, p.a_off + row));
      d = (prob - (int(k) == t ? 1.0 : 0.0)) * LD_F32(G, p.b_off + row);
    }
    D_st(p.dtypes >> 4, p.d_off + i, d);
  }
#endif
}
