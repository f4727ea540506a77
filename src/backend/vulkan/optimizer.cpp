// Vulkan kernels for the in-place optimizer updates (kernels/optimizer.comp).
#include "backend/vulkan/kernel_util.h"
#include "core/ops/optimizer.h"

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

}  // namespace

void AdamWUpdate::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  run("adamw_update", in[0], in[1], in[2], in[3], in[4], false);
}

void SgdUpdate::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  bool momentum = in[1].defined();
  // Without momentum the M and V bindings are unused; bind the parameter there.
  run("sgd_update", in[0], momentum ? in[1] : in[0], in[0], in[2], in[3], momentum);
}

}  // namespace lmtune
