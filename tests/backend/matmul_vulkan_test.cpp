// Vulkan matmul against a double-precision CPU reference: odd sizes (tile edges), transposed operands,
// broadcast batches, f32/f16/bf16, split-K, every scalar tile; the cooperative-matrix kernel gets the same
// cases whenever the device has it (skipped, not failed, elsewhere). Errors are NMSE = |y - ref|^2 / |ref|^2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/fragment_layout.h"
#include "backend/vulkan/matmul.h"
#include "backend/vulkan/matmul_plan.h"
#include "backend/vulkan/recorder.h"
#include "backend/vulkan/vulkan_backend.h"
#include "common/dispatch_count.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/matmul.h"
#include "core/ops/grouped_matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/matmul_gated.h"
#include "core/primitive.h"

namespace lmtune {
namespace {

struct Operand {
  Shape batch;              // this operand's batch dims
  bool transposed = false;  // stored [.., cols, rows] and viewed as [.., rows, cols]
  int64_t offset = 0;       // extra element offset of the view (unaligned views)
};

struct Case {
  int64_t M, N, K;
  DType dtype = DType::f32;
  Operand a, b;
};

std::string describe(const Case& c) {
  std::string s = std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " " +
                  std::string(dtype_name(c.dtype));
  if (!c.a.batch.empty()) s += " a" + to_string(c.a.batch);
  if (!c.b.batch.empty()) s += " b" + to_string(c.b.batch);
  if (c.a.transposed) s += " aT";
  if (c.b.transposed) s += " bT";
  if (c.a.offset || c.b.offset) s += " offset";
  return s;
}

// A random [batch.., rows, cols] tensor of `dtype` on `dev`, possibly a transposed or offset view.
Tensor make_operand(const Operand& o, int64_t rows, int64_t cols, DType dtype, Device dev, uint64_t seed) {
  Shape stored = o.batch;
  stored.push_back(o.transposed ? cols : rows);
  stored.push_back(o.transposed ? rows : cols);
  int64_t n = numel(stored);
  Tensor base = Tensor::randn({n + o.offset}, seed, 1.0f, dtype, dev);
  Strides st = contiguous_strides(stored);
  Shape shape = o.batch;
  shape.push_back(rows);
  shape.push_back(cols);
  if (o.transposed) std::swap(st[st.size() - 1], st[st.size() - 2]);
  return base.view_as(shape, st, o.offset);
}

// out[batch, m, n] = sum_k a[batch', m, k] b[batch'', k, n] with numpy broadcasting, in double.
std::vector<double> reference(const Tensor& a, const Tensor& b, const Shape& out_batch, int64_t M, int64_t N,
                              int64_t K) {
  std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
  int nb = int(out_batch.size());
  int64_t batches = numel(out_batch);
  std::vector<double> out(size_t(batches * M * N));
  auto index_of = [&](const Tensor& t, int64_t flat) {
    int tb = t.ndim() - 2;
    int64_t idx = 0, mul = 1;
    for (int i = nb - 1; i >= 0; --i) {
      int64_t size = out_batch[size_t(i)], coord = flat % size;
      flat /= size;
      int j = i - (nb - tb);
      if (j < 0) continue;
      int64_t tsize = t.shape()[size_t(j)];
      idx += (tsize == 1 ? 0 : coord) * mul;
      mul *= tsize;
    }
    return idx;
  };
  for (int64_t z = 0; z < batches; ++z) {
    const double* ap = av.data() + index_of(a, z) * M * K;
    const double* bp = bv.data() + index_of(b, z) * K * N;
    double* op = out.data() + z * M * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double x = ap[m * K + k];
        for (int64_t n = 0; n < N; ++n) op[m * N + n] += x * bp[k * N + n];
      }
  }
  return out;
}

double nmse(const std::vector<double>& y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double d = y[i] - ref[i];
    num += std::isfinite(d) ? d * d : 1e300;
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

// Expected error: the output's rounding dominates; the coopmat kernel also rounds f32 operands to f16.
double threshold(DType t, bool coopmat) {
  switch (t) {
    case DType::f32: return coopmat ? 1e-5 : 1e-9;
    case DType::f16: return 1e-5;
    case DType::bf16: return 1e-4;
    default: return 0;
  }
}

class VulkanMatmul : public ::testing::Test {
 protected:
  void SetUp() override {
    if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
    dev_ = parse_device("vulkan");
    saved_ = choice();
  }
  void TearDown() override {
    if (!vk::list_devices().empty()) choice() = saved_;
  }
  vk::KernelChoice& choice() const { return vk::context_for(dev_).kernel_choice(); }

  void run(const Case& c, const std::string& what) {
    Tensor a = make_operand(c.a, c.M, c.K, c.dtype, dev_, 1234);
    Tensor b = make_operand(c.b, c.K, c.N, c.dtype, dev_, 5678);
    Shape batch = broadcast_shapes(c.a.batch, c.b.batch, "test");
    Shape out_shape = batch;
    out_shape.push_back(c.M);
    out_shape.push_back(c.N);
    Tensor y = apply1(std::make_shared<Matmul>(), {a, b}, {out_shape, c.dtype});
    ASSERT_EQ(y.shape(), out_shape);
    last_ = kernel_of(a, b, y);
    std::vector<double> ref = reference(a, b, batch, c.M, c.N, c.K);
    double e = nmse(y.to_doubles(), ref);
    bool cm = choice().matmul == vk::MatmulKernel::coopmat;
    EXPECT_LT(e, threshold(c.dtype, cm)) << describe(c) << " [" << what << ": " << last_ << "]";
  }

  // The planner's description of the kernel that takes c = a b.
  std::string kernel_of(const Tensor& a, const Tensor& b, const Tensor& c) const {
    std::optional<vk::MatmulPlan> plan = vk::plan_matmul(vk::context_for(dev_), a, b, c);
    return plan ? plan->describe() : "composed";
  }

  std::vector<Case> cases() const {
    std::vector<Case> cs;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      cs.push_back({1, 1, 1, t, {}, {}});
      cs.push_back({7, 13, 5, t, {}, {}});
      cs.push_back({33, 65, 17, t, {}, {}});
      cs.push_back({129, 31, 257, t, {}, {}});
      cs.push_back({33, 65, 17, t, {{}, true, 0}, {}});
      cs.push_back({33, 65, 17, t, {}, {{}, true, 0}});
      cs.push_back({129, 31, 257, t, {{}, true, 0}, {{}, true, 0}});
      cs.push_back({64, 64, 64, t, {{}, false, 3}, {{}, true, 5}});  // aligned sizes, unaligned views
      cs.push_back({64, 128, 96, t, {{2}, false, 0}, {{}, true, 0}});  // aligned, batched, B broadcast
      cs.push_back({17, 9, 40, t, {{3, 1}, false, 0}, {{4}, true, 0}});  // broadcast both ways
      cs.push_back({5, 24, 7, t, {{2, 3}, true, 0}, {{2, 3}, false, 0}});
    }
    return cs;
  }

  Device dev_;
  vk::KernelChoice saved_;
  std::string last_;  // the kernel of the last run()
};

TEST_F(VulkanMatmul, ScalarKernel) {
  choice().matmul = vk::MatmulKernel::scalar;
  for (const Case& c : cases()) run(c, "scalar");
}

TEST_F(VulkanMatmul, ScalarTilesAndSplitK) {
  choice().matmul = vk::MatmulKernel::scalar;
  for (char tile : {'l', 'm', 's'}) {
    choice().matmul_tile = tile;
    run({129, 31, 257, DType::f32, {}, {{}, true, 0}}, std::string("tile ") + tile);
    run({70, 130, 50, DType::bf16, {{2}, true, 0}, {}}, std::string("tile ") + tile);
  }
  choice().matmul_tile = 0;
  choice().matmul_splitk = 3;
  run({33, 65, 700, DType::f32, {}, {}}, "split-K 3");
  run({33, 65, 700, DType::f16, {{2}, false, 0}, {{}, true, 0}}, "split-K 3");
}

TEST_F(VulkanMatmul, ScalarLarge) {
  choice().matmul = vk::MatmulKernel::scalar;
  run({512, 768, 1024, DType::f32, {}, {}}, "scalar large");
  run({512, 768, 1024, DType::f16, {}, {{}, true, 0}}, "scalar large");
}

TEST_F(VulkanMatmul, CoopmatKernel) {
  if (!vk::coopmat_available(dev_.index)) GTEST_SKIP() << "device has no cooperative matrices";
  choice().matmul = vk::MatmulKernel::coopmat;
  for (char tile : {'l', 'm', 's'}) {
    choice().matmul_tile = tile;
    for (const Case& c : cases()) run(c, std::string("coopmat tile ") + tile);
  }
  choice().matmul_tile = 0;
  choice().matmul_splitk = 3;
  run({33, 65, 700, DType::f32, {}, {}}, "coopmat split-K 3");
  run({130, 260, 2000, DType::f16, {{2}, false, 0}, {{}, true, 0}}, "coopmat split-K 3");
  choice().matmul_splitk = 0;
  // Every tile interior, every operand vector-aligned: the fast kernel, for each layout of a linear layer.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      run({256, 512, 96, DType::bf16, {{}, ta, 0}, {{}, tb, 0}}, "coopmat fast");
      std::string k = last_;
      EXPECT_NE(k.find(" fast"), std::string::npos) << k << (ta ? " aT" : "") << (tb ? " bT" : "");
    }
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    run({512, 768, 1024, t, {}, {}}, "coopmat large");
    run({512, 768, 1024, t, {{}, true, 0}, {{}, true, 0}}, "coopmat large");
    run({1000, 1000, 1000, t, {}, {{}, true, 0}}, "coopmat large");
  }
}

