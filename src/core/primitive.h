// A primitive is one differentiable operation: its kernels on each backend (eval_cpu in src/backend/cpu,
// eval_vulkan in src/backend/vulkan) and its vjp/jvp, written with other ops so they run on every backend.
// Op functions (core/ops.h) check shapes, allocate outputs and call apply(); see docs/architecture.md.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace lmtune {

struct Node;

class Primitive {
 public:
  virtual ~Primitive() = default;
  virtual const char* name() const = 0;
  // Fill `outputs` (allocated with their final shapes and dtypes) from `inputs` (all on one device).
  virtual void eval_cpu(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) = 0;
  virtual void eval_vulkan(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) = 0;

  // Whether vjp/jvp are defined. Recording an op without a vjp on a tensor that requires grad fails at once.
  virtual bool has_vjp() const { return false; }
  virtual bool has_jvp() const { return false; }
  // Which saved values the vjp reads; the rest are released when the forward pass returns.
  virtual bool vjp_needs_inputs() const { return true; }
  virtual bool vjp_needs_outputs() const { return false; }
  // Inside a checkpointed segment's recomputation the segment's results carry only cotangents, so the ops that end
  // it (a decoder layer's down projection and residual add) need not run. There apply defers the kernels of an op
  // that allows it until something reads one of its outputs, and drops them when nothing does (see
  // core/autodiff.h). Allowed only where the vjp reads no outputs; what else it reads (LoRA's s x Aᵀ), the op makes
  // in prepare_vjp, which apply then runs in place of the kernels.
  virtual bool may_defer() const { return false; }
  virtual void prepare_vjp(const std::vector<Tensor>& inputs) { (void)inputs; }

  // Reverse mode: cotangents of the inputs for which wanted[i] is true (others may be left undefined),
  // given the cotangents of the outputs (an undefined cotangent means zero). Runs with gradient recording off.
  virtual std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cotangents,
                                  const std::vector<bool>& wanted);
  // vjp where input i has already collected the gradient into[i] in this backward pass (undefined where it has
  // none, or where other tensors share its memory): a primitive may add its gradient for input i into into[i] in
  // place (its kernel reads it, saving an add pass: RmsNorm), return into[i] there and set added[i]. The default
  // runs vjp (the backward pass then adds).
  virtual std::vector<Tensor> vjp_into(const Node& node, const std::vector<Tensor>& cotangents,
                                       const std::vector<bool>& wanted, const std::vector<Tensor>& into,
                                       std::vector<bool>& added);
  // Forward mode: tangents of the outputs given tangents of the inputs (undefined = zero).
  virtual std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& tangents);
};

// What most primitives declare, in one line each (MLX's DEFINE_GRADS is the model): the kernels on each backend
// (eval_cpu in src/backend/cpu, eval_vulkan in src/backend/vulkan), and vjp and jvp with their has_ flags.
#define LMTUNE_PRIMITIVE_EVAL()                                                      \
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override; \
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override
#define LMTUNE_PRIMITIVE_VJP_JVP()                                                                               \
  bool has_vjp() const override { return true; }                                                               \
  bool has_jvp() const override { return true; }                                                               \
  std::vector<Tensor> vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) \
      override;                                                                                                \
  std::vector<Tensor> jvp(const Node& node, const std::vector<Tensor>& t) override

struct OutputSpec {
  Shape shape;
  DType dtype;
};

// Runs a primitive: allocates its outputs on the inputs' device, evaluates it there, and records it for
// autodiff when gradient recording is on and an input requires grad. Throws ShapeError if inputs are on
// different devices.
std::vector<Tensor> apply(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                          const std::vector<OutputSpec>& outputs);
Tensor apply1(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs, const OutputSpec& output);
// Evaluates a primitive on `device` (its eval_cpu or eval_vulkan) into outputs the caller allocated: no
// recording, for kernels that write into existing tensors (in-place updates, copies into views, a product
// straight into a primitive's own output).
void eval_on(const Device& device, Primitive& prim, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs);
// Records already-computed outputs (views that alias an input) without evaluating anything.
std::vector<Tensor> record(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                           std::vector<Tensor> outputs);

}  // namespace lmtune
