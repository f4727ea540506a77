// Products with a block-quantized weight on Vulkan: the plan (quant_matmul.h) and its one dispatch.
#include "backend/vulkan/quant_matmul.h"

#include <algorithm>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/kernel_util.h"
#include "core/error.h"
#include "core/ops/quant_matmul.h"

namespace lmtune {
namespace vk {
namespace {

// Mirrors QMatmulParams in kernels/quant/qmatmul_common.glsl.
struct QMatmulParams {
  uint32_t M, N, K;
  uint32_t x_off, x_rs;
  uint32_t w_off, w_rb;
  uint32_t c_off;
  uint32_t dtypes;
  uint32_t flags;
  uint32_t d_off;
};
static_assert(sizeof(QMatmulParams) == 11 * 4);
constexpr uint32_t kFlagNt = 1, kFlagXVec = 2, kFlagAdd = 4;

uint32_t dtype_code(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::bf16: return 2;
    default: throw ShapeError("quantized_matmul: unsupported dtype " + std::string(dtype_name(t)) + " on Vulkan");
  }
}

constexpr uint32_t kTiledTile = 64, kCoopmatTile = 128;

}  // namespace

std::string QuantMatmulPlan::describe() const {
  const std::string fmt(quant::info(format).name), layout = transposed ? "nt" : "nn";
  const std::string tile = std::to_string(bm) + "x" + std::to_string(bn);
  switch (route) {
    case QuantMatmulRoute::gemv: return "qgemv " + fmt + " " + std::to_string(M) + " " + layout;
    case QuantMatmulRoute::coopmat: return "qcoopmat " + fmt + " " + tile + " " + layout;
    case QuantMatmulRoute::tiled: break;
  }
  return "qtiled " + fmt + " " + tile + " " + layout;
}

QuantMatmulPlan plan_quant_matmul(Context& ctx, quant::Format format, bool transposed, uint64_t M, uint64_t N,
                                  uint64_t K, DType x_dtype) {
  const KernelChoice& kc = ctx.kernel_choice();
  QuantMatmulPlan p;
  p.format = format, p.transposed = transposed, p.M = M, p.N = N, p.K = K;
  const std::string fmt(quant::info(format).name);
  const bool coopmat = ctx.features().coopmat_kernels();
  if (kc.matmul == MatmulKernel::coopmat && !coopmat)
    throw DeviceError("quantized_matmul: the cooperative-matrix kernel was forced on a device without it");
  if (kc.matmul == MatmulKernel::automatic && transposed && M <= kQuantGemvMaxRows &&
      ctx.features().subgroup_arithmetic && (N + 3) / 4 <= 65535) {
    p.route = QuantMatmulRoute::gemv;
    p.kernel = variant(ctx, "qmatmul_gemv_" + fmt);
    return p;
  }
  const bool exact = x_dtype == DType::f32 && kc.matmul == MatmulKernel::automatic;
  if (kc.matmul != MatmulKernel::scalar && coopmat && !exact) {
    p.route = QuantMatmulRoute::coopmat;
    p.kernel = "qmatmul_cm_" + fmt + (transposed ? "_nt" : "_nn");
    p.bm = p.bn = kCoopmatTile;
    return p;
  }
  p.route = QuantMatmulRoute::tiled;
  p.kernel = variant(ctx, "qmatmul_" + fmt);
  p.bm = p.bn = kTiledTile;
  return p;
}

}  // namespace vk

void QuantizedMatmul::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  Tensor& y = out[0];
  if (y.numel() == 0) return;
  vk::Context& ctx = vk::context_for(y.device());
  const vk::QuantMatmulPlan plan =
      vk::plan_quant_matmul(ctx, weight.format, transposed, uint64_t(x.dim(0)), uint64_t(y.dim(1)),
                            uint64_t(x.dim(1)), x.dtype());
  if (weight.words.buffer()->bytes() > (uint64_t(1) << 32) - 1)
    throw DeviceError("quantized_matmul: a weight of " + std::to_string(weight.words.buffer()->bytes()) +
                      " bytes exceeds the 4 GiB a kernel can address");
  vk::QMatmulParams p{};
  p.M = vk::u32(x.dim(0), "rows"), p.N = vk::u32(y.dim(1), "columns"), p.K = vk::u32(x.dim(1), "inner dim");
  p.x_off = vk::elem_offset(x), p.x_rs = vk::u32(x.dim(0) > 1 ? x.strides()[0] : x.dim(1), "row stride");
  p.w_off = vk::u32(weight.words.offset() * 4, "weight offset");
  p.w_rb = vk::u32(int64_t(quant::row_bytes(weight.format, weight.cols())), "weight row bytes");
  p.c_off = vk::elem_offset(y);
  p.dtypes = vk::dtype_code(x.dtype()) | vk::dtype_code(y.dtype()) << 8;
  p.flags = (transposed ? vk::kFlagNt : 0u) | (p.x_off % 8 == 0 && p.x_rs % 8 == 0 ? vk::kFlagXVec : 0u);
  // The addend D (binding 3; y itself, unread, without one) is dense [M, N].
  const Tensor d = in.size() > 1 ? vk::dense(in[1]) : y;
  if (in.size() > 1) {
    p.flags |= vk::kFlagAdd;
    p.d_off = vk::elem_offset(d);
    p.dtypes |= vk::dtype_code(d.dtype()) << 16;
  }
  const std::vector<vk::Binding> bindings{vk::in(x), vk::in(weight.words), vk::out(y), vk::in(d)};
  if (plan.route == vk::QuantMatmulRoute::gemv) {
    // Workgroups of 4 subgroups, one row of W each on a GPU; a CPU device (lavapipe) pays per workgroup, so there
    // each takes 64 rows of W (as matmul_gemv).
    const uint32_t cols = ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64 : 4;
    ctx.dispatch(plan.kernel, bindings, p, vk::Groups{vk::ceil_div(plan.N, cols), 1, 1},
                 {4 * std::max<uint32_t>(ctx.features().subgroup_size, 1), cols});
    return;
  }
  const uint32_t gy = vk::ceil_div(plan.M, plan.bm);
  if (gy > 65535) throw ShapeError("quantized_matmul: " + std::to_string(plan.M) + " rows exceed one dispatch");
  ctx.dispatch(plan.kernel, bindings, p, vk::Groups{vk::ceil_div(plan.N, plan.bn), gy, 1}, {});
}

}  // namespace lmtune
