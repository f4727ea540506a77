// Elementwise ops: shape/dtype checks, and their vjp/jvp written with other ops.
#include "core/ops/elementwise.h"

#include <cmath>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune {

const char* unary_op_name(UnaryOp op) {
  static const char* names[] = {"neg",     "exp",  "log",       "sqrt",     "rsqrt", "square",    "tanh",
                                "sigmoid", "silu", "gelu_tanh", "gelu_erf", "erf",   "scale",     "add_scalar"};
  return names[int(op)];
}

const char* binary_op_name(BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "greater_equal"};
  return names[int(op)];
}

Tensor broadcast_view(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return t;
  int n = int(shape.size()), k = t.ndim();
  if (k > n) throw ShapeError("cannot broadcast " + to_string(t.shape()) + " to " + to_string(shape));
  Strides st(n, 0);
  for (int i = 0; i < k; ++i) {
    int64_t d = t.shape()[i];
    int j = n - k + i;
    if (d == shape[j])
      st[j] = t.strides()[i];
    else if (d != 1)
      throw ShapeError("cannot broadcast " + to_string(t.shape()) + " to " + to_string(shape));
  }
  return t.view_as(shape, st, t.offset());
}

namespace {

void require_float(const Tensor& x, const char* op) {
  if (!is_float(x.dtype())) throw ShapeError(std::string(op) + ": expected a float tensor, got i32");
}

Tensor unary(UnaryOp op, const Tensor& x, float param = 0) {
  require_float(x, unary_op_name(op));
  return apply1(std::make_shared<Unary>(op, param), {x}, {x.shape(), x.dtype()});
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  if (a.dtype() != b.dtype())
    throw ShapeError(std::string(name) + ": dtypes differ (" + std::string(dtype_name(a.dtype())) + " " +
                     to_string(a.shape()) + " and " + std::string(dtype_name(b.dtype())) + " " + to_string(b.shape()) + ")");
  Shape out = broadcast_shapes(a.shape(), b.shape(), name);
  return apply1(std::make_shared<Binary>(op), {a, b}, {out, a.dtype()});
}


}  // namespace

// ---- unary ----

bool Unary::vjp_needs_inputs() const {
  switch (op) {
    case UnaryOp::log: case UnaryOp::square: case UnaryOp::silu: case UnaryOp::gelu_tanh: case UnaryOp::gelu_erf:
    case UnaryOp::erf:
      return true;
    default:
      return false;
  }
}

bool Unary::vjp_needs_outputs() const {
  switch (op) {
    case UnaryOp::exp: case UnaryOp::sqrt: case UnaryOp::rsqrt: case UnaryOp::tanh: case UnaryOp::sigmoid:
      return true;
    default:
      return false;
  }
}

Tensor Unary::derivative(const Tensor& x, const Tensor& y) const {
  using namespace ops;
  switch (op) {
    case UnaryOp::exp: return y;
    case UnaryOp::log: return div(Tensor::full({}, 1.0f, x.dtype(), x.device()), x);
    case UnaryOp::sqrt: return div(Tensor::full({}, 0.5f, y.dtype(), y.device()), y);
    case UnaryOp::rsqrt: return scale(mul(y, square(y)), -0.5f);
    case UnaryOp::square: return scale(x, 2.0f);
    case UnaryOp::tanh: return add_scalar(neg(square(y)), 1.0f);
    case UnaryOp::sigmoid: return mul(y, add_scalar(neg(y), 1.0f));
    case UnaryOp::silu: {  // s (1 + x (1 - s))
      Tensor s = sigmoid(x);
      return mul(s, add_scalar(mul(x, add_scalar(neg(s), 1.0f)), 1.0f));
    }
    case UnaryOp::gelu_tanh: {  // 0.5 (1 + t) + 0.5 x (1 - t²) c (1 + 3·0.044715 x²), t = tanh(c (x + 0.044715 x³))
      const float c = 0.7978845608028654f;
      Tensor x2 = square(x);
      Tensor t = tanh(scale(mul(x, add_scalar(scale(x2, 0.044715f), 1.0f)), c));
      Tensor left = scale(add_scalar(t, 1.0f), 0.5f);
      Tensor right = mul(scale(mul(x, add_scalar(neg(square(t)), 1.0f)), 0.5f * c),
                         add_scalar(scale(x2, 3.0f * 0.044715f), 1.0f));
      return add(left, right);
    }
    case UnaryOp::gelu_erf: {  // Φ(x) + x φ(x), Φ(x) = 0.5 (1 + erf(x / √2)), φ the normal density
      Tensor phi = add_scalar(scale(erf(scale(x, 0.7071067811865476f)), 0.5f), 0.5f);
      Tensor pdf = scale(exp(scale(square(x), -0.5f)), 0.3989422804014327f);
      return add(phi, mul(x, pdf));
    }
    case UnaryOp::erf:  // 2/√π exp(-x²)
      return scale(exp(neg(square(x))), 1.1283791670955126f);
    case UnaryOp::neg: return Tensor::full({}, -1.0f, x.dtype(), x.device());
    case UnaryOp::scale: return Tensor::full({}, param, x.dtype(), x.device());
    case UnaryOp::add_scalar: return Tensor::full({}, 1.0f, x.dtype(), x.device());
  }
  throw AutodiffError("no derivative for unary op");
}

