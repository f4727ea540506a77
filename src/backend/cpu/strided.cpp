// Row iteration and typed row conversion for CPU kernels.
#include "backend/cpu/strided.h"

#include <cstring>

namespace lmtune::cpu {

void load_row(const char* p, DType dtype, int64_t stride, int64_t n, float* dst) {
  if (n == 0) return;  // an empty tensor's storage (and an empty vector's data()) may be null: no memcpy of it
  switch (dtype) {
    case DType::f32: {
      auto* s = reinterpret_cast<const float*>(p);
      if (stride == 1) std::memcpy(dst, s, size_t(n) * 4);
      else for (int64_t i = 0; i < n; ++i) dst[i] = s[i * stride];
      break;
    }
    case DType::f16: {
      auto* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i * stride]);
      break;
    }
    case DType::bf16: {
      auto* s = reinterpret_cast<const uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i * stride]);
      break;
    }
    case DType::i32: {
      auto* s = reinterpret_cast<const int32_t*>(p);
      for (int64_t i = 0; i < n; ++i) dst[i] = float(s[i * stride]);
      break;
    }
  }
}

void load_row_f64(const char* p, DType dtype, int64_t stride, int64_t n, double* dst) {
  std::vector<float> tmp(static_cast<size_t>(n));
  load_row(p, dtype, stride, n, tmp.data());
  for (int64_t i = 0; i < n; ++i) dst[i] = tmp[i];
}

void store_row(char* p, DType dtype, int64_t stride, int64_t n, const float* src) {
  if (n == 0) return;
  switch (dtype) {
    case DType::f32: {
      auto* d = reinterpret_cast<float*>(p);
      if (stride == 1) std::memcpy(d, src, size_t(n) * 4);
      else for (int64_t i = 0; i < n; ++i) d[i * stride] = src[i];
      break;
    }
    case DType::f16: {
      auto* d = reinterpret_cast<uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) d[i * stride] = f32_to_f16(src[i]);
      break;
    }
    case DType::bf16: {
      auto* d = reinterpret_cast<uint16_t*>(p);
      for (int64_t i = 0; i < n; ++i) d[i * stride] = f32_to_bf16(src[i]);
      break;
    }
    case DType::i32: {
      auto* d = reinterpret_cast<int32_t*>(p);
      for (int64_t i = 0; i < n; ++i) d[i * stride] = int32_t(src[i]);
      break;
    }
  }
}

void for_each_row(const Shape& shape, const std::vector<Strides>& strides, const RowFn& fn) {
  size_t k = strides.size();
  if (shape.empty()) {  // a scalar is one row of one element
    std::vector<int64_t> off(k, 0), st(k, 1);
    fn(off.data(), st.data(), 1);
    return;
  }
  int nd = int(shape.size());
  int64_t n = shape[nd - 1];
  int64_t rows = 1;
  for (int i = 0; i < nd - 1; ++i) rows *= shape[i];
  if (rows == 0 || n == 0) return;
  std::vector<int64_t> inner(k);
  for (size_t t = 0; t < k; ++t) inner[t] = strides[t][nd - 1];
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> idx(size_t(nd), 0), off(k, 0);
    // Decompose r0 into an index over the outer dims.
    int64_t r = r0;
    for (int i = nd - 2; i >= 0; --i) {
      idx[i] = r % shape[i];
      r /= shape[i];
    }
    for (size_t t = 0; t < k; ++t)
      for (int i = 0; i < nd - 1; ++i) off[t] += idx[i] * strides[t][i];
    for (int64_t row = r0; row < r1; ++row) {
      fn(off.data(), inner.data(), n);
      for (int i = nd - 2; i >= 0; --i) {  // advance the outer index
        for (size_t t = 0; t < k; ++t) off[t] += strides[t][i];
        if (++idx[i] < shape[i]) break;
        for (size_t t = 0; t < k; ++t) off[t] -= strides[t][i] * shape[i];
        idx[i] = 0;
      }
    }
  });
}

float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[4];
  auto& b = buffers[slot];
  if (int64_t(b.size()) < n) b.resize(size_t(n));
  return b.data();
}

void for_each_span(const Shape& shape, const std::vector<Strides>& strides, const RowFn& fn) {
  if (shape.empty()) return for_each_row(shape, strides, fn);
  Shape s = shape;
  std::vector<Strides> st = strides;
  collapse_dims(s, st);
  if (s.empty()) {  // every dim is 1: a single element
    s.push_back(1);
    for (auto& v : st) v.push_back(1);
  }
  // Cut the last dim into spans of at most kSpan so that one big contiguous row still runs in parallel.
  const int64_t kSpan = 8192;
  int64_t n = s.back();
  if (n > kSpan) {
    int64_t chunks = (n + kSpan - 1) / kSpan;
    int64_t outer = 1;
    for (size_t d = 0; d + 1 < s.size(); ++d) outer *= s[d];
    size_t k = strides.size();
    parallel_for(outer * chunks, 1, [&](int64_t b, int64_t e) {
      std::vector<int64_t> off(k), inner(k);
      for (size_t t = 0; t < k; ++t) inner[t] = st[t].back();
      for (int64_t task = b; task < e; ++task) {
        int64_t row = task / chunks, c = task % chunks;
        int64_t r = row;
        for (size_t t = 0; t < k; ++t) off[t] = 0;
        for (size_t d = s.size() - 1; d-- > 0;) {
          int64_t i = r % s[d];
          r /= s[d];
          for (size_t t = 0; t < k; ++t) off[t] += i * st[t][d];
        }
        int64_t begin = c * kSpan, len = std::min(kSpan, n - begin);
        for (size_t t = 0; t < k; ++t) off[t] += begin * inner[t];
        fn(off.data(), inner.data(), len);
      }
    });
    return;
  }
  for_each_row(s, st, fn);
}

}  // namespace lmtune::cpu
