#version 450
// The fused gated MLP activation (core/ops/elementwise.h: GatedActivation / GatedActivationBackward) over dense
// tensors, one element per invocation in a grid-stride loop, f32 math (activations from unary_ops.glsl, so the
// values match the unary kernels and backend/cpu/elementwise.cpp).
//   forward:            gate, up -> y = act(gate) * up
//   -DBACKWARD: gate, up, g -> d_gate = g * up * act'(gate), d_up = g * act(gate)
#include "common.glsl"
#include "unary_ops.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, T0)
TENSOR(1, T1)
TENSOR(2, T2)
#ifdef BACKWARD
TENSOR(3, T3)
TENSOR(4, T4)
#endif

layout(push_constant) uniform Push {
  uint n;           // elements
  uint offsets[5];  // element offset of each tensor in its buffer
  uint dtypes;      // 4 bits per tensor
  uint op;          // UnaryOp code of the activation: 8 silu, 9 gelu_tanh, 10 gelu_erf
} p;

uint dtype_of(uint t) { return (p.dtypes >> (4u * t)) & 15u; }

void main() {
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
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