std::vector<Tensor> Unary::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor()};
  if (op == UnaryOp::neg) return {ops::neg(g)};
  if (op == UnaryOp::scale) return {ops::scale(g, param)};
  if (op == UnaryOp::add_scalar) return {g};
  return {ops::mul(g, derivative(node.inputs[0], node.outputs[0]))};
}

std::vector<Tensor> Unary::jvp(const Node& node, const std::vector<Tensor>& t) {
  return vjp(node, t, {true});  // elementwise: the Jacobian is diagonal, so J t = Jᵀ t
}

// ---- binary ----

std::vector<Tensor> Binary::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor()};
  const Shape& sa = node.input_shapes[0];
  const Shape& sb = node.input_shapes[1];
  const Tensor& a = node.inputs[0];
  const Tensor& b = node.inputs[1];
  Tensor ga, gb;
  switch (op) {
    case BinaryOp::add:
      if (wanted[0]) ga = sum_to_shape(g, sa);
      if (wanted[1]) gb = sum_to_shape(g, sb);
      break;
    case BinaryOp::sub:
      if (wanted[0]) ga = sum_to_shape(g, sa);
      if (wanted[1]) gb = sum_to_shape(neg(g), sb);
      break;
    case BinaryOp::mul:
      if (wanted[0]) ga = sum_to_shape(mul(g, b), sa);
      if (wanted[1]) gb = sum_to_shape(mul(g, a), sb);
      break;
    case BinaryOp::div: {
      Tensor gdb = div(g, b);
      if (wanted[0]) ga = sum_to_shape(gdb, sa);
      if (wanted[1]) gb = sum_to_shape(neg(div(mul(gdb, a), b)), sb);
      break;
    }
    case BinaryOp::maximum: {
      Tensor take_a = greater_equal(a, b);
      if (wanted[0]) ga = sum_to_shape(mul(g, take_a), sa);
      if (wanted[1]) gb = sum_to_shape(mul(g, add_scalar(neg(take_a), 1.0f)), sb);
      break;
    }
    case BinaryOp::greater_equal:
      break;
  }
  return {ga, gb};
}

std::vector<Tensor> Binary::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& a = node.inputs[0];
  const Tensor& b = node.inputs[1];
  const Shape& out = node.output_shapes[0];
  Tensor ta = t[0].defined() ? t[0] : Tensor::zeros({}, a.dtype(), a.device());
  Tensor tb = t[1].defined() ? t[1] : Tensor::zeros({}, b.dtype(), b.device());
  Tensor r;
  switch (op) {
    case BinaryOp::add: r = add(ta, tb); break;
    case BinaryOp::sub: r = sub(ta, tb); break;
    case BinaryOp::mul: r = add(mul(ta, b), mul(a, tb)); break;
    case BinaryOp::div: r = div(sub(ta, div(mul(a, tb), b)), b); break;
    case BinaryOp::maximum: r = where(greater_equal(a, b), ta, tb); break;
    case BinaryOp::greater_equal: break;
  }
  if (r.defined() && r.shape() != out) r = contiguous(expand(r, out));
  return {r};
}

// ---- where ----

std::vector<Tensor> Where::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
  const Tensor& cond = node.inputs[0];
  Tensor zero = Tensor::zeros({}, g.dtype(), g.device());
  Tensor ga, gb;
  if (wanted[1]) ga = sum_to_shape(where(cond, g, zero), node.input_shapes[1]);
  if (wanted[2]) gb = sum_to_shape(where(cond, zero, g), node.input_shapes[2]);
  return {Tensor(), ga, gb};
}

