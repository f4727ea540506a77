// Matmul and linear: shape checks, operand layout, and the vjp/jvp written with matmul itself.
#include "core/ops/matmul.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/view.h"

namespace lmtune {
namespace {

// Whether the last two dims [R, C] of t can be handed to a GEMM as they are: row-major (unit column stride,
// row stride >= C) or transposed (unit row stride, column stride >= R). Broadcast rows (stride 0) are not.
bool gemm_layout(const Tensor& t) {
  int n = t.ndim();
  int64_t rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  int64_t rs = t.strides()[n - 2], cs = t.strides()[n - 1];
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) return true;
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) return true;
  return false;
}

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

bool is_16bit(DType t) { return t == DType::f16 || t == DType::bf16; }

}  // namespace

std::vector<Tensor> Matmul::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g_out = cot[0];
  if (!g_out.defined()) return {Tensor(), Tensor()};
  const Tensor& a = node.inputs[0];
  const Tensor& b = node.inputs[1];
  Tensor ga, gb;
  // f32 results of 16-bit operands (matmul with out_dtype) send a 16-bit cotangent back, as autocast does, so the
  // gradient products stay on the 16-bit (tensor-core) path.
  const Tensor& g = is_16bit(a.dtype()) && a.dtype() == b.dtype() && g_out.dtype() == DType::f32
                        ? ops::cast(g_out, a.dtype())
                        : g_out;
  // g [..., M, N]: ga = g bᵀ [..., M, K], gb = aᵀ g [..., K, N], each summed over the batch dims it was broadcast on.
  if (wanted[0]) ga = ops::cast(sum_to_shape(matmul(g, transpose(b), g.dtype(), alpha), a.shape()), a.dtype());
  if (wanted[1])
    gb = ops::cast(sum_to_shape(matmul(transpose(ops::cast(a, g.dtype())), g, g.dtype(), alpha), b.shape()),
                   b.dtype());
  return {ga, gb};
}

std::vector<Tensor> Matmul::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& a = node.inputs[0];
  const Tensor& b = node.inputs[1];
  Tensor r;
  const DType out = node.output_dtypes[0];
  if (t[0].defined()) r = matmul(ops::cast(t[0], a.dtype()), b, out, alpha);
  if (t[1].defined()) {
    Tensor rb = matmul(a, ops::cast(t[1], b.dtype()), out, alpha);
    r = r.defined() ? add(r, rb) : rb;
  }
  if (r.defined() && r.shape() != node.output_shapes[0]) r = contiguous(expand(r, node.output_shapes[0]));
  return {r};
}

// y = a b + α u v: each operand's gradient is the plain matmul one, α-scaled for u and v.
std::vector<Tensor> MatmulLowRank::vjp(const Node& node, const std::vector<Tensor>& cot,
                                       const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g = cot[0];
  if (!g.defined()) return {Tensor(), Tensor(), Tensor(), Tensor()};
  const Tensor &a = node.inputs[0], &b = node.inputs[1], &u = node.inputs[2], &v = node.inputs[3];
  auto scaled = [&](const Tensor& t) { return alpha == 1.0f ? t : scale(t, alpha); };
  std::vector<Tensor> r(4);
  if (wanted[0]) r[0] = ops::cast(matmul(g, transpose(b)), a.dtype());
  if (wanted[1]) r[1] = ops::cast(matmul(transpose(ops::cast(a, g.dtype())), g), b.dtype());
  if (wanted[2]) r[2] = ops::cast(scaled(matmul(g, transpose(v))), u.dtype());
  if (wanted[3]) r[3] = ops::cast(scaled(matmul(transpose(ops::cast(u, g.dtype())), g)), v.dtype());
  return r;
}

std::vector<Tensor> MatmulLowRank::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor &a = node.inputs[0], &b = node.inputs[1], &u = node.inputs[2], &v = node.inputs[3];
  const DType out = node.output_dtypes[0];
  Tensor r, low;
  auto acc = [](Tensor& sum, const Tensor& term) { sum = sum.defined() ? add(sum, term) : term; };
  if (t[0].defined()) acc(r, matmul(ops::cast(t[0], a.dtype()), b, out));
  if (t[1].defined()) acc(r, matmul(a, ops::cast(t[1], b.dtype()), out));
  if (t[2].defined()) acc(low, matmul(ops::cast(t[2], u.dtype()), v, out));
  if (t[3].defined()) acc(low, matmul(u, ops::cast(t[3], v.dtype()), out));
  if (low.defined()) acc(r, alpha == 1.0f ? low : scale(low, alpha));
  return {r};
}

void MatmulAccumulate::compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  using namespace ops;
  Tensor c = ops::cast(out[0], DType::f32);
  if (in.size() > 2) c = mul(c, reshape(in[2], {in[2].dim(0), 1}));
  copy_into(out[0], add(c, matmul(in[0], in[1], DType::f32)));
}

