// Matmul on Vulkan: picks the cooperative-matrix kernel (f16 tensor cores) where the device has
// VK_NV_cooperative_matrix, else the tiled scalar kernel, chooses a tile and split-K from the problem shape,
// folds batch dims into at most two (broadcast = stride 0) and records the dispatches.
#include "backend/vulkan/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <spdlog/spdlog.h>

#include "backend/vulkan/dispatch.h"
#include "backend/vulkan/matmul_cm2.h"
#include "backend/vulkan/matmul_skinny.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"

namespace lmtune {
namespace vk {
namespace {

// Mirrors MatmulParams in kernels/matmul_common.glsl.
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
constexpr uint32_t kFlagAVec = 1, kFlagBVec = 2, kFlagCVec = 4, kFlagCAcc = 8, kFlagRowScale = 16;

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

MatmulOptions options_from_env() {
  MatmulOptions o;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  std::string k = env("LMTUNE_MATMUL_KERNEL");
  if (k == "scalar") o.kernel = MatmulKernel::scalar;
  else if (k == "coopmat") o.kernel = MatmulKernel::coopmat;
  else if (!k.empty() && k != "auto") throw ConfigError("LMTUNE_MATMUL_KERNEL='" + k + "' (expected scalar, coopmat or auto)");
  std::string no = env("LMTUNE_NO_COOPMAT");
  if (!no.empty() && no != "0") o.kernel = MatmulKernel::scalar;
  o.f32_exact = env("LMTUNE_MATMUL_F32") != "fp16";
  if (std::string s = env("LMTUNE_MATMUL_SPLITK"); !s.empty()) o.splitk = std::max(0, std::atoi(s.c_str()));
  if (std::string t = env("LMTUNE_MATMUL_TILE"); t.size() == 1 && std::string("lmswnq").find(t) != std::string::npos)
    o.tile = t[0];
  return o;
}

}  // namespace

bool vector_staging(DType t, bool transposed, int64_t rs, int64_t cs, int64_t off, int64_t bs0, int64_t bs1) {
  const int64_t al = t == DType::f32 ? 4 : 8;
  auto aligned = [al](int64_t v) { return v % al == 0; };
  const int64_t unit = transposed ? rs : cs, other = transposed ? cs : rs;
  return unit == 1 && aligned(other) && aligned(off) && aligned(bs0) && aligned(bs1);
}

namespace {

bool fast_kernel_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LMTUNE_MATMUL_FAST");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

std::mutex g_last_mu;
std::string g_last;

// One batch dim after folding: size and the element strides of A and B (C is contiguous).
struct BatchDim {
  int64_t size, sa, sb;
};

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

struct Plan {
  bool coopmat = false;
  char tile = 'l';
  uint32_t bm = 0, bn = 0, bk = 0;
  std::vector<uint32_t> spec;  // scalar kernel: NT (workgroup size), BM, BN, BK, TM, TN
  uint32_t nsplit = 1;
};

// Scalar tiles: (BM, BN, BK, TM, TN). NT = (BM/TM)(BN/TN); BM*BK and BK*BN are multiples of NT.
Plan scalar_plan(char tile) {
  Plan p;
  p.tile = tile;
  uint32_t bm, bn, bk, tm, tn;
  if (tile == 'l') { bm = 128; bn = 128; bk = 8; tm = 8; tn = 8; }
  else if (tile == 'm') { bm = 64; bn = 64; bk = 16; tm = 4; tn = 4; }
  else { bm = 32; bn = 32; bk = 16; tm = 4; tn = 4; }
  p.bm = bm; p.bn = bn; p.bk = bk;
  p.spec = {(bm / tm) * (bn / tn), bm, bn, bk, tm, tn};
  return p;
}

Plan coopmat_plan(char tile) {
  Plan p;
  p.coopmat = true;
  p.tile = tile;
  p.bk = 32;
  if (tile == 'l') { p.bm = 128; p.bn = 256; }
  else if (tile == 'm') { p.bm = 128; p.bn = 128; }
  else if (tile == 'w') { p.bm = 256; p.bn = 128; }  // fast kernel only
  else if (tile == 'n') { p.bm = 128; p.bn = 16; }  // skinny, fast kernel only
  else if (tile == 'q') { p.bm = 16; p.bn = 128; }  // skinny, fast kernel only
  else { p.bm = 64; p.bn = 64; }
  return p;
}

// Whether the fast coopmat kernel (matmul_coopmat_fast.comp) has a K step for this K and tile: 32 always, 16
// (the l16 / m16 builds) for the l and m tiles.
uint32_t fast_k_step(char tile, uint64_t K) {
  if (K % 32 == 0) return 32;
  if (K % 16 == 0 && (tile == 'l' || tile == 'm')) return 16;
  return 0;
}

uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Chooses tile and split-K with a crude model: time ~ waves * tile area * K per split / tile efficiency,
// where a wave is `slots` workgroups running at once (132 SMs on an H100; 2 on a CPU device). On CPU devices
// (lavapipe) big per-thread tiles win by far (512^3 f32: 49 ms at 128x128 vs 170 ms at 64x64).
const double kGeneralKernelEfficiency = [] {
  const char* e = std::getenv("LMTUNE_MATMUL_GENERAL_EFF");  // A/B timing of the tile choice
  return e ? std::max(0.05, std::atof(e)) : 0.7;
}();

// `fast_only`: the problem may take the tiles that exist only in the fast kernel (it is coopmat with vector
// access to every operand): w (256x128) where it is interior, n / q (128x16, 16x128) where M (n) or N (q) is at
// most 64.
void choose_tile_and_split(Plan& p, bool coopmat, const MatmulOptions& opt, uint64_t M, uint64_t N, uint64_t K,
                           uint64_t batch, bool cpu_device, bool allow_split, bool fast_only) {
  const char tiles[] = {'l', 'm', 's', 'w', 'n', 'q'};
  const int ntiles = coopmat && fast_only ? 6 : 3;
  const double eff_cm[] = {1.0, 0.9, 0.6, 1.0, 0.5, 0.5}, eff_gpu[] = {1.0, 0.85, 0.6}, eff_cpu[] = {1.0, 0.3, 0.15};
  const double* eff_sc = cpu_device ? eff_cpu : eff_gpu;
  const uint64_t slots = cpu_device ? 2 : 132;
  // The cheapest split of tile t when `resident` of its workgroups share a multiprocessor at full speed.
  auto best_split = [&](int t, uint64_t resident, uint32_t& split) {
    Plan q = coopmat ? coopmat_plan(tiles[t]) : scalar_plan(tiles[t]);
    const bool interior = M % q.bm == 0 && N % q.bn == 0;
    if (t >= 3 && !(interior && K % 32 == 0)) return -1.0;
    if ((tiles[t] == 'n' && N > 64) || (tiles[t] == 'q' && M > 64)) return -1.0;
    uint64_t groups = div_up(M, q.bm) * div_up(N, q.bn) * batch;
    // >= 256 of K per split; skinny tiles (few workgroups, long K) may take 32 splits.
    const uint64_t cap = t >= 4 ? 32 : 16;
    uint64_t max_split = std::max<uint64_t>(1, std::min<uint64_t>(cap, K / 256));
    if (opt.splitk) max_split = std::min<uint64_t>(cap, uint64_t(opt.splitk));
    if (!allow_split) max_split = 1;
    double best = -1;
    for (uint64_t s = 1; s <= max_split; ++s) {
      if (opt.splitk && allow_split && uint64_t(opt.splitk) != s) continue;
      if (groups * s > kMaxGroupsZ * 64 || batch * s > kMaxGroupsZ) continue;
      uint64_t kper = div_up(div_up(K, s), q.bk) * q.bk;
      double waves = double(div_up(groups * s, slots * resident));
      double cost = waves * double(q.bm) * double(q.bn) * double(kper) / (coopmat ? eff_cm[t] : eff_sc[t]);
      // Tiles that all lie inside the problem can take the coopmat fast kernel (matmul_coopmat_fast.comp); the
      // general one ran at 0.5-0.95 of its speed on the H100's training shapes (bench/RESULTS.md).
      if (coopmat && !(interior && fast_k_step(tiles[t], K))) cost /= kGeneralKernelEfficiency;
      if (s > 1) cost += double(M * N * batch) * double(s + 2) * 2.0;  // partials written, read, output
      if (best < 0 || cost < best * 0.97) {  // prefer no split on near-ties
        best = cost;
        split = uint32_t(s);
      }
    }
    return best;
  };
  // The tile, as if one workgroup filled a multiprocessor (bigger tiles win near-ties)...
  double best = -1;
  int chosen = 0;
  for (int t = 0; t < ntiles; ++t) {
    if (opt.tile && opt.tile != tiles[t]) continue;
    uint32_t split = 1;
    double cost = best_split(t, 1, split);
    if (cost >= 0 && (best < 0 || cost < best * 0.97)) {
      best = cost;
      chosen = t;
    }
  }
  p = coopmat ? coopmat_plan(tiles[chosen]) : scalar_plan(tiles[chosen]);
  // ...then its split-K knowing that a multiprocessor holds several small coopmat tiles at once: a skinny product
  // (LoRA's rank-16 sides: 8192 x 16 x 4864) splits K to fill the GPU instead of walking all of K in one thin
  // wave (H100: 0.30 -> 0.16 ms).
  const uint64_t resident[] = {1, 2, 4, 1, 4, 4};
  best_split(chosen, coopmat && !cpu_device ? resident[chosen] : 1, p.nsplit);
}

void log_once(std::once_flag& flag, const std::string& msg) {
  std::call_once(flag, [&] { spdlog::info("{}", msg); });
}

}  // namespace

MatmulOptions& matmul_options() {
  static MatmulOptions o = options_from_env();
  return o;
}

std::string last_matmul_kernel() {
  std::lock_guard lock(g_last_mu);
  return g_last;
}

bool coopmat_available(int index) {
  const Features& f = context_for(Device::vulkan(index)).features();
  return f.cooperative_matrix && f.storage_16bit && f.subgroup_size == 32;
}

}  // namespace vk

namespace vk {
namespace {

// LoRA's rank side (N <= 32, 16-bit A): the skinny kernel where it takes the product (matmul_skinny.cpp), with
// the options left automatic.
bool record_skinny_product(const Tensor& a, const Tensor& b, Tensor& c, float alpha) {
  Context& ctx = context_for(c.device());
  const MatmulOptions& opt = matmul_options();
  const bool f32_in = a.dtype() == DType::f32 || b.dtype() == DType::f32;
  if (!coopmat_available(ctx.index()) || opt.kernel == MatmulKernel::scalar ||
      (opt.kernel == MatmulKernel::automatic && f32_in && opt.f32_exact) || opt.tile || opt.splitk ||
      c.ndim() != 2 || a.ndim() != 2 || b.ndim() != 2 || c.numel() == 0)
    return false;
  if (!record_skinny(ctx, a, b, c, alpha)) return false;
  const bool ta = a.strides()[1] != 1 && a.strides()[0] == 1, tb = b.strides()[1] != 1 && b.strides()[0] == 1;
  std::lock_guard lock(g_last_mu);
  g_last = std::string("coopmat skinny ") + (ta ? 't' : 'n') + (tb ? 't' : 'n');
  return true;
}

}  // namespace

bool record_matmul(const Tensor& a, const Tensor& b, Tensor& c, const LowRankTerm* lr, const Accumulate* acc,
                   float alpha) {
  if (alpha != 1.0f) {
    if (lr || acc) throw DeviceError("matmul: internal error, alpha with a low-rank addend or an accumulation");
    if (record_skinny_product(a, b, c, alpha)) return true;
    record_matmul(a, b, c, nullptr);
    Unary scaled(UnaryOp::scale, alpha);
    std::vector<Tensor> y{c};
    eval_on(c.device(), scaled, {c}, y);
    return true;
  }
  Context& ctx = context_for(c.device());
  const Features& feat = ctx.features();
  const MatmulOptions& opt = matmul_options();

  const uint64_t M = uint64_t(c.dim(-2)), N = uint64_t(c.dim(-1)), K = uint64_t(a.dim(-1));
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    if (lr || acc) return false;
    ctx.fill_buffer({c.buffer(), true}, 0);
    return true;
  }
  for (const Tensor* t : {&a, &b, static_cast<const Tensor*>(&c)})
    if (t->buffer()->bytes() > (uint64_t(1) << 32) - 1)
      throw DeviceError("matmul: tensor of " + std::to_string(t->buffer()->bytes()) +
                        " bytes exceeds the 4 GiB a kernel can address (" + to_string(t->shape()) + ")");

