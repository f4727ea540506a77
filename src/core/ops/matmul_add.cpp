// Matmul with an addend in its epilogue (see matmul_add.h): shape checks, the composition both backends fall back
// to, and the vjp/jvp written with matmul.
#include "core/ops/matmul_add.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/view.h"

namespace lmtune {

// The product into y (the addend composed inside MatmulLowRank where its kernel has no room for it), then e added
// in place: the dispatches and roundings of a product followed by an add.
void MatmulAdd::compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const {
  Tensor& y = out[0];
  if (in.size() > 3) {
    MatmulLowRank product(alpha);
    eval_on(y.device(), product, {in[0], in[1], in[3], in[4]}, out);
  } else {
    Matmul product;
    eval_on(y.device(), product, {in[0], in[1]}, out);
  }
  Binary add(BinaryOp::add);
  eval_on(y.device(), add, {y, ops::expand(ops::cast(in[2], y.dtype()), y.shape())}, out);
}

// y = a b + e + α u v: each product's operands get the plain matmul gradients, e the cotangent summed to its shape.
std::vector<Tensor> MatmulAdd::vjp(const Node& node, const std::vector<Tensor>& cot,
                                   const std::vector<bool>& wanted) {
  using namespace ops;
  const Tensor& g = cot[0];
  std::vector<Tensor> r(node.inputs.size());
  if (!g.defined()) return r;
  const Tensor &a = node.inputs[0], &b = node.inputs[1], &e = node.inputs[2];
  if (wanted[0]) r[0] = ops::cast(matmul(g, transpose(b)), a.dtype());
  if (wanted[1]) r[1] = ops::cast(matmul(transpose(ops::cast(a, g.dtype())), g), b.dtype());
  if (wanted[2]) r[2] = ops::cast(sum_to_shape(g, e.shape()), e.dtype());
  if (node.inputs.size() > 3) {
    const Tensor &u = node.inputs[3], &v = node.inputs[4];
    if (wanted[3]) r[3] = ops::cast(matmul(g, transpose(v), g.dtype(), alpha), u.dtype());
    if (wanted[4]) r[4] = ops::cast(matmul(transpose(ops::cast(u, g.dtype())), g, g.dtype(), alpha), v.dtype());
  }
  return r;
}

std::vector<Tensor> MatmulAdd::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Tensor &a = node.inputs[0], &b = node.inputs[1];
  const DType out = node.output_dtypes[0];
  const Shape& shape = node.output_shapes[0];
  Tensor r;
  auto acc = [&](const Tensor& term) { r = r.defined() ? add(r, term) : term; };
  if (t[0].defined()) acc(matmul(ops::cast(t[0], a.dtype()), b, out));
  if (t[1].defined()) acc(matmul(a, ops::cast(t[1], b.dtype()), out));
  if (t[2].defined()) acc(contiguous(expand(ops::cast(t[2], out), shape)));
  if (node.inputs.size() > 3) {
    const Tensor &u = node.inputs[3], &v = node.inputs[4];
    if (t[3].defined()) acc(matmul(ops::cast(t[3], u.dtype()), v, out, alpha));
    if (t[4].defined()) acc(matmul(u, ops::cast(t[4], v.dtype()), out, alpha));
  }
  return {r};
}

namespace ops {

Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& e, DType out_dtype) {
  return matmul_add(a, b, e, Tensor(), Tensor(), 1.0f, out_dtype);
}

Tensor matmul_add(const Tensor& a, const Tensor& b, const Tensor& e, const Tensor& u, const Tensor& v, float alpha,
                  DType out_dtype) {
  const bool low_rank = u.defined() || v.defined();
  auto shapes = [&] {
    return to_string(a.shape()) + " x " + to_string(b.shape()) + " + " + to_string(e.shape()) +
           (low_rank ? " + " + to_string(u.shape()) + " x " + to_string(v.shape()) : std::string());
  };
  for (const Tensor* t : {&a, &b, &e, &u, &v})
    if ((low_rank || (t != &u && t != &v)) && (!t->defined() || !is_float(t->dtype())))
      throw ShapeError("matmul_add: expected float operands, got " + shapes());
  if (a.ndim() != 2 || b.ndim() != 2 || b.dim(0) != a.dim(1))
    throw ShapeError("matmul_add: shapes do not fit a [M, K] x b [K, N]: " + shapes());
  const int64_t M = a.dim(0), N = b.dim(1);
  if (!(e.ndim() == 1 && e.dim(0) == N) && e.shape() != Shape{M, N})
    throw ShapeError("matmul_add: the addend must be [M, N] or [N]: " + shapes());
  if (low_rank && (u.ndim() != 2 || v.ndim() != 2 || u.dim(0) != M || v.dim(0) != u.dim(1) || v.dim(1) != N))
    throw ShapeError("matmul_add: the low-rank term must be u [M, R] x v [R, N]: " + shapes());
  if (!is_float(out_dtype)) throw ShapeError("matmul_add: the output dtype must be a float type");
  // The products' kernels take operands with a unit stride along either dim.
  auto gemm_ready = [](const Tensor& t) {
    return t.ndim() != 2 || t.strides()[0] == 1 || t.strides()[1] == 1 ? t : contiguous(t);
  };
  std::vector<Tensor> in{gemm_ready(a), gemm_ready(b), e};
  if (low_rank) in.insert(in.end(), {gemm_ready(u), gemm_ready(v)});
  return apply1(std::make_shared<MatmulAdd>(alpha), in, {{M, N}, out_dtype});
}

}  // namespace ops
}  // namespace lmtune