// LoRA's products: the rank-16 side takes the skinny kernel where A is 16-bit and row-major (matmul_skinny.comp,
// on devices with the mma.sync fragment layout), else the narrow 128x16 / 16x128 fast tiles (with split-K over a
// long K); a K of 16 takes the fast kernel's 16-step builds (l16 / m16). The automatic choice must pick them. The
// 256x128 tile (fast kernel only) on every layout.
TEST_F(VulkanMatmul, CoopmatSkinnyAndShortK) {
  if (!vk::coopmat_available(dev_.index)) GTEST_SKIP() << "device has no cooperative matrices";
  choice().matmul = vk::MatmulKernel::coopmat;
  const bool skinny_kernel = vk::fragment_layout_is_mma(vk::context_for(dev_));
  struct Want {
    Case c;
    const char* kernel;
  };
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Want wants[] = {
            {{1024, 16, 480, t, {{}, ta, 0}, {{}, tb, 0}}, "128x16"},     // x A^T, dY B
            {{1024, 32, 2048, t, {{}, ta, 0}, {{}, tb, 0}}, "128x16"},    // rank 32, split-K
            {{16, 384, 2048, t, {{}, ta, 0}, {{}, tb, 0}}, "16x128"},     // dA = dH^T x
            {{4096, 512, 16, t, {{}, ta, 0}, {{}, tb, 0}}, "128x128"},    // H B^T (K = rank)
            {{4096, 384, 48, t, {{}, ta, 0}, {{}, tb, 0}}, "128x128"},
            {{256, 16, 64, t, {{2}, ta, 0}, {{}, tb, 0}}, "128x16"},      // batched, B broadcast
        };
        for (const Want& w : wants) {
          run(w.c, "coopmat skinny / short K");
          std::string k = last_;
          const bool skinny = skinny_kernel && t != DType::f32 && !ta && w.c.a.batch.empty() && w.c.N <= 32;
          EXPECT_NE(k.find(skinny ? "skinny" : w.kernel), std::string::npos) << describe(w.c) << ": " << k;
          if (!skinny) {
            EXPECT_NE(k.find(" fast"), std::string::npos) << describe(w.c) << ": " << k;
          }
        }
      }
  // The skinny kernel's edges: rows past a workgroup's 32, a K that leaves some subgroups without a step, N not a
  // multiple of 16, and N = 32 (two fragments wide).
  for (DType t : {DType::bf16, DType::f16})
    for (bool tb : {false, true})
      for (const Case& c : {Case{37, 16, 288, t, {}, {{}, tb, 0}}, Case{1, 8, 64, t, {}, {{}, tb, 0}},
                            Case{301, 18, 1024, t, {}, {{}, tb, 0}}, Case{96, 32, 32, t, {}, {{}, tb, 0}},
                            Case{40, 2, 96, t, {}, {{}, tb, 0}}}) {
        run(c, "coopmat skinny");
        if (skinny_kernel) {
          EXPECT_NE(last_.find("skinny"), std::string::npos) << describe(c);
        }
      }
  choice().matmul_tile = 'w';  // 256x128, fast kernel only
  for (DType t : {DType::bf16, DType::f32})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case c{512, 384, 96, t, {{}, ta, 0}, {{}, tb, 0}};
        run(c, "coopmat tile w");
        EXPECT_NE(last_.find("256x128"), std::string::npos) << describe(c) << ": " << last_;
      }
  for (char tile : {'w', 'n', 'q'}) {  // forced where they cannot run: the choice falls back to the other tiles
    choice().matmul_tile = tile;
    for (const Case& c : cases()) run(c, std::string("coopmat tile ") + tile);
  }
}