  std::vector<BatchDim> batch = fold_batch(a, b, c);
  uint64_t nbatch = 1;
  for (const auto& d : batch) nbatch *= uint64_t(d.size);

  const int64_t a_rs = a.strides()[size_t(a.ndim() - 2)], a_cs = a.strides().back();
  const int64_t b_rs = b.strides()[size_t(b.ndim() - 2)], b_cs = b.strides().back();
  for (int64_t s : {a_rs, a_cs, b_rs, b_cs})
    if (s < 0) throw ShapeError("matmul: negative strides reach the Vulkan kernel; make the operand contiguous");

  // Workgroup-scope cooperative matrices take the large products they can (matmul_cm2.h).
  if (!acc && opt.kernel == MatmulKernel::automatic && !opt.tile && !opt.splitk) {
    std::string name;
    if (record_matmul_cm2(ctx, a, b, c, lr, name)) {
      std::lock_guard lock(g_last_mu);
      g_last = name;
      return true;
    }
  }

  // Kernel choice.
  static std::once_flag no_cm_flag, f32_flag, layout_flag;
  bool cm_device = feat.cooperative_matrix && feat.storage_16bit && feat.subgroup_size == 32;
  bool ta = a_cs != 1 && a_rs == 1, tb = b_cs != 1 && b_rs == 1;
  bool layout_ok = (a_cs == 1 || a_rs == 1) && (b_cs == 1 || b_rs == 1);
  bool use_cm = false;
  if (opt.kernel == MatmulKernel::coopmat) {
    if (!cm_device)
      throw DeviceError("matmul: the cooperative-matrix kernel was forced but " + ctx.name() +
                        " has no VK_NV_cooperative_matrix f16 16x16x16 with subgroup size 32");
    if (!layout_ok) throw ShapeError("matmul: coopmat kernel forced but an operand has no unit stride");
    use_cm = true;
  } else if (opt.kernel == MatmulKernel::automatic) {
    bool f32_in = a.dtype() == DType::f32 || b.dtype() == DType::f32;
    use_cm = cm_device && layout_ok && !(f32_in && opt.f32_exact);
    if (!cm_device)
      log_once(no_cm_flag, "matmul: " + ctx.name() + " has no cooperative matrices; using the scalar kernel");
    else if (!layout_ok)
      log_once(layout_flag, "matmul: an operand without a unit stride takes the scalar kernel (slow)");
    else if (f32_in && opt.f32_exact)
      log_once(f32_flag, "matmul: f32 products take the exact scalar kernel (LMTUNE_MATMUL_F32=fp16 sends them to the "
                                  "f16 tensor-core kernel)");
  }

