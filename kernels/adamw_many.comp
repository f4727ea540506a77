#version 450
// AdamW over many parameter tensors in one dispatch (AdamWUpdateMany in core/ops/optimizer.h). The tensors live in
// up to 8 buffers (B0..B7, bound by the host); the table holds one entry per chunk of a parameter: the buffer slots
// (p | m << 4 | v << 8 | g << 12 | g's dtype << 16), the element offsets of p, m, v and g, and the element count.
// Workgroup e updates entry first + e; the arithmetic is optimizer.comp's (KIND 0) and backend/cpu/optimizer.cpp's.
#include "common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, B0)
TENSOR(1, B1)
TENSOR(2, B2)
TENSOR(3, B3)
TENSOR(4, B4)
TENSOR(5, B5)
TENSOR(6, B6)
TENSOR(7, B7)
TENSOR(8, H)    // f32 hyper-parameters (core/ops/optimizer.h)
TENSOR(9, TAB)  // u32 [entries][8]

layout(push_constant) uniform Push {
  uint first, count;
} p;

float load(uint slot, uint dt, uint i) {
  switch (slot) {
    case 0u: return B0_ld(dt, i);
    case 1u: return B1_ld(dt, i);
    case 2u: return B2_ld(dt, i);
    case 3u: return B3_ld(dt, i);
    case 4u: return B4_ld(dt, i);
    case 5u: return B5_ld(dt, i);
    case 6u: return B6_ld(dt, i);
    default: return B7_ld(dt, i);
  }
}

void store(uint slot, uint i, float v) {  // f32
  switch (slot) {
    case 0u: ST_F32(B0, i, v); break;
    case 1u: ST_F32(B1, i, v); break;
    case 2u: ST_F32(B2, i, v); break;
    case 3u: ST_F32(B3, i, v); break;
    case 4u: ST_F32(B4, i, v); break;
    case 5u: ST_F32(B5, i, v); break;
    case 6u: ST_F32(B6, i, v); break;
    default: ST_F32(B7, i, v); break;
  }
}

void main() {
  float lr = LD_F32(H, 0u), b1 = LD_F32(H, 1u), b2 = LD_F32(H, 2u), eps = LD_F32(H, 3u), wd = LD_F32(H, 4u);
  float bc1 = LD_F32(H, 5u), bc2 = LD_F32(H, 6u), gs = LD_F32(H, 7u);
  const uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
  for (uint e = gl_WorkGroupID.x; e < p.count; e += gl_NumWorkGroups.x) {
    const uint at = (p.first + e) * 8u;
    const uint slots = TAB_w[at], po = TAB_w[at + 1u], mo = TAB_w[at + 2u], vo = TAB_w[at + 3u];
    const uint go = TAB_w[at + 4u], n = TAB_w[at + 5u];
    const uint ps = slots & 15u, ms = (slots >> 4) & 15u, vs = (slots >> 8) & 15u, gsl = (slots >> 12) & 15u;
    const uint gdt = slots >> 16;
    for (uint i = tid; i < n; i += wg) {
      float g = load(gsl, gdt, go + i) * gs;
      float w = load(ps, DT_F32, po + i);
      w -= lr * wd * w;
      float m = b1 * load(ms, DT_F32, mo + i) + (1.0 - b1) * g;
      float v = b2 * load(vs, DT_F32, vo + i) + (1.0 - b2) * g * g;
      store(ms, mo + i, m);
      store(vs, vo + i, v);
      w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps);
      store(ps, po + i, w);
    }
  }
}
