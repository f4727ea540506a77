#version 450
// In-place optimizer updates over one parameter tensor (f32) with f32 moments and a gradient of any float
// dtype; hyper-parameters are read from a device buffer (layout: core/ops/optimizer.h) so recorded steps can be
// replayed. KIND 0: AdamW (torch.optim.AdamW), KIND 1: SGD with optional momentum. Matches
// backend/cpu/optimizer.cpp.
#include "common/common.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, P)
TENSOR(1, M)
TENSOR(2, V)
TENSOR(3, G)
TENSOR(4, H)

layout(push_constant) uniform Push {
  uint n;
  uint p_off, m_off, v_off, g_off, h_off;
  uint g_dtype;
  uint has_momentum;  // SGD: M holds the momentum buffer
} pc;

void main() {
  float lr = LD_F32(H, pc.h_off + 0u), b1 = LD_F32(H, pc.h_off + 1u), b2 = LD_F32(H, pc.h_off + 2u);
  float eps = LD_F32(H, pc.h_off + 3u), wd = LD_F32(H, pc.h_off + 4u);
  float bc1 = LD_F32(H, pc.h_off + 5u), bc2 = LD_F32(H, pc.h_off + 6u), gs = LD_F32(H, pc.h_off + 7u);
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
    float g = G_ld(pc.g_dtype, pc.g_off + i) * gs;
    float p = LD_F32(P, pc.p_off + i);
    p -= lr * wd * p;
#if KIND == 0
    float m = b1 * LD_F32(M, pc.m_off + i) + (1.0 - b1) * g;
    float v = b2 * LD_F32(V, pc.v_off + i) + (1.0 - b2) * g * g;
    ST_F32(M, pc.m_off + i, m);
    ST_F32(V, pc.v_off + i, v);
    p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps);
#else
    if (pc.has_momentum != 0u) {
      g = b1 * LD_F32(M, pc.m_off + i) + g;
      ST_F32(M, pc.m_off + i, g);
    }
    p -= lr * g;
#endif
    ST_F32(P, pc.p_off + i, p);
  }
}
