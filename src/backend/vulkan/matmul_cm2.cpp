// The cooperative-matrix-2 product (see matmul_cm2.h): whether the operands suit kernels/matmul/matmul_cm2.comp, and
// its dispatch. Its builds need glslang 15 (cmake/kernels.cmake); a binary built without them says so once and keeps
// to the other kernels.
#include "backend/vulkan/matmul_cm2.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include <spdlog/spdlog.h>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/pipelines.h"

namespace lmtune::vk {
namespace {

// Mirrors Cm2Params in kernels/matmul/matmul_cm2.comp.
struct Cm2Params {
  uint32_t M, N, K;
  uint32_t a_off, a_rs, b_off, b_rs, c_off, c_rs;
  uint32_t u_off, u_rs, v_off, v_rs, R;
  uint32_t flags;
  uint32_t b_gs;
};

constexpr int64_t kTileM = 128, kTileN = 256;
// Fewer tiles than about a wave of the GPU's multiprocessors leave it idle (the kernel does not split K), and
// edge tiles that reach far past the product waste their tensor-core work (a 896-wide product in 256-wide tiles:
// 1/8): the VK_NV_cooperative_matrix planner, which splits K and has 128-wide tiles, takes those.
constexpr int64_t kMinTiles = 96;
constexpr double kMaxEdgeWaste = 0.125;
// Short K leaves the unrolled loop little to pipeline: Qwen2.5-0.5B's K = 896 products ran slower here than on the
// VK_NV_cooperative_matrix kernel (H100: 16384x4864x896 nt at 176 TFLOP/s; the model's training 4.5% slower).
constexpr int64_t kMinK = 1024;

bool is16(DType t) { return t == DType::f16 || t == DType::bf16; }
bool aligned(int64_t v) { return v % 8 == 0; }
bool transposed(const Tensor& b) { return b.strides()[0] == 1 && b.strides()[1] != 1; }

// Row stride of a 2-dim operand stored row-major (transposed: of its transpose), or 0 where it is neither or its
// rows and offset are not 16-byte aligned.
int64_t row_stride(const Tensor& t, bool transposed) {
  if (t.ndim() != 2) return 0;
  const int64_t unit = t.strides()[transposed ? 0 : 1], rs = t.strides()[transposed ? 1 : 0];
  if ((unit != 1 && t.dim(transposed ? 0 : 1) > 1) || rs <= 0 || !aligned(rs) || !aligned(t.offset())) return 0;
  return rs;
}

// The embedded module `kernel`, or "" after saying once that this binary lacks the cooperative-matrix-2 kernels.
std::string built(Context& ctx, std::string kernel) {
  if (!embedded_spirv(kernel).empty()) return kernel;
  static std::once_flag once;
  std::call_once(once, [&] {
    spdlog::warn("matmul: {} has cooperative matrices 2 but this lmtune was built without their kernels "
                 "(scripts/build_glslang.sh, then rebuild); products take the slower VK_NV_cooperative_matrix ones",
                 ctx.name());
  });
  return "";
}

bool contiguous_aligned(const Tensor& t) { return t.is_contiguous() && aligned(t.offset()); }

}  // namespace

std::string cm2_kernel(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c, const LowRankTerm* lr) {
  const Features& f = ctx.features();
  if (!f.cooperative_matrix2 || a.ndim() != 2 || b.ndim() != 2 || c.ndim() != 2) return "";
  const DType dt = a.dtype();
  if (!is16(dt) || b.dtype() != dt || (dt == DType::bf16 && !f.bf16_cooperative_matrix)) return "";
  if (c.dtype() != dt && c.dtype() != DType::f32) return "";
  const int64_t M = c.dim(0), N = c.dim(1), K = a.dim(1);
  const int64_t tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
  if (K < kMinK || tiles_m * tiles_n < kMinTiles ||
      double(tiles_m * kTileM) * double(tiles_n * kTileN) > (1 + kMaxEdgeWaste) * double(M) * double(N))
    return "";
  const bool tb = transposed(b);
  if (!row_stride(a, false) || !row_stride(b, tb) || c.strides()[1] != 1 || c.strides()[0] < N ||
      !aligned(c.strides()[0]) || !aligned(c.offset()))
    return "";
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    if (lr->alpha != 1.0f || !is16(u.dtype()) || v.dtype() != u.dtype() || !row_stride(u, false) ||
        !row_stride(v, tb) || !aligned(u.dim(1)))
      return "";
  }
  return built(ctx, std::string("matmul_cm2_") + (dt == DType::bf16 ? "bf16" : "f16") + (tb ? "_t" : "_n") +
                        (c.dtype() == DType::f32 ? "_c32" : "_c16"));
}

std::string cm2_grouped_kernel(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& y, bool transposed) {
  const Features& f = ctx.features();
  const DType dt = x.dtype();
  if (!f.cooperative_matrix2 || !is16(dt) || w.dtype() != dt || y.dtype() != dt ||
      (dt == DType::bf16 && !f.bf16_cooperative_matrix))
    return "";
  if (!contiguous_aligned(x) || !contiguous_aligned(w) || !contiguous_aligned(y) || !aligned(x.dim(1)) ||
      !aligned(y.dim(1)) || !aligned(w.dim(1) * w.dim(2)))
    return "";
  const int64_t words = std::numeric_limits<uint32_t>::max();
  if (x.offset() + x.numel() > words || w.offset() + w.numel() > words || y.offset() + y.numel() > words) return "";
  const std::string operands = dt == DType::bf16 ? "bf16" : "f16";
  return built(ctx, "matmul_cm2_grouped_" + operands + (transposed ? "_t" : "_n"));
}

