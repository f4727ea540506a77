// The block formats of quant.h on the host. Dequantization follows ggml's reference code (ggml-quants.c) for the
// GGUF types and bitsandbytes' NF4 levels; quantization is a direct least-error rounding per block (ggml's
// iterative scale search is not reproduced: files stay valid, errors are somewhat larger for the k-quants).
#include "core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace lmtune::quant {
namespace {

constexpr FormatInfo kInfos[] = {
    {"q8_0", 32, 34, 8}, {"q4_0", 32, 18, 2}, {"q4_k", 256, 144, 12},
    {"q5_k", 256, 176, 13}, {"q6_k", 256, 210, 14}, {"nf4", 256, 136, -1},
};

uint16_t load_u16(const std::byte* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
float load_f16(const std::byte* p) { return f16_to_f32(load_u16(p)); }
void store_f16(std::byte* p, float v) { uint16_t h = f32_to_f16(v); std::memcpy(p, &h, 2); }
const uint8_t* bytes(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }
uint8_t* bytes(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }
int nearest_int(float v) { return int(std::lrintf(v)); }  // ties to even, as ggml's nearest_int (k-quants)

// ---- q8_0, q4_0 ----

void quantize_q8_0(const float* x, std::byte* out) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
  store_f16(out, d);
  auto* q = reinterpret_cast<int8_t*>(out + 2);
  // roundf (ties away from zero) as ggml's quantize_row_q8_0_ref, so files match llama.cpp's bit for bit.
  for (int j = 0; j < 32; ++j) q[j] = int8_t(std::clamp(int(std::roundf(x[j] * id)), -127, 127));
}
void dequantize_q8_0(const std::byte* in, float* y) {
  const float d = load_f16(in);
  const auto* q = reinterpret_cast<const int8_t*>(in + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * float(q[j]);
}

// As ggml: the value of largest magnitude maps to -8, so the full 16 levels are used on one side.
void quantize_q4_0(const float* x, std::byte* out) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
  const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(out, d);
  uint8_t* qs = bytes(out + 2);
  // ggml's rounding: truncating x / d + 8.5 toward zero.
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
    qs[j] = uint8_t(lo | (hi << 4));
  }
}
void dequantize_q4_0(const std::byte* in, float* y) {
  const float d = load_f16(in);
  const uint8_t* qs = bytes(in + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float((qs[j] & 15) - 8);
    y[j + 16] = d * float((qs[j] >> 4) - 8);
  }
}

// ---- k-quant 6-bit scales (q4_k, q5_k): 8 scales and 8 mins packed in 12 bytes, as ggml's get_scale_min_k4 ----