std::vector<Tensor> Where::jvp(const Node& node, const std::vector<Tensor>& t) {
  const Tensor& a = node.inputs[1];
  Tensor zero = Tensor::zeros({}, a.dtype(), a.device());
  Tensor r = ops::where(node.inputs[0], t[1].defined() ? t[1] : zero, t[2].defined() ? t[2] : zero);
  if (r.shape() != node.output_shapes[0]) r = ops::contiguous(ops::expand(r, node.output_shapes[0]));
  return {r};
}

// ---- gated activation ----

std::vector<Tensor> GatedActivation::vjp(const Node& node, const std::vector<Tensor>& cot,
                                         const std::vector<bool>& wanted) {
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor()};
  const Tensor& gate = node.inputs[0];
  const Tensor& up = node.inputs[1];
  std::vector<Tensor> grads = apply(std::make_shared<GatedActivationBackward>(act), {gate, up, g},
                                    {{gate.shape(), gate.dtype()}, {up.shape(), up.dtype()}});
  for (size_t i = 0; i < 2; ++i)
    if (!wanted[i]) grads[i] = Tensor();
  return grads;
}

std::vector<Tensor> GatedActivation::jvp(const Node& node, const std::vector<Tensor>& t) {
  // d(act(gate) up) = act'(gate) up t_gate + act(gate) t_up: the backward kernel's d_gate with g = t_gate, plus
  // the forward kernel applied to (gate, t_up).
  const Tensor& gate = node.inputs[0];
  const Tensor& up = node.inputs[1];
  Tensor r;
  if (t[0].defined())
    r = apply(std::make_shared<GatedActivationBackward>(act), {gate, up, t[0]},
              {{gate.shape(), gate.dtype()}, {up.shape(), up.dtype()}})[0];
  if (t[1].defined()) {
    Tensor from_up = apply1(std::make_shared<GatedActivation>(act), {gate, t[1]}, {gate.shape(), gate.dtype()});
    r = r.defined() ? ops::add(r, from_up) : from_up;
  }
  return {r};
}

// ---- op functions ----

namespace ops {

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return binary(BinaryOp::greater_equal, a, b); }
Tensor scale(const Tensor& x, float s) { return unary(UnaryOp::scale, x, s); }
Tensor add_scalar(const Tensor& x, float s) { return unary(UnaryOp::add_scalar, x, s); }
Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::square, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
Tensor silu(const Tensor& x) { return unary(UnaryOp::silu, x); }
Tensor gelu_tanh(const Tensor& x) { return unary(UnaryOp::gelu_tanh, x); }
Tensor gelu_erf(const Tensor& x) { return unary(UnaryOp::gelu_erf, x); }
Tensor erf(const Tensor& x) { return unary(UnaryOp::erf, x); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw ShapeError("where: dtypes of a and b differ (" + std::string(dtype_name(a.dtype())) + " and " +
                     std::string(dtype_name(b.dtype())) + ")");
  Shape out = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  return apply1(std::make_shared<Where>(), {cond, a, b}, {out, a.dtype()});
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  return where(mask, Tensor::full({}, value, x.dtype(), x.device()), x);
}

UnaryOp gate_unary_op(GateActivation act) {
  switch (act) {
    case GateActivation::silu: return UnaryOp::silu;
    case GateActivation::gelu_tanh: return UnaryOp::gelu_tanh;
    case GateActivation::gelu_erf: return UnaryOp::gelu_erf;
  }
  throw ShapeError("gated_activation: unknown activation " + std::to_string(int(act)));
}

Tensor gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) {
  UnaryOp op = gate_unary_op(act);
  require_float(gate, "gated_activation");
  if (gate.shape() != up.shape() || gate.dtype() != up.dtype())
    throw ShapeError("gated_activation: gate " + std::string(dtype_name(gate.dtype())) + " " + to_string(gate.shape()) +
                     " and up " + std::string(dtype_name(up.dtype())) + " " + to_string(up.shape()) +
                     " must have the same shape and dtype");
  return apply1(std::make_shared<GatedActivation>(op), {gate, up}, {gate.shape(), gate.dtype()});
}

Tensor gated_activation_reference(const Tensor& gate, const Tensor& up, GateActivation act) {
  return mul(unary(gate_unary_op(act), gate), up);
}

}  // namespace ops
}  // namespace lmtune
