#version 450
// Top-k along the last axis, sorted descending, ties to the lower index (backend/cpu/reduce.cpp TopK).
// One workgroup per row; k rounds, each picking the best element ranked after the previous pick in the order
// (value descending, index ascending). O(k n) per row: meant for small k.
#include "common/common.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, X)
TENSOR(1, V)
TENSOR(2, I)

layout(push_constant) uniform Push {
  uint n;            // row length
  uint x_stride;     // x's last-dim stride
  uint rows;
  uint oshape[3];
  uint xs[3];        // x's outer strides
  uint x_off, v_off, i_off;  // outputs are dense [rows, k]
  uint dtypes;       // x | v << 4
  uint k;
} p;

shared float s_v[gl_WorkGroupSize.x];
shared uint s_i[gl_WorkGroupSize.x];

// (a, ia) ranks before (b, ib)
bool before(float a, uint ia, float b, uint ib) { return a > b || (a == b && ia < ib); }

void main() {
  uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    uint c2 = row % p.oshape[2];
    uint r = row / p.oshape[2];
    uint c1 = r % p.oshape[1];
    uint c0 = r / p.oshape[1];
    uint xo = p.x_off + c0 * p.xs[0] + c1 * p.xs[1] + c2 * p.xs[2];
    float pv = 0.0;
    uint pi = 0xffffffffu;  // no previous pick yet
    for (uint j = 0u; j < p.k; ++j) {
      float bv = 0.0;
      uint bi = 0xffffffffu;
      for (uint e = tid; e < p.n; e += wg) {
        float v = X_ld(p.dtypes & 15u, xo + e * p.x_stride);
        bool after_prev = pi == 0xffffffffu || before(pv, pi, v, e);
        if (after_prev && (bi == 0xffffffffu || before(v, e, bv, bi))) {
          bv = v;
          bi = e;
        }
      }
      s_v[tid] = bv;
      s_i[tid] = bi;
      for (uint w = wg / 2u; w > 0u; w >>= 1) {
        barrier();
        if (tid < w) {
          float ov = s_v[tid + w];
          uint oi = s_i[tid + w];
          if (oi != 0xffffffffu && (s_i[tid] == 0xffffffffu || before(ov, oi, s_v[tid], s_i[tid]))) {
            s_v[tid] = ov;
            s_i[tid] = oi;
          }
        }
      }
      barrier();
      pv = s_v[0];
      pi = s_i[0];
      barrier();
      if (tid == 0u) {
        V_st(p.dtypes >> 4, p.v_off + row * p.k + j, pv);
        I_w[p.i_off + row * p.k + j] = pi;
      }
    }
  }
}
