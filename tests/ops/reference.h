// Plain double-precision reference implementations of every op, written independently of src/ (loops over
// logical indices, no strides, no kernels). The op tests compare device results against them; the autodiff
// tests differentiate them by central finite differences.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "core/ops.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace lmtune::ref {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A dense row-major array of doubles.
struct Array {
  Shape shape;
  std::vector<double> v;
  Array() = default;
  explicit Array(Shape s, double fill = 0) : shape(std::move(s)), v(size_t(numel(shape)), fill) {}
  Array(Shape s, std::vector<double> d) : shape(std::move(s)), v(std::move(d)) {}
  int64_t size() const { return int64_t(v.size()); }
  int ndim() const { return int(shape.size()); }
  double& operator[](int64_t i) { return v[size_t(i)]; }
  double operator[](int64_t i) const { return v[size_t(i)]; }
};

inline Array of(const Tensor& t) { return Array(t.shape(), t.to_doubles()); }
inline std::vector<int64_t> ints_of(const Tensor& t) {
  auto v = t.to_ints();
  return std::vector<int64_t>(v.begin(), v.end());
}

inline std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = s.size(); i-- > 0;) {
    idx[i] = s[i] ? flat % s[i] : 0;
    flat = s[i] ? flat / s[i] : 0;
  }
  return idx;
}
inline int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t f = 0;
  for (size_t i = 0; i < s.size(); ++i) f = f * s[i] + idx[i];
  return f;
}
// Flat index in an array of shape `from` of the element that broadcasts to index `idx` of shape `to`.
inline int64_t broadcast_flat(const std::vector<int64_t>& idx, const Shape& from, const Shape& to) {
  int64_t f = 0;
  size_t extra = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) f = f * from[i] + (from[i] == 1 ? 0 : idx[i + extra]);
  return f;
}

inline Array unary(const Array& a, const std::function<double(double)>& f) {
  Array r(a.shape);
  for (int64_t i = 0; i < a.size(); ++i) r[i] = f(a[i]);
  return r;
}

inline Array binary(const Array& a, const Array& b, const std::function<double(double, double)>& f) {
  Shape s = broadcast_shapes(a.shape, b.shape, "ref");
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    r[i] = f(a[broadcast_flat(idx, a.shape, s)], b[broadcast_flat(idx, b.shape, s)]);
  }
  return r;
}

inline Array where(const Array& c, const Array& a, const Array& b) {
  Shape s = broadcast_shapes(broadcast_shapes(c.shape, a.shape, "ref"), b.shape, "ref");
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    r[i] = c[broadcast_flat(idx, c.shape, s)] != 0 ? a[broadcast_flat(idx, a.shape, s)] : b[broadcast_flat(idx, b.shape, s)];
  }
  return r;
}

inline Array expand(const Array& a, const Shape& s) {
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) r[i] = a[broadcast_flat(unravel(i, s), a.shape, s)];
  return r;
}

inline Array reshape(Array a, const Shape& s) {
  a.shape = s;
  return a;
}

inline Array permute(const Array& a, const std::vector<int>& axes) {
  Shape s(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) s[i] = a.shape[size_t(axes[i])];
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    std::vector<int64_t> src(idx.size());
    for (size_t k = 0; k < axes.size(); ++k) src[size_t(axes[k])] = idx[k];
    r[i] = a[ravel(src, a.shape)];
  }
  return r;
}

inline Array transpose(const Array& a, int x0, int x1) {
  std::vector<int> axes(size_t(a.ndim()));
  for (int i = 0; i < a.ndim(); ++i) axes[size_t(i)] = i;
  std::swap(axes[size_t(x0 < 0 ? x0 + a.ndim() : x0)], axes[size_t(x1 < 0 ? x1 + a.ndim() : x1)]);
  return permute(a, axes);
}

inline Array slice(const Array& a, int axis, int64_t start, int64_t end, int64_t step) {
  Shape s = a.shape;
  s[size_t(axis)] = (end - start + step - 1) / step;
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    idx[size_t(axis)] = start + idx[size_t(axis)] * step;
    r[i] = a[ravel(idx, a.shape)];
  }
  return r;
}

