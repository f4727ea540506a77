// The Vulkan product's planner (see matmul_plan.h): kernel choice, tile and split-K from a cost model, batch
// folding.
#include "backend/vulkan/matmul_plan.h"

#include <algorithm>
#include <mutex>

#include <spdlog/spdlog.h>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/matmul_cm2.h"
#include "backend/vulkan/matmul_skinny.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

constexpr uint32_t kMaxGroupsZ = 65535;

uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Output batch dims with A's and B's strides (0 where broadcast), size-1 dims dropped and adjacent dims merged
// where both operands allow it. Outermost first.
std::vector<BatchDim> fold_batch(const Tensor& a, const Tensor& b, const Tensor& c) {
  std::vector<BatchDim> dims;
  int nb = c.ndim() - 2;
  for (int i = 0; i < nb; ++i) {
    int64_t size = c.shape()[size_t(i)];
    if (size == 1) continue;
    auto stride_of = [&](const Tensor& t) -> int64_t {
      int j = i - (nb - (t.ndim() - 2));  // right-aligned broadcast
      if (j < 0 || t.shape()[size_t(j)] == 1) return 0;
      return t.strides()[size_t(j)];
    };
    dims.push_back({size, stride_of(a), stride_of(b)});
  }
  std::vector<BatchDim> merged;
  for (const auto& d : dims) {
    if (!merged.empty()) {
      auto& p = merged.back();
      if (p.sa == d.sa * d.size && p.sb == d.sb * d.size) {
        p = {p.size * d.size, d.sa, d.sb};
        continue;
      }
    }
    merged.push_back(d);
  }
  return merged;
}

// Scalar tiles: (BM, BN, BK, TM, TN). NT = (BM/TM)(BN/TN); BM*BK and BK*BN are multiples of NT.
void set_scalar_tile(MatmulPlan& p, char tile) {
  uint32_t tm = 4, tn = 4;
  p.tile = tile;
  if (tile == 'l') p.bm = 128, p.bn = 128, p.bk = 8, tm = 8, tn = 8;
  else if (tile == 'm') p.bm = 64, p.bn = 64, p.bk = 16;
  else p.bm = 32, p.bn = 32, p.bk = 16;
  p.spec = {(p.bm / tm) * (p.bn / tn), p.bm, p.bn, p.bk, tm, tn};
}

// Cooperative-matrix tiles; w, n and q exist only in the fast kernel.
void set_coopmat_tile(MatmulPlan& p, char tile) {
  p.tile = tile;
  p.bk = 32;
  if (tile == 'l') p.bm = 128, p.bn = 256;
  else if (tile == 'm') p.bm = 128, p.bn = 128;
  else if (tile == 'w') p.bm = 256, p.bn = 128;
  else if (tile == 'n') p.bm = 128, p.bn = 16;  // skinny
  else if (tile == 'q') p.bm = 16, p.bn = 128;  // skinny
  else p.bm = 64, p.bn = 64;
}

// The fast kernel's K step for this K and tile: 32 always, 16 (the l16 / m16 builds) for the l and m tiles; 0
// where it has none.
uint32_t fast_k_step(char tile, uint64_t K) {
  if (K % 32 == 0) return 32;
  if (K % 16 == 0 && (tile == 'l' || tile == 'm')) return 16;
  return 0;
}

// What the tile-and-split model needs to know about the problem.
struct TileProblem {
  uint64_t M, N, K, batch;
  bool coopmat, cpu_device, allow_split, fast_only;
  bool m_edge;  // the fast kernel takes a last row tile past M (A not transposed)
};

// The general coopmat kernel ran at 0.5-0.95 of the fast one's speed on the H100's training shapes.
constexpr double kGeneralKernelEfficiency = 0.7;