namespace ops {

void matmul_accumulate(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& row_scale) {
  auto shapes = [&] {
    return to_string(c.shape()) + " += " + to_string(a.shape()) + " x " + to_string(b.shape()) +
           (row_scale.defined() ? " (row scale " + to_string(row_scale.shape()) + ")" : "");
  };
  if (c.ndim() != 2 || a.ndim() != 2 || b.ndim() != 2 || a.dim(0) != c.dim(0) || b.dim(1) != c.dim(1) ||
      a.dim(1) != b.dim(0))
    throw ShapeError("matmul_accumulate: shapes do not fit c [M, N] += a [M, K] x b [K, N]: " + shapes());
  if (!is_float(a.dtype()) || !is_float(b.dtype()) || !is_float(c.dtype()) || !c.is_contiguous())
    throw ShapeError("matmul_accumulate: expected float operands and a contiguous c: " + shapes());
  if (row_scale.defined() && (row_scale.dtype() != DType::f32 || row_scale.ndim() != 1 ||
                              row_scale.dim(0) != c.dim(0) || !row_scale.is_contiguous()))
    throw ShapeError("matmul_accumulate: the row scale must be a contiguous f32 [M]: " + shapes());
  auto gemm_ready = [](const Tensor& t) { return gemm_layout(t) ? t : contiguous(t); };
  std::vector<Tensor> in{gemm_ready(a), gemm_ready(b)};
  if (row_scale.defined()) in.push_back(row_scale);
  std::vector<Tensor> out{c};
  MatmulAccumulate op;
  NoGrad no_grad;
  eval_on(c.device(), op, in, out);
}

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul(a, b, a.dtype()); }

Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype, float alpha) {
  auto shapes = [&] { return to_string(a.shape()) + " and " + to_string(b.shape()); };
  if (a.ndim() < 2 || b.ndim() < 2) throw ShapeError("matmul: operands need at least 2 dims, got " + shapes());
  if (!is_float(a.dtype()) || !is_float(b.dtype()))
    throw ShapeError("matmul: operands must be float tensors, got " + std::string(dtype_name(a.dtype())) + " " +
                     to_string(a.shape()) + " and " + std::string(dtype_name(b.dtype())) + " " + to_string(b.shape()));
  int64_t K = a.dim(-1);
  if (b.dim(-2) != K) throw ShapeError("matmul: inner dimensions differ: " + shapes());
  // A stack of matrices times one matrix is one GEMM with the batch folded into M (one GEMM in the vjp too).
  if (b.ndim() == 2 && a.ndim() > 2) {
    Shape out = a.shape();
    out.back() = b.dim(-1);
    return reshape(matmul(reshape(a, {-1, K}), b, out_dtype, alpha), out);
  }
  Shape batch;
  try {
    batch = broadcast_shapes(batch_of(a.shape()), batch_of(b.shape()), "matmul");
  } catch (const ShapeError&) {
    throw ShapeError("matmul: batch dimensions do not broadcast: " + shapes());
  }
  Shape out = batch;
  out.push_back(a.dim(-2));
  out.push_back(b.dim(-1));
  Tensor ac = gemm_layout(a) ? a : contiguous(a);
  Tensor bc = gemm_layout(b) ? b : contiguous(b);
  if (!is_float(out_dtype)) throw ShapeError("matmul: the output dtype must be a float type");
  return apply1(std::make_shared<Matmul>(alpha), {ac, bc}, {out, out_dtype});
}

Tensor matmul_low_rank(const Tensor& a, const Tensor& b, const Tensor& u, const Tensor& v, float alpha,
                       DType out_dtype) {
  auto shapes = [&] {
    return to_string(a.shape()) + " x " + to_string(b.shape()) + " + " + to_string(u.shape()) + " x " +
           to_string(v.shape());
  };
  for (const Tensor* t : {&a, &b, &u, &v})
    if (t->ndim() != 2 || !is_float(t->dtype()))
      throw ShapeError("matmul_low_rank: expected 2-dim float operands, got " + shapes());
  if (b.dim(0) != a.dim(1) || u.dim(0) != a.dim(0) || v.dim(0) != u.dim(1) || v.dim(1) != b.dim(1))
    throw ShapeError("matmul_low_rank: shapes do not fit a [M, K] x b [K, N] + u [M, R] x v [R, N]: " + shapes());
  if (!is_float(out_dtype)) throw ShapeError("matmul_low_rank: the output dtype must be a float type");
  auto gemm_ready = [](const Tensor& t) { return gemm_layout(t) ? t : contiguous(t); };
  return apply1(std::make_shared<MatmulLowRank>(alpha), {gemm_ready(a), gemm_ready(b), gemm_ready(u), gemm_ready(v)},
                {{a.dim(0), b.dim(1)}, out_dtype});
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (weight.ndim() != 2 || x.ndim() < 1 || x.dim(-1) != weight.dim(1))
    throw ShapeError("linear: input " + to_string(x.shape()) + " does not fit weight " + to_string(weight.shape()) +
                     " (expected [..., K] and [N, K])");
  if (bias.defined() && (bias.ndim() != 1 || bias.dim(0) != weight.dim(0)))
    throw ShapeError("linear: bias " + to_string(bias.shape()) + " does not fit weight " + to_string(weight.shape()));
  Tensor x2 = x.ndim() == 1 ? reshape(x, {1, x.dim(0)}) : x;
  Tensor y = matmul(x2, transpose(weight));
  if (bias.defined()) y = add(y, ops::cast(bias, y.dtype()));
  return x.ndim() == 1 ? reshape(y, {weight.dim(0)}) : y;
}

}  // namespace ops
}  // namespace lmtune
