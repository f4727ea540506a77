#version 450
// Softmax / log-softmax over dense rows of length n (one workgroup per row). Rows that are all -inf give 0
// (softmax) or -inf (log-softmax), as the CPU kernel does.
// Built with -DCHUNK: one vocabulary chunk of the fused loss (SoftmaxChunk): lse = logaddexp(prev[row], logsumexp
// of the row) (prev only when has_prev), y = exp(x - lse) · (1 - (x / softcap)²) (the slope only when softcap > 0),
// zero rows where ign[row] != 0; lse (f32) is written per row.
#include "common/common.glsl"
layout(local_size_x_id = 0) in;
#include "common/rows.glsl"

TENSOR(0, X)
TENSOR(1, Y)
TENSOR4(0, X)
TENSOR4(1, Y)
#ifdef CHUNK
TENSOR(2, IGN)   // i32 [rows]
TENSOR(3, PREV)  // f32 [rows]
TENSOR(4, LSE)   // f32 [rows]
#endif

layout(push_constant) uniform Push {
  uint n, rows, x_off, y_off, dtypes;  // dtypes: x | y << 4
  uint log_softmax;
  uint vec;  // 1: n and both offsets are multiples of 4 (the vector path); 2: CHUNK, also 16-bit x, multiples of 8
#ifdef CHUNK
  uint ign_off, prev_off, lse_off, has_prev;
  float softcap;
#endif
} p;

#ifdef CHUNK
// The row's lse from its max m and Σ exp(x - m), combined with the columns before; written by invocation 0.
float chunk_lse(uint row, uint tid, float m, float s) {
  float l = isinf(m) && m < 0.0 ? m : m + log(s);
  if (p.has_prev != 0u) {
    float a = LD_F32(PREV, p.prev_off + row), hi = max(a, l), lo = min(a, l);
    l = isinf(hi) && hi < 0.0 ? hi : hi + log(1.0 + exp(lo - hi));
  }
  if (tid == 0u) ST_F32(LSE, p.lse_off + row, l);
  return l;
}
float chunk_slope(float x) { return p.softcap > 0.0 ? 1.0 - (x / p.softcap) * (x / p.softcap) : 1.0; }
vec4 chunk_slope4(vec4 x) { return p.softcap > 0.0 ? 1.0 - (x / p.softcap) * (x / p.softcap) : vec4(1.0); }
#endif

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
#ifndef CHUNK
  if (isinf(m) && m < 0.0) {
    for (uint k = tid; k < n4; k += wg) Y_st4(dy, yo + 4u * k, vec4(p.log_softmax != 0u ? NEG_INF : 0.0));
    return;
  }
#endif
  float s = 0.0;
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    if (k < n4 && !(isinf(m) && m < 0.0)) {
      vec4 e = exp(cache[j] - m);
      s += (e.x + e.y) + (e.z + e.w);
    }
  }
  for (uint k = tid + RC * wg; k < n4 && !(isinf(m) && m < 0.0); k += wg) {
    vec4 e = exp(X_ld4(dx, xo + 4u * k) - m);
    s += (e.x + e.y) + (e.z + e.w);
  }
  s = wg_sum(s);
#ifdef CHUNK
  float l = chunk_lse(row, tid, m, s);
  bool zero = LD_I32(IGN, p.ign_off + row) != 0 || (isinf(l) && l < 0.0);
  [[unroll]] for (uint j = 0u; j < RC; ++j) {
    uint k = tid + j * wg;
    if (k < n4) Y_st4(dy, yo + 4u * k, zero ? vec4(0.0) : exp(cache[j] - l) * chunk_slope4(cache[j]));
  }
  for (uint k = tid + RC * wg; k < n4; k += wg) {
    vec4 v = X_ld4(dx, xo + 4u * k);
    Y_st4(dy, yo + 4u * k, zero ? vec4(0.0) : exp(v - l) * chunk_slope4(v));
  }
  return;
#endif
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