// The cost of tile t with its cheapest split when `resident` of its workgroups share a multiprocessor at full
// speed: time ~ waves * tile area * K per split / tile efficiency, a wave being `slots` workgroups at once (132 SMs
// on an H100; 2 on a CPU device, where big per-thread tiles win by far: 512^3 f32 49 ms at 128x128, 170 at 64x64).
// -1 where the tile cannot take the problem.
double tile_cost(const TileProblem& pr, const KernelChoice& kc, char tile, int t, uint64_t resident,
                 uint32_t& split) {
  const double eff_cm[] = {1.0, 0.9, 0.6, 1.0, 0.5, 0.5}, eff_gpu[] = {1.0, 0.85, 0.6}, eff_cpu[] = {1.0, 0.3, 0.15};
  const double eff = pr.coopmat ? eff_cm[t] : pr.cpu_device ? eff_cpu[t] : eff_gpu[t];
  const uint64_t slots = pr.cpu_device ? 2 : 132;
  MatmulPlan q;
  pr.coopmat ? set_coopmat_tile(q, tile) : set_scalar_tile(q, tile);
  const bool interior = (pr.M % q.bm == 0 || pr.m_edge) && pr.N % q.bn == 0;
  if (t >= 3 && !(interior && pr.K % 32 == 0)) return -1.0;
  if ((tile == 'n' && pr.N > 64) || (tile == 'q' && pr.M > 64)) return -1.0;
  const uint64_t groups = div_up(pr.M, q.bm) * div_up(pr.N, q.bn) * pr.batch;
  // >= 256 of K per split; skinny tiles (few workgroups, long K) may take 32 splits.
  const uint64_t cap = t >= 4 ? 32 : 16;
  uint64_t max_split = std::max<uint64_t>(1, std::min<uint64_t>(cap, pr.K / 256));
  if (kc.matmul_splitk) max_split = std::min<uint64_t>(cap, uint64_t(kc.matmul_splitk));
  if (!pr.allow_split) max_split = 1;
  double best = -1;
  for (uint64_t s = 1; s <= max_split; ++s) {
    if (kc.matmul_splitk && pr.allow_split && uint64_t(kc.matmul_splitk) != s) continue;
    if (groups * s > uint64_t(kMaxGroupsZ) * 64 || pr.batch * s > kMaxGroupsZ) continue;
    const uint64_t kper = div_up(div_up(pr.K, s), q.bk) * q.bk;
    const double waves = double(div_up(groups * s, slots * resident));
    double cost = waves * double(q.bm) * double(q.bn) * double(kper) / eff;
    if (pr.coopmat && !(interior && fast_k_step(tile, pr.K))) cost /= kGeneralKernelEfficiency;
    if (s > 1) cost += double(pr.M * pr.N * pr.batch) * double(s + 2) * 2.0;  // partials written, read, output
    if (best < 0 || cost < best * 0.97) {  // prefer no split on near-ties
      best = cost;
      split = uint32_t(s);
    }
  }
  return best;
}

// The tile, as if one workgroup filled a multiprocessor (bigger tiles win near-ties), then its split-K knowing
// that a multiprocessor holds several small coopmat tiles at once: a skinny product (LoRA's rank-16 sides:
// 8192 x 16 x 4864) splits K to fill the GPU instead of walking all of K in one thin wave.
void choose_tile_and_split(MatmulPlan& p, const TileProblem& pr, const KernelChoice& kc) {
  const char tiles[] = {'l', 'm', 's', 'w', 'n', 'q'};
  const int ntiles = pr.coopmat && pr.fast_only ? 6 : 3;
  double best = -1;
  int chosen = 0;
  for (int t = 0; t < ntiles; ++t) {
    if (kc.matmul_tile && kc.matmul_tile != tiles[t]) continue;
    uint32_t split = 1;
    const double cost = tile_cost(pr, kc, tiles[t], t, 1, split);
    if (cost >= 0 && (best < 0 || cost < best * 0.97)) {
      best = cost;
      chosen = t;
    }
  }
  pr.coopmat ? set_coopmat_tile(p, tiles[chosen]) : set_scalar_tile(p, tiles[chosen]);
  const uint64_t resident[] = {1, 2, 4, 1, 4, 4};
  tile_cost(pr, kc, tiles[chosen], chosen, pr.coopmat && !pr.cpu_device ? resident[chosen] : 1, p.nsplit);
  p.k_split = div_up(div_up(pr.K, p.nsplit), p.bk) * p.bk;
  p.nsplit = uint32_t(div_up(pr.K, p.k_split));  // no empty splits
}

