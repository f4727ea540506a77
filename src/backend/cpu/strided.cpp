// Row iteration and typed row conversion for CPU kernels.
#include "backend/cpu/strided.h"

#include <cstring>

namespace lmtune::cpu {

void load_row(const char* p, DType dtype, int64_t stride, int64_t n, float* dst) {
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

}  // namespace lmtune::cpu