// Row counts that are not a multiple of the tile (decode steps of any batch, prompts of any length): with A not
// transposed the fast kernel takes them (rows past M read row M - 1 and are not written), in every tile, batched
// (rows past M would land in the next matrix), with a low-rank addend and as a running sum (C = C * s + A B).
TEST_F(VulkanMatmul, CoopmatFastTakesRowEdges) {
  if (!vk::coopmat_available(dev_.index)) GTEST_SKIP() << "device has no cooperative matrices";
  choice().matmul = vk::MatmulKernel::coopmat;
  for (char tile : {'l', 'm', 's', 'w', 'q'}) {
    choice().matmul_tile = tile;
    for (DType t : {DType::bf16, DType::f16, DType::f32})
      for (int64_t M : {5, 29, 45, 131})
        for (bool tb : {false, true}) {
          const Case c{M, 256, 96, t, {}, {{}, tb, 0}};
          run(c, std::string("row edge, tile ") + tile);
          EXPECT_NE(last_.find(" fast"), std::string::npos) << describe(c) << " tile " << tile << ": " << last_;
        }
    run({29, 256, 64, DType::bf16, {{3}, false, 0}, {{}, true, 0}}, std::string("row edge, batched, tile ") + tile);
    EXPECT_NE(last_.find(" fast"), std::string::npos) << "batched, tile " << tile << ": " << last_;
  }
  choice() = saved_;
  const Device cpu = Device::cpu();
  for (int64_t M : {3, 29, 77}) {
    SCOPED_TRACE("M " + std::to_string(M));
    const Tensor a = Tensor::randn({M, 128}, 11, 1.0f, DType::bf16, cpu), w = Tensor::randn({256, 128}, 12, 0.1f,
                                                                                             DType::bf16, cpu);
    const Tensor u = Tensor::randn({M, 16}, 13, 1.0f, DType::f16, cpu), v = Tensor::randn({16, 256}, 14, 0.1f,
                                                                                          DType::f16, cpu);
    const Tensor want = ops::matmul_low_rank(a, ops::transpose(w), u, v, 0.5f, DType::f32);
    const Tensor got = ops::matmul_low_rank(a.to(dev_), ops::transpose(w.to(dev_)), u.to(dev_), v.to(dev_), 0.5f,
                                            DType::f32);
    std::vector<double> ref = want.to_doubles();
    EXPECT_LT(nmse(got.to_doubles(), ref), 1e-5);
    const Tensor scale = Tensor::randn({M}, 15, 1.0f, DType::f32, cpu);
    const Tensor c_cpu = Tensor::randn({M, 256}, 16, 1.0f, DType::f32, cpu), c_dev = c_cpu.to(dev_);
    ops::matmul_accumulate(c_cpu, a, ops::transpose(w), scale);
    ops::matmul_accumulate(c_dev, a.to(dev_), ops::transpose(w.to(dev_)), scale.to(dev_));
    EXPECT_LT(nmse(c_dev.to_doubles(), c_cpu.to_doubles()), 1e-5);
  }
}

