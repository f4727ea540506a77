// Views, copies, casts and concat: shape logic and vjp/jvp.
#include "core/ops/view.h"

#include "core/ops/elementwise.h"

#include <algorithm>
#include <numeric>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune {
namespace {

// Strides for viewing x with `shape` without copying, if x's layout allows it (numpy's no-copy reshape:
// groups of old dims that map onto groups of new dims must each be contiguous in memory).
std::optional<Strides> reshape_strides(const Tensor& x, const Shape& shape) {
  if (x.is_contiguous()) return contiguous_strides(shape);
  if (x.numel() == 0) return std::nullopt;
  Shape od;
  Strides os;
  for (int i = 0; i < x.ndim(); ++i)
    if (x.shape()[i] != 1) {
      od.push_back(x.shape()[i]);
      os.push_back(x.strides()[i]);
    }
  Shape nd;
  std::vector<size_t> where;  // positions of non-1 dims in `shape`
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1) {
      nd.push_back(shape[i]);
      where.push_back(i);
    }
  Strides ns(nd.size());
  size_t ni = 0, nj = 1, oi = 0, oj = 1;
  while (ni < nd.size() && oi < od.size()) {
    int64_t np = nd[ni], op = od[oi];
    while (np != op) {
      if (np < op) np *= nd[nj++];
      else op *= od[oj++];
    }
    for (size_t k = oi; k + 1 < oj; ++k)
      if (os[k] != od[k + 1] * os[k + 1]) return std::nullopt;
    ns[nj - 1] = os[oj - 1];
    for (size_t k = nj - 1; k > ni; --k) ns[k - 1] = ns[k] * nd[k];
    ni = nj++;
    oi = oj++;
  }
  Strides out(shape.size(), 1);
  for (size_t k = 0; k < nd.size(); ++k) out[where[k]] = ns[k];
  return out;
}

Shape resolve_shape(const Tensor& x, Shape shape) {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw ShapeError("reshape: more than one -1 in " + to_string(shape));
      infer = int(i);
    } else if (shape[i] < 0) {
      throw ShapeError("reshape: negative dimension in " + to_string(shape));
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0)
      throw ShapeError("reshape: cannot reshape " + to_string(x.shape()) + " into " + to_string(shape));
    shape[infer] = x.numel() / known;
  }
  if (numel(shape) != x.numel())
    throw ShapeError("reshape: cannot reshape " + to_string(x.shape()) + " into " + to_string(shape));
  return shape;
}

Tensor view_op(std::shared_ptr<ViewPrimitive> prim, const Tensor& x) {
  Tensor out = prim->apply_to(x);
  return record(std::move(prim), {x}, {out})[0];
}

}  // namespace

std::vector<Tensor> ViewPrimitive::jvp(const Node&, const std::vector<Tensor>& t) {
  return {t[0].defined() ? apply_to(t[0]) : Tensor()};
}

Tensor Reshape::apply_to(const Tensor& x) const {
  auto st = reshape_strides(x, shape);
  if (st) return x.view_as(shape, *st, x.offset());
  // Not viewable: reshape a contiguous copy (the Copy is not recorded; Reshape's vjp covers it).
  Tensor c = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_into(c, x);
  return c.view_as(shape, contiguous_strides(shape), 0);
}

std::vector<Tensor> Reshape::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  return {ops::reshape(cot[0], node.input_shapes[0])};
}

Tensor Permute::apply_to(const Tensor& x) const {
  Shape s(axes.size());
  Strides st(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    s[i] = x.shape()[axes[i]];
    st[i] = x.strides()[axes[i]];
  }
  return x.view_as(s, st, x.offset());
}

std::vector<Tensor> Permute::vjp(const Node&, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  std::vector<int> inverse(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) inverse[axes[i]] = int(i);
  return {ops::permute(cot[0], inverse)};
}

Tensor Slice::apply_to(const Tensor& x) const {
  Shape s = x.shape();
  Strides st = x.strides();
  s[axis] = (end - start + step - 1) / step;
  st[axis] *= step;
  return x.view_as(s, st, x.offset() + start * x.strides()[axis]);
}

std::vector<Tensor> Slice::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  Tensor g = Tensor::zeros(node.input_shapes[0], cot[0].dtype(), cot[0].device());
  copy_into(apply_to(g), cot[0]);
  return {g};
}

Tensor Expand::apply_to(const Tensor& x) const { return broadcast_view(x, shape); }

std::vector<Tensor> Expand::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  return {ops::sum_to_shape(cot[0], node.input_shapes[0])};
}

std::vector<Tensor> Copy::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>&) {
  const Tensor& g = cot[0];
  return {g.dtype() == node.input_dtypes[0] ? g : ops::cast(g, node.input_dtypes[0])};
}

std::vector<Tensor> Copy::jvp(const Node& node, const std::vector<Tensor>& t) {
  return {t[0].defined() ? ops::cast(t[0], node.output_dtypes[0]) : Tensor()};
}