void log_once(std::once_flag& flag, const std::string& msg) {
  std::call_once(flag, [&] { spdlog::info("{}", msg); });
}

// Whether the VK_NV_cooperative_matrix kernels take the product (else the scalar one).
bool use_coopmat(Context& ctx, const KernelChoice& kc, const Tensor& a, const Tensor& b, bool layout_ok) {
  static std::once_flag no_cm_flag, f32_flag, layout_flag;
  const bool cm_device = ctx.features().coopmat_kernels();
  if (kc.matmul == MatmulKernel::coopmat) {
    if (!cm_device)
      throw DeviceError("matmul: the cooperative-matrix kernel was forced but " + ctx.name() +
                        " has no VK_NV_cooperative_matrix f16 16x16x16 with subgroup size 32");
    if (!layout_ok) throw ShapeError("matmul: coopmat kernel forced but an operand has no unit stride");
    return true;
  }
  if (kc.matmul == MatmulKernel::scalar) return false;
  const bool f32_in = a.dtype() == DType::f32 || b.dtype() == DType::f32;
  if (!cm_device)
    log_once(no_cm_flag, "matmul: " + ctx.name() + " has no cooperative matrices; using the scalar kernel");
  else if (!layout_ok)
    log_once(layout_flag, "matmul: an operand without a unit stride takes the scalar kernel (slow)");
  else if (f32_in)
    log_once(f32_flag, "matmul: f32 products take the exact scalar kernel");
  return cm_device && layout_ok && !f32_in;
}

// Whether an operand's every dispatch has vector access (the kernel's A / B dims plus the outer ones).
bool vector_everywhere(const Tensor& t, bool transposed, int64_t rs, int64_t cs, const MatmulPlan& p, bool is_a) {
  auto s = [is_a](const BatchDim& d) { return is_a ? d.sa : d.sb; };
  if (!vector_staging(t.dtype(), transposed, rs, cs, t.offset(), s(p.d0), s(p.d1))) return false;
  for (const BatchDim& d : p.outer)
    if (s(d) % (t.dtype() == DType::f32 ? 4 : 8) != 0) return false;
  return true;
}

bool is16(DType t) { return t == DType::f16 || t == DType::bf16; }

constexpr uint64_t kGemvMaxRows = 4;

// Whether matmul_gemv takes the product (on a device with subgroup arithmetic): A's rows (its batch dims folded
// in, B broadcast over them) at most kGemvMaxRows with one row stride, B a weight [N, K] stored row-major (the
// `nt` layout), K and every offset and stride a multiple of 8 (its 16-byte loads). Sets gemv_rows and
// gemv_row_stride.
bool gemv_takes(MatmulPlan& p, const Tensor& a, const Tensor& b, int64_t a_rs, int64_t a_cs, int64_t b_rs,
                int64_t b_cs, const std::vector<BatchDim>& batch) {
  if (a_cs != 1 || b_rs != 1 || p.K % 8 != 0 || batch.size() > 1) return false;
  uint64_t rows = p.M, stride = uint64_t(a_rs);
  if (!batch.empty()) {
    const BatchDim& d = batch[0];
    if (d.sb != 0) return false;
    if (p.M == 1) stride = uint64_t(d.sa);
    else if (d.sa != int64_t(p.M) * a_rs) return false;
    rows *= uint64_t(d.size);
  }
  if (rows > kGemvMaxRows || (rows > 1 && stride % 8 != 0) || a.offset() % 8 != 0 || b.offset() % 8 != 0 ||
      b_cs % 8 != 0)
    return false;
  p.gemv_rows = rows, p.gemv_row_stride = rows > 1 ? stride : 0;
  return true;
}

