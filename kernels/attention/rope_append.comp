#version 450
// Decoding's rope and KV-cache append in one pass (ops::rope_append): the queries and keys of the fused q, k, v
// product, X [B, T, H + KV, D] (token rows strided, heads dense), rotated as rope.comp's half_split at positions
// i32 [B, T] with inv_freq f32 [R/2] (dims >= R pass through, cos and sin times `scale`): the queries into dense
// Y [B, T, H, D], the keys into the cache's slots Z [B, T, KV, D]; and the values V [B, T, KV, D] copied into
// the cache's slots W. One invocation per rotated pair or pass-through dim of X's rows, then one per value
// element: where rope, a dense copy of the strided X and the two appends would take four dispatches.
#include "attention/rope.glsl"

TENSOR(4, Z)
TENSOR(5, V)
TENSOR(6, W)

// Mirrors RopeAppendPush in src/backend/vulkan/nn.cpp. Strides in elements: _sb batch, _st token.
layout(push_constant) uniform Push {
  uint rot_units, copy_units;  // B T (H + KV) (R/2 + D - R); B T KV D
  uint T, H, KV, D, R;
  uint x_off, x_sb, x_st, pos_off, freq_off, y_off;
  uint z_off, z_sb, z_st, v_off, v_sb, v_st, w_off, w_sb, w_st;
  uint dtypes;  // x | y << 4 | z << 8 | v << 12 | w << 16 (read as DTYPES below)
  float scale;
} p;

// The dtypes as specialization constant 1 (the host passes the push constants' value): a pipeline per dtype
// combination, compiled without the dtype switches.
layout(constant_id = 1) const uint DTYPES = 0u;
uint dt(uint field) { return (DTYPES >> (4u * field)) & 15u; }

// Unit u of X's rows: rotates the pair (k, k + R/2) of its row, or copies dim R + (k - R/2).
void rotate(uint u) {
  const uint half_r = p.R / 2u, per_row = half_r + (p.D - p.R);
  const uint row = u / per_row, k = u % per_row, heads = p.H + p.KV;
  const uint token = row / heads, head = row % heads, b = token / p.T, t = token % p.T;
  const uint xo = p.x_off + b * p.x_sb + t * p.x_st + head * p.D;
  const bool query = head < p.H;
  const uint yo = query ? p.y_off + (token * p.H + head) * p.D
                        : p.z_off + b * p.z_sb + t * p.z_st + (head - p.H) * p.D;
  const uint ydt = query ? dt(1) : dt(2);
  if (k >= half_r) {  // a dim past the rotated ones
    const uint j = p.R + (k - half_r);
    const float x = X_ld(dt(0), xo + j);
    if (query) Y_st(ydt, yo + j, x); else Z_st(ydt, yo + j, x);
    return;
  }
  float s, c;
  sincos_reduced(float(LD_I32(POS, p.pos_off + token)) * LD_F32(FREQ, p.freq_off + k), p.scale, s, c);
  const float a = X_ld(dt(0), xo + k), bv = X_ld(dt(0), xo + k + half_r);
  if (query) {
    Y_st(ydt, yo + k, a * c - bv * s);
    Y_st(ydt, yo + k + half_r, bv * c + a * s);
  } else {
    Z_st(ydt, yo + k, a * c - bv * s);
    Z_st(ydt, yo + k + half_r, bv * c + a * s);
  }
}

// Element c of the values: copied to its slot.
void append_value(uint c) {
  const uint row = p.KV * p.D, token = c / row, e = c % row, b = token / p.T, t = token % p.T;
  W_st(dt(4), p.w_off + b * p.w_sb + t * p.w_st + e, V_ld(dt(3), p.v_off + b * p.v_sb + t * p.v_st + e));
}

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint u = gl_GlobalInvocationID.x; u < p.rot_units + p.copy_units; u += stride) {
    if (u < p.rot_units) rotate(u);
    else append_value(u - p.rot_units);
  }
}