// Which operand layouts take the coopmat kernels' 16-byte staging. A regression here costs no accuracy (the
// element-wise staging gives the same result), only speed: B's conditions were once swapped, so every B went
// element-wise and the fast kernel never ran.
TEST(MatmulVectorStaging, Layouts) {
  using vk::vector_staging;
  // A [M, K] row-major (K contiguous) and B [K, N] row-major (N contiguous): x @ W.
  EXPECT_TRUE(vector_staging(DType::bf16, false, 896, 1, 0, 0, 0));
  EXPECT_TRUE(vector_staging(DType::bf16, false, 4864, 1, 8, 0, 0));
  // Transposed: the row index is the contiguous one (B = W^T of a linear layer, W [N, K]: rs = 1, cs = K).
  EXPECT_TRUE(vector_staging(DType::f16, true, 1, 896, 0, 0, 0));
  EXPECT_FALSE(vector_staging(DType::f16, false, 1, 896, 0, 0, 0));
  EXPECT_FALSE(vector_staging(DType::f16, true, 896, 1, 0, 0, 0));
  // Misaligned offset, row stride or batch stride.
  EXPECT_FALSE(vector_staging(DType::f16, false, 896, 1, 4, 0, 0));
  EXPECT_FALSE(vector_staging(DType::f16, false, 900, 1, 0, 0, 0));
  EXPECT_FALSE(vector_staging(DType::f16, false, 896, 1, 0, 900, 0));
  EXPECT_FALSE(vector_staging(DType::f16, false, 896, 1, 0, 0, 12));
  // f32 loads are vec4: 4-aligned suffices.
  EXPECT_TRUE(vector_staging(DType::f32, false, 900, 1, 4, 0, 0));
  EXPECT_FALSE(vector_staging(DType::f32, false, 902, 1, 0, 0, 0));
}

// The workgroup-scope cooperative-matrix kernel (matmul_cm2.comp, on devices with VK_NV_cooperative_matrix2):
// f16 and real bf16 operands, B row-major and transposed, 16-bit and f32 C, edge tiles and K past the unrolled
// steps, a LoRA addend (f16 U, V beside bf16 A, B, as lora_linear passes them), and bf16 values past f16's 65504
// in and out, which the VK_NV_cooperative_matrix kernel (f16 operands) turns into inf.
TEST_F(VulkanMatmul, Coopmat2Kernel) {
  const vk::Features& f = vk::context_for(dev_).features();
  if (!f.cooperative_matrix2) GTEST_SKIP() << "device has no VK_NV_cooperative_matrix2";
  choice().matmul = vk::MatmulKernel::automatic;
  struct C2 {
    int64_t M, N, K;
    DType dt, out;
    bool tb;
    int64_t R;
    float scale_a;  // A's values times this
  };
  std::vector<C2> cases;
  for (DType dt : {DType::f16, DType::bf16}) {
    if (dt == DType::bf16 && !f.bf16_cooperative_matrix) continue;
    for (bool tb : {false, true}) {
      cases.push_back({1020, 3064, 1064, dt, dt, tb, 0, 1.0f});       // edge tiles, a partial K step
      cases.push_back({1024, 3072, 1536, dt, DType::f32, tb, 0, 1.0f});  // interior, unrolled K steps
      cases.push_back({1111, 4088, 1160, dt, dt, tb, 16, 1.0f});      // LoRA addend, every K loop
    }
  }
  if (f.bf16_cooperative_matrix) {
    cases.push_back({1280, 3072, 1024, DType::bf16, DType::bf16, true, 0, 1e5f});  // inputs past 65504
    cases.push_back({1280, 3072, 1024, DType::bf16, DType::f32, false, 8, 300.0f});  // outputs past 65504
  }
  for (const C2& c : cases) {
    SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " " +
                 std::string(dtype_name(c.dt)) + " -> " + std::string(dtype_name(c.out)) + (c.tb ? " bT" : "") + " R " + std::to_string(c.R) +
                 " A x " + std::to_string(c.scale_a));
    Tensor a = ops::cast(ops::scale(Tensor::randn({c.M, c.K}, 11, 1.0f, DType::f32, dev_), c.scale_a), c.dt);
    Tensor b = make_operand({{}, c.tb, 0}, c.K, c.N, c.dt, dev_, 12);
    const Shape out{c.M, c.N};
    Tensor y;
    std::vector<double> ref = reference(a, b, {}, c.M, c.N, c.K);
    if (c.R > 0) {
      Tensor u = Tensor::randn({c.M, c.R}, 13, 1.0f, DType::f16, dev_);
      Tensor v = make_operand({{}, c.tb, 0}, c.R, c.N, DType::f16, dev_, 14);
      y = apply1(std::make_shared<MatmulLowRank>(1.0f), {a, b, u, v}, {out, c.out});
      const vk::LowRankTerm lr{&u, &v, 1.0f};
      std::optional<vk::MatmulPlan> plan = vk::plan_matmul(vk::context_for(dev_), a, b, y, &lr);
      last_ = plan ? plan->describe() : "composed";
      std::vector<double> uv = reference(u, v, {}, c.M, c.N, c.R);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += uv[i];
    } else {
      y = apply1(std::make_shared<Matmul>(), {a, b}, {out, c.out});
      last_ = kernel_of(a, b, y);
    }
    EXPECT_EQ(last_.rfind("coopmat2", 0), 0u) << last_;
    EXPECT_LT(nmse(y.to_doubles(), ref), c.out == DType::f32 ? 1e-5 : 1e-4);
  }
}

