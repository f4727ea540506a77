#version 450
// Portable tiled product with a block-quantized weight (qmatmul_common.glsl): runs on every Vulkan device (lavapipe
// included) and takes any row count where the gemv and tensor-core kernels do not. Each K step decodes a BK x BN
// tile of W into shared memory as f32 (one 8-element group per invocation, through the format's dequant8), so no
// dequantized copy of W exists outside the workgroup. 64x64 tiles, K step 32, 256 invocations each owning 4x4
// outputs; shared memory is double-buffered and the next step's X values and W groups are loaded into registers
// while this one is multiplied (one barrier per step), as in matmul/matmul.comp.
#extension GL_EXT_control_flow_attributes : enable
#include "common/common.glsl"

layout(local_size_x = 256) in;
TENSOR(0, X)
layout(std430, set = 0, binding = 1) readonly buffer QBuf { uint qw[]; };
TENSOR(2, C)
TENSOR(3, D)
#include "quant/qmatmul_common.glsl"

const uint BM = 64u, BN = 64u, BK = 32u;
shared vec4 As[2u * BK * BM / 4u];  // As[buf][k][m]
shared vec4 Bs[2u * BK * BN / 4u];  // Bs[buf][k][n]

float ra[8];  // X (m0 + tid / 4, k0 + (tid % 4) * 8 + j)
vec4 rlo, rhi;  // the thread's W group: 8 values along k (NT) or along n

void global_load(uint m0, uint n0, uint k0, uint tid) {
  const uint m = m0 + tid / 4u, k = k0 + (tid % 4u) * 8u, xdt = x_dtype();
  [[unroll]] for (uint j = 0u; j < 8u; ++j)
    ra[j] = m < pc.M && k + j < pc.K ? X_ld(xdt, pc.x_off + m * pc.x_rs + k + j) : 0.0;
  rlo = vec4(0.0);
  rhi = vec4(0.0);
  if ((pc.flags & QFLAG_NT) != 0u) {
    const uint n = n0 + tid / 4u;  // K is a multiple of the block size, so k .. k + 7 are inside W's row
    if (n < pc.N && k < pc.K) w_group(n, k, rlo, rhi);
  } else {
    const uint kr = k0 + tid / 8u, n = n0 + (tid % 8u) * 8u;  // N is a multiple of the block size
    if (kr < pc.K && n < pc.N) w_group(kr, n, rlo, rhi);
  }
}

void shared_store(uint buf, uint tid) {
  const uint m = tid / 4u, k = (tid % 4u) * 8u;
  [[unroll]] for (uint j = 0u; j < 8u; ++j) As[(buf * BK + k + j) * (BM / 4u) + m / 4u][m % 4u] = ra[j];
  if ((pc.flags & QFLAG_NT) != 0u) {
    const uint n = tid / 4u;
    [[unroll]] for (uint j = 0u; j < 8u; ++j)
      Bs[(buf * BK + k + j) * (BN / 4u) + n / 4u][n % 4u] = j < 4u ? rlo[j] : rhi[j - 4u];
  } else {
    const uint kr = tid / 8u, n = (tid % 8u) * 8u;
    Bs[(buf * BK + kr) * (BN / 4u) + n / 4u] = rlo;
    Bs[(buf * BK + kr) * (BN / 4u) + n / 4u + 1u] = rhi;
  }
}

void main() {
  Q_PREPARE();
  const uint tid = gl_LocalInvocationID.x, tx = tid % 16u, ty = tid / 16u;
  const uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  vec4 acc[4];
  [[unroll]] for (uint r = 0u; r < 4u; ++r) acc[r] = vec4(0.0);
  const uint ntiles = (pc.K + BK - 1u) / BK;
  global_load(m0, n0, 0u, tid);
  shared_store(0u, tid);
  barrier();
  for (uint t = 0u; t < ntiles; ++t) {
    const uint cur = t & 1u;
    if (t + 1u < ntiles) global_load(m0, n0, (t + 1u) * BK, tid);
    [[unroll]] for (uint k = 0u; k < BK; ++k) {
      const vec4 a = As[(cur * BK + k) * (BM / 4u) + ty], b = Bs[(cur * BK + k) * (BN / 4u) + tx];
      [[unroll]] for (uint r = 0u; r < 4u; ++r) acc[r] += a[r] * b;
    }
    if (t + 1u < ntiles) shared_store(cur ^ 1u, tid);
    barrier();
  }
  [[unroll]] for (uint r = 0u; r < 4u; ++r) {
    const uint m = m0 + ty * 4u + r;
    if (m >= pc.M) continue;
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      const uint n = n0 + tx * 4u + c;
      if (n < pc.N) store_result(m, n, acc[r][c]);
    }
  }
}
