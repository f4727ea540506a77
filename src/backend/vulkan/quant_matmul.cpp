// Products with a block-quantized weight on Vulkan: the plan (quant_matmul.h) and its one dispatch.
#include "backend/vulkan/quant_matmul.h"

#include <algorithm>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/kernel_util.h"
#include "backend/vulkan/matmul.h"
#include "backend/vulkan/matmul_cm2.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
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

// Mirrors QDequantParams in kernels/quant/qdequant.comp.
struct QDequantParams {
  uint32_t w_off, w_rb, row0, col0, rows, cols, p_off, p_dtype, groups_x;
};

// Result columns per panel: as many as keep the decoded panel (panel x K elements either way: W's rows x K for nt,
// K rows of W's columns for nn) within the budget, in multiples of 256 (whole tiles of the dense products) where
// the budget allows, else of 8 (the decoder's groups), and at most N.
uint64_t panel_columns(uint64_t budget, uint64_t N, uint64_t K, DType dt) {
  const uint64_t fit = budget / std::max<uint64_t>(K * dtype_size(dt), 1);
  const uint64_t unit = fit >= 256 ? 256 : 8;
  return std::min(N, std::max<uint64_t>(unit, fit / unit * unit));
}

}  // namespace

std::string QuantMatmulPlan::describe() const {
  const std::string fmt(quant::info(format).name), layout = transposed ? "nt" : "nn";
  const std::string tile = std::to_string(bm) + "x" + std::to_string(bn);
  switch (route) {
    case QuantMatmulRoute::gemv: return "qgemv " + fmt + " " + std::to_string(M) + " " + layout;
    case QuantMatmulRoute::panels:
      return "qpanels " + fmt + " " + std::to_string((N + panel - 1) / panel) + "x" + std::to_string(panel) + " " +
             layout;
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
  if (kc.quant_panels || (kc.matmul == MatmulKernel::automatic && coopmat && !exact && M >= kQuantPanelMinRows)) {
    p.route = QuantMatmulRoute::panels;
    p.kernel = variant(ctx, "qdequant_" + fmt);
    p.panel_dtype = x_dtype == DType::f32 ? DType::f32 : x_dtype;
    const uint64_t budget = kc.quant_panel_bytes > 0 ? uint64_t(kc.quant_panel_bytes) : kQuantPanelBytes;
    p.panel = panel_columns(budget, N, K, p.panel_dtype);
    return p;
  }
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

namespace {

// The panels route: each panel of W decoded into one reused scratch buffer, then the dense product writes the
// panel's columns of y: in place where the product takes a column slice (matmul_cm2), else through a reused
// temporary and a copy. The addend d is added over the whole of y at the end.
void record_panels(Context& ctx, const QuantMatmulPlan& plan, const quant::QuantizedTensor& w, const Tensor& x,
                   Tensor& y, const Tensor* d) {
  const uint64_t M = plan.M, N = plan.N, K = plan.K, panel = plan.panel;
  const Tensor scratch = Tensor::empty({int64_t(panel * K)}, plan.panel_dtype, y.device());
  if (scratch.offset() % 8 != 0) throw DeviceError("quantized_matmul: internal error, a misaligned panel");
  Tensor tmp;
  QDequantParams q{};
  q.w_off = u32(w.words.offset() * 4, "weight offset");
  q.w_rb = u32(int64_t(quant::row_bytes(w.format, w.cols())), "weight row bytes");
  q.p_off = elem_offset(scratch);
  q.p_dtype = dtype_code(plan.panel_dtype);
  const int64_t m = int64_t(M), k = int64_t(K), n = int64_t(N);
  for (uint64_t n0 = 0; n0 < N; n0 += panel) {
    const int64_t cols = int64_t(std::min(panel, N - n0)), c0 = int64_t(n0);
    // nt: rows n0.. of W [N, K], read as B = panelᵀ [K, cols]; nn: columns n0.. of W [K, N], B = panel [K, cols].
    Tensor b;
    if (plan.transposed) {
      q.row0 = u32(c0, "panel row"), q.col0 = 0, q.rows = u32(cols, "panel rows"), q.cols = u32(k, "panel cols");
      b = scratch.view_as({k, cols}, {1, k}, scratch.offset());
    } else {
      q.row0 = 0, q.col0 = u32(c0, "panel col"), q.rows = u32(k, "panel rows"), q.cols = u32(cols, "panel cols");
      b = scratch.view_as({k, cols}, {cols, 1}, scratch.offset());
    }
    const uint64_t groups = (uint64_t(q.rows) * q.cols / 8 + 255) / 256;
    q.groups_x = uint32_t(std::min<uint64_t>(groups, 65535));
    ctx.dispatch(plan.kernel, {in(w.words), out(scratch)}, q,
                 Groups{q.groups_x, uint32_t((groups + q.groups_x - 1) / q.groups_x), 1}, {});
    Tensor c = y.view_as({m, cols}, {n, 1}, y.offset() + c0);
    if (cols == n) {
      if (!record_matmul(x, b, c, nullptr)) throw DeviceError("quantized_matmul: internal error, no product");
      continue;
    }
    if (const std::string cm2 = cm2_kernel(ctx, x, b, c, nullptr); !cm2.empty()) {
      record_cm2(ctx, cm2, x, b, c, nullptr);
      continue;
    }
    if (!tmp.defined()) tmp = Tensor::empty({int64_t(M * panel)}, y.dtype(), y.device());
    Tensor t = tmp.view_as({m, cols}, {cols, 1}, tmp.offset());
    if (!record_matmul(x, b, t, nullptr)) throw DeviceError("quantized_matmul: internal error, no product");
    copy_tensor(t, c);
  }
  if (d) {
    Binary add(BinaryOp::add);
    std::vector<Tensor> dst{y};
    eval_on(y.device(), add, {y, *d}, dst);
  }
}

}  // namespace
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
  if (plan.route == vk::QuantMatmulRoute::panels) {
    vk::record_panels(ctx, plan, weight, x, y, in.size() > 1 ? &d : nullptr);
    return;
  }
  const std::vector<vk::Binding> bindings{vk::in(x), vk::in(weight.words), vk::out(y), vk::in(d)};
  if (plan.route == vk::QuantMatmulRoute::gemv) {
    // Workgroups of 4 subgroups, one row of W each on a GPU; a CPU device (lavapipe) pays per workgroup, so there
    // each takes 64 rows of W (as matmul_gemv).
    const uint32_t cols = ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64 : 4;
    ctx.dispatch(plan.kernel, bindings, p, vk::Groups{vk::ceil_div(plan.N, cols), 1, 1},
                 {4 * std::max<uint32_t>(ctx.features().subgroup_size, 1), cols, p.dtypes, p.flags});
    return;
  }
  const uint32_t gy = vk::ceil_div(plan.M, plan.bm);
  if (gy > 65535) throw ShapeError("quantized_matmul: " + std::to_string(plan.M) + " rows exceed one dispatch");
  ctx.dispatch(plan.kernel, bindings, p, vk::Groups{vk::ceil_div(plan.N, plan.bn), gy, 1}, {});
}

}  // namespace lmtune
