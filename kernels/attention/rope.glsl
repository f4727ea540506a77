// What rope.comp and rope_append.comp share: the workgroup size (specialization constant 0), the bindings of the
// rotated tensor X, the positions (i32), inv_freq (f32) and the output Y, and the rotation: sin and cos of angle
// a, reduced to [-pi, pi] in two steps first so that large positions stay accurate on GPUs whose sin/cos are only
// good near 0, both times `scale` (transformers' attention_scaling of yarn and longrope).
#ifndef LMTUNE_ROPE_GLSL
#define LMTUNE_ROPE_GLSL

#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, X)
TENSOR(1, POS)
TENSOR(2, FREQ)
TENSOR(3, Y)

void sincos_reduced(float a, float scale, out float s, out float c) {
  float k = round(a * 0.15915494309189535);  // a / (2 pi)
  float r = (a - k * 6.28125) - k * 0.0019353071795864769;  // 2 pi = 6.28125 + 0.00193530717958647...
  s = sin(r) * scale;
  c = cos(r) * scale;
}

#endif