  if (acc && !use_cm) return false;  // only the fast coopmat kernel accumulates
  if (!lr && !acc && record_skinny_product(a, b, c, 1.0f)) return true;

  // At most two batch dims go to the kernel; outer ones (rare) become separate dispatches, as do chunks of
  // the outer kernel dim when the grid's z would pass 65535. Split-K needs everything in one dispatch.
  BatchDim d0{1, 0, 0}, d1{1, 0, 0};
  std::vector<BatchDim> outer;
  if (batch.size() >= 1) d1 = batch.back();
  if (batch.size() >= 2) d0 = batch[batch.size() - 2];
  if (batch.size() > 2) outer.assign(batch.begin(), batch.end() - 2);
  uint64_t n_outer = 1;
  for (const auto& d : outer) n_outer *= uint64_t(d.size);
  bool allow_split = n_outer == 1 && nbatch * 16 <= kMaxGroupsZ && !lr && !acc;
  if ((lr || acc) && nbatch != 1) return false;
  if (lr && acc) return false;
  // The low-rank addend in the fast kernel (more K tiles through its staging): 16-bit U and V laid out as A and B
  // with vector access, R a multiple of 8.
  bool lr_fast = false;
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    auto is16 = [](DType t) { return t == DType::f16 || t == DType::bf16; };
    lr_fast = is16(u.dtype()) && is16(v.dtype()) && u.dim(1) % 8 == 0 &&
              vector_staging(u.dtype(), ta, u.strides()[0], u.strides()[1], u.offset(), 0, 0) &&
              vector_staging(v.dtype(), tb, v.strides()[0], v.strides()[1], v.offset(), 0, 0);
  }

