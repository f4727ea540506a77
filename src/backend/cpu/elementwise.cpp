// CPU kernels for elementwise ops (and the fused gated activation): rows are converted to f32, computed, and converted back.
#include <cmath>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/elementwise.h"

namespace lmtune {
namespace {

float apply_unary(UnaryOp op, float x, float p) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1.0f / std::sqrt(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case UnaryOp::silu: return x / (1.0f + std::exp(-x));
    case UnaryOp::gelu_tanh:
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case UnaryOp::gelu_erf: return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
    case UnaryOp::erf: return std::erf(x);
    case UnaryOp::scale: return p * x;
    case UnaryOp::add_scalar: return x + p;
  }
  return x;
}

// d act(x) / dx for the gate activations (the formulas of Unary::derivative, in f32).
float gate_derivative(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::silu: {  // s (1 + x (1 - s))
      float s = 1.0f / (1.0f + std::exp(-x));
      return s * (1.0f + x * (1.0f - s));
    }
    case UnaryOp::gelu_tanh: {  // 0.5 (1 + t) + 0.5 x (1 - t²) c (1 + 3·0.044715 x²)
      const float c = 0.7978845608028654f;
      float t = std::tanh(c * (x + 0.044715f * x * x * x));
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
    }
    case UnaryOp::gelu_erf:  // Φ(x) + x φ(x)
      return 0.5f * (1.0f + std::erf(x * 0.7071067811865476f)) +
             x * 0.3989422804014327f * std::exp(-0.5f * x * x);
    default: return 0.0f;  // not a gate activation (ops::gated_activation admits only the three above)
  }
}

float apply_binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return a >= b ? a : b;
    case BinaryOp::greater_equal: return a >= b ? 1.0f : 0.0f;
  }
  return a;
}

// The switch sits outside the loop so each loop is a simple, vectorizable kernel.
void apply_unary_row(UnaryOp op, float* v, int64_t n, float p) {
  switch (op) {
    case UnaryOp::neg: for (int64_t i = 0; i < n; ++i) v[i] = -v[i]; return;
    case UnaryOp::square: for (int64_t i = 0; i < n; ++i) v[i] = v[i] * v[i]; return;
    case UnaryOp::scale: for (int64_t i = 0; i < n; ++i) v[i] = p * v[i]; return;
    case UnaryOp::add_scalar: for (int64_t i = 0; i < n; ++i) v[i] = v[i] + p; return;
    default: for (int64_t i = 0; i < n; ++i) v[i] = apply_unary(op, v[i], p); return;
  }
}

void apply_binary_row(BinaryOp op, float* a, const float* b, int64_t n) {
  switch (op) {
    case BinaryOp::add: for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i]; return;
    case BinaryOp::sub: for (int64_t i = 0; i < n; ++i) a[i] = a[i] - b[i]; return;
    case BinaryOp::mul: for (int64_t i = 0; i < n; ++i) a[i] = a[i] * b[i]; return;
    case BinaryOp::div: for (int64_t i = 0; i < n; ++i) a[i] = a[i] / b[i]; return;
    default: for (int64_t i = 0; i < n; ++i) a[i] = apply_binary(op, a[i], b[i]); return;
  }
}

}  // namespace

void Unary::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  Tensor& y = out[0];
  char* xp = cpu::base_ptr(x);
  char* yp = cpu::base_ptr(y);
  size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
  cpu::for_each_span(x.shape(), {x.strides(), y.strides()}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    float* buf = cpu::scratch(0, n);
    cpu::load_row(xp + o[0] * xs, x.dtype(), s[0], n, buf);
    apply_unary_row(op, buf, n, param);
    cpu::store_row(yp + o[1] * ys, y.dtype(), s[1], n, buf);
  });
}

void Binary::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& y = out[0];
  Tensor a = broadcast_view(in[0], y.shape());
  Tensor b = broadcast_view(in[1], y.shape());
  char *ap = cpu::base_ptr(a), *bp = cpu::base_ptr(b), *yp = cpu::base_ptr(y);
  size_t es = dtype_size(a.dtype()), ys = dtype_size(y.dtype());
  cpu::for_each_span(y.shape(), {a.strides(), b.strides(), y.strides()},
                    [&](const int64_t* o, const int64_t* s, int64_t n) {
                      float* va = cpu::scratch(0, n);
                      float* vb = cpu::scratch(1, n);
                      cpu::load_row(ap + o[0] * es, a.dtype(), s[0], n, va);
                      cpu::load_row(bp + o[1] * es, b.dtype(), s[1], n, vb);
                      apply_binary_row(op, va, vb, n);
                      cpu::store_row(yp + o[2] * ys, y.dtype(), s[2], n, va);
                    });
}

