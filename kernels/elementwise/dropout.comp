#version 450
// Dropout of dense x into dense y: element i is kept (times `scale` = 1 / (1 - p)) unless a counter-based hash of
// (i, key) falls below `threshold` = p * 2^32, so the mask needs no storage and the backward pass (the same op on
// the gradient) reproduces it. The hash must match dropout_hash in backend/cpu/nn.cpp bit for bit
// (OpTest.Dropout compares the two backends).
#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, X)
TENSOR(1, Y)

layout(push_constant) uniform Push {
  uint total, x_off, y_off, dtypes;  // dtypes: x | y << 4
  uint key0, key1, threshold;
  float scale;
} p;

uint mix32(uint h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}

void main() {
  uint dx = p.dtypes & 15u, dy = p.dtypes >> 4;
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.total; i += stride) {
    uint h = mix32(mix32(i ^ p.key0) + p.key1);
    Y_st(dy, p.y_off + i, h < p.threshold ? 0.0 : X_ld(dx, p.x_off + i) * p.scale);
  }
}