  // Some tiles exist only in the fast kernel: every dispatch must have vector access to A, B and C.
  const bool fast_only = use_cm && fast_kernel_enabled() && n_outer == 1 &&
                         uint64_t(d0.size) * uint64_t(d1.size) * 32 <= kMaxGroupsZ &&
                         vector_staging(a.dtype(), ta, a_rs, a_cs, a.offset(), d0.sa, d1.sa) &&
                         vector_staging(b.dtype(), tb, b_rs, b_cs, b.offset(), d0.sb, d1.sb) &&
                         c.offset() % 8 == 0 && N % 8 == 0;
  Plan plan;
  choose_tile_and_split(plan, use_cm, opt, M, N, K, nbatch,
                        ctx.properties().deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU, allow_split, fast_only);
  uint32_t nsplit = plan.nsplit;
  uint64_t k_split = div_up(div_up(K, nsplit), plan.bk) * plan.bk;
  nsplit = uint32_t(div_up(K, k_split));  // no empty splits

  std::string kernel = use_cm ? std::string("matmul_cm_") + plan.tile + "_" + (ta ? 't' : 'n') + (tb ? 't' : 'n')
                              : variant(ctx, "matmul");
  {
    std::lock_guard lock(g_last_mu);
    g_last = (use_cm ? "coopmat " : "scalar ") + std::to_string(plan.bm) + "x" + std::to_string(plan.bn) +
             (use_cm ? std::string(" ") + (ta ? 't' : 'n') + (tb ? 't' : 'n') : std::string()) +
             (nsplit > 1 ? " splitk " + std::to_string(nsplit) : std::string());
  }

