// dtype names and IEEE half conversions.
#include "core/dtype.h"

#include "core/error.h"

namespace lmtune {

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "F32") return DType::f32;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "F16") return DType::f16;
  if (n == "bf16" || n == "bfloat16" || n == "BF16") return DType::bf16;
  if (n == "i32" || n == "int32" || n == "I32") return DType::i32;
  throw ConfigError("unknown dtype '" + std::string(n) + "' (expected f32, f16, bf16 or i32)");
}

uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (after rounding) -> inf
  if (absx < 0x38800000u) {                                  // subnormal or zero in f16
    if (absx < 0x33000000u) return uint16_t(sign);           // rounds to zero
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(absx >> 23);                       // bits to drop: value = mant * 2^(e-150), unit 2^-24
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return uint16_t(sign | half);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t h = r >> 13;
  uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return uint16_t(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = float(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace lmtune
