// The block formats of core/quant.h against references written here from their published definitions: ggml's
// dequantize_row_* loops (ggml-quants.c) and bitsandbytes' NF4 levels, walked the way those sources walk them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/quant.h"

namespace lmtune {
namespace {

using quant::Format;

float half(const uint8_t* p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }

// ggml's get_scale_min_k4.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63; *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// One block of each format, as ggml's dequantize_row_* writes it (pointer walks kept as in the source).
void reference_block(Format f, const uint8_t* x, float* y) {
  switch (f) {
    case Format::q8_0: {
      const float d = half(x);
      for (int j = 0; j < 32; ++j) y[j] = float(int8_t(x[2 + j])) * d;
      return;
    }
    case Format::q4_0: {
      const float d = half(x);
      for (int j = 0; j < 16; ++j) {
        y[j] = float((x[2 + j] & 0x0F) - 8) * d;
        y[j + 16] = float((x[2 + j] >> 4) - 8) * d;
      }
      return;
    }
    case Format::q4_k: {
      const float d = half(x), min = half(x + 2);
      const uint8_t* scales = x + 4;
      const uint8_t* q = x + 16;
      int is = 0;
      uint8_t sc, m;
      for (int j = 0; j < 256; j += 64) {
        get_scale_min_k4(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        get_scale_min_k4(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
        q += 32; is += 2;
      }
      return;
    }
    case Format::q5_k: {
      const float d = half(x), min = half(x + 2);
      const uint8_t* scales = x + 4;
      const uint8_t* qh = x + 16;
      const uint8_t* ql = x + 48;
      int is = 0;
      uint8_t sc, m, u1 = 1, u2 = 2;
      for (int j = 0; j < 256; j += 64) {
        get_scale_min_k4(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        get_scale_min_k4(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32; is += 2;
        u1 <<= 2; u2 <<= 2;
      }
      return;
    }
    case Format::q6_k: {
      const float d = half(x + 208);
      const uint8_t* ql = x;
      const uint8_t* qh = x + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(x + 192);
      for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int8_t q1 = int8_t((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int8_t q2 = int8_t((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int8_t q3 = int8_t((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int8_t q4 = int8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l + 0] = d * sc[is + 0] * q1;
          y[l + 32] = d * sc[is + 2] * q2;
          y[l + 64] = d * sc[is + 4] * q3;
          y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128; ql += 64; qh += 32; sc += 8;
      }
      return;
    }
    case Format::nf4: {
      // The NF4 code as bitsandbytes lists it (create_normal_map), and quant.h's block: f32 d, 4 u8 scales.
      static const float code[16] = {-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                                     -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                                     0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                                     0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                                     0.7229568362236023f, 1.0f};
      float d;
      std::memcpy(&d, x, 4);
      for (int b = 0; b < 4; ++b)
        for (int j = 0; j < 64; ++j) {
          const uint8_t byte = x[8 + 32 * b + j % 32];
          y[64 * b + j] = d * x[4 + b] * code[j < 32 ? byte & 15 : byte >> 4];
        }
      return;
    }
  }
}

constexpr Format kFormats[] = {Format::q8_0, Format::q4_0, Format::q4_k, Format::q5_k, Format::q6_k, Format::nf4};

std::vector<float> random_row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  // A few outliers and an all-zero block: the scales' extremes.
  for (int64_t i = 0; i < n; i += 97) x[size_t(i)] *= 9.0f;
  return x;
}

class QuantFormat : public ::testing::TestWithParam<Format> {};

TEST_P(QuantFormat, DequantizationMatchesThePublishedLayout) {
  const Format f = GetParam();
  const quant::FormatInfo& fi = quant::info(f);
  // Random bytes (every bit pattern of the levels and packed scales), with finite f16/f32 scales written over.
  const int64_t blocks = 7, cols = blocks * fi.block_elems;
  std::mt19937 rng(11);
  std::vector<std::byte> raw(quant::row_bytes(f, cols));
  for (auto& b : raw) b = std::byte(rng() & 0xFF);
  for (int64_t b = 0; b < blocks; ++b) {
    std::byte* blk = raw.data() + b * fi.block_bytes;
    const uint16_t h = f32_to_f16(0.01f * float(b + 1)), hm = f32_to_f16(0.003f * float(b + 2));
    const float d32 = 0.002f * float(b + 1);
    if (f == Format::q6_k) std::memcpy(blk + 208, &h, 2);
    else if (f == Format::nf4) std::memcpy(blk, &d32, 4);
    else std::memcpy(blk, &h, 2);
    if (f == Format::q4_k || f == Format::q5_k) std::memcpy(blk + 2, &hm, 2);
  }
  std::vector<float> got(static_cast<size_t>(cols)), want(static_cast<size_t>(cols));
  quant::dequantize_row(f, raw.data(), cols, got.data());
  for (int64_t b = 0; b < blocks; ++b)
    reference_block(f, reinterpret_cast<const uint8_t*>(raw.data() + b * fi.block_bytes), &want[b * fi.block_elems]);
  for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << fi.name << " element " << i;
}

TEST_P(QuantFormat, RoundTripErrorIsWithinTheFormatsStep) {
  const Format f = GetParam();
  const quant::FormatInfo& fi = quant::info(f);
  const int64_t cols = 5 * fi.block_elems;
  std::vector<float> x = random_row(cols, 3);
  std::fill(x.begin(), x.begin() + fi.block_elems, 0.0f);  // an all-zero block dequantizes to zeros
  std::vector<std::byte> q(quant::row_bytes(f, cols));
  quant::quantize_row(f, x.data(), cols, q.data());
  std::vector<float> y(static_cast<size_t>(cols));
  quant::dequantize_row(f, q.data(), cols, y.data());
  // Bound per block: a fraction of the block's largest magnitude (levels of the format, plus scale rounding).
  const float fraction = f == Format::q8_0 ? 0.006f : f == Format::q6_k ? 0.03f : f == Format::q5_k ? 0.06f : 0.13f;
  double err2 = 0, ref2 = 0;
  for (int64_t b = 0; b < cols / fi.block_elems; ++b) {
    float amax = 0;
    for (int64_t j = 0; j < fi.block_elems; ++j) amax = std::max(amax, std::fabs(x[size_t(b * fi.block_elems + j)]));
    for (int64_t j = 0; j < fi.block_elems; ++j) {
      const size_t i = size_t(b * fi.block_elems + j);
      if (amax == 0) {
        ASSERT_EQ(y[i], 0.0f) << fi.name;
      }
      ASSERT_LE(std::fabs(y[i] - x[i]), fraction * amax + 1e-6f) << fi.name << " element " << i;
      err2 += double(y[i] - x[i]) * (y[i] - x[i]);
      ref2 += double(x[i]) * x[i];
    }
  }
  // Relative RMS error: what each format is known for on Gaussian data (q8_0 ~0.4%, 4-bit ~10%).
  const double rel = std::sqrt(err2 / ref2);
  const double limit = f == Format::q8_0 ? 0.02 : f == Format::q6_k ? 0.04 : f == Format::q5_k ? 0.07 : 0.15;
  EXPECT_LT(rel, limit) << fi.name;
}

TEST_P(QuantFormat, TensorsRoundTripThroughTheDevice) {
  const Format f = GetParam();
  const int64_t rows = 3, cols = 2 * quant::info(f).block_elems;
  const std::vector<float> x = random_row(rows * cols, 5);
  const Tensor dense = Tensor::from_floats(x, {rows, cols});
  const quant::QuantizedTensor q = quant::quantize(dense, f, dense.device());
  EXPECT_EQ(q.nbytes(), size_t(rows) * quant::row_bytes(f, cols));
  const std::vector<std::byte> blocks = quant::to_blocks(q);
  std::vector<float> want(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    quant::dequantize_row(f, blocks.data() + r * quant::row_bytes(f, cols), cols, &want[r * cols]);
  EXPECT_EQ(quant::dequantize(q, DType::f32).to_floats(), want);
  const quant::QuantizedTensor again = quant::from_blocks(f, {rows, cols}, blocks, dense.device());
  EXPECT_EQ(quant::to_blocks(again), blocks);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantFormat, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(quant::info(info.param).name); });

TEST(Quant, NamesSizesAndErrors) {
  EXPECT_EQ(quant::parse_format("Q4_K"), Format::q4_k);
  EXPECT_EQ(quant::parse_format("nf4"), Format::nf4);
  EXPECT_FALSE(quant::parse_format("q4_1").has_value());
  EXPECT_EQ(quant::from_ggml_type(14), Format::q6_k);
  EXPECT_FALSE(quant::from_ggml_type(3).has_value());  // q4_1: not a format lmtune computes with
  EXPECT_EQ(quant::row_bytes(Format::q8_0, 4096), 128u * 34u);
  EXPECT_EQ(quant::row_bytes(Format::q4_k, 4096), 16u * 144u);
  EXPECT_THROW(quant::row_bytes(Format::q4_k, 4000), ShapeError);
  EXPECT_THROW(quant::row_bytes(Format::q8_0, 0), ShapeError);
  const std::vector<std::byte> short_blocks(10);
  EXPECT_THROW(quant::from_blocks(Format::q8_0, {1, 32}, short_blocks, default_device()), ShapeError);
}

}  // namespace
}  // namespace lmtune