inline Array concat(const std::vector<Array>& xs, int axis) {
  Shape s = xs[0].shape;
  s[size_t(axis)] = 0;
  for (const auto& x : xs) s[size_t(axis)] += x.shape[size_t(axis)];
  Array r(s);
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    size_t k = 0;
    while (idx[size_t(axis)] >= xs[k].shape[size_t(axis)]) idx[size_t(axis)] -= xs[k++].shape[size_t(axis)];
    r[i] = xs[k][ravel(idx, xs[k].shape)];
  }
  return r;
}

// Reduces one axis with keepdims; fold(values along the axis) -> result.
inline Array reduce(const Array& a, int axis, const std::function<double(const std::vector<double>&)>& fold) {
  Shape s = a.shape;
  int64_t n = s[size_t(axis)];
  s[size_t(axis)] = 1;
  Array r(s);
  std::vector<double> row(static_cast<size_t>(n));
  for (int64_t i = 0; i < r.size(); ++i) {
    auto idx = unravel(i, s);
    for (int64_t j = 0; j < n; ++j) {
      idx[size_t(axis)] = j;
      row[size_t(j)] = a[ravel(idx, a.shape)];
    }
    r[i] = fold(row);
  }
  return r;
}

inline Array drop_axes(Array a, std::vector<int> axes) {
  Shape s;
  for (int i = 0; i < a.ndim(); ++i)
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) s.push_back(a.shape[size_t(i)]);
  a.shape = s;
  return a;
}

inline double fold_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
inline double fold_max(const std::vector<double>& v) { return v.empty() ? -kInf : *std::max_element(v.begin(), v.end()); }
inline double fold_logsumexp(const std::vector<double>& v) {
  double m = fold_max(v);
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return m + std::log(s);
}

inline Array sum(const Array& a, std::vector<int> axes, bool keep) {
  Array r = a;
  for (int ax : axes) r = reduce(r, ax, fold_sum);
  return keep ? r : drop_axes(r, axes);
}

inline Array matmul(const Array& a, const Array& b) {
  int na = a.ndim(), nb = b.ndim();
  int64_t M = a.shape[size_t(na - 2)], K = a.shape[size_t(na - 1)], N = b.shape[size_t(nb - 1)];
  Shape ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "ref matmul");
  Shape s = batch;
  s.push_back(M);
  s.push_back(N);
  Array r(s);
  int64_t nbatch = numel(batch);
  for (int64_t t = 0; t < nbatch; ++t) {
    auto idx = unravel(t, batch);
    int64_t ao = broadcast_flat(idx, ba, batch) * M * K, bo = broadcast_flat(idx, bb, batch) * K * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += a[ao + i * K + k] * b[bo + k * N + j];
        r[(t * M + i) * N + j] = acc;
      }
  }
  return r;
}

inline Array linear(const Array& x, const Array& w, const Array* bias) {
  Array y = matmul(x, transpose(w, 0, 1));
  return bias ? binary(y, *bias, [](double p, double q) { return p + q; }) : y;
}

inline Array softmax(const Array& x, int axis, bool log) {
  Array lse = reduce(x, axis, fold_logsumexp);
  return binary(x, lse, [log](double v, double l) {
    if (l == -kInf) return log ? -kInf : 0.0;
    return log ? v - l : std::exp(v - l);
  });
}

inline Array cross_entropy(const Array& logits, const std::vector<int64_t>& targets, int64_t ignore) {
  int64_t N = logits.shape[0], V = logits.shape[1];
  Array r(Shape{N});
  for (int64_t n = 0; n < N; ++n) {
    if (targets[size_t(n)] == ignore) continue;
    std::vector<double> row(logits.v.begin() + n * V, logits.v.begin() + (n + 1) * V);
    r[n] = fold_logsumexp(row) - row[size_t(targets[size_t(n)])];
  }
  return r;
}

