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
               const char* op, const Tensor& addend = Tensor()) {
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
  const Shape rows{numel(out) / std::max<int64_t>(n_out, 1), n_out};
  std::vector<Tensor> in{as_rows(x)};
  if (addend.defined()) {
    if (addend.shape() != out || !is_float(addend.dtype()))
      throw ShapeError(std::string(op) + ": the addend " + std::string(dtype_name(addend.dtype())) + " " +
                       to_string(addend.shape()) + " does not fit the product " + to_string(out) + " of " +
                       describe());
    in.push_back(ops::reshape(addend, rows));
  }
  return ops::reshape(apply1(std::make_shared<QuantizedMatmul>(w, transposed), in, {rows, out_dtype}), out);
}

}  // namespace

// y = x W(ᵀ) (+ d) is linear in x: dx = g Wᵀ(ᵀ), the other layout of the same weight, in x's dtype; dd = g.
std::vector<Tensor> QuantizedMatmul::vjp(const Node& node, const std::vector<Tensor>& cot,
                                         const std::vector<bool>& wanted) {
  std::vector<Tensor> r(node.input_dtypes.size());
  if (!cot[0].defined()) return r;
  if (wanted[0]) r[0] = product(cot[0], weight, !transposed, node.input_dtypes[0], "quantized_matmul vjp");
  if (r.size() > 1 && wanted[1]) r[1] = ops::cast(cot[0], node.input_dtypes[1]);
  return r;
}

std::vector<Tensor> QuantizedMatmul::jvp(const Node& node, const std::vector<Tensor>& t) {
  Tensor r;
  if (t[0].defined())
    r = product(ops::cast(t[0], node.input_dtypes[0]), weight, transposed, node.output_dtypes[0],
                "quantized_matmul jvp");
  if (t.size() > 1 && t[1].defined()) {
    const Tensor td = ops::cast(t[1], node.output_dtypes[0]);
    r = r.defined() ? ops::add(r, td) : td;
  }
  return {r};
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

Tensor quantized_linear_add(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& addend) {
  return product(x, weight, true, x.dtype(), "quantized_linear", addend);
}

}  // namespace ops
}  // namespace lmtune
