// Vulkan kernels for the in-place optimizer updates (kernels/optimizer/optimizer.comp) and the gradient norm's sum of
// squares over many tensors (kernels/optimizer/sum_of_squares.comp).
#include <algorithm>

#include "backend/vulkan/kernel_util.h"
#include "core/ops.h"
#include "core/ops/optimizer.h"
#include "core/ops/view.h"

namespace lmtune {
namespace {

struct OptimPush {
  uint32_t n, p_off, m_off, v_off, g_off, h_off, g_dtype, has_momentum;
};
static_assert(sizeof(OptimPush) <= 128);

void run(const char* kernel, const Tensor& p, const Tensor& m, const Tensor& v, const Tensor& g, const Tensor& h,
         bool has_momentum) {
  vk::Context& ctx = vk::context_for(p.device());
  OptimPush push{vk::u32(p.numel(), "parameter size"), vk::elem_offset(p), vk::elem_offset(m), vk::elem_offset(v),
                 vk::elem_offset(g),                   vk::elem_offset(h), uint32_t(g.dtype()), has_momentum};
  ctx.dispatch(vk::variant(ctx, kernel), {vk::out(p), vk::out(m), vk::out(v), vk::in(g), vk::in(h)}, push,
               vk::groups_1d(p.numel(), 256), {256});
}

struct SumSqPush {
  uint32_t first, count, part_base;
};

}  // namespace

// Tensors grouped by device buffer, up to max_buffers buffers per dispatch; a table of (slot | dtype << 8, offset,
// count) per chunk of 8192 elements goes up once, partial sums come back in one f32 tensor summed by ops::sum_all.
void SumOfSquares::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  constexpr uint32_t kChunk = 8192;
  vk::Context& ctx = vk::context_for(out[0].device());
  struct Group {
    std::vector<std::shared_ptr<Buffer>> buffers;
    uint32_t first = 0, count = 0;
  };
  std::vector<Group> groups(1);
  std::vector<int32_t> table;
  for (const Tensor& x : in) {
    if (x.numel() == 0) continue;
    Group* g = &groups.back();
    auto it = std::find(g->buffers.begin(), g->buffers.end(), x.buffer());
    if (it == g->buffers.end() && int(g->buffers.size()) == max_buffers) {
      groups.push_back(Group{{}, uint32_t(table.size() / 4), 0});
      g = &groups.back();
      it = g->buffers.end();
    }
    if (it == g->buffers.end()) it = g->buffers.insert(g->buffers.end(), x.buffer());
    const uint32_t slot = uint32_t(it - g->buffers.begin()), off = vk::elem_offset(x);
    const uint32_t n = vk::u32(x.numel(), "tensor size");
    for (uint32_t c = 0; c < n; c += kChunk) {
      table.insert(table.end(), {int32_t(slot | uint32_t(x.dtype()) << 8), int32_t(off + c),
                                 int32_t(std::min(kChunk, n - c)), 0});
      ++g->count;
    }
  }
  const uint32_t entries = uint32_t(table.size() / 4);
  if (entries == 0) {
    copy_into(out[0], Tensor::zeros({}, DType::f32, out[0].device()));
    return;
  }
  Tensor tab = Tensor::from_ints(table, {int64_t(table.size())}, out[0].device());
  Tensor partials = Tensor::empty({int64_t(entries)}, DType::f32, out[0].device());
  for (const Group& g : groups) {
    if (g.count == 0) continue;
    std::vector<vk::Binding> b;
    for (int i = 0; i < 8; ++i) b.push_back({g.buffers[size_t(std::min<int>(i, int(g.buffers.size()) - 1))], false});
    b.push_back(vk::in(tab));
    b.push_back(vk::out(partials));
    SumSqPush push{g.first, g.count, g.first};
    ctx.dispatch(vk::variant(ctx, "sum_of_squares"), b, push, vk::groups_1d(g.count, 1), {256});
  }
  copy_into(out[0], ops::sum_all(partials));
}

void AdamWUpdate::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  run("adamw_update", in[0], in[1], in[2], in[3], in[4], false);
}

void SgdUpdate::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  bool momentum = in[1].defined();
  // Without momentum the M and V bindings are unused; bind the parameter there.
  run("sgd_update", in[0], momentum ? in[1] : in[0], in[0], in[2], in[3], momentum);
}

}  // namespace lmtune
