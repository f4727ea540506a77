#version 450
// Elementwise kernels over up to 4 strided tensors (the last one is the output), one element per invocation in a
// grid-stride loop. Built per KIND: unary (x -> y), binary (a, b -> y), where (c, a, b -> y), copy (x -> y, casting).
// Broadcast inputs have stride 0. Semantics match backend/cpu/elementwise.cpp and copy.cpp (compute in f32).
#include "common/common.glsl"
#include "elementwise/unary_ops.glsl"

layout(local_size_x_id = 0) in;

#define KIND_UNARY 0
#define KIND_BINARY 1
#define KIND_WHERE 2
#define KIND_COPY 3

#if KIND == KIND_UNARY || KIND == KIND_COPY
#define NT 2
#elif KIND == KIND_BINARY
#define NT 3
#else
#define NT 4
#endif

TENSOR(0, T0)
TENSOR4(0, T0)
TENSOR(1, T1)
TENSOR4(1, T1)
#if NT >= 3
TENSOR(2, T2)
TENSOR4(2, T2)
#endif
#if NT >= 4
TENSOR(3, T3)
TENSOR4(3, T3)
#endif

layout(push_constant) uniform Push {
  uint n;           // elements
  uint shape[4];    // iteration space, outermost first (padded with 1s)
  uint strides[16]; // strides[4 * t + d] of tensor t
  uint offsets[4];
  uint dtypes;      // 4 bits per tensor
  uint op;
  float param;
  uint contiguous;  // 1: every tensor is dense in iteration order (offset + i); 2: also every offset is a
                    // multiple of 4 elements: the vector path (4 elements per item, UNROLL items per invocation)
} p;

uint dtype_of(uint t) { return (p.dtypes >> (4u * t)) & 15u; }

uint offset_of(uint t, uint c0, uint c1, uint c2, uint c3) {
  return p.offsets[t] + c0 * p.strides[4u * t] + c1 * p.strides[4u * t + 1u] + c2 * p.strides[4u * t + 2u] +
         c3 * p.strides[4u * t + 3u];
}

float binary_op(uint op, float a, float b) {
  switch (op) {
    case 0u: return a + b;
    case 1u: return a - b;
    case 2u: return a * b;
    case 3u: return a / b;
    case 4u: return a >= b ? a : b;
    case 5u: return a >= b ? 1.0 : 0.0;
  }
  return a;
}

// One element at offsets o[] (the tail of the vector path and the strided path).
void element(uint o[NT]) {
#if KIND == KIND_UNARY
  T1_st(dtype_of(1u), o[1], unary_op(p.op, T0_ld(dtype_of(0u), o[0]), p.param));
#elif KIND == KIND_COPY
  uint dx = dtype_of(0u), dy = dtype_of(1u);
  if (dx == dy) T1_setbits(dy, o[1], T0_bits(dx, o[0]));  // bit-exact (i32 above 2^24, NaN payloads)
  else T1_st(dy, o[1], T0_ld(dx, o[0]));
#elif KIND == KIND_BINARY
  T2_st(dtype_of(2u), o[2], binary_op(p.op, T0_ld(dtype_of(0u), o[0]), T1_ld(dtype_of(1u), o[1])));
#else
  float c = T0_ld(dtype_of(0u), o[0]);
  float v = c != 0.0 ? T1_ld(dtype_of(1u), o[1]) : T2_ld(dtype_of(2u), o[2]);
  T3_st(dtype_of(3u), o[3], v);
#endif
}

