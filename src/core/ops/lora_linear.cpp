// LoRA linear layer as one primitive (see lora_linear.h).
#include "core/ops/lora_linear.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/matmul.h"

namespace lmtune {
namespace {

Tensor rows(const Tensor& x) { return ops::reshape(x, {-1, x.dim(-1)}); }

}  // namespace

// in[4], where given, is the adapter's input (x after LoRA dropout); else x.
void LoraLinear::prepare_vjp(const std::vector<Tensor>& in) {
  if (down.defined()) return;  // a deferred op's kernels (core/tape.h) run after its preparation
  a16 = ops::cast(in[2], DType::f16);
  // B in f16, in the layout the addend takes (beside weight_t's [K, N]: [R, N] rows).
  const Tensor b = weight_t.defined() ? ops::transpose(in[3]) : in[3];
  b16 = weight_t.defined() ? ops::transpose(ops::cast(b, DType::f16)) : ops::cast(b, DType::f16);
  // s x Aᵀ, the scale in the product: the addend needs no scale of its own and dB = gᵀ down no scaling pass.
  down = ops::matmul(rows(in.size() > 4 ? in[4] : in[0]), ops::transpose(a16), DType::f16, scale);
}

void LoraLinear::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor &x = in[0], &w = in[1];
  prepare_vjp(in);
  const Tensor x2 = rows(x);
  std::vector<Tensor> y{ops::reshape(out[0], {-1, w.dim(0)})};
  MatmulLowRank product(1.0f);
  eval_on(x.device(), product, {x2, weight_t.defined() ? weight_t : ops::transpose(w), down, ops::transpose(b16)}, y);
}

// g [M, N]: with gb = s g B [M, R], dx = g W + gb A (one product with a low-rank addend), dA = gbᵀ x and
// dB = gᵀ (s x Aᵀ), both in f32. With dropout the adapter's input is its own input: dx = g W and d x_in = gb A.
std::vector<Tensor> LoraLinear::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  const bool dropout = node.inputs.size() > 4;
  if (!cot[0].defined()) return std::vector<Tensor>(node.inputs.size());
  const Tensor &x = node.inputs[0], &w = node.inputs[1], &x_in = dropout ? node.inputs[4] : x;
  const Tensor g = rows(cot[0]), x2 = rows(x_in);
  const Tensor gb = matmul(g, b16, DType::f16, scale);  // s g B
  std::vector<Tensor> r(node.inputs.size());
  if (wanted[0] && !dropout) r[0] = reshape(matmul_low_rank(g, w, gb, a16, 1.0f, x.dtype()), x.shape());
  if (wanted[0] && dropout) r[0] = reshape(matmul(g, w, x.dtype()), x.shape());
  if (dropout && wanted[4]) r[4] = reshape(matmul(gb, a16, x_in.dtype()), x_in.shape());
  if (wanted[1]) r[1] = matmul(transpose(g), rows(x), w.dtype());
  if (wanted[2]) r[2] = matmul(transpose(gb), x2, DType::f32);
  if (wanted[3]) r[3] = matmul(transpose(g), down, DType::f32);  // down holds s x Aᵀ
  return r;
}

// The tangent of x Wᵀ + s (x_in Aᵀ) Bᵀ, composed of the same products.
std::vector<Tensor> LoraLinear::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const bool dropout = node.inputs.size() > 4;
  const Tensor &x = node.inputs[0], &w = node.inputs[1], &a = node.inputs[2], &b = node.inputs[3];
  const Tensor& x_in = dropout ? node.inputs[4] : x;
  const Tensor& t_in = dropout ? t[4] : t[0];
  Tensor r, low;
  auto acc = [](Tensor& sum, const Tensor& term) { sum = sum.defined() ? add(sum, term) : term; };
  if (t[0].defined()) acc(r, linear(t[0], w));
  if (t[1].defined()) acc(r, linear(x, cast(t[1], w.dtype())));
  if (t_in.defined()) acc(low, autocast_linear(autocast_linear(t_in, a), b));
  if (t[2].defined()) acc(low, autocast_linear(autocast_linear(x_in, t[2]), b));
  if (t[3].defined()) acc(low, autocast_linear(autocast_linear(x_in, a), t[3]));
  if (low.defined()) acc(r, scale == 1.0f ? low : ops::scale(low, scale));
  return {r};
}

namespace ops {

Tensor lora_linear(const Tensor& x, const Tensor& weight, const Tensor& a, const Tensor& b, float scale,
                   const Tensor& x_in, const Tensor& weight_t) {
  const bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  if (!half || x.ndim() < 1 || weight.ndim() != 2 || a.ndim() != 2 || b.ndim() != 2 || a.dtype() != DType::f32 ||
      b.dtype() != DType::f32 || !is_float(weight.dtype()) || x.dim(-1) != weight.dim(1) || a.dim(1) != weight.dim(1) ||
      b.dim(0) != weight.dim(0) || b.dim(1) != a.dim(0))
    throw ShapeError("lora_linear: expected f16/bf16 x [..., K], weight [N, K], f32 A [R, K] and B [N, R], got x " +
                     std::string(dtype_name(x.dtype())) + " " + to_string(x.shape()) + ", weight " +
                     to_string(weight.shape()) + ", A " + std::string(dtype_name(a.dtype())) + " " +
                     to_string(a.shape()) + ", B " + std::string(dtype_name(b.dtype())) + " " + to_string(b.shape()));
  if (x_in.defined() && (x_in.shape() != x.shape() || x_in.dtype() != x.dtype()))
    throw ShapeError("lora_linear: the adapter's input " + to_string(x_in.shape()) + " differs from x " +
                     to_string(x.shape()));
  if (weight_t.defined() && (weight_t.dtype() != weight.dtype() || weight_t.ndim() != 2 ||
                             weight_t.dim(0) != weight.dim(1) || weight_t.dim(1) != weight.dim(0)))
    throw ShapeError("lora_linear: the transposed weight must be " + std::string(dtype_name(weight.dtype())) + " [" +
                     std::to_string(weight.dim(1)) + ", " + std::to_string(weight.dim(0)) + "], got " +
                     std::string(dtype_name(weight_t.dtype())) + " " + to_string(weight_t.shape()));
  if (weight_t.defined() && on_tape(weight))
    throw AutodiffError("lora_linear: a transposed copy of the weight is for a frozen weight; this one requires grad");
  Shape out = x.shape();
  out.back() = weight.dim(0);
  std::vector<Tensor> in{x, weight, a, b};
  if (x_in.defined()) in.push_back(x_in);
  return apply1(std::make_shared<LoraLinear>(scale, weight_t.defined() ? ops::contiguous(weight_t) : Tensor()), in,
                {out, x.dtype()});
}

}  // namespace ops
}  // namespace lmtune
