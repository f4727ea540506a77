// CPU kernels for reductions and top-k: the reduced axis is moved last (a view), then each row is reduced.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/reduce.h"

namespace lmtune {
namespace {

// A view of t with `axis` moved to the end.
Tensor axis_last(const Tensor& t, int axis) {
  Shape s = t.shape();
  Strides st = t.strides();
  int64_t d = s[axis], ds = st[axis];
  s.erase(s.begin() + axis);
  st.erase(st.begin() + axis);
  s.push_back(d);
  st.push_back(ds);
  return t.view_as(s, st, t.offset());
}

}  // namespace

void Reduce::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor x = axis_last(in[0], axis);
  Tensor y = axis_last(out[0], axis);
  Strides ys = y.strides();
  ys.back() = 0;
  char *xp = cpu::base_ptr(x), *yp = cpu::base_ptr(y);
  size_t xe = dtype_size(x.dtype()), ye = dtype_size(y.dtype());
  const ReduceOp kind = op;
  cpu::for_each_row(x.shape(), {x.strides(), ys}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    cpu::load_row(xp + o[0] * xe, x.dtype(), s[0], n, v.data());
    float r = 0;
    switch (kind) {
      case ReduceOp::sum: {
        double acc = 0;
        for (float f : v) acc += f;
        r = float(acc);
        break;
      }
      case ReduceOp::max:
        r = n ? *std::max_element(v.begin(), v.end()) : -std::numeric_limits<float>::infinity();
        break;
      case ReduceOp::logsumexp: {
        float m = n ? *std::max_element(v.begin(), v.end()) : -std::numeric_limits<float>::infinity();
        if (!std::isfinite(m)) { r = m; break; }
        double acc = 0;
        for (float f : v) acc += std::exp(double(f) - m);
        r = float(m + std::log(acc));
        break;
      }
      case ReduceOp::argmax:
        r = float(std::max_element(v.begin(), v.end()) - v.begin());  // first maximum
        break;
    }
    cpu::store_row(yp + o[1] * ye, y.dtype(), 1, 1, &r);
  });
}

void TopK::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  char *xp = cpu::base_ptr(x), *vp = cpu::base_ptr(out[0]), *ip = cpu::base_ptr(out[1]);
  size_t xe = dtype_size(x.dtype()), ve = dtype_size(out[0].dtype());
  const int kk = k;
  cpu::for_each_row(x.shape(), {x.strides(), out[0].strides(), out[1].strides()},
                    [&](const int64_t* o, const int64_t* s, int64_t n) {
                      std::vector<float> v(static_cast<size_t>(n));
                      cpu::load_row(xp + o[0] * xe, x.dtype(), s[0], n, v.data());
                      std::vector<int32_t> idx(static_cast<size_t>(n));
                      std::iota(idx.begin(), idx.end(), 0);
                      std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), [&](int32_t a, int32_t b) {
                        return v[a] > v[b] || (v[a] == v[b] && a < b);
                      });
                      std::vector<float> vals(static_cast<size_t>(kk));
                      for (int i = 0; i < kk; ++i) vals[i] = v[idx[i]];
                      cpu::store_row(vp + o[1] * ve, out[0].dtype(), s[1], kk, vals.data());
                      auto* ids = reinterpret_cast<int32_t*>(ip) + o[2];
                      for (int i = 0; i < kk; ++i) ids[i * s[2]] = idx[i];
                    });
}

}  // namespace lmtune
