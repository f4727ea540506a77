// Shared kernel helpers: element types (codes match lmtune::DType: 0 f32, 1 f16, 2 bf16, 3 i32), conversions that
// round like the CPU backend (round-to-nearest-even for f16/bf16), and TENSOR(binding, name), which declares a
// storage buffer and the functions name_ld(dtype, i) / name_st(dtype, i, v) (as float) and name_bits /
// name_setbits (raw element bits) for element index i. Built with -DPACKED16 for devices without 16-bit storage:
// 16-bit elements are then read from uint32 words and written with two atomics on the word (only our half changes).
#ifndef LMTUNE_COMMON_GLSL
#define LMTUNE_COMMON_GLSL

#extension GL_EXT_control_flow_attributes : enable

#ifndef PACKED16
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#endif

#define DT_F32 0u
#define DT_F16 1u
#define DT_BF16 2u
#define DT_I32 3u

bool is16(uint dt) { return dt == DT_F16 || dt == DT_BF16; }

float f16_to_f32(uint h) { return unpackHalf2x16(h).x; }

// Port of lmtune::f32_to_f16 (core/dtype.cpp): exact round-to-nearest-even, subnormals, overflow to inf.
uint f32_to_f16(float f) {
  uint x = floatBitsToUint(f);
  uint sgn = (x >> 16) & 0x8000u;
  uint absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return sgn | 0x7e00u;
  if (absx >= 0x477ff000u) return sgn | 0x7c00u;
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return sgn;
    uint mant = (absx & 0x7fffffu) | 0x800000u;
    uint shift = 126u - (absx >> 23);  // value = mant * 2^(e - 126) units of 2^-24
    uint h = mant >> shift;
    uint rem = mant & ((1u << shift) - 1u);
    uint mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (h & 1u) != 0u)) h++;
    return sgn | h;
  }
  uint r = absx - 0x38000000u;
  uint h = r >> 13;
  uint rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
  return sgn | h;
}

float bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