TEST_F(VulkanMatmul, AutomaticChoice) {
  choice().matmul = vk::MatmulKernel::automatic;
  run({129, 31, 257, DType::f16, {}, {{}, true, 0}}, "auto");
  std::string k = last_;
  if (vk::coopmat_available(dev_.index)) EXPECT_EQ(k.rfind("coopmat", 0), 0u) << k;
  else EXPECT_EQ(k.rfind("scalar", 0), 0u) << k;
}

// Decode's products (at most 4 rows against a weight [N, K]) on matmul_gemv, batch dims folded into rows; other
// shapes stay on the tiled kernels.
TEST_F(VulkanMatmul, GemvKernel) {
  if (!vk::context_for(dev_).features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  choice().matmul = vk::MatmulKernel::automatic;
  const Operand weight{{}, true, 0};
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t M : {1, 3, 4})
      for (int64_t N : {1, 37, 1000})
        for (int64_t K : {8, 104, 2056}) {
          run({M, N, K, t, {}, weight}, "gemv");
          EXPECT_EQ(last_.rfind("gemv " + std::to_string(M) + " nt", 0), 0u) << last_;
        }
  Case batched{1, 300, 96, DType::bf16, Operand(), weight};
  batched.a.batch.assign(1, 3);
  run(batched, "gemv, batch of single rows");
  EXPECT_EQ(last_, "gemv 3 nt");
  batched.M = 2, batched.dtype = DType::f16;
  batched.a.batch.assign(1, 2);
  run(batched, "gemv, batch of row pairs");
  EXPECT_EQ(last_, "gemv 4 nt");
  run({5, 64, 96, DType::bf16, {}, weight}, "five rows");
  EXPECT_NE(last_.rfind("gemv", 0), 0u) << last_;
  run({2, 64, 13, DType::bf16, {}, weight}, "K not a multiple of 8");
  EXPECT_NE(last_.rfind("gemv", 0), 0u) << last_;
  // The lm_head's product in decode: f32 hidden states, a bf16 weight, f32 logits.
  Tensor h = Tensor::randn({2, 136}, 7, 1.0f, DType::f32, dev_);
  Tensor w = Tensor::randn({517, 136}, 8, 1.0f, DType::bf16, dev_);
  Tensor logits = apply1(std::make_shared<Matmul>(), {h, ops::transpose(w)}, {{2, 517}, DType::f32});
  EXPECT_EQ(kernel_of(h, ops::transpose(w), logits), "gemv 2 nt");
  const Shape no_batch;
  EXPECT_LT(nmse(logits.to_doubles(), reference(h, ops::transpose(w), no_batch, 2, 517, 136)), 1e-10);
  // Gemma 3's lm_head (a vocabulary of 262144): more than 65535 workgroups of columns, in rows of the grid.
  const int64_t V = 262144 + 9;
  Tensor h1 = Tensor::randn({1, 8}, 9, 1.0f, DType::f32, dev_);
  Tensor wide = Tensor::randn({V, 8}, 10, 1.0f, DType::bf16, dev_);
  Tensor wide_logits = apply1(std::make_shared<Matmul>(), {h1, ops::transpose(wide)}, {{1, V}, DType::f32});
  EXPECT_EQ(kernel_of(h1, ops::transpose(wide), wide_logits), "gemv 1 nt");
  EXPECT_LT(nmse(wide_logits.to_doubles(), reference(h1, ops::transpose(wide), no_batch, 1, V, 8)), 1e-10);
}