  // With split-K the kernel writes f32 partials [nsplit][batch][M][N] to a workspace.
  Tensor dst = c;
  if (nsplit > 1) dst = Tensor::empty({int64_t(nsplit * nbatch * M * N)}, DType::f32, c.device());

  MatmulParams p{};
  p.M = uint32_t(M); p.N = uint32_t(N); p.K = uint32_t(K);
  p.a_rs = uint32_t(a_rs); p.a_cs = uint32_t(a_cs);
  p.b_rs = uint32_t(b_rs); p.b_cs = uint32_t(b_cs);
  p.dtypes = dtype_code(a.dtype()) | dtype_code(b.dtype()) << 4 | dtype_code(dst.dtype()) << 8;
  p.k_split = uint32_t(k_split);
  p.nsplit = nsplit;
  if (lr) {
    const Tensor &u = *lr->u, &v = *lr->v;
    p.u_off = uint32_t(u.offset()); p.u_rs = uint32_t(u.strides()[0]); p.u_cs = uint32_t(u.strides()[1]);
    p.v_off = uint32_t(v.offset()); p.v_rs = uint32_t(v.strides()[0]); p.v_cs = uint32_t(v.strides()[1]);
    p.R = uint32_t(u.dim(1));
    p.alpha = lr->alpha;
    p.dtypes |= dtype_code(u.dtype()) << 12 | dtype_code(v.dtype()) << 16;
  }

  if (uint64_t(d1.size) * nsplit > kMaxGroupsZ)
    throw ShapeError("matmul: batch dim of " + std::to_string(d1.size) + " is too large for one dispatch");
  uint64_t d0_chunk = std::max<uint64_t>(1, kMaxGroupsZ / (uint64_t(d1.size) * nsplit));

  auto aligned = [](int64_t v, int64_t al) { return v % al == 0; };
  const uint32_t gx = uint32_t(div_up(N, plan.bn)), gy = uint32_t(div_up(M, plan.bm));
  if (gy > 65535) throw ShapeError("matmul: M = " + std::to_string(M) + " is too large for one dispatch");
  std::vector<Binding> bindings{{a.buffer(), false}, {b.buffer(), false}, {dst.buffer(), true}};
  // The scalar and fast kernels read U and V at bindings 3 and 4 (A and B again when there is no addend).
  std::vector<Binding> bindings5 = bindings;
  bindings5.push_back({lr ? lr->u->buffer() : a.buffer(), false});
  bindings5.push_back({lr ? lr->v->buffer() : b.buffer(), false});
  // The fast kernel reads FLAG_ROW_SCALE's scales at binding 5 (C again without them).
  std::vector<Binding> bindings6 = bindings5;
  bindings6.push_back({acc && acc->row_scale ? acc->row_scale->buffer() : dst.buffer(), false});

