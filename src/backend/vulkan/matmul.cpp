// Matmul on Vulkan: records the plan of matmul_plan.cpp (kernel, tile, split-K, batch dims) as dispatches, and
// composes a low-rank addend or an accumulation where the kernel taking the product has no room for it.
#include "backend/vulkan/matmul.h"

#include <algorithm>
#include <optional>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/matmul_cm2.h"
#include "backend/vulkan/matmul_plan.h"
#include "backend/vulkan/matmul_skinny.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/grouped_matmul.h"
#include "core/ops/matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/matmul_gated.h"

namespace lmtune {
namespace vk {
namespace {

// Mirrors MatmulParams in kernels/matmul/matmul_common.glsl.
struct MatmulParams {
  uint32_t M, N, K;
  uint32_t a_off, a_rs, a_cs, a_bs0, a_bs1;
  uint32_t b_off, b_rs, b_cs, b_bs0, b_bs1;
  uint32_t c_off;
  uint32_t nb1;
  uint32_t dtypes;
  uint32_t k_split;
  uint32_t nsplit;
  uint32_t flags;
  uint32_t u_off, u_rs, u_cs;
  uint32_t v_off, v_rs, v_cs;
  uint32_t R;
  float alpha;
  uint32_t s_off;
};
static_assert(sizeof(MatmulParams) == 28 * 4);
constexpr uint32_t kFlagAVec = 1, kFlagBVec = 2, kFlagCVec = 4, kFlagCAcc = 8, kFlagRowScale = 16, kFlagMEdge = 32;

struct SplitKParams {
  uint32_t count, nsplit, out_off, out_dtype, groups_x;
};

constexpr uint32_t kMaxGroupsZ = 65535;

uint32_t dtype_code(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::bf16: return 2;
    default: throw ShapeError("matmul: unsupported dtype " + std::string(dtype_name(t)) + " on Vulkan");
  }
}

}  // namespace

bool vector_staging(DType t, bool transposed, int64_t rs, int64_t cs, int64_t off, int64_t bs0, int64_t bs1) {
  const int64_t al = t == DType::f32 ? 4 : 8;
  auto aligned = [al](int64_t v) { return v % al == 0; };
  const int64_t unit = transposed ? rs : cs, other = transposed ? cs : rs;
  return unit == 1 && aligned(other) && aligned(off) && aligned(bs0) && aligned(bs1);
}

bool coopmat_available(int index) {
  return context_for(Device::vulkan(index)).features().coopmat_kernels();
}

namespace {

// The push block shared by the dispatches of a VK_NV_cooperative_matrix or scalar plan (offsets and flags are
// set per dispatch).
MatmulParams common_params(const MatmulPlan& plan, const Tensor& a, const Tensor& b, const Tensor& dst,
                           const LowRankTerm* lr) {
  MatmulParams p{};
  p.M = uint32_t(plan.M), p.N = uint32_t(plan.N), p.K = uint32_t(plan.K);
  p.a_rs = uint32_t(a.strides()[size_t(a.ndim() - 2)]), p.a_cs = uint32_t(a.strides().back());
  p.b_rs = uint32_t(b.strides()[size_t(b.ndim() - 2)]), p.b_cs = uint32_t(b.strides().back());
  p.dtypes = dtype_code(a.dtype()) | dtype_code(b.dtype()) << 4 | dtype_code(dst.dtype()) << 8;
  p.k_split = uint32_t(plan.k_split);
  p.nsplit = plan.nsplit;
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    p.u_off = uint32_t(u.offset()), p.u_rs = uint32_t(u.strides()[0]), p.u_cs = uint32_t(u.strides()[1]);
    p.v_off = uint32_t(v.offset()), p.v_rs = uint32_t(v.strides()[0]), p.v_cs = uint32_t(v.strides()[1]);
    p.R = uint32_t(u.dim(1));
    p.alpha = lr->alpha;
    p.dtypes |= dtype_code(u.dtype()) << 12 | dtype_code(v.dtype()) << 16;
  }
  return p;
}

// Sums split-K's f32 partials [nsplit][batch][M][N] into c.
void record_splitk_sum(Context& ctx, const MatmulPlan& plan, const Tensor& partials, Tensor& c) {
  SplitKParams s{};
  s.count = uint32_t(uint64_t(c.numel()));
  s.nsplit = plan.nsplit;
  s.out_off = uint32_t(c.offset());
  s.out_dtype = dtype_code(c.dtype());
  const uint64_t groups = (uint64_t(s.count) + 255) / 256;
  s.groups_x = uint32_t(std::min<uint64_t>(groups, 65535));
  ctx.dispatch(variant(ctx, "matmul_splitk"), {{partials.buffer(), false}, {c.buffer(), true}}, s,
               Groups{s.groups_x, uint32_t((groups + s.groups_x - 1) / s.groups_x), 1});
}

// The dispatches of a VK_NV_cooperative_matrix or scalar plan: one per outer batch index and per chunk of the
// kernel's outer batch dim that keeps the grid's z within 65535.
void record_tiled(Context& ctx, const MatmulPlan& plan, const Tensor& a, const Tensor& b, Tensor& c,
                  const LowRankTerm* lr, const Accumulate* acc) {
  const uint64_t M = plan.M, N = plan.N;
  const BatchDim &d0 = plan.d0, &d1 = plan.d1;
  // With split-K the kernel writes f32 partials [nsplit][batch][M][N] to a workspace.
  Tensor dst = plan.nsplit > 1 ? Tensor::empty({int64_t(plan.nsplit) * c.numel()}, DType::f32, c.device()) : c;
  const MatmulParams p = common_params(plan, a, b, dst, lr);
  // The scalar and fast kernels read U and V at bindings 3 and 4 (A and B again without an addend), the fast
  // one FLAG_ROW_SCALE's scales at 5 (C again without them); the general coopmat kernel has only A, B and C.
  std::vector<Binding> bindings{in(a), in(b), out(dst)};
  if (plan.route != MatmulRoute::coopmat) {
    bindings.push_back(in(lr ? *lr->u : a));
    bindings.push_back(in(lr ? *lr->v : b));
  }
  if (plan.route == MatmulRoute::coopmat_fast) bindings.push_back(in(acc && acc->row_scale ? *acc->row_scale : dst));
  const bool cm = plan.route != MatmulRoute::scalar;
  std::vector<uint32_t> spec = plan.spec;
  if (cm) spec = {dtype_code(a.dtype()), dtype_code(b.dtype()), dtype_code(dst.dtype())};
  const uint64_t d0_chunk = std::max<uint64_t>(1, kMaxGroupsZ / (uint64_t(d1.size) * plan.nsplit));
  uint64_t n_outer = 1;
  for (const auto& d : plan.outer) n_outer *= uint64_t(d.size);
  for (uint64_t o = 0; o < n_outer; ++o) {
    int64_t a_off = a.offset(), b_off = b.offset();
    const int64_t c_off = dst.offset() + int64_t(o * uint64_t(d0.size * d1.size) * M * N);
    uint64_t rem = o;
    for (size_t i = plan.outer.size(); i-- > 0;) {
      const int64_t idx = int64_t(rem % uint64_t(plan.outer[i].size));
      rem /= uint64_t(plan.outer[i].size);
      a_off += idx * plan.outer[i].sa;
      b_off += idx * plan.outer[i].sb;
    }
    for (int64_t b0 = 0; b0 < d0.size; b0 += int64_t(d0_chunk)) {
      const int64_t n0 = std::min<int64_t>(int64_t(d0_chunk), d0.size - b0);
      MatmulParams q = p;
      q.a_off = uint32_t(a_off + b0 * d0.sa);
      q.b_off = uint32_t(b_off + b0 * d0.sb);
      q.c_off = uint32_t(c_off + b0 * d1.size * int64_t(M * N));
      q.a_bs0 = uint32_t(d0.sa), q.a_bs1 = uint32_t(d1.sa);
      q.b_bs0 = uint32_t(d0.sb), q.b_bs1 = uint32_t(d1.sb);
      q.nb1 = uint32_t(d1.size);
      if (vector_staging(a.dtype(), plan.ta, q.a_rs, q.a_cs, q.a_off, d0.sa, d1.sa)) q.flags |= kFlagAVec;
      if (vector_staging(b.dtype(), plan.tb, q.b_rs, q.b_cs, q.b_off, d0.sb, d1.sb)) q.flags |= kFlagBVec;
      if (q.c_off % 8 == 0 && N % 8 == 0) q.flags |= kFlagCVec;
      if (plan.route == MatmulRoute::coopmat_fast && M % plan.bm != 0) q.flags |= kFlagMEdge;
      if (acc) {
        q.flags |= kFlagCAcc | (acc->row_scale ? kFlagRowScale : 0u);
        q.s_off = acc->row_scale ? uint32_t(acc->row_scale->offset()) : 0u;
      }
      const Groups groups{uint32_t((N + plan.bn - 1) / plan.bn), uint32_t((M + plan.bm - 1) / plan.bm),
                          uint32_t(uint64_t(n0 * d1.size) * plan.nsplit)};
      ctx.dispatch(plan.kernel, bindings, q, groups, spec);
    }
  }
  if (plan.nsplit > 1) record_splitk_sum(ctx, plan, dst, c);
}

// Mirrors GemvParams in kernels/matmul/matmul_gemv.comp.
struct GemvParams {
  uint32_t N, K, rows, a_off, a_rs, w_off, w_rs, c_off, dtypes;
  float alpha;
  uint32_t flags, R, u_off, u_rs, v_off, v_rs;
  float lr_alpha;
  uint32_t e_off, e_rs, act;
  uint32_t w_ms, id_off, a_div, matrices;
};
static_assert(sizeof(GemvParams) == 24 * 4);
constexpr uint32_t kGemvLowRank = 1, kGemvAddend = 2, kGemvGated = 4, kGemvById = 8;
// Split-K below this many columns, from this K on (matmul_gemv.comp).
constexpr uint64_t kGemvSplitBelowN = 256, kGemvSplitFromK = 256;

// With `addend` (E [rows, N] with unit column stride, or a row [N]): C = A Wᵀ (+ U V) + E. With `act`: C [rows,
// N / 2] = act(Y[:, :N / 2]) * Y[:, N / 2:] of that product Y.
void record_gemv(Context& ctx, const MatmulPlan& plan, const Tensor& a, const Tensor& b, Tensor& c, float alpha,
                 const LowRankTerm* lr, const Tensor* addend = nullptr, const UnaryOp* act = nullptr) {
  GemvParams p{};
  p.N = uint32_t(plan.N), p.K = uint32_t(plan.K), p.rows = uint32_t(plan.gemv_rows);
  p.a_off = uint32_t(a.offset()), p.a_rs = uint32_t(plan.gemv_row_stride);
  p.w_off = uint32_t(b.offset()), p.w_rs = uint32_t(b.strides().back());
  p.c_off = uint32_t(c.offset());
  p.dtypes = dtype_code(a.dtype()) | dtype_code(b.dtype()) << 4 | dtype_code(c.dtype()) << 8;
  p.alpha = alpha;
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    p.flags = kGemvLowRank;
    p.R = uint32_t(u.dim(1));
    p.u_off = uint32_t(u.offset()), p.u_rs = uint32_t(u.strides()[0]);
    p.v_off = uint32_t(v.offset()), p.v_rs = uint32_t(v.strides()[1]);  // V [R, N] is B [N, R] seen transposed
    p.dtypes |= dtype_code(u.dtype()) << 12 | dtype_code(v.dtype()) << 16;
    p.lr_alpha = lr->alpha;
  }
  if (addend) {
    p.flags |= kGemvAddend;
    p.e_off = uint32_t(addend->offset()), p.e_rs = addend->ndim() == 2 ? uint32_t(addend->strides()[0]) : 0u;
    p.dtypes |= dtype_code(addend->dtype()) << 20;
  }
  if (act) {
    p.flags |= kGemvGated;
    p.act = uint32_t(*act);
  }
  const uint64_t columns = act ? plan.N / 2 : plan.N;  // C's columns
  // Workgroups of 4 subgroups (kernels/matmul/matmul_gemv.comp), one column each on a GPU; a CPU device (lavapipe)
  // pays per workgroup, so there each takes 64 columns. Few columns of a long K (a LoRA adapter's x Aᵀ) split K
  // among a workgroup's subgroups, one column per workgroup.
  const bool split_k = plan.N < kGemvSplitBelowN && plan.K >= kGemvSplitFromK;
  const uint32_t cols = split_k ? 1 : ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64 : 4;
  // The workgroups in rows of at most 65535 (the kernel reads its index from x and y). Without the terms,
  // bindings 3, 4, 5 and 6 (U, V, E, ids) see A, B, A and A again.
  const uint64_t groups = (columns + cols - 1) / cols, row = std::min<uint64_t>(groups, 65535);
  ctx.dispatch(plan.kernel,
               {in(a), in(b), out(c), in(lr ? *lr->u : a), in(lr ? *lr->v : b), in(addend ? *addend : a), in(a)},
               p, Groups{uint32_t(row), uint32_t((groups + row - 1) / row), 1},
               {4 * std::max<uint32_t>(ctx.features().subgroup_size, 1), cols, split_k ? 4u : 1u, p.dtypes, p.flags});
}

