// Elementwise primitives: unary maps, broadcasting binary ops, where, and the fused gated activation. Kernels:
// backend/{cpu,vulkan}/elementwise.cpp.
#pragma once
#include "core/ops.h"
#include "core/primitive.h"

namespace lmtune {

enum class UnaryOp : int {
  neg, exp, log, sqrt, rsqrt, square, tanh, sigmoid, silu, gelu_tanh, gelu_erf, erf, scale, add_scalar
};
enum class BinaryOp : int { add, sub, mul, div, maximum, greater_equal };  // greater_equal: 1/0, no vjp

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);

// y = f(x) elementwise; `param` is the scalar of scale/add_scalar.
class Unary final : public Primitive {
 public:
  Unary(UnaryOp op, float param = 0) : op(op), param(param) {}
  const char* name() const override { return unary_op_name(op); }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override;
  bool vjp_needs_outputs() const override;
  bool may_defer() const override { return !vjp_needs_outputs(); }
  // dy/dx as a tensor, from the saved input x and output y.
  Tensor derivative(const Tensor& x, const Tensor& y) const;

  UnaryOp op;
  float param;
};

// out = a (op) b with numpy broadcasting; inputs keep their own shapes, kernels broadcast by stride 0.
class Binary final : public Primitive {
 public:
  explicit Binary(BinaryOp op) : op(op) {}
  const char* name() const override { return binary_op_name(op); }
  LMTUNE_PRIMITIVE_EVAL();
  bool has_vjp() const override { return op != BinaryOp::greater_equal; }
  bool has_jvp() const override { return op != BinaryOp::greater_equal; }
  bool vjp_needs_inputs() const override { return op != BinaryOp::add && op != BinaryOp::sub; }
  bool may_defer() const override { return true; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& tangents) override;

  BinaryOp op;
};

// out = cond != 0 ? a : b, all three broadcast to out's shape.
class Where final : public Primitive {
 public:
  const char* name() const override { return "where"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
};

// out = act(gate) * up for act one of silu, gelu_tanh, gelu_erf (the UnaryOp code, shared with the kernels).
// Inputs gate, up of one shape and dtype; vjp: GatedActivationBackward on the saved inputs (act(gate) is not
// saved); jvp: that kernel for the gate's tangent plus gated_activation(gate, t_up).
class GatedActivation final : public Primitive {
 public:
  explicit GatedActivation(UnaryOp act) : act(act) {}
  const char* name() const override { return "gated_activation"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();

  UnaryOp act;
};

// Inputs gate, up, g (one shape, any float dtypes); outputs d_gate = g * up * act'(gate) (gate's dtype) and
// d_up = g * act(gate) (up's dtype), in one pass. Not differentiable itself.
class GatedActivationBackward final : public Primitive {
 public:
  explicit GatedActivationBackward(UnaryOp act) : act(act) {}
  const char* name() const override { return "gated_activation_backward"; }
  LMTUNE_PRIMITIVE_EVAL();

  UnaryOp act;
};

namespace ops {
// The UnaryOp code of a gate activation (the kernels' `op`).
UnaryOp gate_unary_op(GateActivation act);
}  // namespace ops

// A view of `t` broadcast to `shape` (stride 0 on broadcast axes), for kernels.
Tensor broadcast_view(const Tensor& t, const Shape& shape);

}  // namespace lmtune
