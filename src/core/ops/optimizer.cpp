// Optimizer update ops: argument checks, then the in-place kernel on the parameter's device.
#include "core/ops/optimizer.h"

#include "core/error.h"
#include "core/ops.h"

namespace lmtune {
namespace {

void check_same(const Tensor& p, const Tensor& t, const char* what, const char* op) {
  if (!t.defined()) return;
  if (t.shape() != p.shape())
    throw ShapeError(std::string(op) + ": " + what + " has shape " + to_string(t.shape()) + ", parameter has " +
                     to_string(p.shape()));
  if (t.device() != p.device())
    throw ShapeError(std::string(op) + ": " + what + " is on " + t.device().str() + ", parameter on " + p.device().str());
  if (std::string(what) != "grad" && (t.dtype() != DType::f32 || !t.is_contiguous()))
    throw ShapeError(std::string(op) + ": " + what + " must be a contiguous f32 tensor");
}

void run(Primitive& prim, const std::vector<Tensor>& in) {
  std::vector<Tensor> none;
  eval_on(in[0].device(), prim, in, none);
}

}  // namespace

namespace ops {

Tensor sum_of_squares(const std::vector<Tensor>& xs, int max_buffers) {
  if (xs.empty()) throw ShapeError("sum_of_squares: no tensors");
  if (max_buffers < 1 || max_buffers > 8) throw ShapeError("sum_of_squares: max_buffers must be in [1, 8]");
  std::vector<Tensor> in;
  for (const Tensor& x : xs) {
    if (!is_float(x.dtype()))
      throw ShapeError("sum_of_squares: " + std::string(dtype_name(x.dtype())) + " tensor " + to_string(x.shape()));
    if (x.device() != xs[0].device())
      throw ShapeError("sum_of_squares: tensors on " + x.device().str() + " and " + xs[0].device().str());
    in.push_back(x.is_contiguous() ? x : contiguous(x));
  }
  return apply1(std::make_shared<SumOfSquares>(max_buffers), in, {Shape{}, DType::f32});
}

void adamw_update(const Tensor& param, const Tensor& m, const Tensor& v, const Tensor& grad, const Tensor& hyper) {
  check_same(param, param, "parameter", "adamw_update");
  check_same(param, m, "m", "adamw_update");
  check_same(param, v, "v", "adamw_update");
  check_same(param, grad, "grad", "adamw_update");
  if (hyper.numel() != kOptimHyperSize || hyper.dtype() != DType::f32)
    throw ShapeError("adamw_update: hyper-parameters must be f32 [" + std::to_string(kOptimHyperSize) + "]");
  AdamWUpdate prim;
  run(prim, {param, m, v, grad.is_contiguous() ? grad : contiguous(grad), hyper});
}

void sgd_update(const Tensor& param, const Tensor& momentum, const Tensor& grad, const Tensor& hyper) {
  check_same(param, param, "parameter", "sgd_update");
  check_same(param, momentum, "momentum", "sgd_update");
  check_same(param, grad, "grad", "sgd_update");
  if (hyper.numel() != kOptimHyperSize || hyper.dtype() != DType::f32)
    throw ShapeError("sgd_update: hyper-parameters must be f32 [" + std::to_string(kOptimHyperSize) + "]");
  SgdUpdate prim;
  run(prim, {param, momentum, grad.is_contiguous() ? grad : contiguous(grad), hyper});
}

}  // namespace ops
}  // namespace lmtune