// Vector path: dense tensors, offsets multiple of 4. Item q covers elements 4q .. 4q+3; each invocation loads
// UNROLL items (16-byte loads for 32-bit types) before it stores any, in a grid-stride loop.
#define UNROLL 4
void vector_path() {
  uint n4 = p.n >> 2, wg = gl_WorkGroupSize.x, tid = gl_LocalInvocationID.x;
  uint chunk = wg * UNROLL;
  for (uint base = gl_WorkGroupID.x * chunk; base < n4; base += gl_NumWorkGroups.x * chunk) {
    uvec4 v0[UNROLL];
#if NT >= 3
    uvec4 v1[UNROLL];
#endif
#if NT >= 4
    uvec4 v2[UNROLL];
#endif
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
      uint q = base + u * wg + tid;
      if (q < n4) {
        v0[u] = T0_bits4(dtype_of(0u), p.offsets[0] + 4u * q);
#if NT >= 3
        v1[u] = T1_bits4(dtype_of(1u), p.offsets[1] + 4u * q);
#endif
#if NT >= 4
        v2[u] = T2_bits4(dtype_of(2u), p.offsets[2] + 4u * q);
#endif
      }
    }
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
      uint q = base + u * wg + tid;
      if (q >= n4) continue;
#if KIND == KIND_UNARY
      vec4 x = decode4(dtype_of(0u), v0[u]);
      T1_st4(dtype_of(1u), p.offsets[1] + 4u * q,
             vec4(unary_op(p.op, x.x, p.param), unary_op(p.op, x.y, p.param), unary_op(p.op, x.z, p.param),
                  unary_op(p.op, x.w, p.param)));
#elif KIND == KIND_COPY
      uint dx = dtype_of(0u), dy = dtype_of(1u);
      if (dx == dy) T1_setbits4(dy, p.offsets[1] + 4u * q, v0[u]);
      else T1_st4(dy, p.offsets[1] + 4u * q, decode4(dx, v0[u]));
#elif KIND == KIND_BINARY
      vec4 a = decode4(dtype_of(0u), v0[u]), b = decode4(dtype_of(1u), v1[u]);
      vec4 r;
      if (p.op == 0u) r = a + b;
      else if (p.op == 2u) r = a * b;
      else r = vec4(binary_op(p.op, a.x, b.x), binary_op(p.op, a.y, b.y), binary_op(p.op, a.z, b.z),
                    binary_op(p.op, a.w, b.w));
      T2_st4(dtype_of(2u), p.offsets[2] + 4u * q, r);
#else
      vec4 c = decode4(dtype_of(0u), v0[u]), a = decode4(dtype_of(1u), v1[u]), b = decode4(dtype_of(2u), v2[u]);
      T3_st4(dtype_of(3u), p.offsets[3] + 4u * q,
             vec4(c.x != 0.0 ? a.x : b.x, c.y != 0.0 ? a.y : b.y, c.z != 0.0 ? a.z : b.z, c.w != 0.0 ? a.w : b.w));
#endif
    }
  }
  // The last n % 4 elements.
  uint i = (n4 << 2) + gl_GlobalInvocationID.x;
  if (i < p.n) {
    uint o[NT];
    for (uint t = 0u; t < NT; ++t) o[t] = p.offsets[t] + i;
    element(o);
  }
}

