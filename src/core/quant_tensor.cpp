// QuantizedTensor on a device: wrapping, quantizing and dequantizing whole matrices (the block formats themselves
// are in quant.cpp, which needs no engine, so parsers such as the recipe reader can use its format table alone).
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/quant.h"

namespace lmtune::quant {
namespace {

// Runs fn(begin, end) over [0, n) on the host's threads in contiguous chunks.
template <typename Fn>
void for_rows(int64_t n, Fn fn) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(n, 1));
  if (threads <= 1) { fn(int64_t(0), n); return; }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { fn(n * t / threads, n * (t + 1) / threads); });
  for (std::thread& th : pool) th.join();
}

}  // namespace

QuantizedTensor from_blocks(Format format, const Shape& shape, std::span<const std::byte> blocks, Device device) {
  if (shape.size() != 2 || shape[0] <= 0)
    throw ShapeError("quantized tensor: shape " + to_string(shape) + " is not [rows, cols]");
  const size_t bytes_needed = size_t(shape[0]) * row_bytes(format, shape[1]);
  if (blocks.size() != bytes_needed)
    throw ShapeError("quantized tensor " + to_string(shape) + " in " + std::string(info(format).name) + ": " +
                     std::to_string(blocks.size()) + " bytes given, " + std::to_string(bytes_needed) + " needed");
  QuantizedTensor q;
  q.format = format;
  q.shape = shape;
  q.words = Tensor::empty({int64_t((bytes_needed + 3) / 4)}, DType::i32, device);
  backend(device).write(*q.words.buffer(), 0, blocks.data(), bytes_needed);
  return q;
}

QuantizedTensor quantize(const Tensor& weight, Format format, Device device) {
  if (weight.ndim() != 2) throw ShapeError("quantize: weight " + to_string(weight.shape()) + " is not 2-D");
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  const size_t rb = row_bytes(format, cols);
  const std::vector<float> dense = weight.to_floats();
  std::vector<std::byte> blocks(size_t(rows) * rb);
  for_rows(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_row(format, dense.data() + r * cols, cols, blocks.data() + r * rb);
  });
  return from_blocks(format, weight.shape(), blocks, device);
}

std::vector<std::byte> to_blocks(const QuantizedTensor& weight) {
  std::vector<std::byte> blocks(weight.nbytes());
  backend(weight.device()).read(*weight.words.buffer(), 0, blocks.data(), blocks.size());
  return blocks;
}

Tensor dequantize(const QuantizedTensor& weight, DType dtype) {
  const std::vector<std::byte> blocks = to_blocks(weight);
  const int64_t rows = weight.rows(), cols = weight.cols();
  const size_t rb = row_bytes(weight.format, cols);
  std::vector<float> dense(size_t(rows * cols));
  for_rows(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row(weight.format, blocks.data() + r * rb, cols, &dense[r * cols]);
  });
  return Tensor::from_floats(dense, weight.shape, dtype, weight.device());
}

}  // namespace lmtune::quant
