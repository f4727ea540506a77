#version 450
// Reductions over one axis (sum, max, logsumexp, argmax), matching backend/cpu/reduce.cpp: f32 math (compensated
// sums), first index on ties for argmax, -inf for empty max/logsumexp.
// Rows (the outputs) are addressed through up to 3 collapsed outer dims with strides for x and y.
// mode 0: one workgroup per output row (the axis is read by all invocations, then a shared-memory tree reduction);
// mode 1: one invocation per output, looping over the axis (coalesced when the axis is not the innermost dim);
// modes 2 and 3: max or argmax of few long rows (a decode step's logits: one workgroup would walk a vocabulary
// of 150k alone) in two dispatches. Mode 2: workgroup (x, y) takes stretch x of `chunk` elements of row y and
// writes its maximum and first index to PV and PI [rows, chunks]; mode 3: a workgroup per row picks the best
// stretch, the lower index on ties, as one workgroup would have.
#include "common/common.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, X)
TENSOR(1, Y)
TENSOR4(0, X)
TENSOR(2, PV)  // modes 2 and 3: f32 [rows, chunks] stretch maxima
TENSOR(3, PI)  // and their indices (f32: exact below 2^24, the host checks)

layout(push_constant) uniform Push {
  uint n;            // length of the reduced axis
  uint axis_stride;  // x's stride along it
  uint rows;
  uint oshape[3];
  uint xs[3];
  uint ys[3];
  uint x_off, y_off;
  uint dtypes;       // x | y << 4
  uint op;           // 0 sum, 1 max, 2 logsumexp, 3 argmax
  uint mode;
  uint vec;          // modes 0 and 2: the axis is dense, n and every row's offset are multiples of 4 (vector loads)
  uint chunk, chunks;  // modes 2 and 3: elements per stretch (a multiple of 4), stretches per row
} p;

#define NEG_INF uintBitsToFloat(0xff800000u)
shared float s_v[gl_WorkGroupSize.x];
shared float s_c[gl_WorkGroupSize.x];
shared uint s_i[gl_WorkGroupSize.x];

void offsets(uint row, out uint xo, out uint yo) {
  uint c2 = row % p.oshape[2];
  uint r = row / p.oshape[2];
  uint c1 = r % p.oshape[1];
  uint c0 = r / p.oshape[1];
  xo = p.x_off + c0 * p.xs[0] + c1 * p.xs[1] + c2 * p.xs[2];
  yo = p.y_off + c0 * p.ys[0] + c1 * p.ys[1] + c2 * p.ys[2];
}

float ld(uint xo, uint k) { return X_ld(p.dtypes & 15u, xo + k * p.axis_stride); }

void store(uint yo, float v, uint idx) {
  uint dy = p.dtypes >> 4;
  if (p.op == 3u) Y_st(dy, yo, float(idx));
  else Y_st(dy, yo, v);
}

// Kahan-compensated accumulation (precise: the compiler must not reassociate it away).
void kahan(inout precise float sum, inout precise float comp, float v) {
  precise float y = v - comp;
  precise float t = sum + y;
  comp = isinf(t) ? 0.0 : (t - sum) - y;  // an infinite sum stays infinite (not inf - inf = NaN)
  sum = t;
}

// ---- mode 0: workgroup per row ----
// Tree reduction of (s_v, s_c) as a compensated sum, or s_v max, or (s_v, s_i) argmax (first index on ties).
void tree(uint kind) {
  uint tid = gl_LocalInvocationID.x;
  for (uint w = gl_WorkGroupSize.x / 2u; w > 0u; w >>= 1) {
    barrier();
    if (tid < w) {
      if (kind == 0u) {
        precise float s = s_v[tid], c = s_c[tid];
        kahan(s, c, s_v[tid + w]);
        kahan(s, c, -s_c[tid + w]);
        s_v[tid] = s;
        s_c[tid] = c;
      } else if (kind == 1u) {
        s_v[tid] = max(s_v[tid], s_v[tid + w]);
      } else {
        float a = s_v[tid], b = s_v[tid + w];
        uint ia = s_i[tid], ib = s_i[tid + w];
        if (b > a || (b == a && ib < ia)) {
          s_v[tid] = b;
          s_i[tid] = ib;
        }
      }
    }
  }
  barrier();
}

