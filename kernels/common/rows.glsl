// Workgroup-wide sum and max for kernels that process one row per workgroup. Include after declaring
// `layout(local_size_x_id = 0) in;` (the workgroup size must be a power of two). Every invocation of the
// workgroup must call these (they contain barriers) and all receive the result.
#ifndef LMTUNE_ROWS_GLSL
#define LMTUNE_ROWS_GLSL

shared float s_row[gl_WorkGroupSize.x];

float wg_sum(float v) {
  uint tid = gl_LocalInvocationID.x;
  barrier();
  s_row[tid] = v;
  for (uint w = gl_WorkGroupSize.x / 2u; w > 0u; w >>= 1) {
    barrier();
    if (tid < w) s_row[tid] += s_row[tid + w];
  }
  barrier();
  return s_row[0];
}

float wg_max(float v) {
  uint tid = gl_LocalInvocationID.x;
  barrier();
  s_row[tid] = v;
  for (uint w = gl_WorkGroupSize.x / 2u; w > 0u; w >>= 1) {
    barrier();
    if (tid < w) s_row[tid] = max(s_row[tid], s_row[tid + w]);
  }
  barrier();
  return s_row[0];
}

#define NEG_INF uintBitsToFloat(0xff800000u)
#define POS_NAN uintBitsToFloat(0x7fc00000u)

#endif