// C row r = A row r / a_div times W[ids[r]]ᵀ of a stacked weight W [E, P, K] (with `act`, act(gate) * up of the
// halves) on matmul_gemv_r1, a workgroup row per C row; false, recording nothing, where that kernel cannot read
// the operands (no subgroup arithmetic, or K, strides and offsets not multiples of 8).
bool record_gemv_by_id(const Tensor& a, const Tensor& w, const Tensor& ids, int64_t a_div,
                       const std::optional<UnaryOp>& act, Tensor& c) {
  Context& ctx = context_for(c.device());
  const int64_t E = w.dim(0), P = w.dim(1), K = w.dim(2), R = ids.dim(0);
  auto eights = [](int64_t v) { return v % 8 == 0; };
  if (!ctx.features().subgroup_arithmetic || R == 0 || R > 65535 || K == 0 || !eights(K) ||
      !eights(a.offset()) || !eights(a.strides()[0]) || !eights(w.offset()) || a.strides()[1] != 1 ||
      c.strides()[1] != 1)
    return false;
  GemvParams p{};
  p.N = uint32_t(P), p.K = uint32_t(K), p.rows = 1;
  p.a_off = uint32_t(a.offset()), p.a_rs = uint32_t(a.strides()[0]);
  p.w_off = uint32_t(w.offset()), p.w_rs = uint32_t(K);
  p.c_off = uint32_t(c.offset());
  p.dtypes = dtype_code(a.dtype()) | dtype_code(w.dtype()) << 4 | dtype_code(c.dtype()) << 8;
  p.alpha = 1.0f;
  p.flags = kGemvById | (act ? kGemvGated : 0u);
  p.act = act ? uint32_t(*act) : 0u;
  p.w_ms = uint32_t(P * K), p.id_off = uint32_t(ids.offset()), p.a_div = uint32_t(a_div);
  p.matrices = uint32_t(E);
  const uint64_t columns = act ? P / 2 : P;
  const uint32_t cols = ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 64 : 4;
  const uint64_t groups = (columns + cols - 1) / cols, row = std::min<uint64_t>(groups, 65535);
  ctx.dispatch(variant(ctx, "matmul_gemv_r1"), {in(a), in(w), out(c), in(a), in(w), in(a), in(ids)}, p,
               Groups{uint32_t(row), uint32_t((groups + row - 1) / row), uint32_t(R)},
               {4 * std::max<uint32_t>(ctx.features().subgroup_size, 1), cols, 1u, p.dtypes, p.flags});
  return true;
}