// Whether matmul_gemv takes a low-rank addend U [M, R] V [R, N]: unbatched, U's rows and V's columns (a LoRA
// B [N, R] seen transposed) with unit stride along R, as its subgroups read them.
bool gemv_takes_low_rank(const LowRankTerm& lr, const std::vector<BatchDim>& batch) {
  const Tensor &u = *lr.u, &v = *lr.v;
  const int64_t R = u.dim(1);
  return batch.empty() && u.ndim() == 2 && v.ndim() == 2 && (u.strides()[1] == 1 || R == 1) &&
         (v.strides()[0] == 1 || R == 1);
}

}  // namespace

std::string MatmulPlan::describe() const {
  const std::string layout = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
  const std::string tile_size = std::to_string(bm) + "x" + std::to_string(bn);
  switch (route) {
    case MatmulRoute::coopmat2: return "coopmat2 " + tile_size + " " + layout;
    case MatmulRoute::skinny: return "coopmat skinny " + layout;
    case MatmulRoute::gemv:
      return "gemv " + std::to_string(gemv_rows) + " " + layout + (low_rank ? " low-rank" : "");
    default: break;
  }
  const bool cm = route != MatmulRoute::scalar;
  return (cm ? "coopmat " : "scalar ") + tile_size + (cm ? " " + layout : std::string()) +
         (nsplit > 1 ? " splitk " + std::to_string(nsplit) : std::string()) +
         (route == MatmulRoute::coopmat_fast ? " fast" : "");
}

