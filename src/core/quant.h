// Block-quantized weight formats: their byte layouts, quantization and dequantization on the host, and
// QuantizedTensor, a frozen [rows, cols] weight kept in one of them on a device. Quantized weights are never
// trained: products read them (dequantizing block by block inside the kernels) and the adapters beside them learn.
//
// Layouts (little-endian; a row of `cols` elements is cols / block_elems consecutive blocks):
//   q8_0 (GGUF type 8):   32 elements, 34 bytes: f16 d, int8 q[32];                       x = d * q
//   q4_0 (GGUF type 2):   32 elements, 18 bytes: f16 d, u8 qs[16];     x[j] = d * ((qs[j] & 15) - 8),
//                                                                      x[j + 16] = d * ((qs[j] >> 4) - 8)
//   q4_k (GGUF type 12): 256 elements, 144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//   q5_k (GGUF type 13): 256 elements, 176 bytes: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//   q6_k (GGUF type 14): 256 elements, 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
//     (the k-quants exactly as ggml's ggml-common.h defines them; the dequantization formulas are in quant.cpp)
//   nf4:                 256 elements, 136 bytes: f32 d, u8 scale[4], u8 qs[128]
//     Four blocks of 64 elements, each with absmax = d * scale[i] (bitsandbytes' double quantization of the block
//     absmax, here to 8 bits against one f32 per 256 elements); element j of block i is
//     absmax * NF4[code], code = qs[32 i + j] & 15 for j < 32, qs[32 i + j - 32] >> 4 for j >= 32, with NF4 the
//     16 normal-float levels of bitsandbytes (kNf4Levels).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/tensor.h"

namespace lmtune::quant {

enum class Format : uint8_t { q8_0, q4_0, q4_k, q5_k, q6_k, nf4 };

struct FormatInfo {
  std::string_view name;  // "q8_0", ..., "nf4"
  int64_t block_elems;    // elements per block
  size_t block_bytes;     // bytes per block
  int ggml_type;          // GGUF/ggml type id, or -1 (nf4 has none)
};

const FormatInfo& info(Format format);
// "q8_0" | "q4_0" | "q4_k" | "q5_k" | "q6_k" | "nf4", case-insensitive; nullopt otherwise.
std::optional<Format> parse_format(std::string_view name);
// The format with this ggml type id, or nullopt.
std::optional<Format> from_ggml_type(int ggml_type);

// The 16 NF4 levels (bitsandbytes' create_normal_map), ascending from -1 to 1.
extern const std::array<float, 16> kNf4Levels;

// Bytes of one row of `cols` elements; throws ShapeError unless cols is a positive multiple of block_elems.
size_t row_bytes(Format format, int64_t cols);

// One row of `cols` elements (a multiple of block_elems) to row_bytes(format, cols) bytes, and back.
void quantize_row(Format format, const float* x, int64_t cols, std::byte* out);
void dequantize_row(Format format, const std::byte* in, int64_t cols, float* out);

// A quantized [rows, cols] matrix on a device. The rows are stored one after another, each row_bytes(format, cols)
// long, in an i32 tensor `words` of ceil(rows * row_bytes / 4) elements (the kernels read bytes out of words).
struct QuantizedTensor {
  Format format = Format::q8_0;
  Shape shape;  // [rows, cols]
  Tensor words;

  bool defined() const { return words.defined(); }
  int64_t rows() const { return shape.at(0); }
  int64_t cols() const { return shape.at(1); }
  size_t nbytes() const { return size_t(rows()) * row_bytes(format, cols()); }
  Device device() const { return words.device(); }
};

// Quantizes a [rows, cols] float tensor (any float dtype, any device), row by row on all host threads.
QuantizedTensor quantize(const Tensor& weight, Format format, Device device);
// Wraps rows already in `format` (e.g. a GGUF tensor's bytes; rows * row_bytes(format, cols) of them).
QuantizedTensor from_blocks(Format format, const Shape& shape, std::span<const std::byte> blocks, Device device);
// The matrix back as a dense tensor of `dtype` on the tensor's device.
Tensor dequantize(const QuantizedTensor& weight, DType dtype);
// The raw blocks on the host (rows * row_bytes bytes), e.g. for writing a GGUF file.
std::vector<std::byte> to_blocks(const QuantizedTensor& weight);

}  // namespace lmtune::quant