void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
void pack_scale_min_k4(const int* sc, const int* m, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = uint8_t(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = uint8_t(m[j] | ((m[j + 4] >> 4) << 6));
    q[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Shared by q4_k (levels 0..15) and q5_k (0..31): per 32-element sub-block y = d·sc·q − dmin·m with 6-bit sc, m.
// Writes d, dmin and the packed scales; q receives the level of each of the 256 elements.
void quantize_k_scales(const float* x, int nmax, std::byte* out, uint8_t* q) {
  float scale[8], min[8];
  for (int s = 0; s < 8; ++s) {
    float lo = 0, hi = 0;  // the range always holds 0, as ggml's
    for (int j = 0; j < 32; ++j) { lo = std::min(lo, x[32 * s + j]); hi = std::max(hi, x[32 * s + j]); }
    scale[s] = (hi - lo) / float(nmax);
    min[s] = -lo;
  }
  const float max_scale = *std::max_element(scale, scale + 8), max_min = *std::max_element(min, min + 8);
  const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0 ? std::clamp(nearest_int(scale[s] / d), 0, 63) : 0;
    m[s] = dmin > 0 ? std::clamp(nearest_int(min[s] / dmin), 0, 63) : 0;
  }
  store_f16(out, d);
  store_f16(out + 2, dmin);
  pack_scale_min_k4(sc, m, bytes(out + 4));
  // Levels against the scales as stored (f16-rounded), so the rounding is judged by what dequantization sees.
  const float df = load_f16(out), dminf = load_f16(out + 2);
  for (int s = 0; s < 8; ++s) {
    const float step = df * float(sc[s]), offset = dminf * float(m[s]);
    for (int j = 0; j < 32; ++j) {
      const int level = step > 0 ? nearest_int((x[32 * s + j] + offset) / step) : 0;
      q[32 * s + j] = uint8_t(std::clamp(level, 0, nmax));
    }
  }
}

void quantize_q4_k(const float* x, std::byte* out) {
  uint8_t q[256];
  quantize_k_scales(x, 15, out, q);
  uint8_t* qs = bytes(out + 16);
  for (int c = 0; c < 4; ++c)  // 64-element chunks: low nibbles the first 32, high nibbles the next 32
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = uint8_t(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}
void dequantize_q4_k(const std::byte* in, float* y) {
  const float d = load_f16(in), dmin = load_f16(in + 2);
  const uint8_t* scales = bytes(in + 4);
  const uint8_t* qs = bytes(in + 16);
  for (int c = 0; c < 4; ++c) {
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * c, scales, sc1, m1);
    scale_min_k4(2 * c + 1, scales, sc2, m2);
    for (int l = 0; l < 32; ++l) y[64 * c + l] = d * float(sc1) * float(qs[32 * c + l] & 15) - dmin * float(m1);
    for (int l = 0; l < 32; ++l) y[64 * c + 32 + l] = d * float(sc2) * float(qs[32 * c + l] >> 4) - dmin * float(m2);
  }
}

void quantize_q5_k(const float* x, std::byte* out) {
  uint8_t q[256];
  quantize_k_scales(x, 31, out, q);
  uint8_t* qh = bytes(out + 16);
  uint8_t* qs = bytes(out + 48);
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      qs[32 * c + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
      qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}
void dequantize_q5_k(const std::byte* in, float* y) {
  const float d = load_f16(in), dmin = load_f16(in + 2);
  const uint8_t* scales = bytes(in + 4);
  const uint8_t* qh = bytes(in + 16);
  const uint8_t* qs = bytes(in + 48);
  for (int c = 0; c < 4; ++c) {
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * c, scales, sc1, m1);
    scale_min_k4(2 * c + 1, scales, sc2, m2);
    const uint8_t u1 = uint8_t(1u << (2 * c)), u2 = uint8_t(2u << (2 * c));
    for (int l = 0; l < 32; ++l)
      y[64 * c + l] = d * float(sc1) * float((qs[32 * c + l] & 15) + (qh[l] & u1 ? 16 : 0)) - dmin * float(m1);
    for (int l = 0; l < 32; ++l)
      y[64 * c + 32 + l] = d * float(sc2) * float((qs[32 * c + l] >> 4) + (qh[l] & u2 ? 16 : 0)) - dmin * float(m2);
  }
}

// ---- q6_k: 16 sub-blocks of 16 with int8 scales against one f16 d; levels -32..31 ----

// Where element e (0..255) of a q6_k block keeps its low 4 bits (ql byte, shift) and high 2 bits (qh byte, shift),
// as ggml's dequantize_row_q6_K walks them: two halves of 128, each four runs of 32.
void q6_k_position(int e, int& ql_byte, int& ql_shift, int& qh_byte, int& qh_shift) {
  const int half = e / 128, r = e % 128, run = r / 32, l = r % 32;
  ql_byte = 64 * half + l + (run & 1 ? 32 : 0);
  ql_shift = run >= 2 ? 4 : 0;
  qh_byte = 32 * half + l;
  qh_shift = 2 * run;
}

void quantize_q6_k(const float* x, std::byte* out) {
  float scale[16];
  for (int s = 0; s < 16; ++s) {
    float amax = 0, max = 0;
    for (int j = 0; j < 16; ++j)
      if (std::fabs(x[16 * s + j]) > amax) { amax = std::fabs(x[16 * s + j]); max = x[16 * s + j]; }
    scale[s] = max / -32.0f;  // the largest magnitude maps to -32, as ggml's make_qx_quants starts from
  }
  float amax_scale = 0;
  for (float s : scale) amax_scale = std::max(amax_scale, std::fabs(s));
  const float d = amax_scale / 127.0f;
  store_f16(out + 208, d);
  const float df = load_f16(out + 208);
  auto* sc = reinterpret_cast<int8_t*>(out + 192);
  uint8_t* ql = bytes(out);
  uint8_t* qh = bytes(out + 128);
  std::memset(ql, 0, 128);
  std::memset(qh, 0, 64);
  for (int s = 0; s < 16; ++s) sc[s] = int8_t(d > 0 ? std::clamp(nearest_int(scale[s] / d), -127, 127) : 0);
  for (int e = 0; e < 256; ++e) {
    const float step = df * float(sc[e / 16]);
    const int level = std::clamp(step != 0 ? nearest_int(x[e] / step) : 0, -32, 31) + 32;
    int qlb, qls, qhb, qhs;
    q6_k_position(e, qlb, qls, qhb, qhs);
    ql[qlb] |= uint8_t((level & 15) << qls);
    qh[qhb] |= uint8_t((level >> 4) << qhs);
  }
}
void dequantize_q6_k(const std::byte* in, float* y) {
  const uint8_t* ql = bytes(in);
  const uint8_t* qh = bytes(in + 128);
  const auto* sc = reinterpret_cast<const int8_t*>(in + 192);
  const float d = load_f16(in + 208);
  for (int e = 0; e < 256; ++e) {
    int qlb, qls, qhb, qhs;
    q6_k_position(e, qlb, qls, qhb, qhs);
    const int level = int(((ql[qlb] >> qls) & 15) | (((qh[qhb] >> qhs) & 3) << 4)) - 32;
    y[e] = d * float(sc[e / 16]) * float(level);
  }
}

// ---- nf4 ----

// The nearest level, as the number of midpoints between neighbouring levels below v. (An argmin loop over the
// distances is miscompiled by GCC 12's loop vectorizer at -O3: values near 0 came out as level 1.)
int nearest_nf4(float v) {
  int index = 0;
  for (int i = 0; i < 15; ++i) index += v > 0.5f * (kNf4Levels[i] + kNf4Levels[i + 1]) ? 1 : 0;
  return index;
}

void quantize_nf4(const float* x, std::byte* out) {
  float absmax[4];
  for (int b = 0; b < 4; ++b) {
    absmax[b] = 0;
    for (int j = 0; j < 64; ++j) absmax[b] = std::max(absmax[b], std::fabs(x[64 * b + j]));
  }
  const float d = *std::max_element(absmax, absmax + 4) / 255.0f;
  std::memcpy(out, &d, 4);
  uint8_t* scale = bytes(out + 4);
  uint8_t* qs = bytes(out + 8);
  for (int b = 0; b < 4; ++b) {
    // Rounded up so |x| / absmax stays within the levels' [-1, 1].
    scale[b] = uint8_t(d > 0 ? std::clamp(int(std::ceil(absmax[b] / d)), 0, 255) : 0);
    const float block_max = d * float(scale[b]), inv = block_max > 0 ? 1.0f / block_max : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const int lo = nearest_nf4(x[64 * b + j] * inv), hi = nearest_nf4(x[64 * b + 32 + j] * inv);
      qs[32 * b + j] = uint8_t(lo | (hi << 4));
    }
  }
}
void dequantize_nf4(const std::byte* in, float* y) {
  float d;
  std::memcpy(&d, in, 4);
  const uint8_t* scale = bytes(in + 4);
  const uint8_t* qs = bytes(in + 8);
  for (int b = 0; b < 4; ++b) {
    const float block_max = d * float(scale[b]);
    for (int j = 0; j < 32; ++j) {
      y[64 * b + j] = block_max * kNf4Levels[qs[32 * b + j] & 15];
      y[64 * b + 32 + j] = block_max * kNf4Levels[qs[32 * b + j] >> 4];
    }
  }
}

using BlockFn = void (*)(const float*, std::byte*);
using UnblockFn = void (*)(const std::byte*, float*);
constexpr BlockFn kQuantize[] = {quantize_q8_0, quantize_q4_0, quantize_q4_k, quantize_q5_k, quantize_q6_k,
                                 quantize_nf4};
constexpr UnblockFn kDequantize[] = {dequantize_q8_0, dequantize_q4_0, dequantize_q4_k, dequantize_q5_k,
                                     dequantize_q6_k, dequantize_nf4};

}  // namespace

