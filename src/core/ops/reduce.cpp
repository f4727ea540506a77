// Reductions: shape logic and vjp/jvp.
#include "core/ops/reduce.h"

#include <algorithm>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune {
namespace {

Tensor reduce_keepdims(ReduceOp op, const Tensor& x, int axis, DType out_dtype) {
  Shape s = x.shape();
  s[axis] = 1;
  return apply1(std::make_shared<Reduce>(op, axis), {x}, {s, out_dtype});
}

Tensor drop_axis(const Tensor& x, int axis) {
  Shape s = x.shape();
  s.erase(s.begin() + axis);
  return ops::reshape(x, s);
}

void require_float(const Tensor& x, const char* op) {
  if (!is_float(x.dtype())) throw ShapeError(std::string(op) + ": expected a float tensor, got i32");
}

}  // namespace

const char* Reduce::name() const {
  static const char* names[] = {"sum", "max", "logsumexp", "argmax"};
  return names[int(op)];
}

std::vector<Tensor> Reduce::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  using namespace ops;
  const Shape& in_shape = node.input_shapes[0];
  Tensor g = expand(cot[0], in_shape);
  switch (op) {
    case ReduceOp::sum: return {contiguous(g)};
    case ReduceOp::max: {  // to every position equal to the max (ties share the full gradient, like a mask)
      Tensor mask = greater_equal(node.inputs[0], expand(node.outputs[0], in_shape));
      return {mul(g, mask)};
    }
    case ReduceOp::logsumexp:
      return {mul(g, exp(sub(node.inputs[0], expand(node.outputs[0], in_shape))))};
    case ReduceOp::argmax: break;
  }
  return {Tensor()};
}

std::vector<Tensor> Reduce::jvp(const Node& node, const std::vector<Tensor>& t) {
  using namespace ops;
  const Shape& in_shape = node.input_shapes[0];
  switch (op) {
    case ReduceOp::sum: return {sum(t[0], {axis}, true)};
    case ReduceOp::max: {
      Tensor mask = greater_equal(node.inputs[0], expand(node.outputs[0], in_shape));
      return {sum(mul(t[0], mask), {axis}, true)};
    }
    case ReduceOp::logsumexp: {
      Tensor p = exp(sub(node.inputs[0], expand(node.outputs[0], in_shape)));
      return {sum(mul(t[0], p), {axis}, true)};
    }
    case ReduceOp::argmax: break;
  }
  return {Tensor()};
}

std::vector<Tensor> TopK::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  // Scatter: one-hot(indices) [.., k, n] contracted with the cotangent [.., k].
  const Shape& in_shape = node.input_shapes[0];
  int64_t n = in_shape.back();
  const Tensor& idx = node.outputs[1];
  Shape oh_shape = idx.shape();
  oh_shape.push_back(n);
  std::vector<int32_t> ids = idx.to_ints();
  std::vector<float> onehot(size_t(numel(oh_shape)), 0.0f);
  for (size_t r = 0; r < ids.size(); ++r) onehot[r * size_t(n) + size_t(ids[r])] = 1.0f;
  Tensor oh = Tensor::from_floats(onehot, oh_shape, cot[0].dtype(), cot[0].device());
  Shape gs = cot[0].shape();
  gs.push_back(1);
  Tensor g = ops::mul(oh, ops::reshape(cot[0], gs));
  return {ops::sum(g, {-2}), Tensor()};
}

std::vector<Tensor> TopK::jvp(const Node& node, const std::vector<Tensor>& t) {
  const Tensor& idx = node.outputs[1];
  std::vector<int32_t> ids = idx.to_ints();
  int64_t n = node.input_shapes[0].back();
  Shape oh_shape = idx.shape();
  oh_shape.push_back(n);
  std::vector<float> onehot(size_t(numel(oh_shape)), 0.0f);
  for (size_t r = 0; r < ids.size(); ++r) onehot[r * size_t(n) + size_t(ids[r])] = 1.0f;
  Tensor oh = Tensor::from_floats(onehot, oh_shape, t[0].dtype(), t[0].device());
  Shape ts = t[0].shape();
  ts.insert(ts.end() - 1, 1);
  return {ops::sum(ops::mul(oh, ops::reshape(t[0], ts)), {-1}), Tensor()};
}

namespace ops {

Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  require_float(x, "sum");
  std::vector<int> norm;
  for (int a : axes) norm.push_back(normalize_axis(a, x.ndim(), "sum"));
  std::sort(norm.begin(), norm.end());
  norm.erase(std::unique(norm.begin(), norm.end()), norm.end());
  Tensor r = x;
  for (int a : norm) r = reduce_keepdims(ReduceOp::sum, r, a, x.dtype());
  if (keepdims) return r;
  Shape s;
  for (int i = 0; i < x.ndim(); ++i)
    if (!std::binary_search(norm.begin(), norm.end(), i)) s.push_back(x.shape()[i]);
  return reshape(r, s);
}

Tensor sum_all(const Tensor& x) {
  std::vector<int> axes(x.ndim());
  for (int i = 0; i < x.ndim(); ++i) axes[i] = i;
  return sum(x, axes, false);
}

Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims) {
  int64_t count = 1;
  for (int a : axes) count *= x.shape()[normalize_axis(a, x.ndim(), "mean")];
  return scale(sum(x, axes, keepdims), count ? 1.0f / float(count) : 0.0f);
}

Tensor max(const Tensor& x, int axis, bool keepdims) {
  require_float(x, "max");
  int a = normalize_axis(axis, x.ndim(), "max");
  Tensor r = reduce_keepdims(ReduceOp::max, x, a, x.dtype());
  return keepdims ? r : drop_axis(r, a);
}

Tensor logsumexp(const Tensor& x, int axis, bool keepdims) {
  require_float(x, "logsumexp");
  int a = normalize_axis(axis, x.ndim(), "logsumexp");
  Tensor r = reduce_keepdims(ReduceOp::logsumexp, x, a, x.dtype());
  return keepdims ? r : drop_axis(r, a);
}

Tensor argmax(const Tensor& x, int axis) {
  require_float(x, "argmax");
  int a = normalize_axis(axis, x.ndim(), "argmax");
  return drop_axis(reduce_keepdims(ReduceOp::argmax, x, a, DType::i32), a);
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int k) {
  require_float(x, "topk");
  if (x.ndim() == 0 || k <= 0 || k > x.shape().back())
    throw ShapeError("topk: k = " + std::to_string(k) + " for shape " + to_string(x.shape()));
  Shape s = x.shape();
  s.back() = k;
  auto outs = apply(std::make_shared<TopK>(k), {x}, {{s, x.dtype()}, {s, DType::i32}});
  return {outs[0], outs[1]};
}

}  // namespace ops
}  // namespace lmtune
