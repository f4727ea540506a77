// Vulkan kernels for reductions over one axis and top-k: kernels/reduce/reduce.comp, kernels/reduce/topk.comp.
#include "backend/vulkan/kernel_util.h"
#include "core/error.h"
#include "core/ops/reduce.h"

namespace lmtune::vk {
namespace {

// Workgroup size for a workgroup-per-row kernel: enough invocations to stream long rows, few for short ones
// (barriers in a mostly idle workgroup are expensive, on lavapipe especially).
uint32_t row_group_size(uint32_t n) { return n >= 4096 ? 256 : n >= 512 ? 128 : 64; }

struct ReducePush {
  uint32_t n, axis_stride, rows;
  uint32_t oshape[3], xs[3], ys[3];
  uint32_t x_off, y_off, dtypes, op, mode, vec;
  uint32_t chunk, chunks;  // modes 2 and 3 (the max or argmax of few long rows in two dispatches)
};
static_assert(sizeof(ReducePush) <= 128);

// The max or argmax of few long rows (a decode step's logits) in two dispatches: stretches of kStretch elements
// of every row on workgroups of their own, then each row's best stretch. One workgroup per row walked Qwen's
// 151,936 logits alone: 224 us of a 3.9 ms decode step on an H200.
constexpr uint32_t kStretch = 4096, kStretchFromN = 4 * kStretch, kStretchMaxRows = 512;

struct TopKPush {
  uint32_t n, x_stride, rows;
  uint32_t oshape[3], xs[3];
  uint32_t x_off, v_off, i_off, dtypes, k;
};
static_assert(sizeof(TopKPush) <= 128);

// Shape and strides of t without `axis`.
void drop_axis(const Tensor& t, int axis, Shape& s, Strides& st) {
  s = t.shape();
  st = t.strides();
  s.erase(s.begin() + axis);
  st.erase(st.begin() + axis);
}

}  // namespace

void reduce_axis(const Tensor& x_in, const Tensor& y, int axis, ReduceOp op) {
  if (y.numel() == 0) return;
  Context& ctx = context_for(y.device());
  Tensor x = x_in;
  Shape outer;
  Strides xs, ys;
  drop_axis(x, axis, outer, xs);
  drop_axis(y, axis, outer, ys);
  Rows rows;
  if (!make_rows(outer, {xs, ys}, rows)) {
    x = dense(x);  // then at most 2 outer dims remain
    drop_axis(x, axis, outer, xs);
    if (!make_rows(outer, {xs, ys}, rows)) throw ShapeError("vulkan reduce: cannot collapse " + to_string(y.shape()));
  }
  ReducePush p{};
  p.n = u32(x.shape()[axis], "axis length");
  p.axis_stride = u32(x.strides()[axis], "stride");
  p.rows = rows.count;
  for (int d = 0; d < 3; ++d) {
    p.oshape[d] = rows.shape[d];
    p.xs[d] = rows.strides[0][d];
    p.ys[d] = rows.strides[1][d];
  }
  p.x_off = elem_offset(x);
  p.y_off = elem_offset(y);
  p.dtypes = uint32_t(x.dtype()) | uint32_t(y.dtype()) << 4;
  p.op = uint32_t(op);
  // A workgroup per row when rows are contiguous along the axis or too few to keep the device busy; otherwise an
  // invocation per row, whose neighbours then read neighbouring memory.
  // Short axes always take the invocation-per-row mode.
  p.mode = p.n <= 32 || (p.axis_stride != 1 && p.rows >= 4096) ? 1 : 0;
  p.vec = p.mode == 0 && p.axis_stride == 1 && p.n % 4 == 0 && p.x_off % 4 == 0 && p.xs[0] % 4 == 0 &&
          p.xs[1] % 4 == 0 && p.xs[2] % 4 == 0;
  const bool stretches = p.mode == 0 && (op == ReduceOp::max || op == ReduceOp::argmax) && p.n >= kStretchFromN &&
                         p.n < (1u << 24) && p.rows <= kStretchMaxRows;
  if (stretches) {
    p.chunk = kStretch;
    p.chunks = (p.n + kStretch - 1) / kStretch;
    Tensor best = Tensor::empty({int64_t(p.rows), int64_t(p.chunks)}, DType::f32, y.device());
    Tensor where = Tensor::empty({int64_t(p.rows), int64_t(p.chunks)}, DType::f32, y.device());
    p.mode = 2;
    ctx.dispatch(variant(ctx, "reduce"), {in(x), out(y), out(best), out(where)}, p, {p.chunks, p.rows, 1}, {256});
    p.mode = 3;
    ctx.dispatch(variant(ctx, "reduce"), {in(x), out(y), in(best), in(where)}, p,
                 {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(p.chunks)});
    return;
  }
  uint32_t wg = p.mode == 1 ? 64 : row_group_size(p.n);
  Groups g = p.mode == 0 ? Groups{std::min<uint32_t>(p.rows, 65535), 1, 1} : groups_1d(p.rows, wg);
  ctx.dispatch(variant(ctx, "reduce"), {in(x), out(y), in(x), out(y)}, p, g, {wg});
}

void topk_rows(const Tensor& x, const Tensor& values, const Tensor& indices, int k) {
  if (values.numel() == 0) return;
  if (!values.is_contiguous() || !indices.is_contiguous())
    throw ShapeError("vulkan topk: outputs must be contiguous");
  Context& ctx = context_for(x.device());
  Tensor xx = x;
  int last = x.ndim() - 1;
  Shape outer;
  Strides xs;
  drop_axis(xx, last, outer, xs);
  Rows rows;
  if (!make_rows(outer, {xs}, rows)) {
    xx = dense(x);
    drop_axis(xx, last, outer, xs);
    make_rows(outer, {xs}, rows);
  }
  TopKPush p{};
  p.n = u32(xx.shape()[last], "row length");
  p.x_stride = u32(xx.strides()[last], "stride");
  p.rows = rows.count;
  for (int d = 0; d < 3; ++d) {
    p.oshape[d] = rows.shape[d];
    p.xs[d] = rows.strides[0][d];
  }
  p.x_off = elem_offset(xx);
  p.v_off = elem_offset(values);
  p.i_off = elem_offset(indices);
  p.dtypes = uint32_t(xx.dtype()) | uint32_t(values.dtype()) << 4;
  p.k = u32(k, "k");
  ctx.dispatch(variant(ctx, "topk"), {in(xx), out(values), out(indices)}, p,
               {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(p.n)});
}

}  // namespace lmtune::vk

namespace lmtune {

void Reduce::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::reduce_axis(in[0], out[0], axis, op);
}

void TopK::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::topk_rows(in[0], out[0], out[1], k);
}

}  // namespace lmtune
