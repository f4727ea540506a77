#version 450
// The fused gated MLP activation (core/ops/elementwise.h: GatedActivation / GatedActivationBackward) over dense
// tensors in a grid-stride loop, f32 math (activations from unary_ops.glsl, so the values match the unary kernels
// and backend/cpu/elementwise.cpp). With p.vec (every offset a multiple of 4) an invocation takes 4 elements at a
// time (TENSOR4 loads and stores) and the last n % 4 elements go one by one.
//   forward:            gate, up -> y = act(gate) * up
//   -DBACKWARD: gate, up, g -> d_gate = g * up * act'(gate), d_up = g * act(gate)
#include "common/common.glsl"
#include "elementwise/unary_ops.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, T0)
TENSOR4(0, T0)
TENSOR(1, T1)
TENSOR4(1, T1)
TENSOR(2, T2)
TENSOR4(2, T2)
#ifdef BACKWARD
TENSOR(3, T3)
TENSOR4(3, T3)
TENSOR(4, T4)
TENSOR4(4, T4)
#endif

layout(push_constant) uniform Push {
  uint n;           // elements
  uint offsets[5];  // element offset of each tensor in its buffer
  uint dtypes;      // 4 bits per tensor
  uint op;          // UnaryOp code of the activation: 8 silu, 9 gelu_tanh, 10 gelu_erf
  uint vec;
} p;

vec4 act4(vec4 x) {
  return vec4(unary_op(p.op, x.x, 0.0), unary_op(p.op, x.y, 0.0), unary_op(p.op, x.z, 0.0), unary_op(p.op, x.w, 0.0));
}
#ifdef BACKWARD
vec4 dact4(vec4 x) {
  return vec4(gate_derivative(p.op, x.x), gate_derivative(p.op, x.y), gate_derivative(p.op, x.z),
              gate_derivative(p.op, x.w));
}
#endif

uint dtype_of(uint t) { return (p.dtypes >> (4u * t)) & 15u; }

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  uint start = 0u;
#ifdef WIDE
  // gated_activation_wide (forward; a pipeline of its own): every tensor 16-bit at an offset that is a multiple of
  // 8, 8 elements per step with 16-byte accesses. The backward kept 4 (8 ran 25% slower on the H100).
  const uint n8 = p.n / 8u;
  for (uint j = gl_GlobalInvocationID.x; j < n8; j += stride) {
    const uint i = 8u * j;
    vec4 x0, x1, u0, u1;
    T0_ld8(dtype_of(0u), p.offsets[0] + i, x0, x1);
    T1_ld8(dtype_of(1u), p.offsets[1] + i, u0, u1);
    T2_st8(dtype_of(2u), p.offsets[2] + i, act4(x0) * u0, act4(x1) * u1);
  }
  start = 8u * n8;
#else
  if (p.vec != 0u) {
    const uint n4 = p.n / 4u;
    for (uint j = gl_GlobalInvocationID.x; j < n4; j += stride) {
      const uint i = 4u * j;
      vec4 x = T0_ld4(dtype_of(0u), p.offsets[0] + i);
      vec4 u = T1_ld4(dtype_of(1u), p.offsets[1] + i);
#ifdef BACKWARD
      vec4 g = T2_ld4(dtype_of(2u), p.offsets[2] + i);
      T3_st4(dtype_of(3u), p.offsets[3] + i, g * u * dact4(x));
      T4_st4(dtype_of(4u), p.offsets[4] + i, g * act4(x));
#else
      T2_st4(dtype_of(2u), p.offsets[2] + i, act4(x) * u);
#endif
    }
    start = 4u * n4;
  }
#endif
  for (uint i = start + gl_GlobalInvocationID.x; i < p.n; i += stride) {
    float x = T0_ld(dtype_of(0u), p.offsets[0] + i);
    float u = T1_ld(dtype_of(1u), p.offsets[1] + i);
#ifdef BACKWARD
    float g = T2_ld(dtype_of(2u), p.offsets[2] + i);
    T3_st(dtype_of(3u), p.offsets[3] + i, g * u * gate_derivative(p.op, x));
    T4_st(dtype_of(4u), p.offsets[4] + i, g * unary_op(p.op, x, 0.0));
#else
    T2_st(dtype_of(2u), p.offsets[2] + i, unary_op(p.op, x, 0.0) * u);
#endif
  }
}
