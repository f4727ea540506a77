// Vulkan kernels for the elementwise primitives (unary, binary, where, the fused gated activation) and the strided
// elementwise launcher that copy.cpp shares. Kernels: kernels/elementwise/elementwise.comp,
// kernels/elementwise/gated_activation.comp.
#include <algorithm>
#include <cstdlib>

#include "backend/vulkan/kernel_util.h"
#include "core/error.h"
#include "core/ops/elementwise.h"

namespace lmtune::vk {

uint32_t u32(int64_t v, const char* what) {
  if (v < 0 || v > int64_t(UINT32_MAX))
    throw ShapeError(std::string("vulkan: ") + what + " " + std::to_string(v) + " does not fit the kernels' 32-bit indices");
  return uint32_t(v);
}

namespace {

constexpr uint32_t kGroup = 256;

void launch(Context& ctx, const std::string& kernel, const std::vector<Tensor>& tensors, const Shape& shape,
            const std::vector<Strides>& strides, std::vector<int64_t> offsets, uint32_t op, float param) {
  size_t nd = shape.size();
  if (nd > 4) {  // rare after collapsing: one launch per index of the outermost dim
    Shape inner(shape.begin() + 1, shape.end());
    std::vector<Strides> st(strides.size());
    for (size_t t = 0; t < strides.size(); ++t) st[t] = Strides(strides[t].begin() + 1, strides[t].end());
    for (int64_t i = 0; i < shape[0]; ++i) {
      std::vector<int64_t> off = offsets;
      for (size_t t = 0; t < off.size(); ++t) off[t] += i * strides[t][0];
      launch(ctx, kernel, tensors, inner, st, off, op, param);
    }
    return;
  }
  ElementwisePush p{};
  p.n = u32(numel(shape), "element count");
  bool contiguous = nd <= 1;
  for (size_t t = 0; t < strides.size() && contiguous; ++t) contiguous = nd == 0 || strides[t][0] == 1;
  p.contiguous = contiguous;
  for (size_t d = 0; d < 4; ++d) p.shape[d] = d + nd >= 4 ? u32(shape[d + nd - 4], "dimension") : 1;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t d = 0; d < 4; ++d)
      p.strides[4 * t + d] = d + nd >= 4 ? u32(strides[t][d + nd - 4], "stride") : 0;
    p.offsets[t] = u32(offsets[t], "tensor offset");
    p.dtypes |= uint32_t(tensors[t].dtype()) << (4 * t);
  }
  p.op = op;
  p.param = param;
  // Vector path: dense and every offset a multiple of 4 elements; 4 elements per item, 4 items per invocation.
  bool vec = contiguous;
  for (size_t t = 0; t < tensors.size() && vec; ++t) vec = p.offsets[t] % 4 == 0;
  if (vec) p.contiguous = 2;
  // The *_wide builds (binary, where, copy): 8 elements per item where some tensor is 16-bit and every offset is a
  // multiple of 8.
  bool wide = vec && kernel != "unary", some16 = false;
  for (size_t t = 0; t < tensors.size() && wide; ++t) {
    wide = p.offsets[t] % 8 == 0;
    some16 = some16 || dtype_size(tensors[t].dtype()) == 2;
  }
  wide = wide && some16;
  std::vector<Binding> b;
  for (size_t t = 0; t < tensors.size(); ++t)
    b.push_back(t + 1 == tensors.size() ? out(tensors[t]) : in(tensors[t]));
  ctx.dispatch(variant(ctx, wide ? kernel + "_wide" : kernel), b, p,
               vec ? groups_1d(p.n, kGroup * 16) : groups_1d(p.n, kGroup), {kGroup});
}

}  // namespace

void run_elementwise(const std::string& kernel, const std::vector<Tensor>& tensors, uint32_t op, float param) {
  const Tensor& y = tensors.back();
  if (y.numel() == 0) return;
  Shape shape = y.shape();
  std::vector<Strides> strides;
  std::vector<int64_t> offsets;
  for (const Tensor& t : tensors) {
    Tensor v = broadcast_view(t, shape);
    strides.push_back(v.strides());
    offsets.push_back(v.offset());
  }
  collapse_dims(shape, strides);
  launch(context_for(y.device()), kernel, tensors, shape, strides, offsets, op, param);
}

}  // namespace lmtune::vk

namespace lmtune {

void Unary::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::run_elementwise("unary", {in[0], out[0]}, uint32_t(op), param);
}

void Binary::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::run_elementwise("binary", {in[0], in[1], out[0]}, uint32_t(op), 0);
}

void Where::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::run_elementwise("where", {in[0], in[1], in[2], out[0]}, 0, 0);
}

namespace {

// Push constants of kernels/elementwise/gated_activation.comp.
struct GatedActivationPush {
  uint32_t n;
  uint32_t offsets[5];
  uint32_t dtypes;
  uint32_t op;
  uint32_t vec;  // every offset a multiple of 4: 4 elements per item
};
static_assert(sizeof(GatedActivationPush) <= 128);

// Runs the forward (gate, up, y) or backward (gate, up, g, d_gate, d_up) kernel; inputs are made dense first, the
// outputs are fresh (dense) tensors.
void run_gated_activation(const std::string& kernel, UnaryOp act, const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& outputs) {
  std::vector<Tensor> tensors;
  for (const Tensor& t : inputs) tensors.push_back(vk::dense(t));
  for (const Tensor& t : outputs) tensors.push_back(t);
  GatedActivationPush p{};
  p.n = vk::u32(outputs[0].numel(), "element count");
  if (p.n == 0) return;
  std::vector<vk::Binding> b;
  for (size_t t = 0; t < tensors.size(); ++t) {
    p.offsets[t] = vk::elem_offset(tensors[t]);
    p.dtypes |= uint32_t(tensors[t].dtype()) << (4 * t);
    b.push_back(t < inputs.size() ? vk::in(tensors[t]) : vk::out(tensors[t]));
  }
  p.op = uint32_t(act);
  p.vec = true;
  bool wide = p.vec && kernel == "gated_activation";  // gated_activation_wide: every tensor 16-bit, 8-aligned
  for (size_t t = 0; t < tensors.size(); ++t) {
    p.vec = p.vec && p.offsets[t] % 4 == 0;
    wide = wide && p.offsets[t] % 8 == 0 && dtype_size(tensors[t].dtype()) == 2;
  }
  const uint32_t per_thread = wide ? 8 : p.vec ? 4 : 1;
  vk::Context& ctx = vk::context_for(outputs[0].device());
  ctx.dispatch(vk::variant(ctx, wide ? kernel + "_wide" : kernel), b, p,
               vk::groups_1d(std::max<uint32_t>(p.n / per_thread, 1), 256), {256});
}

}  // namespace

void GatedActivation::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_gated_activation("gated_activation", act, in, out);
}

void GatedActivationBackward::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  run_gated_activation("gated_activation_backward", act, in, out);
}

}  // namespace lmtune

namespace lmtune::vk {

bool make_rows(Shape shape, std::vector<Strides> strides, Rows& rows) {
  rows.count = u32(numel(shape), "row count");
  collapse_dims(shape, strides);
  size_t nd = shape.size();
  if (nd > 3) return false;
  for (size_t d = 0; d < nd; ++d) {
    rows.shape[3 - nd + d] = u32(shape[d], "dimension");
    for (size_t t = 0; t < strides.size() && t < 2; ++t) rows.strides[t][3 - nd + d] = u32(strides[t][d], "stride");
  }
  return true;
}

}  // namespace lmtune::vk