  bool used_fast = false;
  for (uint64_t o = 0; o < n_outer; ++o) {
    int64_t a_off = a.offset(), b_off = b.offset(), c_off = dst.offset() + int64_t(o * uint64_t(d0.size * d1.size) * M * N);
    uint64_t rem = o;
    for (size_t i = outer.size(); i-- > 0;) {
      int64_t idx = int64_t(rem % uint64_t(outer[i].size));
      rem /= uint64_t(outer[i].size);
      a_off += idx * outer[i].sa;
      b_off += idx * outer[i].sb;
    }
    for (int64_t b0 = 0; b0 < d0.size; b0 += int64_t(d0_chunk)) {
      int64_t n0 = std::min<int64_t>(int64_t(d0_chunk), d0.size - b0);
      MatmulParams q = p;
      q.a_off = uint32_t(a_off + b0 * d0.sa);
      q.b_off = uint32_t(b_off + b0 * d0.sb);
      q.c_off = uint32_t(c_off + b0 * d1.size * int64_t(M * N));
      q.a_bs0 = uint32_t(d0.sa); q.a_bs1 = uint32_t(d1.sa);
      q.b_bs0 = uint32_t(d0.sb); q.b_bs1 = uint32_t(d1.sb);
      q.nb1 = uint32_t(d1.size);
      q.flags = 0;
      if (vector_staging(a.dtype(), ta, a_rs, a_cs, q.a_off, d0.sa, d1.sa)) q.flags |= kFlagAVec;
      if (vector_staging(b.dtype(), tb, b_rs, b_cs, q.b_off, d0.sb, d1.sb)) q.flags |= kFlagBVec;
      if (aligned(q.c_off, 8) && aligned(int64_t(N), 8)) q.flags |= kFlagCVec;
      if (acc) {
        q.flags |= kFlagCAcc | (acc->row_scale ? kFlagRowScale : 0u);
        q.s_off = acc->row_scale ? uint32_t(acc->row_scale->offset()) : 0u;
      }
      Groups groups{gx, gy, uint32_t(n0 * d1.size * nsplit)};
      // Split-K (one dispatch only): partials [nsplit][batch][M][N] from c_off.
      if (use_cm) {
        // Every tile interior and vector access to A, B and C: the fast kernel (matmul_coopmat_fast.comp), or
        // with LMTUNE_MATMUL_FAST=0 the general one specialized with FAST = 1. Dtypes are specialization
        // constants of both.
        const uint32_t kstep = fast_k_step(plan.tile, K);
        bool fast = M % plan.bm == 0 && N % plan.bn == 0 && kstep && (q.flags & kFlagAVec) &&
                    (q.flags & kFlagBVec) && (q.flags & kFlagCVec);
        std::vector<uint32_t> spec{dtype_code(a.dtype()), dtype_code(b.dtype()), dtype_code(dst.dtype())};
        if (lr && !(fast && fast_kernel_enabled() && lr_fast)) return false;  // nothing recorded yet
        if (acc && !(fast && fast_kernel_enabled())) return false;
        if (fast && fast_kernel_enabled()) {
          ctx.dispatch(std::string("matmul_cmf_") + plan.tile + (kstep == 16 ? "16" : "") + kernel.substr(11),
                       bindings6, q, groups, spec);
          used_fast = true;
        } else {
          if (plan.tile == 'w' || plan.tile == 'n' || plan.tile == 'q')
            throw DeviceError("matmul: internal error, a fast-kernel-only tile without the fast kernel's conditions");
          spec.push_back(fast ? 1u : 0u);
          ctx.dispatch(kernel, bindings, q, groups, spec);
        }
      }
      else ctx.dispatch(kernel, bindings5, q, groups, plan.spec);
    }
  }
  if (used_fast) {
    std::lock_guard lock(g_last_mu);
    g_last += " fast";
  }
  if (nsplit > 1) {
    SplitKParams s{};
    s.count = uint32_t(nbatch * M * N);
    s.nsplit = nsplit;
    s.out_off = uint32_t(c.offset());
    s.out_dtype = dtype_code(c.dtype());
    uint64_t groups = div_up(s.count, 256);
    s.groups_x = uint32_t(std::min<uint64_t>(groups, 65535));
    ctx.dispatch(variant(ctx, "matmul_splitk"), {{dst.buffer(), false}, {c.buffer(), true}}, s,
                 Groups{s.groups_x, uint32_t(div_up(groups, s.groups_x)), 1});
  }
  return true;
}

}  // namespace vk

void Matmul::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::record_matmul(in[0], in[1], out[0], nullptr, nullptr, alpha);
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

}  // namespace lmtune
