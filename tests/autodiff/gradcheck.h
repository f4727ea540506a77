// Gradient checking: an op's vjp and jvp (computed in f32 by the library on the CPU) against central finite
// differences, in double precision, of the test's own double reference implementation (ops/reference.h).
// The reference is differentiated, not the library, so f32 rounding in the forward pass cannot hide a wrong
// derivative, and the step can be small (h = 1e-5: truncation ~1e-10, cancellation ~1e-11).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/autodiff.h"
#include "ops/op_test_util.h"

namespace lmtune::test {

using RefFn = std::function<std::vector<ref::Array>(const std::vector<ref::Array>&)>;

inline ref::Array axpy(const ref::Array& x, double a, const ref::Array& d) {
  ref::Array r = x;
  for (int64_t i = 0; i < r.size(); ++i) r[i] += a * d[i];
  return r;
}

inline Tensor random_like(const Shape& s, uint64_t seed, Device dev = Device::cpu(), DType dtype = DType::f32) {
  return Tensor::from_floats(random_values(numel(s), seed, 0.1f, 1.0f), s, dtype, dev);
}

// Checks f's forward values, vjp (against the finite-difference gradient of Σ <u, f_ref(x)>) and jvp (against
// the directional difference of f_ref along the tangents). All primals must be float tensors.
inline void check_gradients(const Fn& f, const RefFn& rf, const std::vector<Tensor>& primals, double tol = 1e-8,
                            uint64_t seed = 1) {
  const double h = 1e-5;
  std::vector<ref::Array> x;
  for (const auto& p : primals) x.push_back(ref::of(p));
  std::vector<ref::Array> y = rf(x);

  std::vector<Tensor> u;
  std::vector<ref::Array> ru;
  for (size_t k = 0; k < y.size(); ++k) {
    u.push_back(random_like(y[k].shape, seed * 100 + k));
    ru.push_back(ref::of(u.back()));
  }
  auto [outs, grads] = lmtune::vjp(f, primals, u);
  ASSERT_EQ(outs.size(), y.size());
  for (size_t k = 0; k < y.size(); ++k) EXPECT_TRUE(close(outs[k], y[k], 1e-10)) << "forward output " << k;

  auto loss = [&](const std::vector<ref::Array>& xs) {
    std::vector<ref::Array> ys = rf(xs);
    double s = 0;
    for (size_t k = 0; k < ys.size(); ++k)
      for (int64_t i = 0; i < ys[k].size(); ++i) s += ru[k][i] * ys[k][i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    ref::Array fd(x[i].shape);
    std::vector<ref::Array> xp = x;
    for (int64_t e = 0; e < x[i].size(); ++e) {
      xp[i][e] = x[i][e] + h;
      double lp = loss(xp);
      xp[i][e] = x[i][e] - h;
      double lm = loss(xp);
      xp[i][e] = x[i][e];
      fd[e] = (lp - lm) / (2 * h);
    }
    EXPECT_TRUE(close(grads[i], fd, tol)) << "vjp for input " << i;
  }

  std::vector<Tensor> v;
  std::vector<ref::Array> rv;
  for (size_t i = 0; i < x.size(); ++i) {
    v.push_back(random_like(x[i].shape, seed * 1000 + i));
    rv.push_back(ref::of(v.back()));
  }
  auto [outs2, tangents] = lmtune::jvp(f, primals, v);
  std::vector<ref::Array> xp, xm;
  for (size_t i = 0; i < x.size(); ++i) {
    xp.push_back(axpy(x[i], h, rv[i]));
    xm.push_back(axpy(x[i], -h, rv[i]));
  }
  std::vector<ref::Array> yp = rf(xp), ym = rf(xm);
  for (size_t k = 0; k < y.size(); ++k) {
    ref::Array fd(y[k].shape);
    for (int64_t e = 0; e < fd.size(); ++e) fd[e] = (yp[k][e] - ym[k][e]) / (2 * h);
    EXPECT_TRUE(close(tangents[k], fd, tol)) << "jvp for output " << k;
  }
}

// Single-input, single-output shorthand.
inline void check_gradients1(const std::function<Tensor(const Tensor&)>& f,
                             const std::function<ref::Array(const ref::Array&)>& rf, const Tensor& x,
                             double tol = 1e-8) {
  check_gradients([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; },
                  [&](const std::vector<ref::Array>& in) { return std::vector<ref::Array>{rf(in[0])}; }, {x}, tol);
}

inline Tensor f32_input(const Shape& s, uint64_t seed, Layout l = Layout::contiguous, float lo = 0.1f, float hi = 1.0f,
                        bool positive = false) {
  return make_input(s, DType::f32, Device::cpu(), seed, l, lo, hi, positive);
}

inline double dot(const Tensor& a, const Tensor& b) {
  auto x = a.to_doubles(), y = b.to_doubles();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

struct DotProducts {
  double forward = 0, reverse = 0, fd = 0;  // <J v, u>, <v, Jᵀ u>, d/dε <u, f_ref(x + ε v)>
};

// Checks <J v, u> == <v, Jᵀ u> (f32 autodiff on the primals' device, both ways) and that both match
// d/dε <u, f_ref(x + ε v)>. u and v come from fixed seeds, so every device sees the same directions.
inline DotProducts check_dot_product_identity(const Fn& f, const RefFn& rf, const std::vector<Tensor>& primals) {
  Device dev = primals.at(0).device();
  std::vector<Tensor> v;
  std::vector<ref::Array> x, rv;
  for (size_t i = 0; i < primals.size(); ++i) {
    v.push_back(random_like(primals[i].shape(), 500 + i, dev));
    x.push_back(ref::of(primals[i]));
    rv.push_back(ref::of(v.back()));
  }
  auto [o1, jv] = lmtune::jvp(f, primals, v);
  std::vector<Tensor> u;
  for (size_t k = 0; k < o1.size(); ++k) u.push_back(random_like(o1[k].shape(), 600 + k, dev));
  auto [o2, jtu] = lmtune::vjp(f, primals, u);
  DotProducts d;
  for (size_t k = 0; k < u.size(); ++k) d.forward += dot(jv[k], u[k]);
  for (size_t i = 0; i < v.size(); ++i) d.reverse += dot(v[i], jtu[i]);

  const double h = 1e-5;
  std::vector<ref::Array> xp, xm;
  for (size_t i = 0; i < x.size(); ++i) {
    xp.push_back(axpy(x[i], h, rv[i]));
    xm.push_back(axpy(x[i], -h, rv[i]));
  }
  auto yp = rf(xp), ym = rf(xm);
  for (size_t k = 0; k < u.size(); ++k) {
    ref::Array ru = ref::of(u[k]);
    for (int64_t e = 0; e < ru.size(); ++e) d.fd += ru[e] * (yp[k][e] - ym[k][e]) / (2 * h);
  }
  std::cout << "    [" << dev.str() << "] <Jv,u> = " << d.forward << "  <v,J^T u> = " << d.reverse
            << "  finite difference = " << d.fd << "\n";
  EXPECT_NEAR(d.forward, d.reverse, 1e-5 * std::abs(d.fd));
  EXPECT_NEAR(d.forward, d.fd, 1e-4 * std::abs(d.fd));
  EXPECT_NEAR(d.reverse, d.fd, 1e-4 * std::abs(d.fd));
  return d;
}

}  // namespace lmtune::test
