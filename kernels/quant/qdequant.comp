#version 450
// Decodes a rectangle of a block-quantized weight W into a dense row-major panel P [rows, cols] (f32, f16 or bf16)
// for the quantized products' panel route (src/backend/vulkan/quant_matmul.cpp): with many rows of x the device's
// fastest dense product on a decoded panel beats decoding W's tiles inside a tensor-core kernel, and the panel is
// small and transient (a budget of bytes, reused panel after panel), never a copy of the whole layer.
// One invocation per 8-element group, through the format's dequant8, the code every quantized kernel decodes with.
#include "common/common.glsl"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer QBuf { uint qw[]; };
TENSOR(1, P)
TENSOR4(1, P)
#include "quant/quant_block.glsl"

// Mirrored by QDequantParams in src/backend/vulkan/quant_matmul.cpp.
layout(push_constant) uniform QDequantParams {
  uint w_off, w_rb;     // W's byte offset and bytes per row
  uint row0, col0;      // the rectangle's first row and column of W (col0 a multiple of 8)
  uint rows, cols;      // its size (cols a multiple of 8)
  uint p_off, p_dtype;  // P's element offset (a multiple of 8) and DT_* code
  uint groups_x;        // workgroups per row of the grid (a grid wider than 65535 folds into y)
} pc;

void main() {
  Q_PREPARE();
  const uint per_row = pc.cols / 8u;
  const uint g = (gl_WorkGroupID.y * pc.groups_x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x;
  if (g >= pc.rows * per_row) return;
  const uint r = pc.row0 + g / per_row, c = pc.col0 + (g % per_row) * 8u;
  vec4 lo, hi;
  dequant8(pc.w_off + r * pc.w_rb + (c / QK) * QB, (c % QK) >> 3, lo, hi);
  P_st8(pc.p_dtype, pc.p_off + g * 8u, lo, hi);
}