#ifdef WIDE
// Wide vector path (the *_wide builds, a pipeline of their own so that its registers do not weigh on the other
// paths): as vector_path with items of 8 elements (one 16-byte load per 16-bit operand, two per 32-bit one). The
// host takes it when the tensors are dense, some operand is 16-bit and every offset is a multiple of 8 (H100:
// bf16 add 2.8 TB/s instead of 2.0). It keeps the raw words in its own registers (LOAD8, lo4 / hi4) rather than going
// through common.glsl's name_ld8: written with those helpers, bf16 add ran at 2.56 TB/s.
uvec4 lo4(uint dt, uvec4 a, uvec4 b) { return is16(dt) ? uvec4(a.x & 0xffffu, a.x >> 16, a.y & 0xffffu, a.y >> 16) : a; }
uvec4 hi4(uint dt, uvec4 a, uvec4 b) { return is16(dt) ? uvec4(a.z & 0xffffu, a.z >> 16, a.w & 0xffffu, a.w >> 16) : b; }
#define LOAD8(T, t, i, A, B)                                                      \
  {                                                                               \
    uint dt_ = dtype_of(t);                                                       \
    if (is16(dt_)) { A = T##_q4[(i) >> 3]; }                                      \
    else { A = T##_q4[(i) >> 2]; B = T##_q4[((i) >> 2) + 1u]; }                   \
  }
#if KIND == KIND_UNARY
#error "elementwise.comp: no wide unary build (small unary ops ran slower through it)"
#elif KIND == KIND_COPY
#define TOUT_Q4 T1_q4
#elif KIND == KIND_BINARY
#define TOUT_Q4 T2_q4
#else
#define TOUT_Q4 T3_q4
#endif
// 8 elements as raw bits (16-bit: the low halves of lo and hi).
void store8_bits(uint dt, uint i, uvec4 a, uvec4 b) {
  if (is16(dt)) {
    TOUT_Q4[i >> 3] = uvec4(a.x | (a.y << 16), a.z | (a.w << 16), b.x | (b.y << 16), b.z | (b.w << 16));
  } else {
    TOUT_Q4[i >> 2] = a;
    TOUT_Q4[(i >> 2) + 1u] = b;
  }
}
void store8(uint dt, uint i, vec4 lo, vec4 hi) { store8_bits(dt, i, encode4(dt, lo), encode4(dt, hi)); }
#define WUNROLL 2
void wide_path() {
  uint n8 = p.n >> 3, wg = gl_WorkGroupSize.x, tid = gl_LocalInvocationID.x;
  uint chunk = wg * WUNROLL;
  for (uint base = gl_WorkGroupID.x * chunk; base < n8; base += gl_NumWorkGroups.x * chunk) {
    uvec4 a0[WUNROLL], b0[WUNROLL];
#if NT >= 3
    uvec4 a1[WUNROLL], b1[WUNROLL];
#endif
#if NT >= 4
    uvec4 a2[WUNROLL], b2[WUNROLL];
#endif
    [[unroll]] for (uint u = 0u; u < WUNROLL; ++u) {
      uint q = base + u * wg + tid;
      if (q < n8) {
        LOAD8(T0, 0u, p.offsets[0] + 8u * q, a0[u], b0[u])
#if NT >= 3
        LOAD8(T1, 1u, p.offsets[1] + 8u * q, a1[u], b1[u])
#endif
#if NT >= 4
        LOAD8(T2, 2u, p.offsets[2] + 8u * q, a2[u], b2[u])
#endif
      }
    }
    [[unroll]] for (uint u = 0u; u < WUNROLL; ++u) {
      uint q = base + u * wg + tid;
      if (q >= n8) continue;
      uint d0 = dtype_of(0u);
      vec4 xl = decode4(d0, lo4(d0, a0[u], b0[u])), xh = decode4(d0, hi4(d0, a0[u], b0[u]));
#if KIND == KIND_COPY
      if (d0 == dtype_of(1u)) {  // bit-exact
        if (is16(d0)) TOUT_Q4[(p.offsets[1] + 8u * q) >> 3] = a0[u];
        else store8_bits(d0, p.offsets[1] + 8u * q, a0[u], b0[u]);
      } else {
        store8(dtype_of(1u), p.offsets[1] + 8u * q, xl, xh);
      }
#elif KIND == KIND_BINARY
      uint d1 = dtype_of(1u);
      vec4 yl = decode4(d1, lo4(d1, a1[u], b1[u])), yh = decode4(d1, hi4(d1, a1[u], b1[u]));
      vec4 rl, rh;
      if (p.op == 0u) { rl = xl + yl; rh = xh + yh; }
      else if (p.op == 2u) { rl = xl * yl; rh = xh * yh; }
      else {
        rl = vec4(binary_op(p.op, xl.x, yl.x), binary_op(p.op, xl.y, yl.y), binary_op(p.op, xl.z, yl.z),
                  binary_op(p.op, xl.w, yl.w));
        rh = vec4(binary_op(p.op, xh.x, yh.x), binary_op(p.op, xh.y, yh.y), binary_op(p.op, xh.z, yh.z),
                  binary_op(p.op, xh.w, yh.w));
      }
      store8(dtype_of(2u), p.offsets[2] + 8u * q, rl, rh);
#else
      uint d1 = dtype_of(1u), d2 = dtype_of(2u);
      vec4 yl = decode4(d1, lo4(d1, a1[u], b1[u])), yh = decode4(d1, hi4(d1, a1[u], b1[u]));
      vec4 zl = decode4(d2, lo4(d2, a2[u], b2[u])), zh = decode4(d2, hi4(d2, a2[u], b2[u]));
      store8(dtype_of(3u), p.offsets[3] + 8u * q,
             vec4(xl.x != 0.0 ? yl.x : zl.x, xl.y != 0.0 ? yl.y : zl.y, xl.z != 0.0 ? yl.z : zl.z, xl.w != 0.0 ? yl.w : zl.w),
             vec4(xh.x != 0.0 ? yh.x : zh.x, xh.y != 0.0 ? yh.y : zh.y, xh.z != 0.0 ? yh.z : zh.z, xh.w != 0.0 ? yh.w : zh.w));
#endif
    }
  }
  uint i = (n8 << 3) + gl_GlobalInvocationID.x;
  if (i < p.n) {
    uint o[NT];
    for (uint t = 0u; t < NT; ++t) o[t] = p.offsets[t] + i;
    element(o);
  }
}

#endif

void main() {
#ifdef WIDE
  wide_path();
  return;
#endif
  if (p.contiguous == 2u) {
    vector_path();
    return;
  }
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    uint o[NT];
    if (p.contiguous != 0u) {
      for (uint t = 0u; t < NT; ++t) o[t] = p.offsets[t] + i;
    } else {
      uint r = i;
      uint c3 = r % p.shape[3]; r /= p.shape[3];
      uint c2 = r % p.shape[2]; r /= p.shape[2];
      uint c1 = r % p.shape[1];
      uint c0 = r / p.shape[1];
      for (uint t = 0u; t < NT; ++t) o[t] = offset_of(t, c0, c1, c2, c3);
    }
    element(o);
  }
}
