// CPU kernels for RMSNorm, LayerNorm, rotary embedding, dropout, embedding and its scatter-add. Rows are converted to
// f32, statistics accumulate in f64, and work is split over rows (over columns for the scatter-add, so that
// each output element has one writer and the result is deterministic).
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/nn.h"

namespace lmtune {
namespace {

int64_t row_len(const Tensor& x) { return x.ndim() ? x.shape().back() : 1; }

std::vector<float> load_vector(const Tensor& v) {
  std::vector<float> out(size_t(v.numel()));
  cpu::load_row(cpu::base_ptr(v), v.dtype(), v.ndim() ? v.strides()[0] : 1, v.numel(), out.data());
  return out;
}

// Dropout's counter-based hash: kernels/elementwise/dropout.comp computes the same bits.
uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  h ^= h >> 16;
  return h;
}
uint32_t dropout_hash(uint32_t i, uint64_t key) { return mix32(mix32(i ^ uint32_t(key)) + uint32_t(key >> 32)); }

}  // namespace

void Dropout::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];  // contiguous (the op function makes it so)
  const int64_t n = x.numel();
  const uint32_t drop_below = threshold();
  const float keep = scale();
  cpu::parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    std::vector<float> v(size_t(i1 - i0));
    cpu::load_row(cpu::base_ptr(x) + i0 * int64_t(dtype_size(x.dtype())), x.dtype(), 1, i1 - i0, v.data());
    for (int64_t i = i0; i < i1; ++i) {
      float& e = v[size_t(i - i0)];
      e = dropout_hash(uint32_t(i), key) < drop_below ? 0.0f : e * keep;
    }
    cpu::store_row(cpu::base_ptr(out[0]) + i0 * int64_t(dtype_size(x.dtype())), x.dtype(), 1, i1 - i0, v.data());
  });
}

void RmsNorm::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];  // contiguous (the op function makes it so)
  const int64_t C = row_len(x), rows = C ? x.numel() / C : 0;
  std::vector<float> w = load_vector(in[1]);
  const char* xp = cpu::base_ptr(x);
  char* yp = cpu::base_ptr(out[0]);
  float* rp = cpu::data<float>(out[1]);
  const size_t xe = dtype_size(x.dtype()), ye = dtype_size(out[0].dtype());
  const float e = eps;
  cpu::parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(xp + r * C * int64_t(xe), x.dtype(), 1, C, v.data());
      double ss = 0;
      for (float f : v) ss += double(f) * f;
      float rstd = float(1.0 / std::sqrt(ss / double(C) + e));
      for (int64_t i = 0; i < C; ++i) v[i] = v[i] * rstd * w[i];
      cpu::store_row(yp + r * C * int64_t(ye), out[0].dtype(), 1, C, v.data());
      rp[r] = rstd;
    }
  });
}

void RmsNormGrad::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];  // x, rstd and g contiguous (RmsNorm::vjp makes them so)
  const Tensor& g = in[3];
  const int64_t C = row_len(x), rows = C ? x.numel() / C : 0;
  std::vector<float> w = load_vector(in[1]);
  const float* rp = cpu::data<float>(in[2]);
  const char* xp = cpu::base_ptr(x);
  const char* gp = cpu::base_ptr(g);
  char* dp = cpu::base_ptr(out[0]);
  const size_t xe = dtype_size(x.dtype()), ge = dtype_size(g.dtype()), de = dtype_size(out[0].dtype());
  cpu::parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> xv(static_cast<size_t>(C)), gv(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(xp + r * C * int64_t(xe), x.dtype(), 1, C, xv.data());
      cpu::load_row(gp + r * C * int64_t(ge), g.dtype(), 1, C, gv.data());
      double s = 0;
      for (int64_t i = 0; i < C; ++i) s += double(gv[i]) * w[i] * xv[i];
      const float rstd = rp[r], coef = float(double(rstd) * rstd * rstd * s / double(C));
      for (int64_t i = 0; i < C; ++i) xv[i] = rstd * gv[i] * w[i] - coef * xv[i];
      if (accumulate) {
        cpu::load_row(dp + r * C * int64_t(de), out[0].dtype(), 1, C, gv.data());
        for (int64_t i = 0; i < C; ++i) xv[i] += gv[i];
      }
      cpu::store_row(dp + r * C * int64_t(de), out[0].dtype(), 1, C, xv.data());
    }
  });
}