uint f32_to_bf16(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

float decode(uint dt, uint bits) {
  if (dt == DT_F32) return uintBitsToFloat(bits);
  if (dt == DT_F16) return f16_to_f32(bits);
  if (dt == DT_BF16) return bf16_to_f32(bits);
  return float(int(bits));
}

uint encode(uint dt, float v) {
  if (dt == DT_F32) return floatBitsToUint(v);
  if (dt == DT_F16) return f32_to_f16(v);
  if (dt == DT_BF16) return f32_to_bf16(v);
  return uint(int(v));
}

#ifdef PACKED16
#define TENSOR(B, T)                                                                             \
  layout(std430, set = 0, binding = B) buffer T##_buf32 { uint T##_w[]; };                       \
  uint T##_bits(uint dt, uint i) {                                                               \
    if (!is16(dt)) return T##_w[i];                                                              \
    uint w = T##_w[i >> 1];                                                                      \
    return (i & 1u) != 0u ? (w >> 16) : (w & 0xffffu);                                           \
  }                                                                                              \
  void T##_setbits(uint dt, uint i, uint v) {                                                    \
    if (!is16(dt)) { T##_w[i] = v; return; }                                                     \
    uint sh = (i & 1u) * 16u;                                                                    \
    atomicAnd(T##_w[i >> 1], ~(0xffffu << sh));                                                  \
    atomicOr(T##_w[i >> 1], (v & 0xffffu) << sh);                                                \
  }                                                                                              \
  float T##_ld(uint dt, uint i) { return decode(dt, T##_bits(dt, i)); }                          \
  void T##_st(uint dt, uint i, float v) { T##_setbits(dt, i, encode(dt, v)); }
#else
#define TENSOR(B, T)                                                                             \
  layout(std430, set = 0, binding = B) buffer T##_buf32 { uint T##_w[]; };                       \
  layout(std430, set = 0, binding = B) buffer T##_buf16 { uint16_t T##_h[]; };                   \
  uint T##_bits(uint dt, uint i) { return is16(dt) ? uint(T##_h[i]) : T##_w[i]; }                \
  void T##_setbits(uint dt, uint i, uint v) {                                                    \
    if (is16(dt)) T##_h[i] = uint16_t(v); else T##_w[i] = v;                                     \
  }                                                                                              \
  float T##_ld(uint dt, uint i) { return decode(dt, T##_bits(dt, i)); }                          \
  void T##_st(uint dt, uint i, float v) { T##_setbits(dt, i, encode(dt, v)); }
#endif

// TENSOR4(binding, name), after TENSOR(binding, name): 4 consecutive elements at once, for dense fast paths.
// Element index i must be a multiple of 4 (16-byte loads of 32-bit types, 8-byte loads of 16-bit ones; the same
// in the PACKED16 variants, which then need no atomics as whole words are written).
//   name_bits4(dt, i) -> uvec4 raw element bits; name_setbits4(dt, i, uvec4 bits);
//   name_ld4(dt, i) -> vec4; name_st4(dt, i, vec4) (conversions as name_ld / name_st).
//   name_ld8(dt, i, lo, hi) / name_st8(dt, i, lo, hi): 8 elements, i a multiple of 8 (one 16-byte access for
//   16-bit types, the fast case on the H100: 8-byte accesses reached 2.0 TB/s of its 3).
#define TENSOR4(B, T)                                                                            \
  layout(std430, set = 0, binding = B) buffer T##_buf128 { uvec4 T##_q4[]; };                    \
  layout(std430, set = 0, binding = B) buffer T##_buf64 { uvec2 T##_q2[]; };                     \
  uvec4 T##_bits4(uint dt, uint i) {                                                             \
    if (!is16(dt)) return T##_q4[i >> 2];                                                        \
    uvec2 w = T##_q2[i >> 2];                                                                    \
    return uvec4(w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16);                            \
  }                                                                                              \
  void T##_setbits4(uint dt, uint i, uvec4 v) {                                                  \
    if (is16(dt)) T##_q2[i >> 2] = uvec2((v.x & 0xffffu) | (v.y << 16), (v.z & 0xffffu) | (v.w << 16)); \
    else T##_q4[i >> 2] = v;                                                                     \
  }                                                                                              \
  vec4 T##_ld4(uint dt, uint i) { return decode4(dt, T##_bits4(dt, i)); }                        \
  void T##_st4(uint dt, uint i, vec4 v) { T##_setbits4(dt, i, encode4(dt, v)); }                 \
  void T##_ld8(uint dt, uint i, out vec4 lo, out vec4 hi) {                                      \
    if (!is16(dt)) { lo = T##_ld4(dt, i); hi = T##_ld4(dt, i + 4u); return; }                    \
    uvec4 w = T##_q4[i >> 3];                                                                    \
    lo = decode4(dt, uvec4(w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16));                 \
    hi = decode4(dt, uvec4(w.z & 0xffffu, w.z >> 16, w.w & 0xffffu, w.w >> 16));                 \
  }                                                                                              \
  void T##_st8(uint dt, uint i, vec4 lo, vec4 hi) {                                              \
    if (!is16(dt)) { T##_st4(dt, i, lo); T##_st4(dt, i + 4u, hi); return; }                      \
    uvec4 a = encode4(dt, lo), b = encode4(dt, hi);                                              \
    T##_q4[i >> 3] = uvec4(a.x | (a.y << 16), a.z | (a.w << 16), b.x | (b.y << 16), b.z | (b.w << 16)); \
  }

vec4 decode4(uint dt, uvec4 b) {
  if (dt == DT_F32) return uintBitsToFloat(b);
  if (dt == DT_BF16) return uintBitsToFloat(b << 16);
  return vec4(decode(dt, b.x), decode(dt, b.y), decode(dt, b.z), decode(dt, b.w));
}
uvec4 encode4(uint dt, vec4 v) {
  if (dt == DT_F32) return floatBitsToUint(v);
  return uvec4(encode(dt, v.x), encode(dt, v.y), encode(dt, v.z), encode(dt, v.w));
}

// f32-only access (indices, statistics): name_w[i] through the uint view.
#define LD_F32(T, i) uintBitsToFloat(T##_w[i])
#define ST_F32(T, i, v) T##_w[i] = floatBitsToUint(v)
#define LD_I32(T, i) int(T##_w[i])

#endif