// C = A B (+ U V) + E on matmul_gemv, where its plan takes the product and E's rows have unit stride; false,
// recording nothing, elsewhere.
bool record_gemv_add(const Tensor& a, const Tensor& b, const Tensor& e, const LowRankTerm* lr, Tensor& c) {
  Context& ctx = context_for(c.device());
  if (c.numel() == 0 || a.dim(-1) == 0 || e.strides().back() != 1 || (e.ndim() == 2 && e.strides()[0] < 0))
    return false;
  const std::optional<MatmulPlan> plan = plan_matmul(ctx, a, b, c, lr);
  if (!plan || plan->route != MatmulRoute::gemv) return false;
  record_gemv(ctx, *plan, a, b, c, 1.0f, lr, &e);
  return true;
}

// C = act(Y[:, :F]) * Y[:, F:] for Y = A B (+ bias) (+ U V) [M, 2F] on matmul_gemv, where its plan takes the
// product; false, recording nothing, elsewhere.
bool record_gemv_gated(const Tensor& a, const Tensor& b, const Tensor* bias, const LowRankTerm* lr, UnaryOp act,
                       Tensor& c) {
  Context& ctx = context_for(c.device());
  if (c.numel() == 0 || a.dim(-1) == 0 || (bias && bias->strides().back() != 1)) return false;
  const Tensor y = c.view_as({c.dim(0), 2 * c.dim(1)}, {2 * c.dim(1), 1}, c.offset());  // planned as Y, C's buffer
  const std::optional<MatmulPlan> plan = plan_matmul(ctx, a, b, y, lr);
  if (!plan || plan->route != MatmulRoute::gemv) return false;
  record_gemv(ctx, *plan, a, b, c, 1.0f, lr, bias, &act);
  return true;
}

}  // namespace