// Decode's LoRA products: x Wᵀ + s U Bᵀ with U = x Aᵀ [rows, R] and B [N, R] in their stored dtypes (f32
// factors beside 16-bit activations and weights, as Linear::adapted passes them), the addend inside matmul_gemv;
// ranks below, at and past a subgroup's width, odd N and K. A U without unit stride along R is composed instead.
TEST_F(VulkanMatmul, GemvLowRankAddend) {
  if (!vk::context_for(dev_).features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  choice().matmul = vk::MatmulKernel::automatic;
  struct G {
    int64_t M, N, K, R;
    DType x, factors;
  };
  std::vector<G> cases;
  for (DType x : {DType::f32, DType::bf16, DType::f16})
    for (int64_t M : {1, 3, 4})
      for (int64_t R : {1, 7, 16, 70}) cases.push_back({M, M == 3 ? 1001 : 37, M == 1 ? 2056 : 104, R, x,
                                                         R == 7 ? DType::f16 : DType::f32});
  const float alpha = 0.37f;
  for (const G& c : cases) {
    SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " R " +
                 std::to_string(c.R) + " " + std::string(dtype_name(c.x)) + ", factors " +
                 std::string(dtype_name(c.factors)));
    Tensor a = Tensor::randn({c.M, c.K}, 21, 1.0f, c.x, dev_);
    Tensor b = make_operand({{}, true, 0}, c.K, c.N, c.x, dev_, 22);
    Tensor u = Tensor::randn({c.M, c.R}, 23, 1.0f, c.factors, dev_);
    Tensor v = make_operand({{}, true, 0}, c.R, c.N, c.factors, dev_, 24);  // B [N, R] seen as [R, N]
    Tensor y = apply1(std::make_shared<MatmulLowRank>(alpha), {a, b, u, v}, {{c.M, c.N}, c.x});
    const vk::LowRankTerm lr{&u, &v, alpha};
    std::optional<vk::MatmulPlan> plan = vk::plan_matmul(vk::context_for(dev_), a, b, y, &lr);
    ASSERT_TRUE(plan);
    EXPECT_EQ(plan->describe(), "gemv " + std::to_string(c.M) + " nt low-rank");
    std::vector<double> ref = reference(a, b, {}, c.M, c.N, c.K), uv = reference(u, v, {}, c.M, c.N, c.R);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += alpha * uv[i];
    EXPECT_LT(nmse(y.to_doubles(), ref), threshold(c.x, false));
  }
  Tensor a = Tensor::randn({2, 64}, 31, 1.0f, DType::bf16, dev_);
  Tensor b = make_operand({{}, true, 0}, 64, 45, DType::bf16, dev_, 32);
  Tensor u = make_operand({{}, true, 0}, 2, 8, DType::f32, dev_, 33);  // unit stride along M, not R
  Tensor v = make_operand({{}, true, 0}, 8, 45, DType::f32, dev_, 34);
  Tensor y = apply1(std::make_shared<MatmulLowRank>(1.0f), {a, b, u, v}, {{2, 45}, DType::f32});
  const vk::LowRankTerm lr{&u, &v, 1.0f};
  std::optional<vk::MatmulPlan> plan = vk::plan_matmul(vk::context_for(dev_), a, b, y, &lr);
  EXPECT_TRUE(!plan || plan->route != vk::MatmulRoute::gemv) << plan->describe();
  std::vector<double> ref = reference(a, b, {}, 2, 45, 64), uv = reference(u, v, {}, 2, 45, 8);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += uv[i];
  EXPECT_LT(nmse(y.to_doubles(), ref), 1e-5);
}

using test::count_dispatches;
using test::DispatchCount;

