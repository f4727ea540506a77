// Reductions over one axis (sum, max, logsumexp, argmax) and top-k. The kernel output keeps the reduced axis
// with size 1; op functions drop it unless keepdims. Kernels: backend/{cpu,vulkan}/reduce.cpp.
#pragma once
#include "core/primitive.h"

namespace lmtune {

enum class ReduceOp : int { sum, max, logsumexp, argmax };

class Reduce final : public Primitive {
 public:
  Reduce(ReduceOp op, int axis) : op(op), axis(axis) {}
  const char* name() const override;
  LMTUNE_PRIMITIVE_EVAL();
  bool has_vjp() const override { return op != ReduceOp::argmax; }
  bool has_jvp() const override { return op != ReduceOp::argmax; }
  bool vjp_needs_inputs() const override { return op != ReduceOp::sum; }
  bool vjp_needs_outputs() const override { return op != ReduceOp::sum; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& t) override;

  ReduceOp op;
  int axis;
};

// k largest along the last axis, sorted descending (ties: lower index first): values and i32 indices.
// Its vjp scatters the values' cotangent back to the chosen positions.
class TopK final : public Primitive {
 public:
  explicit TopK(int k) : k(k) {}
  const char* name() const override { return "topk"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_outputs() const override { return true; }
  int k;
};

}  // namespace lmtune
