// Matmul and linear: shape checks, operand layout, and the vjp/jvp written with matmul itself.
#include "core/ops/matmul.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

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

Tensor cast_to(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : ops::cast(t, dtype); }
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
                        ? cast_to(g_out, a.dtype())
                        : g_out;
  // g [..., M, N]: ga = g bᵀ [..., M, K], gb = aᵀ g [..., K, N], each summed over the batch dims it was broadcast on.
  if (wanted[0]) ga = cast_to(sum_to_shape(matmul(g, transpose(b)), a.shape()), a.dtype());
  if (wanted[1]) gb = cast_to(sum_to_shape(matmul(transpose(cast_to(a, g.dtype())), g), b.shape()), b.dtype());
  return {ga, gb};
}

std::vector<Tensor> Matmul::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor& a = node.inputs[0];
  const Tensor& b = node.inputs[1];
  Tensor r;
  const DType out = node.output_dtypes[0];
  if (t[0].defined()) r = matmul(cast_to(t[0], a.dtype()), b, out);
  if (t[1].defined()) {
    Tensor rb = matmul(a, cast_to(t[1], b.dtype()), out);
    r = r.defined() ? add(r, rb) : rb;
  }
  if (r.defined() && r.shape() != node.output_shapes[0]) r = contiguous(expand(r, node.output_shapes[0]));
  return {r};
}

namespace ops {

Tensor matmul(const Tensor& a, const Tensor& b) { return matmul(a, b, a.dtype()); }

Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype) {
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
    return reshape(matmul(reshape(a, {-1, K}), b, out_dtype), out);
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
  return apply1(std::make_shared<Matmul>(), {ac, bc}, {out, out_dtype});
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (weight.ndim() != 2 || x.ndim() < 1 || x.dim(-1) != weight.dim(1))
    throw ShapeError("linear: input " + to_string(x.shape()) + " does not fit weight " + to_string(weight.shape()) +
                     " (expected [..., K] and [N, K])");
  if (bias.defined() && (bias.ndim() != 1 || bias.dim(0) != weight.dim(0)))
    throw ShapeError("linear: bias " + to_string(bias.shape()) + " does not fit weight " + to_string(weight.shape()));
  Tensor x2 = x.ndim() == 1 ? reshape(x, {1, x.dim(0)}) : x;
  Tensor y = matmul(x2, transpose(weight));
  if (bias.defined()) y = add(y, cast_to(bias, y.dtype()));
  return x.ndim() == 1 ? reshape(y, {weight.dim(0)}) : y;
}

}  // namespace ops
}  // namespace lmtune