void row_mode(uint row) {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint xo, yo;
  offsets(row, xo, yo);
  float m = NEG_INF;
  uint idx = 0xffffffffu;
  if (p.op != 0u) {
    for (uint k = tid; k < p.n; k += wg) {
      float v = ld(xo, k);
      if (idx == 0xffffffffu || v > m) {
        m = v;
        idx = k;
      }
    }
    s_v[tid] = m;
    s_i[tid] = idx;
    tree(p.op == 3u ? 2u : 1u);
    m = s_v[0];
    idx = s_i[0];
    if (p.n == 0u) {
      m = NEG_INF;
      idx = 0u;
    }
    barrier();
  }
  if (p.op == 0u || (p.op == 2u && !isinf(m) && !isnan(m))) {
    precise float sum = 0.0, comp = 0.0;
    if (p.vec != 0u) {
      uint dx = p.dtypes & 15u;
      for (uint k = tid; k < (p.n >> 2); k += wg) {
        vec4 v = X_ld4(dx, xo + 4u * k);
        if (p.op != 0u) v = exp(v - m);
        kahan(sum, comp, v.x);
        kahan(sum, comp, v.y);
        kahan(sum, comp, v.z);
        kahan(sum, comp, v.w);
      }
    } else {
      for (uint k = tid; k < p.n; k += wg) kahan(sum, comp, p.op == 0u ? ld(xo, k) : exp(ld(xo, k) - m));
    }
    s_v[tid] = sum;
    s_c[tid] = comp;
    tree(0u);
    float total = s_v[0] - s_c[0];
    barrier();
    if (tid == 0u) store(yo, p.op == 0u ? total : m + log(total), 0u);
  } else if (tid == 0u) {
    store(yo, m, idx);
  }
}

// ---- modes 2 and 3: stretches of a row, then their best ----
// The maximum and first index of elements [k0, k1) of the row at xo, met over the workgroup (valid in s_v[0],
// s_i[0]; n/a: -inf and index 0xffffffff).
void best_of(uint xo, uint k0, uint k1) {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  float m = NEG_INF;
  uint idx = 0xffffffffu;
  if (p.vec != 0u) {  // k0 and k1 are multiples of 4 here
    uint dx = p.dtypes & 15u;
    for (uint k = k0 + 4u * tid; k < k1; k += 4u * wg) {
      vec4 v = X_ld4(dx, xo + k);
      [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        if (idx == 0xffffffffu || v[e] > m) {
          m = v[e];
          idx = k + e;
        }
      }
    }
  } else {
    for (uint k = k0 + tid; k < k1; k += wg) {
      float v = ld(xo, k);
      if (idx == 0xffffffffu || v > m) {
        m = v;
        idx = k;
      }
    }
  }
  s_v[tid] = m;
  s_i[tid] = idx;
  tree(2u);
}

void stretch_mode(uint chunk, uint row) {
  uint xo, yo;
  offsets(row, xo, yo);
  uint k0 = chunk * p.chunk;
  best_of(xo, k0, min(p.n, k0 + p.chunk));
  if (gl_LocalInvocationID.x == 0u) {
    ST_F32(PV, row * p.chunks + chunk, s_v[0]);
    ST_F32(PI, row * p.chunks + chunk, s_i[0] == 0xffffffffu ? -1.0 : float(s_i[0]));
  }
}

void best_stretch_mode(uint row) {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  uint xo, yo;
  offsets(row, xo, yo);
  float m = NEG_INF;
  uint idx = 0xffffffffu;
  for (uint c = tid; c < p.chunks; c += wg) {
    float v = LD_F32(PV, row * p.chunks + c), i = LD_F32(PI, row * p.chunks + c);
    if (i >= 0.0 && (idx == 0xffffffffu || v > m)) {  // stretches in order: a later one wins only if greater
      m = v;
      idx = uint(i);
    }
  }
  s_v[tid] = m;
  s_i[tid] = idx;
  tree(2u);
  if (tid == 0u) store(yo, s_v[0], s_i[0]);
}

// ---- mode 1: invocation per row ----
void col_mode(uint row) {
  uint xo, yo;
  offsets(row, xo, yo);
  float m = NEG_INF;
  uint idx = 0u;
  if (p.op != 0u)
    for (uint k = 0u; k < p.n; ++k) {
      float v = ld(xo, k);
      if (k == 0u || v > m) {
        m = v;
        idx = k;
      }
    }
  if (p.op == 0u || (p.op == 2u && !isinf(m) && !isnan(m))) {
    precise float sum = 0.0, comp = 0.0;
    for (uint k = 0u; k < p.n; ++k) kahan(sum, comp, p.op == 0u ? ld(xo, k) : exp(ld(xo, k) - m));
    store(yo, p.op == 0u ? sum - comp : m + log(sum - comp), 0u);
  } else {
    store(yo, m, idx);
  }
}

void main() {
  if (p.mode == 2u) {
    stretch_mode(gl_WorkGroupID.x, gl_WorkGroupID.y);
  } else if (p.mode == 3u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) best_stretch_mode(row);
  } else if (p.mode == 0u) {
    for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) row_mode(row);
  } else {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) col_mode(row);
  }
}