std::string cm2_outer_kernel(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& y) {
  const Features& f = ctx.features();
  const DType dt = a.dtype();
  if (!f.cooperative_matrix2 || !is16(dt) || b.dtype() != dt || y.dtype() != dt ||
      (dt == DType::bf16 && !f.bf16_cooperative_matrix))
    return "";
  if (!contiguous_aligned(a) || !contiguous_aligned(b) || !contiguous_aligned(y) || !aligned(a.dim(1)) ||
      !aligned(b.dim(1)) || y.dim(0) > int64_t(ctx.properties().limits.maxComputeWorkGroupCount[2]))
    return "";
  const int64_t words = std::numeric_limits<uint32_t>::max();
  if (a.offset() + a.numel() > words || b.offset() + b.numel() > words || y.offset() + y.numel() > words) return "";
  return built(ctx, std::string("matmul_cm2_grouped_outer_") + (dt == DType::bf16 ? "bf16" : "f16"));
}

void record_cm2_outer(Context& ctx, const std::string& kernel, const Tensor& a, const Tensor& b,
                      const std::vector<int64_t>& offsets, Tensor& y) {
  // One entry per group: its first row and its end.
  std::vector<int32_t> ranges;
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    ranges.insert(ranges.end(), {int32_t(offsets[g]), int32_t(offsets[g + 1]), 0, 0});
  const int64_t G = int64_t(offsets.size()) - 1, M = a.dim(1), N = b.dim(1);
  Cm2Params p{};
  p.M = uint32_t(M), p.N = uint32_t(N), p.K = uint32_t(a.dim(0));
  p.a_off = uint32_t(a.offset()), p.a_rs = uint32_t(M);
  p.b_off = uint32_t(b.offset()), p.b_rs = uint32_t(N);
  p.c_off = uint32_t(y.offset()), p.c_rs = uint32_t(N), p.b_gs = uint32_t(M * N);
  const Tensor table = Tensor::from_ints(ranges, {G, 4}, a.device());
  ctx.dispatch(kernel, {in(a), in(b), out(y), in(table)}, p,
               {uint32_t((N + kTileN - 1) / kTileN), uint32_t((M + kTileM - 1) / kTileM), uint32_t(G)});
}

void record_cm2(Context& ctx, const std::string& kernel, const Tensor& a, const Tensor& b, Tensor& c,
                const LowRankTerm* lr) {
  const int64_t M = c.dim(0), N = c.dim(1), K = a.dim(1);
  const bool tb = transposed(b);
  Cm2Params p{};
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    p.u_off = uint32_t(u.offset()), p.u_rs = uint32_t(row_stride(u, false));
    p.v_off = uint32_t(v.offset()), p.v_rs = uint32_t(row_stride(v, tb));
    p.R = uint32_t(u.dim(1));
    p.flags = u.dtype() == DType::bf16 ? 1u : 0u;
  }
  p.M = uint32_t(M), p.N = uint32_t(N), p.K = uint32_t(K);
  p.a_off = uint32_t(a.offset()), p.a_rs = uint32_t(row_stride(a, false));
  p.b_off = uint32_t(b.offset()), p.b_rs = uint32_t(row_stride(b, tb));
  p.c_off = uint32_t(c.offset()), p.c_rs = uint32_t(c.strides()[0]);
  ctx.dispatch(kernel, {in(a), in(b), out(c), in(lr ? *lr->u : a), in(lr ? *lr->v : b)}, p,
               {uint32_t((N + kTileN - 1) / kTileN), uint32_t((M + kTileM - 1) / kTileM), 1});
}

void record_cm2_grouped(Context& ctx, const std::string& kernel, const Tensor& x, const Tensor& w,
                        const std::vector<int64_t>& offsets, Tensor& y) {
  // One entry per tile of rows: its first row, the end of its group's rows, the group.
  std::vector<int32_t> tiles;
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    for (int64_t r = offsets[g]; r < offsets[g + 1]; r += kTileM)
      tiles.insert(tiles.end(), {int32_t(r), int32_t(offsets[g + 1]), int32_t(g), 0});
  const int64_t count = int64_t(tiles.size() / 4), N = y.dim(1);
  Cm2Params p{};
  p.M = uint32_t(x.dim(0)), p.N = uint32_t(N), p.K = uint32_t(x.dim(1));
  p.a_off = uint32_t(x.offset()), p.a_rs = uint32_t(x.dim(1));
  p.b_off = uint32_t(w.offset()), p.b_rs = uint32_t(w.dim(2)), p.b_gs = uint32_t(w.dim(1) * w.dim(2));
  p.c_off = uint32_t(y.offset()), p.c_rs = uint32_t(N);
  // Workgroup rows are tiles; more tiles than the device's grid height take several dispatches.
  const int64_t per_dispatch = ctx.properties().limits.maxComputeWorkGroupCount[1];
  for (int64_t first = 0; first < count; first += per_dispatch) {
    const int64_t n = std::min(per_dispatch, count - first);
    const std::vector<int32_t> part(tiles.begin() + first * 4, tiles.begin() + (first + n) * 4);
    const Tensor table = Tensor::from_ints(part, {n, 4}, x.device());
    ctx.dispatch(kernel, {in(x), in(w), out(y), in(table)}, p,
                 {uint32_t((N + kTileN - 1) / kTileN), uint32_t(n), 1});
  }
}

}  // namespace lmtune::vk
