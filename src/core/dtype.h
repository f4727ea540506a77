// Element types and the f16/bf16 <-> f32 conversions the CPU side uses (round-to-nearest-even).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lmtune {

enum class DType : uint8_t { f32, f16, bf16, i32 };

constexpr size_t dtype_size(DType t) { return t == DType::f16 || t == DType::bf16 ? 2 : 4; }
constexpr bool is_float(DType t) { return t != DType::i32; }
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}
DType parse_dtype(std::string_view name);  // "f32"|"float32"|"fp32"|..., throws ConfigError

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace lmtune