// y = act(gate) * up, one pass over the (possibly strided) inputs.
void GatedActivation::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &gate = in[0], &up = in[1];
  Tensor& y = out[0];
  char *gp = cpu::base_ptr(gate), *up_p = cpu::base_ptr(up), *yp = cpu::base_ptr(y);
  size_t gs = dtype_size(gate.dtype()), us = dtype_size(up.dtype()), ys = dtype_size(y.dtype());
  cpu::for_each_span(y.shape(), {gate.strides(), up.strides(), y.strides()},
                    [&](const int64_t* o, const int64_t* s, int64_t n) {
                      float* vg = cpu::scratch(0, n);
                      float* vu = cpu::scratch(1, n);
                      cpu::load_row(gp + o[0] * gs, gate.dtype(), s[0], n, vg);
                      cpu::load_row(up_p + o[1] * us, up.dtype(), s[1], n, vu);
                      for (int64_t i = 0; i < n; ++i) vg[i] = apply_unary(act, vg[i], 0) * vu[i];
                      cpu::store_row(yp + o[2] * ys, y.dtype(), s[2], n, vg);
                    });
}

// d_gate = g * up * act'(gate), d_up = g * act(gate), both from one read of gate, up and g.
void GatedActivationBackward::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &gate = in[0], &up = in[1], &g = in[2];
  Tensor &d_gate = out[0], &d_up = out[1];
  const Tensor* t[5] = {&gate, &up, &g, &d_gate, &d_up};
  char* p[5];
  size_t es[5];
  for (int k = 0; k < 5; ++k) {
    p[k] = cpu::base_ptr(*t[k]);
    es[k] = dtype_size(t[k]->dtype());
  }
  cpu::for_each_span(gate.shape(), {gate.strides(), up.strides(), g.strides(), d_gate.strides(), d_up.strides()},
                    [&](const int64_t* o, const int64_t* s, int64_t n) {
                      float* vx = cpu::scratch(0, n);
                      float* vu = cpu::scratch(1, n);
                      float* vg = cpu::scratch(2, n);
                      for (int k = 0; k < 3; ++k)
                        cpu::load_row(p[k] + o[k] * es[k], t[k]->dtype(), s[k], n, k == 0 ? vx : k == 1 ? vu : vg);
                      for (int64_t i = 0; i < n; ++i) {
                        float x = vx[i];
                        vx[i] = vg[i] * vu[i] * gate_derivative(act, x);
                        vu[i] = vg[i] * apply_unary(act, x, 0);
                      }
                      cpu::store_row(p[3] + o[3] * es[3], d_gate.dtype(), s[3], n, vx);
                      cpu::store_row(p[4] + o[4] * es[4], d_up.dtype(), s[4], n, vu);
                    });
}

void Where::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& y = out[0];
  Tensor c = broadcast_view(in[0], y.shape());
  Tensor a = broadcast_view(in[1], y.shape());
  Tensor b = broadcast_view(in[2], y.shape());
  char *cp = cpu::base_ptr(c), *ap = cpu::base_ptr(a), *bp = cpu::base_ptr(b), *yp = cpu::base_ptr(y);
  size_t cs = dtype_size(c.dtype()), es = dtype_size(a.dtype());
  cpu::for_each_span(y.shape(), {c.strides(), a.strides(), b.strides(), y.strides()},
                    [&](const int64_t* o, const int64_t* s, int64_t n) {
                      float* vc = cpu::scratch(0, n);
                      float* va = cpu::scratch(1, n);
                      float* vb = cpu::scratch(2, n);
                      cpu::load_row(cp + o[0] * cs, c.dtype(), s[0], n, vc);
                      cpu::load_row(ap + o[1] * es, a.dtype(), s[1], n, va);
                      cpu::load_row(bp + o[2] * es, b.dtype(), s[2], n, vb);
                      for (int64_t i = 0; i < n; ++i) va[i] = vc[i] != 0.0f ? va[i] : vb[i];
                      cpu::store_row(yp + o[3] * es, y.dtype(), s[3], n, va);
                    });
}

}  // namespace lmtune