std::optional<MatmulPlan> plan_matmul(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                                      const LowRankTerm* lr, const Accumulate* acc) {
  const KernelChoice& kc = ctx.kernel_choice();
  MatmulPlan p;
  p.M = uint64_t(c.dim(-2)), p.N = uint64_t(c.dim(-1)), p.K = uint64_t(a.dim(-1));
  p.low_rank = lr != nullptr, p.accumulate = acc != nullptr;
  for (const Tensor* t : {&a, &b, &c})
    if (t->buffer()->bytes() > (uint64_t(1) << 32) - 1)
      throw DeviceError("matmul: tensor of " + std::to_string(t->buffer()->bytes()) +
                        " bytes exceeds the 4 GiB a kernel can address (" + to_string(t->shape()) + ")");
  const int64_t a_rs = a.strides()[size_t(a.ndim() - 2)], a_cs = a.strides().back();
  const int64_t b_rs = b.strides()[size_t(b.ndim() - 2)], b_cs = b.strides().back();
  for (int64_t s : {a_rs, a_cs, b_rs, b_cs})
    if (s < 0) throw ShapeError("matmul: negative strides reach the Vulkan kernel; make the operand contiguous");
  p.ta = a_cs != 1 && a_rs == 1, p.tb = b_cs != 1 && b_rs == 1;

  const std::vector<BatchDim> batch = fold_batch(a, b, c);
  if (!acc && (!lr || gemv_takes_low_rank(*lr, batch)) && kc.automatic_matmul() &&
      ctx.features().subgroup_arithmetic && gemv_takes(p, a, b, a_rs, a_cs, b_rs, b_cs, batch)) {
    p.route = MatmulRoute::gemv;
    p.kernel = variant(ctx, p.gemv_rows == 1 ? "matmul_gemv_r1" : "matmul_gemv");  // one row: fewer registers
    return p;
  }
  if (!acc && kc.automatic_matmul()) {
    p.kernel = cm2_kernel(ctx, a, b, c, lr);
    if (!p.kernel.empty()) {
      p.route = MatmulRoute::coopmat2, p.bm = 128, p.bn = 256;
      return p;
    }
  }
  const bool layout_ok = (a_cs == 1 || a_rs == 1) && (b_cs == 1 || b_rs == 1);
  const bool cm = use_coopmat(ctx, kc, a, b, layout_ok);
  if (acc && !cm) return std::nullopt;  // only the fast coopmat kernel accumulates
  const bool f32_in = a.dtype() == DType::f32 || b.dtype() == DType::f32;
  if (!lr && !acc && ctx.features().coopmat_kernels() && kc.matmul != MatmulKernel::scalar && !kc.matmul_tile &&
      !kc.matmul_splitk && !(kc.matmul == MatmulKernel::automatic && f32_in) && skinny_takes(ctx, a, b, c)) {
    p.route = MatmulRoute::skinny;
    p.kernel = p.N <= 16 ? "matmul_skinny_n1" : "matmul_skinny_n2";
    return p;
  }

  // At most two batch dims go to the kernel; outer ones (rare) become separate dispatches, as do chunks of the
  // outer kernel dim when the grid's z would pass 65535. Split-K needs everything in one dispatch.
  uint64_t nbatch = 1;
  for (const auto& d : batch) nbatch *= uint64_t(d.size);
  if (batch.size() >= 1) p.d1 = batch.back();
  if (batch.size() >= 2) p.d0 = batch[batch.size() - 2];
  if (batch.size() > 2) p.outer.assign(batch.begin(), batch.end() - 2);
  if ((lr || acc) && nbatch != 1) return std::nullopt;
  if (lr && acc) return std::nullopt;
  const bool a_vec = vector_everywhere(a, p.ta, a_rs, a_cs, p, true);
  const bool b_vec = vector_everywhere(b, p.tb, b_rs, b_cs, p, false);
  const bool c_vec = c.offset() % 8 == 0 && p.N % 8 == 0;
  // Some tiles exist only in the fast kernel: every dispatch must have vector access to A, B and C.
  const bool fast_only = cm && p.outer.empty() && uint64_t(p.d0.size) * uint64_t(p.d1.size) * 32 <= kMaxGroupsZ &&
                         a_vec && b_vec && c_vec;
  const TileProblem pr{p.M, p.N, p.K, nbatch, cm, ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU,
                       p.outer.empty() && nbatch * 16 <= kMaxGroupsZ && !lr && !acc, fast_only, !p.ta && p.M > 0};
  choose_tile_and_split(p, pr, kc);
  if (uint64_t(p.d1.size) * p.nsplit > kMaxGroupsZ)
    throw ShapeError("matmul: batch dim of " + std::to_string(p.d1.size) + " is too large for one dispatch");
  if (div_up(p.M, p.bm) > 65535)
    throw ShapeError("matmul: M = " + std::to_string(p.M) + " is too large for one dispatch");
  const std::string layout = std::string("_") + (p.ta ? 't' : 'n') + (p.tb ? 't' : 'n');
  if (!cm) {
    p.route = MatmulRoute::scalar;
    p.kernel = variant(ctx, "matmul");
    return p;
  }
  const uint32_t kstep = fast_k_step(p.tile, p.K);
  const bool fast = (p.M % p.bm == 0 || pr.m_edge) && p.N % p.bn == 0 && kstep && a_vec && b_vec && c_vec;
  // The low-rank addend in the fast kernel (more K tiles through its staging): 16-bit U and V laid out as A and
  // B with vector access, R a multiple of 8.
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    const bool lr_fast = is16(u.dtype()) && is16(v.dtype()) && u.dim(1) % 8 == 0 &&
                         vector_staging(u.dtype(), p.ta, u.strides()[0], u.strides()[1], u.offset(), 0, 0) &&
                         vector_staging(v.dtype(), p.tb, v.strides()[0], v.strides()[1], v.offset(), 0, 0);
    if (!(fast && lr_fast)) return std::nullopt;
  }
  if (acc && !fast) return std::nullopt;
  if (fast) {
    p.route = MatmulRoute::coopmat_fast;
    p.kernel = std::string("matmul_cmf_") + p.tile + (kstep == 16 ? "16" : "") + layout;
  } else {
    if (p.tile == 'w' || p.tile == 'n' || p.tile == 'q')
      throw DeviceError("matmul: internal error, a fast-kernel-only tile without the fast kernel's conditions");
    p.route = MatmulRoute::coopmat;
    p.kernel = std::string("matmul_cm_") + p.tile + layout;
  }
  return p;
}

}  // namespace lmtune::vk
