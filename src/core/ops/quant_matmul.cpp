// Products with a block-quantized weight: shape checks, and the vjp/jvp written with the same products.
#include "core/ops/quant_matmul.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune {
namespace {

// x [..., K] with a unit column stride, as rows [M, K] (a copy only when the layout needs one).
Tensor as_rows(const Tensor& x) {
  Tensor r = ops::reshape(x, {-1, x.dim(-1)});
  return r.strides()[1] == 1 || r.dim(1) == 1 ? r : ops::contiguous(r);
}

Tensor product(const Tensor& x, const quant::QuantizedTensor& w, bool transposed, DType out_dtype,
               const char* op) {
  const int64_t k_in = transposed ? w.cols() : w.rows(), n_out = transposed ? w.rows() : w.cols();
  auto describe = [&] {
    return std::string(dtype_name(x.dtype())) + " x " + to_string(x.shape()) + " and " +
           std::string(quant::info(w.format).name) + " weight " + to_string(w.shape);
  };
  if (!w.defined()) throw ShapeError(std::string(op) + ": the quantized weight is undefined");
  if (!is_float(x.dtype()) || x.ndim() < 1 || x.dim(-1) != k_in)
    throw ShapeError(std::string(op) + ": input does not fit: " + describe() +
                     (transposed ? " (expected x [..., K] and W [N, K])" : " (expected x [..., N] and W [N, K])"));
  if (!is_float(out_dtype)) throw ShapeError(std::string(op) + ": the output dtype must be a float type");
  if (x.device() != w.device())
    throw ShapeError(std::string(op) + ": x is on " + x.device().str() + ", the weight on " + w.device().str());
  Shape out = x.shape();
  out.back() = n_out;
  Tensor y = apply1(std::make_shared<QuantizedMatmul>(w, transposed), {as_rows(x)},
                    {{numel(out) / std::max<int64_t>(n_out, 1), n_out}, out_dtype});
  return ops::reshape(y, out);
}

}  // namespace

// y = x W(ᵀ) is linear in x: dx = g Wᵀ(ᵀ), the other layout of the same weight, in x's dtype.
std::vector<Tensor> QuantizedMatmul::vjp(const Node& node, const std::vector<Tensor>& cot,
                                         const std::vector<bool>& wanted) {
  if (!cot[0].defined() || !wanted[0]) return {Tensor()};
  return {product(cot[0], weight, !transposed, node.input_dtypes[0], "quantized_matmul vjp")};
}

std::vector<Tensor> QuantizedMatmul::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  return {product(ops::cast(t[0], node.input_dtypes[0]), weight, transposed, node.output_dtypes[0],
                  "quantized_matmul jvp")};
}

namespace ops {

Tensor quantized_linear(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& bias) {
  Tensor y = product(x, weight, true, x.dtype(), "quantized_linear");
  if (bias.defined()) {
    if (bias.ndim() != 1 || bias.dim(0) != weight.rows())
      throw ShapeError("quantized_linear: bias " + to_string(bias.shape()) + " does not fit weight " +
                       to_string(weight.shape));
    y = add(y, cast(bias, y.dtype()));
  }
  return y;
}

Tensor quantized_matmul(const Tensor& x, const quant::QuantizedTensor& weight, DType out_dtype) {
  return product(x, weight, false, out_dtype, "quantized_matmul");
}

}  // namespace ops
}  // namespace lmtune