bool record_matmul(const Tensor& a, const Tensor& b, Tensor& c, const LowRankTerm* lr, const Accumulate* acc,
                   float alpha) {
  Context& ctx = context_for(c.device());
  if (c.dim(-2) == 0 || c.dim(-1) == 0) return true;
  if (a.dim(-1) == 0) {
    if (lr || acc) return false;
    ctx.fill_buffer({c.buffer(), true}, 0);
    return true;
  }
  if (alpha != 1.0f && (lr || acc))
    throw DeviceError("matmul: internal error, alpha with a low-rank addend or an accumulation");
  const std::optional<MatmulPlan> plan = plan_matmul(ctx, a, b, c, lr, acc);
  if (!plan) return false;
  switch (plan->route) {
    case MatmulRoute::coopmat2: record_cm2(ctx, plan->kernel, a, b, c, lr); break;
    case MatmulRoute::skinny: record_skinny(ctx, a, b, c, alpha); return true;  // alpha in its sums
    case MatmulRoute::gemv: record_gemv(ctx, *plan, a, b, c, alpha, lr); return true;
    default: record_tiled(ctx, *plan, a, b, c, lr, acc);
  }
  if (alpha != 1.0f) {
    Unary scaled(UnaryOp::scale, alpha);
    std::vector<Tensor> y{c};
    eval_on(c.device(), scaled, {c}, y);
  }
  return true;
}

}  // namespace vk

