// Reductions: shape logic and vjp/jvp.
#include "core/ops/reduce.h"

#include <algorithm>
#include <climits>
#include <string>

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

namespace {

// The chosen entries' positions in the input flattened to [rows * n]: r * n + idx[r, s]. Indices within a row are
// distinct, so each position is taken at most once.
Tensor chosen_positions(const Tensor& idx, int64_t n) {
  const int64_t k = idx.shape().back(), total = idx.numel() / std::max<int64_t>(k, 1) * n;
  if (total > INT32_MAX) throw ShapeError("topk: " + std::to_string(total) + " inputs exceed int32 positions");
  std::vector<int32_t> pos = idx.to_ints();
  for (size_t i = 0; i < pos.size(); ++i) pos[i] += int32_t(int64_t(i) / k * n);
  return Tensor::from_ints(pos, {int64_t(pos.size())}, idx.device());
}

}  // namespace

// The values' cotangent scattered to the chosen positions, zero elsewhere (each position receives one value, so
// the scatter-add is exact), on the device: a one-hot [.., k, n] built on the host and uploaded cost a
// mixture-of-experts router 33 MB per layer and most of the training step.
std::vector<Tensor> TopK::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  const Shape& in_shape = node.input_shapes[0];
  const Tensor& idx = node.outputs[1];
  const Tensor g = ops::reshape(cot[0], {idx.numel(), 1});
  const Tensor scattered = ops::embedding_backward(g, chosen_positions(idx, in_shape.back()), numel(in_shape));
  return {ops::cast(ops::reshape(scattered, in_shape), node.input_dtypes[0]), Tensor()};
}

// The tangent gathered at the chosen positions.
std::vector<Tensor> TopK::jvp(const Node& node, const std::vector<Tensor>& t) {
  const Tensor& idx = node.outputs[1];
  const Tensor flat = ops::reshape(ops::contiguous(t[0]), {t[0].numel(), 1});
  const Tensor picked = ops::embedding(flat, chosen_positions(idx, node.input_shapes[0].back()));
  return {ops::cast(ops::reshape(picked, idx.shape()), t[0].dtype()), Tensor()};
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
