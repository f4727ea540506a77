// Helpers for CPU kernels: typed row loads/stores into f32 scratch, and iteration over the rows (all dims but
// the last) of equally-shaped strided tensors, in parallel.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/tensor.h"

namespace lmtune::cpu {

// Pointer to element 0 of a CPU tensor view.
inline char* base_ptr(const Tensor& t) {
  return static_cast<char*>(t.buffer()->host_data()) + t.offset() * int64_t(dtype_size(t.dtype()));
}
template <class T>
T* data(const Tensor& t) { return reinterpret_cast<T*>(base_ptr(t)); }

// Loads n elements (element stride `stride`) starting at p into dst as f32.
void load_row(const char* p, DType dtype, int64_t stride, int64_t n, float* dst);
void store_row(char* p, DType dtype, int64_t stride, int64_t n, const float* src);
void load_row_f64(const char* p, DType dtype, int64_t stride, int64_t n, double* dst);

// Calls fn(row_offsets, inner_strides, n) for every row of `shape`, where row_offsets[k] is the element offset
// of the row's first element in tensor k (relative to its base) and inner_strides[k] its last-dim stride.
// Rows are processed in parallel; fn must be thread-safe.
struct RowFn {
  virtual ~RowFn() = default;
  virtual void operator()(const int64_t* offsets, const int64_t* inner_strides, int64_t n) const = 0;
};
void for_each_row(const Shape& shape, const std::vector<Strides>& strides, const RowFn& fn);

// Like for_each_row for elementwise kernels, where rows have no meaning: dims that are contiguous in every
// tensor are merged and long rows are cut into spans, so contiguous tensors become a few large spans processed
// in parallel. fn(offsets, inner_strides, n) as above.
void for_each_span(const Shape& shape, const std::vector<Strides>& strides, const RowFn& fn);

// Thread-local f32 scratch of at least n elements (slot distinguishes buffers used at the same time).
float* scratch(int slot, int64_t n);

template <class F>
void for_each_span(const Shape& shape, const std::vector<Strides>& strides, F&& f) {
  struct Impl final : RowFn {
    F& f;
    explicit Impl(F& f) : f(f) {}
    void operator()(const int64_t* o, const int64_t* s, int64_t n) const override { f(o, s, n); }
  } impl(f);
  for_each_span(shape, strides, static_cast<const RowFn&>(impl));
}

template <class F>
void for_each_row(const Shape& shape, const std::vector<Strides>& strides, F&& f) {
  struct Impl final : RowFn {
    F& f;
    explicit Impl(F& f) : f(f) {}
    void operator()(const int64_t* o, const int64_t* s, int64_t n) const override { f(o, s, n); }
  } impl(f);
  for_each_row(shape, strides, static_cast<const RowFn&>(impl));
}

}  // namespace lmtune::cpu
