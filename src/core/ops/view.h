// Layout primitives: views that alias their input (reshape, permute, slice, expand), the strided copy that
// also casts dtypes (contiguous, cast, copy_into), and concat. Kernels: backend/{cpu,vulkan}/copy.cpp.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Views: never evaluated (outputs alias the input); only their vjp/jvp matter.
class ViewPrimitive : public Primitive {
 public:
  void eval_cpu(const std::vector<Tensor>&, std::vector<Tensor>&) override {}
  void eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) override {}
  bool has_vjp() const override { return true; }
  bool has_jvp() const override { return true; }
  bool vjp_needs_inputs() const override { return false; }
  std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& t) override;
  // The same view applied to another tensor of the input's shape.
  virtual Tensor apply_to(const Tensor& x) const = 0;
};

class Reshape final : public ViewPrimitive {
 public:
  explicit Reshape(Shape shape) : shape(std::move(shape)) {}
  const char* name() const override { return "reshape"; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  Tensor apply_to(const Tensor& x) const override;
  Shape shape;
};

class Permute final : public ViewPrimitive {
 public:
  explicit Permute(std::vector<int> axes) : axes(std::move(axes)) {}
  const char* name() const override { return "permute"; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  Tensor apply_to(const Tensor& x) const override;
  std::vector<int> axes;
};

class Slice final : public ViewPrimitive {
 public:
  Slice(int axis, int64_t start, int64_t end, int64_t step) : axis(axis), start(start), end(end), step(step) {}
  const char* name() const override { return "slice"; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  Tensor apply_to(const Tensor& x) const override;
  int axis;
  int64_t start, end, step;
};

class Expand final : public ViewPrimitive {
 public:
  explicit Expand(Shape shape) : shape(std::move(shape)) {}
  const char* name() const override { return "expand"; }
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) override;
  Tensor apply_to(const Tensor& x) const override;
  Shape shape;
};

// out = in, element by element in logical order, converting dtype; either side may be strided.
class Copy final : public Primitive {
 public:
  const char* name() const override { return "copy"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return false; }
};

class Concat final : public Primitive {
 public:
  explicit Concat(int axis) : axis(axis) {}
  const char* name() const override { return "concat"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return false; }
  int axis;
};

// Writes src into the existing (possibly strided) tensor dst, converting dtype. Not recorded for autodiff:
// for kernels and vjps that assemble results in place.
void copy_into(const Tensor& dst, const Tensor& src);

}  // namespace lmtune
