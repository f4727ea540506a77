#version 450
// Embedding gather: out[r, c] = weight[ids[r], c] (raw element bits when the dtypes match; 0 for an id outside
// [0, V), which the op rejects before launching). One invocation per output element.
#include "common/common.glsl"
layout(local_size_x_id = 0) in;

TENSOR(0, W)
TENSOR(1, IDS)
TENSOR(2, Y)

layout(push_constant) uniform Push {
  uint total, c, v;
  uint w_off, ids_off, y_off;
  uint dtypes;  // w | y << 4
} p;

void main() {
  uint dw = p.dtypes & 15u, dy = p.dtypes >> 4;
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint e = gl_GlobalInvocationID.x; e < p.total; e += stride) {
    uint row = e / p.c, col = e - row * p.c;
    int id = LD_I32(IDS, p.ids_off + row);
    if (id < 0 || uint(id) >= p.v) {
      Y_st(dy, p.y_off + e, 0.0);
    } else if (dw == dy) {
      Y_setbits(dy, p.y_off + e, W_bits(dw, p.w_off + uint(id) * p.c + col));
    } else {
      Y_st(dy, p.y_off + e, W_ld(dw, p.w_off + uint(id) * p.c + col));
    }
  }
}