void Concat::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  int64_t at = 0;
  for (const auto& x : in) {
    copy_into(Slice(axis, at, at + x.dim(axis), 1).apply_to(out[0]), x);
    at += x.dim(axis);
  }
}
void Concat::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) { eval_cpu(in, out); }

std::vector<Tensor> Concat::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  std::vector<Tensor> r(node.input_shapes.size());
  int64_t at = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t n = node.input_shapes[i][axis];
    if (wanted[i]) r[i] = ops::contiguous(ops::slice(cot[0], axis, at, at + n));
    at += n;
  }
  return r;
}

std::vector<Tensor> Concat::jvp(const Node& node, const std::vector<Tensor>& t) {
  std::vector<Tensor> parts;
  for (size_t i = 0; i < t.size(); ++i)
    parts.push_back(t[i].defined() ? t[i]
                                   : Tensor::zeros(node.input_shapes[i], node.output_dtypes[0], node.inputs[0].device()));
  return {ops::concat(parts, axis)};
}

void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.shape() != src.shape())
    throw ShapeError("copy: destination " + to_string(dst.shape()) + " and source " + to_string(src.shape()) + " differ");
  if (dst.device() != src.device())
    throw ShapeError("copy: devices differ (" + dst.device().str() + " and " + src.device().str() + ")");
  Copy copy;
  std::vector<Tensor> out{dst};
  eval_on(dst.device(), copy, {src}, out);
}

namespace ops {

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape s = resolve_shape(x, shape);
  if (s == x.shape()) return x;
  return view_op(std::make_shared<Reshape>(s), x);
}

Tensor permute(const Tensor& x, const std::vector<int>& axes) {
  if (int(axes.size()) != x.ndim()) throw ShapeError("permute: " + std::to_string(axes.size()) + " axes for shape " + to_string(x.shape()));
  std::vector<int> norm(axes.size());
  std::vector<bool> seen(axes.size());
  for (size_t i = 0; i < axes.size(); ++i) {
    norm[i] = normalize_axis(axes[i], x.ndim(), "permute");
    if (seen[norm[i]]) throw ShapeError("permute: repeated axis " + std::to_string(axes[i]));
    seen[norm[i]] = true;
  }
  return view_op(std::make_shared<Permute>(norm), x);
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  std::vector<int> axes(x.ndim());
  std::iota(axes.begin(), axes.end(), 0);
  std::swap(axes[normalize_axis(axis0, x.ndim(), "transpose")], axes[normalize_axis(axis1, x.ndim(), "transpose")]);
  return permute(x, axes);
}

Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end, int64_t step) {
  int a = normalize_axis(axis, x.ndim(), "slice");
  int64_t n = x.shape()[a];
  if (start < 0) start += n;
  if (end < 0) end += n;
  end = std::min(end, n);
  if (step <= 0 || start < 0 || start > end)
    throw ShapeError("slice: bad range [" + std::to_string(start) + ", " + std::to_string(end) + ") step " +
                     std::to_string(step) + " on axis " + std::to_string(axis) + " of " + to_string(x.shape()));
  return view_op(std::make_shared<Slice>(a, start, end, step), x);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  broadcast_view(x, shape);  // validates
  return view_op(std::make_shared<Expand>(shape), x);
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return apply1(std::make_shared<Copy>(), {x}, {x.shape(), x.dtype()});
}

Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return apply1(std::make_shared<Copy>(), {x}, {x.shape(), dtype});
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  if (xs.empty()) throw ShapeError("concat: no tensors");
  int a = normalize_axis(axis, xs[0].ndim(), "concat");
  Shape out = xs[0].shape();
  out[a] = 0;
  for (const auto& x : xs) {
    Shape s = x.shape();
    if (x.ndim() != xs[0].ndim() || x.dtype() != xs[0].dtype())
      throw ShapeError("concat: " + to_string(xs[0].shape()) + " and " + to_string(x.shape()) + " do not fit");
    s[a] = xs[0].shape()[a];
    if (s != xs[0].shape())
      throw ShapeError("concat: shapes " + to_string(xs[0].shape()) + " and " + to_string(x.shape()) +
                       " differ outside axis " + std::to_string(axis));
    out[a] += x.shape()[a];
  }
  return apply1(std::make_shared<Concat>(a), xs, {out, xs[0].dtype()});
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int extra = x.ndim() - int(shape.size());
  if (extra < 0) throw ShapeError("sum_to_shape: " + to_string(x.shape()) + " has fewer dims than " + to_string(shape));
  std::vector<int> axes;
  for (int i = 0; i < x.ndim(); ++i)
    if (i < extra || (shape[i - extra] == 1 && x.shape()[i] != 1)) axes.push_back(i);
  Tensor s = axes.empty() ? x : sum(x, axes, /*keepdims=*/true);
  return reshape(s, shape);
}

}  // namespace ops
}  // namespace lmtune