// bitsandbytes' NF4 code (functional.py, create_normal_map with offset 0.9677083).
const std::array<float, 16> kNf4Levels = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

const FormatInfo& info(Format format) { return kInfos[size_t(format)]; }

std::optional<Format> parse_format(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (size_t i = 0; i < std::size(kInfos); ++i)
    if (kInfos[i].name == lower) return Format(i);
  return std::nullopt;
}

std::optional<Format> from_ggml_type(int ggml_type) {
  for (size_t i = 0; i < std::size(kInfos); ++i)
    if (kInfos[i].ggml_type >= 0 && kInfos[i].ggml_type == ggml_type) return Format(i);
  return std::nullopt;
}

size_t row_bytes(Format format, int64_t cols) {
  const FormatInfo& f = info(format);
  if (cols <= 0 || cols % f.block_elems != 0)
    throw ShapeError(std::string(f.name) + ": a row of " + std::to_string(cols) +
                     " elements is not a positive multiple of the block size " + std::to_string(f.block_elems));
  return size_t(cols / f.block_elems) * f.block_bytes;
}

void quantize_row(Format format, const float* x, int64_t cols, std::byte* out) {
  const FormatInfo& f = info(format);
  const int64_t blocks = int64_t(row_bytes(format, cols) / f.block_bytes);
  for (int64_t b = 0; b < blocks; ++b) kQuantize[size_t(format)](x + b * f.block_elems, out + b * f.block_bytes);
}

void dequantize_row(Format format, const std::byte* in, int64_t cols, float* out) {
  const FormatInfo& f = info(format);
  const int64_t blocks = int64_t(row_bytes(format, cols) / f.block_bytes);
  for (int64_t b = 0; b < blocks; ++b) kDequantize[size_t(format)](in + b * f.block_bytes, out + b * f.block_elems);
}

}  // namespace lmtune::quant
