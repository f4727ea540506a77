// CPU kernels for softmax / log-softmax over the last axis and for cross-entropy and its gradient. Rows are
// processed in parallel in f32 with f64 sums; rows that are entirely -inf give 0 (softmax) or -inf (log).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/softmax.h"

namespace lmtune {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float row_max(const float* v, int64_t n) {
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// log Σ exp(v), or -inf for an all -inf row.
double row_logsumexp(const float* v, int64_t n) {
  float m = row_max(v, n);
  if (m == kNegInf) return -std::numeric_limits<double>::infinity();
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(v[i]) - m);
  return m + std::log(s);
}

}  // namespace

void Softmax::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  Tensor& y = out[0];
  const char* xp = cpu::base_ptr(x);
  char* yp = cpu::base_ptr(y);
  const size_t xe = dtype_size(x.dtype()), ye = dtype_size(y.dtype());
  const bool take_log = log;
  cpu::for_each_row(x.shape(), {x.strides(), y.strides()}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    cpu::load_row(xp + o[0] * int64_t(xe), x.dtype(), s[0], n, v.data());
    float m = row_max(v.data(), n);
    if (m == kNegInf) {
      for (float& f : v) f = take_log ? kNegInf : 0.0f;
    } else {
      double sum = 0;
      for (float f : v) sum += std::exp(double(f) - m);
      if (take_log) {
        float shift = float(m + std::log(sum));
        for (float& f : v) f -= shift;
      } else {
        double inv = 1.0 / sum;
        for (float& f : v) f = float(std::exp(double(f) - m) * inv);
      }
    }
    cpu::store_row(yp + o[1] * int64_t(ye), y.dtype(), s[1], n, v.data());
  });
}

void CrossEntropy::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& logits = in[0];  // contiguous [N, V]
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const char* lp = cpu::base_ptr(logits);
  const size_t le = dtype_size(logits.dtype());
  const int32_t* targets = cpu::data<int32_t>(in[1]);
  float* loss = cpu::data<float>(out[0]);
  float* lse = cpu::data<float>(out[1]);
  const int ignore = ignore_index;
  cpu::parallel_for(N, std::max<int64_t>(1, 16384 / std::max<int64_t>(V, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(V));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(lp + r * V * int64_t(le), logits.dtype(), 1, V, v.data());
      double l = row_logsumexp(v.data(), V);
      lse[r] = float(l);
      loss[r] = targets[r] == ignore ? 0.0f : float(l - v[size_t(targets[r])]);
    }
  });
}

void CrossEntropyGrad::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& logits = in[0];
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const char* lp = cpu::base_ptr(logits);
  const size_t le = dtype_size(logits.dtype());
  const int32_t* targets = cpu::data<int32_t>(in[1]);
  std::vector<float> lse(static_cast<size_t>(N)), g(static_cast<size_t>(N));
  cpu::load_row(cpu::base_ptr(in[2]), in[2].dtype(), in[2].strides()[0], N, lse.data());
  cpu::load_row(cpu::base_ptr(in[3]), in[3].dtype(), in[3].strides()[0], N, g.data());
  Tensor& y = out[0];
  char* yp = cpu::base_ptr(y);
  const size_t ye = dtype_size(y.dtype());
  const int ignore = ignore_index;
  cpu::parallel_for(N, std::max<int64_t>(1, 16384 / std::max<int64_t>(V, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(V));
    for (int64_t r = r0; r < r1; ++r) {
      if (targets[r] == ignore) {
        std::fill(v.begin(), v.end(), 0.0f);
      } else {
        cpu::load_row(lp + r * V * int64_t(le), logits.dtype(), 1, V, v.data());
        for (float& f : v) f = float(std::exp(double(f) - lse[r])) * g[r];
        if (targets[r] >= 0 && targets[r] < V) v[size_t(targets[r])] -= g[r];  // else: no one-hot term
      }
      cpu::store_row(yp + r * V * int64_t(ye), y.dtype(), 1, V, v.data());
    }
  });
}

void SoftmaxChunk::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& z = in[0];  // contiguous [N, c], f32 or 16-bit
  const int64_t N = z.shape()[0], C = z.shape()[1];
  const char* zp = cpu::base_ptr(z);
  const size_t ze = dtype_size(z.dtype());
  const int32_t* ignored = cpu::data<int32_t>(in[1]);
  const float* prev = has_prev ? cpu::data<float>(in[2]) : nullptr;
  char* yp = cpu::base_ptr(out[0]);
  const size_t ye = dtype_size(out[0].dtype());
  float* lse = cpu::data<float>(out[1]);
  const double cap = softcap;
  cpu::parallel_for(N, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(C)), zr(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(zp + r * C * int64_t(ze), z.dtype(), 1, C, zr.data());
      const float* row = zr.data();
      double l = row_logsumexp(row, C);
      if (prev) {
        double a = prev[r], hi = std::max(a, l), lo = std::min(a, l);
        if (!(std::isinf(hi) && hi < 0)) l = hi + std::log1p(std::exp(lo - hi));
      }
      lse[r] = float(l);
      for (int64_t i = 0; i < C; ++i) {
        double x = row[i], slope = cap > 0 ? 1.0 - (x / cap) * (x / cap) : 1.0;
        v[size_t(i)] = ignored[r] != 0 || (std::isinf(l) && l < 0) ? 0.0f : float(std::exp(x - l) * slope);
      }
      cpu::store_row(yp + r * C * int64_t(ye), out[0].dtype(), 1, C, v.data());
    }
  });
}

}  // namespace lmtune