void LayerNorm::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  const int64_t C = row_len(x), rows = C ? x.numel() / C : 0;
  std::vector<float> w = load_vector(in[1]), b = load_vector(in[2]);
  const char* xp = cpu::base_ptr(x);
  char* yp = cpu::base_ptr(out[0]);
  float* mp = cpu::data<float>(out[1]);
  float* rp = cpu::data<float>(out[2]);
  const size_t xe = dtype_size(x.dtype()), ye = dtype_size(out[0].dtype());
  const float e = eps;
  cpu::parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(C));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(xp + r * C * int64_t(xe), x.dtype(), 1, C, v.data());
      double s = 0;
      for (float f : v) s += f;
      double mean = s / double(C), ss = 0;
      for (float f : v) ss += (f - mean) * (f - mean);  // two passes: no cancellation for large means
      float rstd = float(1.0 / std::sqrt(ss / double(C) + e));
      float m = float(mean);
      for (int64_t i = 0; i < C; ++i) v[i] = (v[i] - m) * rstd * w[i] + b[i];
      cpu::store_row(yp + r * C * int64_t(ye), out[0].dtype(), 1, C, v.data());
      mp[r] = m;
      rp[r] = rstd;
    }
  });
}

void Rope::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];  // contiguous [B, T, H, D]
  const int64_t B = x.shape()[0], T = x.shape()[1], H = x.shape()[2], D = x.shape()[3];
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  std::memcpy(pos.data(), cpu::base_ptr(in[1]), pos.size() * 4);
  std::vector<float> inv_freq = load_vector(in[2]);
  const int64_t half = int64_t(inv_freq.size());
  const char* xp = cpu::base_ptr(x);
  char* yp = cpu::base_ptr(out[0]);
  const size_t xe = dtype_size(x.dtype()), ye = dtype_size(out[0].dtype());
  const bool split = layout == ops::RopeLayout::half_split;
  const double sign = inverse ? -1.0 : 1.0;
  cpu::parallel_for(B * T, std::max<int64_t>(1, 4096 / std::max<int64_t>(H * D, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<float> v(static_cast<size_t>(H * D)), c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t i = 0; i < half; ++i) {  // angles in f64: positions can be large
        double a = double(pos[size_t(r)]) * double(inv_freq[size_t(i)]);
        c[i] = float(std::cos(a)) * scale;
        s[i] = float(sign * std::sin(a)) * scale;
      }
      cpu::load_row(xp + r * H * D * int64_t(xe), x.dtype(), 1, H * D, v.data());
      for (int64_t h = 0; h < H; ++h) {
        float* p = v.data() + h * D;
        for (int64_t i = 0; i < half; ++i) {
          int64_t i0 = split ? i : 2 * i, i1 = split ? i + half : 2 * i + 1;
          float x0 = p[i0], x1 = p[i1];
          p[i0] = x0 * c[i] - x1 * s[i];
          p[i1] = x1 * c[i] + x0 * s[i];
        }
      }
      cpu::store_row(yp + r * H * D * int64_t(ye), out[0].dtype(), 1, H * D, v.data());
    }
  });
}

void Embedding::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& w = in[0];  // contiguous [V, C]
  const int64_t C = w.shape()[1], n = in[1].numel();
  const int32_t* ids = cpu::data<int32_t>(in[1]);
  const char* wp = cpu::base_ptr(w);
  char* yp = cpu::base_ptr(out[0]);
  const size_t es = dtype_size(w.dtype());
  cpu::parallel_for(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(yp + i * C * int64_t(es), wp + int64_t(ids[i]) * C * int64_t(es), size_t(C) * es);
  });
}

void EmbeddingBackward::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& g = in[0];  // contiguous [..., C]
  Tensor& y = out[0];       // [V, C]
  const int64_t C = y.shape()[1], V = vocab, n = in[1].numel();
  const int32_t* ids = cpu::data<int32_t>(in[1]);
  const char* gp = cpu::base_ptr(g);
  const size_t ge = dtype_size(g.dtype());
  std::vector<float> scratch;
  float* acc = y.dtype() == DType::f32 ? cpu::data<float>(y) : (scratch.resize(size_t(V * C)), scratch.data());
  std::memset(acc, 0, size_t(V * C) * sizeof(float));
  // Each chunk owns a range of columns and walks all ids in order: one writer per element, fixed order.
  cpu::parallel_for(C, 64, [&](int64_t c0, int64_t c1) {
    std::vector<float> row(static_cast<size_t>(c1 - c0));
    for (int64_t i = 0; i < n; ++i) {
      cpu::load_row(gp + (i * C + c0) * int64_t(ge), g.dtype(), 1, c1 - c0, row.data());
      float* dst = acc + int64_t(ids[i]) * C + c0;
      for (int64_t c = 0; c < c1 - c0; ++c) dst[c] += row[c];
    }
  });
  if (!scratch.empty()) cpu::store_row(cpu::base_ptr(y), y.dtype(), 1, V * C, scratch.data());
}

}  // namespace lmtune