// Decode's adapted product with the residual (Linear::fused): x Aᵀ, then one matmul_gemv that adds s (x Aᵀ) Bᵀ and
// the residual to x Wᵀ as it writes: two dispatches, and the sums of the composed ops.
TEST_F(VulkanMatmul, GemvEpilogueDispatches) {
  vk::Context& ctx = vk::context_for(dev_);
  if (!ctx.features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  choice().matmul = vk::MatmulKernel::automatic;
  const int64_t M = 2, K = 136, N = 104, R = 8;
  Tensor x = Tensor::randn({M, K}, 41, 1.0f, DType::bf16, dev_);
  Tensor w = Tensor::randn({N, K}, 42, 1.0f, DType::bf16, dev_);
  Tensor a = Tensor::randn({R, K}, 43, 0.1f, DType::f32, dev_), b = Tensor::randn({N, R}, 44, 0.1f, DType::f32, dev_);
  Tensor res = Tensor::randn({M, N}, 45, 1.0f, DType::bf16, dev_);
  Tensor down, y;
  const DispatchCount c = count_dispatches(ctx, "matmul_gemv", [&] {
    down = ops::matmul(x, ops::transpose(a), DType::f32, 0.5f);
    y = ops::matmul_add(x, ops::transpose(w), res, down, ops::transpose(b), 1.0f, DType::bf16);
  });
  EXPECT_EQ(c.matching, 2u) << c.report;
  EXPECT_EQ(c.all, 2u) << c.report;
  std::vector<double> ref = reference(x, ops::transpose(w), {}, M, N, K);
  const std::vector<double> lr = reference(down, ops::transpose(b), {}, M, N, R), r = res.to_doubles();
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += lr[i] + r[i];
  EXPECT_LT(nmse(y.to_doubles(), ref), threshold(DType::bf16, false));
}

// Decode's gate and up with their activation (LinearGroup::gated): one matmul_gemv writes act(gate) * up, and an
// adapter adds its x Aᵀ dispatch only; no gated_activation pass. The values are checked in OpTest.MatmulGated.
TEST_F(VulkanMatmul, GemvGatedDispatches) {
  vk::Context& ctx = vk::context_for(dev_);
  if (!ctx.features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  choice().matmul = vk::MatmulKernel::automatic;
  const int64_t K = 136, F = 104, R = 8;
  Tensor x = Tensor::randn({1, K}, 51, 1.0f, DType::bf16, dev_);
  Tensor w = Tensor::randn({2 * F, K}, 52, 1.0f, DType::bf16, dev_);
  Tensor a = Tensor::randn({R, K}, 53, 0.1f, DType::f32, dev_);
  Tensor b = Tensor::randn({2 * F, R}, 54, 0.1f, DType::f32, dev_);
  for (bool adapter : {false, true}) {
    SCOPED_TRACE(adapter ? "adapter" : "base");
    Tensor y;
    const DispatchCount c = count_dispatches(ctx, "matmul_gemv", [&] {
      const Tensor down = adapter ? ops::matmul(x, ops::transpose(a), DType::f32, 0.5f) : Tensor();
      y = ops::matmul_gated(x, ops::transpose(w), Tensor(), down, adapter ? ops::transpose(b) : Tensor(), 1.0f,
                            ops::GateActivation::silu, DType::bf16);
    });
    EXPECT_EQ(c.matching, adapter ? 2u : 1u) << c.report;
    EXPECT_EQ(c.all, c.matching) << c.report;
    EXPECT_EQ(y.shape(), (Shape{1, F}));
  }
}

// A mixture of experts' decode products routed on the device (ops::matmul_by_id): the gated gate_up and the down
// product are one matmul_gemv dispatch each, nothing else (no read-back of the ids, no product per row). The
// values are checked in OpTest.MatmulByIdForward.
TEST_F(VulkanMatmul, MatmulByIdDispatches) {
  vk::Context& ctx = vk::context_for(dev_);
  if (!ctx.features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  const int64_t E = 16, C = 136, I = 40, k = 4;
  Tensor x = Tensor::randn({2, C}, 61, 1.0f, DType::bf16, dev_);
  Tensor gate_up = Tensor::randn({E, 2 * I, C}, 62, 1.0f, DType::bf16, dev_);
  Tensor down = Tensor::randn({E, C, I}, 63, 1.0f, DType::bf16, dev_);
  const Tensor ids = Tensor::from_ints({3, 15, 0, 7, 7, 2, 9, 3}, {2 * k}, dev_);
  Tensor y;
  const DispatchCount c = count_dispatches(ctx, "matmul_gemv", [&] {
    const Tensor a = ops::matmul_by_id(x, gate_up, ids, k, ops::GateActivation::silu);
    y = ops::matmul_by_id(a, down, ids, 1);
  });
  EXPECT_EQ(c.matching, 2u) << c.report;
  EXPECT_EQ(c.all, 2u) << c.report;
  EXPECT_EQ(y.shape(), (Shape{2 * k, C}));
}

// The experts' products of a mixture-of-experts layer (ops::grouped_matmul) on a device with cooperative matrices 2:
// one dispatch of matmul_cm2_grouped for every group, whatever their sizes (empty, one row, several row tiles with
// a partial last one), several column tiles with a partial last one, K past the unrolled steps with a partial
// last step; f16 and bf16, the weights stacked as linear layers' ([G, N, K]) or as [G, K, N].
TEST_F(VulkanMatmul, GroupedProductsInOneDispatch) {
  vk::Context& ctx = vk::context_for(dev_);
  if (!ctx.features().cooperative_matrix2) GTEST_SKIP() << "no cooperative matrices 2";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  const std::vector<int64_t> offsets{0, 0, 130, 131, 431, 431, 440};
  const int64_t G = int64_t(offsets.size()) - 1, R = offsets.back(), P = 264, Q = 520;
  for (DType dt : {DType::f16, DType::bf16})
    for (bool t : {true, false}) {
      if (dt == DType::bf16 && !ctx.features().bf16_cooperative_matrix) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + (t ? " transposed" : ""));
      const int64_t K = t ? Q : P, N = t ? P : Q;
      Tensor x = Tensor::randn({R, K}, 61, 1.0f, dt, dev_), w = Tensor::randn({G, P, Q}, 62, 1.0f, dt, dev_);
      Tensor y;
      const DispatchCount c =
          count_dispatches(ctx, "matmul_cm2_grouped", [&] { y = ops::grouped_matmul(x, w, offsets, t); });
      EXPECT_EQ(c.matching, 1u) << c.report;
      EXPECT_EQ(c.all, 1u) << c.report;
      std::vector<double> ref(size_t(R * N));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t rows = offsets[size_t(g) + 1] - offsets[size_t(g)];
        if (rows == 0) continue;
        const Tensor xg = ops::slice(x, 0, offsets[size_t(g)], offsets[size_t(g) + 1]);
        const Tensor wg = ops::reshape(ops::slice(w, 0, g, g + 1), {P, Q});
        const std::vector<double> part = reference(xg, t ? ops::transpose(wg) : wg, {}, rows, N, K);
        std::copy(part.begin(), part.end(), ref.begin() + offsets[size_t(g)] * N);
      }
      EXPECT_LT(nmse(y.to_doubles(), ref), threshold(dt, false));
    }
}

// The stacked weight's gradient of those products (GroupedOuter: y[g] = a_gᵀ b_g over group g's rows) in one
// dispatch of matmul_cm2_grouped_outer: empty groups (zeros), a one-row group, groups past the unrolled K steps with
// a partial last one; M one partial row tile (a LoRA rank) and several, N several column tiles with a partial last.
TEST_F(VulkanMatmul, GroupedOuterInOneDispatch) {
  vk::Context& ctx = vk::context_for(dev_);
  if (!ctx.features().cooperative_matrix2) GTEST_SKIP() << "no cooperative matrices 2";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  NoGrad no_grad;
  const std::vector<int64_t> offsets{0, 0, 130, 131, 431, 431, 440};
  const int64_t G = int64_t(offsets.size()) - 1, R = offsets.back(), N = 520;
  for (DType dt : {DType::f16, DType::bf16})
    for (int64_t M : {int64_t(16), int64_t(264)}) {
      if (dt == DType::bf16 && !ctx.features().bf16_cooperative_matrix) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " M " + std::to_string(M));
      Tensor a = Tensor::randn({R, M}, 63, 1.0f, dt, dev_), b = Tensor::randn({R, N}, 64, 1.0f, dt, dev_);
      Tensor y;  // allocated uninitialised: the empty groups' zeros must come from the kernel
      const DispatchCount c = count_dispatches(ctx, "matmul_cm2_grouped_outer", [&] {
        y = apply1(std::make_shared<GroupedOuter>(offsets), {a, b}, {{G, M, N}, dt});
      });
      EXPECT_EQ(c.matching, 1u) << c.report;
      EXPECT_EQ(c.all, 1u) << c.report;
      const std::vector<double> av = a.to_doubles(), bv = b.to_doubles();
      std::vector<double> ref(size_t(G * M * N), 0.0);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t r = offsets[size_t(g)]; r < offsets[size_t(g) + 1]; ++r)
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
              ref[size_t((g * M + m) * N + n)] += av[size_t(r * M + m)] * bv[size_t(r * N + n)];
      EXPECT_LT(nmse(y.to_doubles(), ref), threshold(dt, false));
      const std::vector<double> got = y.to_doubles();
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(got[size_t(i)], 0.0) << "empty group 0 at " << i;
    }
}