#ifdef CHUNK
// The chunk with 8-element loads (vec == 2: 16-bit x, n and the offsets multiples of 8): one 16-byte access per
// 8 elements of x (and of a 16-bit y), the row held in registers up to RC / 2 pairs of vec4 per invocation.
void chunk_wide(uint row, uint tid, uint wg, uint dx, uint dy) {
  uint xo = p.x_off + row * p.n, yo = p.y_off + row * p.n, n8 = p.n >> 3;
  vec4 lo[RC / 2], hi[RC / 2];
  float m = NEG_INF;
  [[unroll]] for (uint j = 0u; j < RC / 2; ++j) {
    uint k = tid + j * wg;
    lo[j] = hi[j] = vec4(NEG_INF);
    if (k < n8) X_ld8(dx, xo + 8u * k, lo[j], hi[j]);
    vec4 t = max(lo[j], hi[j]);
    m = max(m, max(max(t.x, t.y), max(t.z, t.w)));
  }
  for (uint k = tid + (RC / 2) * wg; k < n8; k += wg) {
    vec4 a, b;
    X_ld8(dx, xo + 8u * k, a, b);
    vec4 t = max(a, b);
    m = max(m, max(max(t.x, t.y), max(t.z, t.w)));
  }
  m = wg_max(m);
  float s = 0.0;
  const bool none = isinf(m) && m < 0.0;
  [[unroll]] for (uint j = 0u; j < RC / 2; ++j) {
    if (tid + j * wg < n8 && !none) {
      vec4 e = exp(lo[j] - m) + exp(hi[j] - m);
      s += (e.x + e.y) + (e.z + e.w);
    }
  }
  for (uint k = tid + (RC / 2) * wg; k < n8 && !none; k += wg) {
    vec4 a, b;
    X_ld8(dx, xo + 8u * k, a, b);
    vec4 e = exp(a - m) + exp(b - m);
    s += (e.x + e.y) + (e.z + e.w);
  }
  s = wg_sum(s);
  float l = chunk_lse(row, tid, m, s);
  bool zero = LD_I32(IGN, p.ign_off + row) != 0 || (isinf(l) && l < 0.0);
  [[unroll]] for (uint j = 0u; j < RC / 2; ++j) {
    uint k = tid + j * wg;
    if (k < n8)
      Y_st8(dy, yo + 8u * k, zero ? vec4(0.0) : exp(lo[j] - l) * chunk_slope4(lo[j]),
            zero ? vec4(0.0) : exp(hi[j] - l) * chunk_slope4(hi[j]));
  }
  for (uint k = tid + (RC / 2) * wg; k < n8; k += wg) {
    vec4 a, b;
    X_ld8(dx, xo + 8u * k, a, b);
    Y_st8(dy, yo + 8u * k, zero ? vec4(0.0) : exp(a - l) * chunk_slope4(a),
          zero ? vec4(0.0) : exp(b - l) * chunk_slope4(b));
  }
}
#endif

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
#ifdef CHUNK
  if (p.vec == 2u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) chunk_wide(row, tid, wg, dx, dy);
    return;
  }
#endif
  if (p.vec != 0u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) row_vec(row, tid, wg, dx, dy);
    return;
  }
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    uint xo = p.x_off + row * p.n, yo = p.y_off + row * p.n;
    float m = NEG_INF;
    for (uint k = tid; k < p.n; k += wg) m = max(m, X_ld(dx, xo + k));
    m = wg_max(m);
#ifdef CHUNK
    float s = 0.0;
    if (!(isinf(m) && m < 0.0)) for (uint k = tid; k < p.n; k += wg) s += exp(X_ld(dx, xo + k) - m);
    s = wg_sum(s);
    float l = chunk_lse(row, tid, m, s);
    bool zero = LD_I32(IGN, p.ign_off + row) != 0 || (isinf(l) && l < 0.0);
    for (uint k = tid; k < p.n; k += wg) {
      float v = X_ld(dx, xo + k);
      Y_st(dy, yo + k, zero ? 0.0 : exp(v - l) * chunk_slope(v));
    }
    continue;
#else
    if (isinf(m) && m < 0.0) {
      for (uint k = tid; k < p.n; k += wg) Y_st(dy, yo + k, p.log_softmax != 0u ? NEG_INF : 0.0);
      continue;
    }
    float s = 0.0;
    for (uint k = tid; k < p.n; k += wg) s += exp(X_ld(dx, xo + k) - m);
    s = wg_sum(s);
#endif
    float ls = log(s);
    for (uint k = tid; k < p.n; k += wg) {
      float v = X_ld(dx, xo + k) - m;
      Y_st(dy, yo + k, p.log_softmax != 0u ? v - ls : exp(v) / s);
    }
  }
}
