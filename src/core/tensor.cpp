// Tensor construction, host transfers and views of raw storage.
#include "core/tensor.h"

#include <algorithm>

#include "core/error.h"
#include "core/random.h"
#include "core/tape.h"

namespace lmtune {
namespace {

std::vector<uint8_t> encode_floats(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  switch (dtype) {
    case DType::f32:
      if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());  // an empty vector's data() may be null
      break;
    case DType::f16: {
      auto* p = reinterpret_cast<uint16_t*>(out.data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = f32_to_f16(v[i]);
      break;
    }
    case DType::bf16: {
      auto* p = reinterpret_cast<uint16_t*>(out.data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = f32_to_bf16(v[i]);
      break;
    }
    case DType::i32: {
      auto* p = reinterpret_cast<int32_t*>(out.data());
      for (size_t i = 0; i < v.size(); ++i) p[i] = int32_t(v[i]);
      break;
    }
  }
  return out;
}

double decode_one(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::f16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    case DType::bf16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case DType::i32: { int32_t i; std::memcpy(&i, p, 4); return i; }
  }
  return 0;
}

std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError("tensor shape " + to_string(shape) + " has a negative dimension");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->buffer = backend(device).allocate(size_t(numel(shape)) * dtype_size(dtype));
  return impl;
}

// Reads the bytes spanned by a view and returns them in logical row-major order.
std::vector<uint8_t> read_logical_bytes(const Tensor& t) {
  size_t es = dtype_size(t.dtype());
  int64_t n = t.numel();
  std::vector<uint8_t> out(size_t(n) * es);
  if (n == 0) return out;
  int64_t lo = t.offset(), hi = t.offset();
  for (int i = 0; i < t.ndim(); ++i) {
    int64_t span = (t.shape()[i] - 1) * t.strides()[i];
    (span < 0 ? lo : hi) += span;
  }
  std::vector<uint8_t> raw(size_t(hi - lo + 1) * es);
  tape::read_by({t});
  backend(t.device()).read(*t.buffer(), size_t(lo) * es, raw.data(), raw.size());
  if (t.is_contiguous()) return raw;
  std::vector<int64_t> idx(t.ndim(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = t.offset() - lo;
    for (int i = 0; i < t.ndim(); ++i) off += idx[i] * t.strides()[i];
    std::memcpy(out.data() + k * es, raw.data() + off * es, es);
    for (int i = t.ndim() - 1; i >= 0; --i) {
      if (++idx[i] < t.shape()[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) { return Tensor(make_impl(shape, dtype, device)); }

Tensor Tensor::from_floats(const std::vector<float>& data, const Shape& shape, DType dtype, Device device) {
  if (int64_t(data.size()) != lmtune::numel(shape))
    throw ShapeError("from_floats: " + std::to_string(data.size()) + " values for shape " + to_string(shape));
  Tensor t = empty(shape, dtype, device);
  auto bytes = encode_floats(data, dtype);
  if (!bytes.empty()) backend(device).write(*t.buffer(), 0, bytes.data(), bytes.size());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& data, const Shape& shape, Device device) {
  if (int64_t(data.size()) != lmtune::numel(shape))
    throw ShapeError("from_ints: " + std::to_string(data.size()) + " values for shape " + to_string(shape));
  Tensor t = empty(shape, DType::i32, device);
  if (!data.empty()) backend(device).write(*t.buffer(), 0, data.data(), data.size() * 4);
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  // One element's encoding repeated over the buffer by the backend: no host array of the whole tensor (a zero
  // gradient of a big activation was once built and uploaded from the host).
  const std::vector<uint8_t> one = encode_floats({value}, dtype);  // 2 or 4 bytes
  uint32_t word = 0;
  std::memcpy(&word, one.data(), one.size());
  if (one.size() == 2) word |= word << 16;
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) backend(device).fill(*t.buffer(), word);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0f, dtype, device); }

Tensor Tensor::randn(const Shape& shape, uint64_t seed, float stddev, DType dtype, Device device) {
  std::vector<float> v(static_cast<size_t>(lmtune::numel(shape)));
  Rng::fill_normal(v.data(), 0, v.size(), seed, stddev);
  return from_floats(v, shape, dtype, device);
}

Tensor Tensor::uniform(const Shape& shape, uint64_t seed, float lo, float hi, DType dtype, Device device) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(lmtune::numel(shape)));
  for (float& x : v) x = float(lo + (hi - lo) * rng.uniform());
  return from_floats(v, shape, dtype, device);
}

int64_t Tensor::dim(int axis) const {
  int a = axis < 0 ? axis + ndim() : axis;
  if (a < 0 || a >= ndim())
    throw ShapeError("axis " + std::to_string(axis) + " out of range for shape " + to_string(shape()));
  return shape()[a];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape()[i] != 1 && strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

Tensor Tensor::view_as(const Shape& shape, const Strides& strides, int64_t offset) const {
  auto impl = std::make_shared<TensorImpl>();
  impl->buffer = impl_->buffer;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = impl_->dtype;
  impl->device = impl_->device;
  return Tensor(impl);
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  auto bytes = read_logical_bytes(*this);
  Tensor t = empty(shape(), dtype(), device);
  if (!bytes.empty()) backend(device).write(*t.buffer(), 0, bytes.data(), bytes.size());
  return t;
}

std::vector<double> Tensor::to_doubles() const {
  auto bytes = read_logical_bytes(*this);
  size_t es = dtype_size(dtype());
  std::vector<double> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = decode_one(bytes.data() + i * es, dtype());
  return out;
}

std::vector<float> Tensor::to_floats() const {
  if (dtype() == DType::f32) {
    auto bytes = read_logical_bytes(*this);
    std::vector<float> out(static_cast<size_t>(numel()));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());  // empty vectors' data() may be null
    return out;
  }
  auto d = to_doubles();
  return std::vector<float>(d.begin(), d.end());
}

std::vector<int32_t> Tensor::to_ints() const {
  if (dtype() != DType::i32) throw ShapeError("to_ints: tensor has dtype " + std::string(dtype_name(dtype())));
  auto bytes = read_logical_bytes(*this);
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

float Tensor::item() const {
  if (numel() != 1) throw ShapeError("item: tensor of shape " + to_string(shape()) + " is not a single value");
  return float(to_doubles()[0]);
}

Tensor& Tensor::set_requires_grad(bool on) {
  if (on && !is_float(dtype())) throw ShapeError("set_requires_grad: an i32 tensor cannot require grad");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::detach() const {
  Tensor t = view_as(shape(), strides(), offset());
  return t;
}

}  // namespace lmtune