// The planner on its own: what it returns without recording anything, where the addend or the accumulation
// cannot go into the kernel, and a forced kernel the device lacks.
TEST_F(VulkanMatmul, PlanWithoutRecording) {
  vk::Context& ctx = vk::context_for(dev_);
  Tensor a = Tensor::randn({512, 1024}, 1, 1.0f, DType::f32, dev_);
  Tensor b = Tensor::randn({1024, 768}, 2, 1.0f, DType::f32, dev_);
  Tensor c = Tensor::empty({512, 768}, DType::f32, dev_);
  std::optional<vk::MatmulPlan> p = vk::plan_matmul(ctx, a, b, c);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->route, vk::MatmulRoute::scalar) << p->describe();  // f32 products stay exact
  EXPECT_EQ(p->describe().rfind("scalar ", 0), 0u) << p->describe();
  EXPECT_EQ(p->M, 512u);
  EXPECT_EQ(p->N, 768u);
  EXPECT_EQ(p->K, 1024u);
  EXPECT_GE(p->k_split * p->nsplit, p->K);
  EXPECT_LT(p->k_split * (p->nsplit - 1), p->K);  // no empty split
  // Batched A [3, 64, 96] x B [96, 40]: both batch dims folded, no outer dispatches.
  Tensor ab = Tensor::randn({3, 64, 96}, 3, 1.0f, DType::f32, dev_);
  Tensor bb = Tensor::randn({96, 40}, 4, 1.0f, DType::f32, dev_);
  Tensor cb = Tensor::empty({3, 64, 40}, DType::f32, dev_);
  p = vk::plan_matmul(ctx, ab, bb, cb);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->d1.size, 3);
  EXPECT_EQ(p->d1.sb, 0);  // B broadcast
  EXPECT_TRUE(p->outer.empty());
  // A low-rank addend on a batched product, and an accumulation on the scalar kernel: composed by the caller.
  Tensor u = Tensor::randn({64, 8}, 5, 1.0f, DType::f32, dev_);
  Tensor v = Tensor::randn({8, 40}, 6, 1.0f, DType::f32, dev_);
  const vk::LowRankTerm lr{&u, &v, 1.0f};
  EXPECT_FALSE(vk::plan_matmul(ctx, ab, bb, cb, &lr));
  const vk::Accumulate acc{nullptr};
  choice().matmul = vk::MatmulKernel::scalar;
  EXPECT_FALSE(vk::plan_matmul(ctx, a, b, c, nullptr, &acc));
  if (!vk::coopmat_available(dev_.index)) {
    choice().matmul = vk::MatmulKernel::coopmat;
    EXPECT_THROW(vk::plan_matmul(ctx, a, b, c), DeviceError);
  }
}

}  // namespace
}  // namespace lmtune