inline Array rms_norm(const Array& x, const Array& w, double eps) {
  int64_t C = x.shape.back(), rows = x.size() / C;
  Array r(x.shape);
  for (int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
    double rstd = 1.0 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) r[i * C + c] = x[i * C + c] * rstd * w[c];
  }
  return r;
}

inline Array layer_norm(const Array& x, const Array& w, const Array* b, double eps) {
  int64_t C = x.shape.back(), rows = x.size() / C;
  Array r(x.shape);
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[i * C + c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[i * C + c] - mean) * (x[i * C + c] - mean);
    double rstd = 1.0 / std::sqrt(var / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) r[i * C + c] = (x[i * C + c] - mean) * rstd * w[c] + (b ? (*b)[c] : 0.0);
  }
  return r;
}

// x [B, T, H, D], positions [B, T], inv_freq [R/2]; the rotated dims are multiplied by scale.
inline Array rope(const Array& x, const std::vector<int64_t>& pos, const Array& inv_freq, ops::RopeLayout layout,
                  bool inverse = false, double scale = 1.0) {
  int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], D = x.shape[3], half = inv_freq.size();
  Array r = x;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        int64_t base = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          double a = double(pos[size_t(b * T + t)]) * inv_freq[i] * (inverse ? -1 : 1);
          int64_t i0 = layout == ops::RopeLayout::half_split ? i : 2 * i;
          int64_t i1 = layout == ops::RopeLayout::half_split ? i + half : 2 * i + 1;
          double x0 = x[base + i0], x1 = x[base + i1];
          r[base + i0] = scale * (x0 * std::cos(a) - x1 * std::sin(a));
          r[base + i1] = scale * (x1 * std::cos(a) + x0 * std::sin(a));
        }
      }
  return r;
}

inline Array embedding(const Array& w, const std::vector<int64_t>& ids, const Shape& ids_shape) {
  int64_t C = w.shape[1];
  Shape s = ids_shape;
  s.push_back(C);
  Array r(s);
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c) r[int64_t(i) * C + c] = w[ids[i] * C + c];
  return r;
}

inline Array embedding_backward(const Array& g, const std::vector<int64_t>& ids, int64_t vocab) {
  int64_t C = g.shape.back();
  Array r(Shape{vocab, C});
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < C; ++c) r[ids[i] * C + c] += g[int64_t(i) * C + c];
  return r;
}

struct AttentionRef {
  double scale = 0;
  bool causal = true;
  int64_t window = 0;
  double softcap = 0;
  std::vector<int64_t> doc_ids;  // [B, T] or empty
  int64_t q_offset = 0;
};

// q [B, T, H, D], k/v [B, S, KV, D]; query head h reads kv head h / (H / KV).
inline Array attention(const Array& q, const Array& k, const Array& v, const AttentionRef& o) {
  int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], D = q.shape[3], S = k.shape[1], KV = k.shape[2];
  int64_t G = H / KV;
  double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(D));
  Array r(q.shape);
  std::vector<double> s(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        int64_t kvh = h / G, qp = i + o.q_offset;
        double m = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          bool visible = (!o.causal || j <= qp) && (o.window <= 0 || qp - j < o.window) &&
                         (o.doc_ids.empty() || o.doc_ids[size_t(b * T + i)] == o.doc_ids[size_t(b * T + j)]);
          double d = 0;
          for (int64_t c = 0; c < D; ++c) d += q[((b * T + i) * H + h) * D + c] * k[((b * S + j) * KV + kvh) * D + c];
          d *= scale;
          if (o.softcap > 0) d = o.softcap * std::tanh(d / o.softcap);
          s[size_t(j)] = visible ? d : -kInf;
          m = std::max(m, s[size_t(j)]);
        }
        if (m == -kInf) continue;  // nothing visible: output 0
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - m));
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += s[size_t(j)] * v[((b * S + j) * KV + kvh) * D + c];
          r[((b * T + i) * H + h) * D + c] = acc / z;
        }
      }
  return r;
}

}  // namespace lmtune::ref
