#version 450
// Input gradient of RMSNorm (RmsNormGrad in core/ops/nn.h), one workgroup per dense row of length c, in f32:
//   s = sum(g w x);  dx = rstd g w - x rstd^3 s / c      (= rstd (ĝ - x̂ mean(ĝ x̂)), ĝ = g w, x̂ = x rstd)
// Reads x and g twice (the second time from cache), writes dx in its own dtype (acc = 1: adds it to dx's
// contents, a gradient collected from the residual path). vec 1: c and every offset are multiples of 4
// (4-element loads); vec 2: of 8, x and g 16-bit (8-element loads).
#include "common/common.glsl"
layout(local_size_x_id = 0) in;
#include "common/rows.glsl"

TENSOR(0, X)
TENSOR4(0, X)
TENSOR(1, W)
TENSOR4(1, W)
TENSOR(2, RSTD)  // f32 [rows]
TENSOR(3, G)
TENSOR4(3, G)
TENSOR(4, DX)
TENSOR4(4, DX)

layout(push_constant) uniform Push {
  uint c, rows;
  uint x_off, w_off, rstd_off, g_off, dx_off;
  uint dtypes;  // x | w << 4 | g << 8 | dx << 12
  uint vec;
  uint acc;
} p;

void main() {
  const uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  const uint dx_t = p.dtypes & 15u, dw = (p.dtypes >> 4) & 15u, dg = (p.dtypes >> 8) & 15u, dd = (p.dtypes >> 12) & 15u;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint xo = p.x_off + row * p.c, go = p.g_off + row * p.c, oo = p.dx_off + row * p.c;
    const float rstd = LD_F32(RSTD, p.rstd_off + row);
    float s = 0.0;
    if (p.vec == 2u) {  // 16-bit x and g, c and every offset multiples of 8: 16-byte loads
      for (uint k = 8u * tid; k < p.c; k += 8u * wg) {
        vec4 g0, g1, w0, w1, x0, x1;
        G_ld8(dg, go + k, g0, g1);
        W_ld8(dw, p.w_off + k, w0, w1);
        X_ld8(dx_t, xo + k, x0, x1);
        s += dot(g0 * w0, x0) + dot(g1 * w1, x1);
      }
    } else if (p.vec != 0u) {
      for (uint k = 4u * tid; k < p.c; k += 4u * wg)
        s += dot(G_ld4(dg, go + k) * W_ld4(dw, p.w_off + k), X_ld4(dx_t, xo + k));
    } else {
      for (uint k = tid; k < p.c; k += wg) s += G_ld(dg, go + k) * W_ld(dw, p.w_off + k) * X_ld(dx_t, xo + k);
    }
    const float coef = rstd * rstd * rstd * wg_sum(s) / float(p.c);
    if (p.vec == 2u) {
      for (uint k = 8u * tid; k < p.c; k += 8u * wg) {
        vec4 g0, g1, w0, w1, x0, x1;
        G_ld8(dg, go + k, g0, g1);
        W_ld8(dw, p.w_off + k, w0, w1);
        X_ld8(dx_t, xo + k, x0, x1);
        vec4 d0 = rstd * g0 * w0 - coef * x0, d1 = rstd * g1 * w1 - coef * x1;
        if (p.acc != 0u) {
          vec4 o0, o1;
          DX_ld8(dd, oo + k, o0, o1);
          d0 += o0;
          d1 += o1;
        }
        DX_st8(dd, oo + k, d0, d1);
      }
    } else if (p.vec != 0u) {
      for (uint k = 4u * tid; k < p.c; k += 4u * wg) {
        vec4 d = rstd * G_ld4(dg, go + k) * W_ld4(dw, p.w_off + k) - coef * X_ld4(dx_t, xo + k);
        if (p.acc != 0u) d += DX_ld4(dd, oo + k);
        DX_st4(dd, oo + k, d);
      }
    } else {
      for (uint k = tid; k < p.c; k += wg) {
        float d = rstd * G_ld(dg, go + k) * W_ld(dw, p.w_off + k) - coef * X_ld(dx_t, xo + k);
        if (p.acc != 0u) d += DX_ld(dd, oo + k);
        DX_st(dd, oo + k, d);
      }
    }
  }
}
