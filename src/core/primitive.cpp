// Running primitives on their device and recording them for autodiff.
#include "core/primitive.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/tape.h"

namespace lmtune {

std::vector<Tensor> Primitive::vjp(const Node&, const std::vector<Tensor>&, const std::vector<bool>&) {
  throw AutodiffError(std::string("op '") + name() + "' has no vjp");
}

std::vector<Tensor> Primitive::vjp_into(const Node& node, const std::vector<Tensor>& cotangents,
                                        const std::vector<bool>& wanted, const std::vector<Tensor>&,
                                        std::vector<bool>&) {
  return vjp(node, cotangents, wanted);
}

std::vector<Tensor> Primitive::jvp(const Node&, const std::vector<Tensor>&) {
  throw AutodiffError(std::string("op '") + name() + "' has no jvp");
}

namespace {

Device common_device(const Primitive& prim, const std::vector<Tensor>& inputs) {
  Device d = default_device();
  bool first = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) throw ShapeError(std::string(prim.name()) + ": input " + std::to_string(i) + " is undefined");
    if (first) {
      d = inputs[i].device();
      first = false;
    } else if (inputs[i].device() != d) {
      throw ShapeError(std::string(prim.name()) + ": inputs are on different devices (" + d.str() + " and " +
                       inputs[i].device().str() + ")");
    }
  }
  return d;
}

}  // namespace

std::vector<Tensor> apply(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                          const std::vector<OutputSpec>& specs) {
  Device device = common_device(*prim, inputs);
  std::vector<Tensor> outputs;
  outputs.reserve(specs.size());
  for (const auto& s : specs) outputs.push_back(Tensor::empty(s.shape, s.dtype, device));
  if (tape::defer(prim, inputs, outputs)) return record(std::move(prim), inputs, std::move(outputs));
  {
    NoGrad no_grad;  // kernels that compose other ops must not record them
    eval_on(device, *prim, inputs, outputs);
  }
  return record(std::move(prim), inputs, std::move(outputs));
}

void eval_on(const Device& device, Primitive& prim, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  tape::read_by(inputs);
  tape::read_by(outputs);  // a kernel writing into a deferred op's output must come after it
  if (device.is_cpu())
    prim.eval_cpu(inputs, outputs);
  else
    prim.eval_vulkan(inputs, outputs);
}

Tensor apply1(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs, const OutputSpec& output) {
  return apply(std::move(prim), inputs, {output})[0];
}

std::vector<Tensor> record(std::shared_ptr<Primitive> prim, const std::vector<Tensor>& inputs,
                           std::vector<Tensor> outputs) {
  if (!grad_enabled()) return outputs;
  bool any = tape::force_record();
  for (const auto& t : inputs) any = any || on_tape(t);
  if (!any) return outputs;
  bool any_float_out = false;
  for (const auto& o : outputs) any_float_out = any_float_out || is_float(o.dtype());
  if (!any_float_out) return outputs;  // integer results (argmax, ...) carry no gradient
  if (!prim->has_vjp())
    throw AutodiffError(std::string("op '") + prim->name() +
                        "' has no vjp, but one of its inputs requires grad; it cannot be part of a differentiated "
                        "computation");
  auto node = std::make_shared<Node>();
  node->seq = tape::next_seq();
  bool save_all = tape::saving_everything();
  bool keep_in = save_all || prim->vjp_needs_inputs();
  bool keep_out = save_all || prim->vjp_needs_outputs();
  if (keep_in) tape::read_by(inputs);  // the vjp will read them
  for (const auto& t : inputs) {
    Edge e;
    if (t.impl()->node) {
      e.node = t.impl()->node;
      e.output_index = t.impl()->output_index;
    } else if (t.requires_grad()) {
      e.leaf = t.impl_ptr();
    }
    node->edges.push_back(std::move(e));
    node->input_shapes.push_back(t.shape());
    node->input_dtypes.push_back(t.dtype());
    node->inputs.push_back(keep_in ? t.detach() : Tensor());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    node->output_shapes.push_back(outputs[i].shape());
    node->output_dtypes.push_back(outputs[i].dtype());
    node->outputs.push_back(keep_out ? outputs[i].detach() : Tensor());
  }
  node->prim = std::move(prim);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!is_float(outputs[i].dtype())) continue;
    outputs[i].impl()->node = node;
    outputs[i].impl()->output_index = int(i);
    outputs[i].impl()->requires_grad = true;
  }
  return outputs;
}

}  // namespace lmtune