void Matmul::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::record_matmul(in[0], in[1], out[0], nullptr, nullptr, alpha);
}

// The addend in matmul_gemv's epilogue where it takes the product (decode), else composed of ops.
void MatmulAdd::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const bool low_rank = in.size() > 3;
  const vk::LowRankTerm lr{low_rank ? &in[3] : nullptr, low_rank ? &in[4] : nullptr, alpha};
  if (vk::record_gemv_add(in[0], in[1], in[2], low_rank ? &lr : nullptr, out[0])) return;
  compose(in, out);
}

// The activation in matmul_gemv's epilogue where it takes the product (decode), else composed of ops.
void MatmulGated::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const size_t iu = bias ? 3 : 2;
  const vk::LowRankTerm lr{low_rank ? &in[iu] : nullptr, low_rank ? &in[iu + 1] : nullptr, alpha};
  if (vk::record_gemv_gated(in[0], in[1], bias ? &in[2] : nullptr, low_rank ? &lr : nullptr, act, out[0])) return;
  compose(in, out);
}

// In the fast kernel's epilogue where it takes the product, else composed: c ⊙ scale + a b.
void MatmulAccumulate::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const vk::Accumulate acc{in.size() > 2 ? &in[2] : nullptr};
  if (vk::record_matmul(in[0], in[1], out[0], nullptr, &acc)) return;
  compose(in, out);
}

// The addend in the kernel where it can go (scalar kernel; fast coopmat kernel, see record_matmul), else three
// more dispatches: U V into a temporary, scaled, added.
void MatmulLowRank::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const vk::LowRankTerm lr{&in[2], &in[3], alpha};
  if (vk::record_matmul(in[0], in[1], out[0], &lr)) return;
  vk::record_matmul(in[0], in[1], out[0], nullptr);
  std::vector<Tensor> t{Tensor::empty(out[0].shape(), out[0].dtype(), out[0].device())};
  vk::record_matmul(in[2], in[3], t[0], nullptr);
  if (alpha != 1.0f) {
    Unary scale(UnaryOp::scale, alpha);
    eval_on(t[0].device(), scale, {t[0]}, t);
  }
  Binary add(BinaryOp::add);
  eval_on(t[0].device(), add, {out[0], t[0]}, out);
}

// Every group's product in one dispatch where the cooperative-matrix-2 kernel takes them, else a product per group.
void GroupedMatmul::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::Context& ctx = vk::context_for(out[0].device());
  const std::string kernel = vk::cm2_grouped_kernel(ctx, in[0], in[1], out[0], transposed);
  if (kernel.empty()) return forward(in, out);
  vk::record_cm2_grouped(ctx, kernel, in[0], in[1], offsets, out[0]);
}

// One matmul_gemv dispatch, routed by the ids on the device, where it can read the operands; else the ids read
// back and a product per row.
void MatmulById::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  if (vk::record_gemv_by_id(in[0], in[1], in[2], x_div, act, out[0])) return;
  forward(in, out);
}

void GroupedOuter::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::Context& ctx = vk::context_for(out[0].device());
  const std::string kernel = vk::cm2_outer_kernel(ctx, in[0], in[1], out[0]);
  if (kernel.empty()) return forward(in, out);
  vk::record_cm2_outer(ctx, kernel, in[0], in[1], offsets, out[0]);
}

}  // namespace lmtune
