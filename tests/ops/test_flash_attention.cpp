// The fused attention (ops::flash_attention) against the reference composition (ops::attention_reference), on
// every device: O, LSE and the gradients dQ, dK, dV of a random-weighted sum, for causal / full / GQA / odd sizes /
// KV-cache decode / sliding window / softcap / packed documents / padded keys / fully masked rows, f32 and bf16,
// head dims 64, 80 (the 128 class) and 256. bf16 runs are checked against the f32 reference on the same
// (bf16-valued) inputs: the fused kernels accumulate in f32, so only the final rounding differs.
#include <limits>

#include "backend/vulkan/context.h"
#include "backend/vulkan/flash_attention.h"
#include "backend/vulkan/matmul.h"
#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops/flash_attention.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

using V = std::vector<Tensor>;

struct FlashCase {
  const char* name;
  int64_t B, T, S, H, KV, D;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0;
  int64_t q_offset = 0;
  bool docs = false;        // three packed documents per row
  int64_t pad_keys = 0;     // batch row 1 has this many padding keys at the start (key_mask)
  bool strided_kv = false;  // k, v are [0, S) slices of a longer cache (batch and time strides)
  float sharpen = 0;        // q x 4 and key j x (1 + sharpen j / S): row maxima that keep growing block after
                            // block by more than the forward's lazy-rescale threshold
};

std::vector<int32_t> three_docs(int64_t B, int64_t T) {
  std::vector<int32_t> d(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) d[size_t(b * T + t)] = int32_t(t < T / 3 + b ? 0 : t < 2 * T / 3 ? 1 : 2);
  return d;
}

// What one attention implementation gives: O, its LSE (empty for the reference) and the gradients.
struct Result {
  Tensor out, lse;
  V grads;
};

Result run(bool fused, const V& qkv, const Tensor& w, const ops::AttentionOptions& opt) {
  Result r;
  auto loss = [&](const V& in) {
    Tensor o = fused ? ops::flash_attention(in[0], in[1], in[2], opt).first
                     : ops::attention_reference(in[0], in[1], in[2], opt);
    r.out = o.detach();
    return V{ops::sum_all(ops::mul(ops::cast(o, DType::f32), w))};
  };
  r.grads = value_and_grad(loss)(qkv).second;
  if (fused) r.lse = ops::flash_attention(qkv[0], qkv[1], qkv[2], opt).second;
  return r;
}

::testing::AssertionResult near(const Tensor& got, const Tensor& want, double tol) {
  return close(got, ref::of(want), tol);
}

// Runs each case in each dtype through the fused op and the reference; checks O, LSE, dQ, dK, dV (NMSE at most
// f32_tol for f32 inputs, 1e-4 for 16-bit ones).
void check_cases(const Device& dev, const std::vector<FlashCase>& cases, const std::vector<DType>& dtypes,
                 double f32_tol = 1e-10) {
  for (const auto& c : cases)
    for (DType dt : dtypes) {
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      // Inputs hold bf16-representable values either way, so the f32 reference sees exactly the bf16 run's inputs.
      auto input = [&](const Shape& s, uint64_t seed, Layout l) {
        return ops::cast(ops::cast(make_input(s, DType::f32, dev, seed, l, 0.1f, 1.5f), DType::bf16), DType::f32);
      };
      Tensor q = input({c.B, c.T, c.H, c.D}, 61, Layout::strided);
      Tensor k = input({c.B, c.S + (c.strided_kv ? 6 : 0), c.KV, c.D}, 62, Layout::contiguous);
      Tensor v = input({c.B, c.S + (c.strided_kv ? 6 : 0), c.KV, c.D}, 63, Layout::contiguous);
      if (c.strided_kv) k = ops::slice(k, 1, 0, c.S), v = ops::slice(v, 1, 0, c.S);
      if (c.sharpen > 0) {  // still bf16-representable: x4 is exact, the ramped keys are rounded to bf16
        std::vector<float> ramp(static_cast<size_t>(c.S));
        for (int64_t j = 0; j < c.S; ++j) ramp[size_t(j)] = 1.0f + c.sharpen * float(j) / float(c.S);
        Tensor r = Tensor::from_floats(ramp, {1, c.S, 1, 1}, DType::f32, dev);
        q = ops::scale(q, 4.0f);
        k = ops::cast(ops::cast(ops::mul(k, r), DType::bf16), DType::f32);
      }
      Tensor w = make_input({c.B, c.T, c.H, c.D}, DType::f32, dev, 64);
      ops::AttentionOptions opt;
      opt.causal = c.causal;
      opt.window = c.window;
      opt.softcap = c.softcap;
      opt.q_offset = c.q_offset;
      if (c.docs) opt.doc_ids = Tensor::from_ints(three_docs(c.B, c.T), {c.B, c.T}, dev);
      if (c.pad_keys > 0) {
        std::vector<int32_t> m(static_cast<size_t>(c.B * c.S), 1);
        for (int64_t j = 0; j < c.pad_keys; ++j) m[size_t(c.S + j)] = 0;
        opt.key_mask = Tensor::from_ints(m, {c.B, c.S}, dev);
      }
      Result want = run(false, {q, k, v}, w, opt);
      auto cast = [&](const Tensor& t) { return dt == DType::f32 ? t : ops::cast(t, dt); };
      Result got = run(true, {cast(q), cast(k), cast(v)}, w, opt);

      const double tol = dt == DType::f32 ? f32_tol : 1e-4;
      EXPECT_EQ(got.out.dtype(), dt);
      EXPECT_TRUE(near(got.out, want.out, tol)) << "O";
      const char* names[] = {"dQ", "dK", "dV"};
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(got.grads[i].dtype(), dt);
        EXPECT_TRUE(near(got.grads[i], want.grads[i], tol)) << names[i];
      }
      // LSE: logsumexp of the reference's masked scores, -inf exactly where a row sees no key.
      Tensor scores = ops::attention_scores(q, k, opt);  // [B, KV, G, T, S]
      Tensor lse = ops::reshape(ops::logsumexp(scores, -1), {c.B, c.H, c.T});
      EXPECT_EQ(got.lse.dtype(), DType::f32);
      EXPECT_TRUE(near(got.lse, lse, dt == DType::f32 ? f32_tol / 100 : 1e-5)) << "LSE";
      for (double x : got.out.to_doubles()) ASSERT_FALSE(std::isnan(x));
      for (const Tensor& g : got.grads)
        for (double x : g.to_doubles()) ASSERT_FALSE(std::isnan(x));
    }
}

// Head dim 64 cases that both the portable and the tensor-core kernels run.
std::vector<FlashCase> d64_cases() {
  return {
      {"causal_gqa_odd", 1, 37, 37, 6, 2, 64},
      {"full_gqa", 1, 37, 37, 6, 2, 64, false},
      {"decode_kv_cache", 2, 1, 41, 6, 2, 64, true, 0, 0, 40, false, 3, true},
      {"prefill_kv_cache", 1, 5, 41, 4, 2, 64, true, 0, 0, 36, false, 0, true},
      {"softcap_full", 1, 21, 29, 4, 1, 64, false, 0, 5.0f},
      {"padded_keys_masked_rows", 2, 13, 13, 4, 2, 64, true, 0, 0, 0, false, 5},
      {"negative_offset_masked_rows", 1, 9, 9, 2, 2, 64, true, 0, 0, -3},
  };
}

TEST_P(OpTest, FlashAttentionMatchesReference) {
  std::vector<FlashCase> cases = d64_cases();
  cases.insert(cases.end(), {
      {"decode_long_split", 2, 1, 300, 6, 2, 64, true, 0, 0, 299, false, 7, true},  // Vulkan: split key range
      {"decode_long_window_split", 1, 1, 300, 4, 1, 128, true, 100, 0, 299},
      {"window", 1, 37, 37, 4, 2, 64, true, 8},
      {"docs", 2, 37, 37, 2, 1, 64, true, 0, 0, 0, true},
      {"d80_window_softcap", 1, 19, 19, 4, 2, 80, true, 6, 4.0f},
      {"d256", 1, 9, 9, 2, 1, 256, true, 0, 30.0f},
      {"sharp_growing_logits", 1, 70, 70, 2, 1, 64, true, 0, 0, 0, false, 0, false, 3.0f},
      // Vulkan's decode kernel (at most 16 rows per kv head): 16 heads on one kv head, head dims 80 and 256,
      // soft-capping, padding and a window; with 64 (batch, kv head) pairs 4 splits of 150 keys: two 128-key
      // tiles per split.
      {"decode_g16_d80", 2, 1, 150, 16, 1, 80, true, 0, 0, 149, false, 4, true},
      {"decode_many_kv_heads_tiles", 2, 1, 600, 32, 32, 64, true, 0, 0, 599, false, 9},
      {"decode_d256_softcap_window", 1, 1, 700, 8, 2, 256, true, 200, 30.0f, 699},
      {"decode_two_tokens_sharp", 1, 2, 1000, 4, 2, 64, true, 0, 0, 998, false, 0, false, 3.0f},
  });
  check_cases(dev(), cases, {DType::f32, DType::bf16});
}

// The tensor-core kernels (Vulkan devices with cooperative matrices), forced for every case and dtype (f16
// products, so f32 runs get the bf16 tolerance: their inputs are f16-exact): the register-softmax ones (coopmat: on
// NVIDIA's fragment layout; every head-dim class) and the shared-memory ones (coopmat_shared; D <= 64). Elsewhere
// forcing them is an error, not a silent fallback.
namespace {
void check_tensor_core_kernels(const Device& d, vk::FlashKernel kind) {
  struct Force {
    Force(const Device& d, vk::FlashKernel k) : choice(vk::context_for(d).kernel_choice()) { choice.flash = k; }
    ~Force() { choice.flash = vk::FlashKernel::automatic; }
    vk::KernelChoice& choice;
  } force(d, kind);
  Tensor x = make_input({1, 70, 2, 64}, DType::bf16, d, 91);
  if (!vk::coopmat_available(d.index)) {
    EXPECT_THROW(ops::flash_attention(x, x, x, {}), DeviceError);
    GTEST_SKIP() << "device has no cooperative matrices";
  }
  ops::flash_attention(x, x, x, {});
  const std::string ran = vk::flash_kernel_family(d, ops::attention_params(x, x, x, {}), x.dtype());
  if (kind == vk::FlashKernel::coopmat_shared) EXPECT_EQ(ran, "coopmat-shared");
  else EXPECT_TRUE(ran == "coopmat" || ran == "coopmat-shared") << ran;  // coopmat-shared off NVIDIA's layout
  // The register-softmax kernels take every head-dim class; the shared-memory ones stop at 64.
  const bool all_dims = ran == "coopmat";
  Tensor wide = make_input({1, 9, 2, 80}, DType::bf16, d, 92);
  if (!all_dims) {
    EXPECT_THROW(ops::flash_attention(wide, wide, wide, {}), ShapeError);
  }
  // Longer sequences than the portable test's, so that whole blocks skip the element-wise masks.
  std::vector<FlashCase> cases = d64_cases();
  cases.insert(cases.end(), {
      {"long_gqa7_two_batches", 2, 150, 150, 14, 2, 64},  // dK/dV in 4 row-range splits
      {"long_docs_window_split", 1, 200, 200, 8, 2, 64, true, 50, 0, 0, true},
      {"window", 1, 97, 97, 4, 2, 64, true, 8},
      {"docs", 2, 77, 77, 2, 1, 64, true, 0, 0, 0, true},
      {"d40_odd_dims", 1, 33, 33, 4, 2, 40, true, 6, 4.0f},
      {"d12_unaligned_rows", 1, 19, 23, 2, 1, 12, false},
      {"sharp_growing_logits", 1, 200, 200, 4, 2, 64, true, 0, 0, 0, false, 0, false, 3.0f},
  });
  if (all_dims)  // the 128 class (whole head dims in the forward and dQ, split in two for dK/dV), the 256 class
    cases.insert(cases.end(), {  // (split in two, and in four for dK/dV) and the 512 class, every mask, odd lengths
        {"d128_gqa_two_batches", 2, 150, 150, 8, 2, 128},
        {"d128_docs_window_split", 1, 300, 300, 8, 1, 128, true, 70, 0, 0, true},  // dK/dV row-range splits
        {"d128_full_prefill_cache", 2, 45, 77, 4, 2, 128, false, 0, 0, 32, false, 6, true},
        {"d96_window_softcap", 1, 97, 97, 4, 2, 96, true, 24, 30.0f},
        {"d80_padded_keys", 2, 70, 70, 4, 4, 80, true, 0, 0, 0, false, 9},
        {"d128_sharp_growing_logits", 1, 200, 200, 4, 2, 128, true, 0, 0, 0, false, 0, false, 3.0f},
        {"d256_softcap_gqa", 1, 150, 150, 8, 2, 256, true, 0, 30.0f},
        {"d256_mqa_window_docs", 2, 133, 133, 4, 1, 256, true, 40, 0, 0, true},
        {"d256_full_padded_keys", 2, 37, 37, 2, 1, 256, false, 0, 0, 0, false, 5},
        {"d200_negative_offset", 1, 80, 80, 4, 2, 200, true, 0, 0, -3},
        {"d256_sharp_growing_logits", 1, 200, 200, 4, 1, 256, true, 0, 0, 0, false, 0, false, 3.0f},
        // The 512 class (Gemma 4's full layers; split in four, and in eight for dK/dV, two exchange rounds in
        // the backward): GQA with documents, padded keys without a causal mask, unaligned dims, growing maxima.
        {"d512_gqa_docs", 2, 133, 133, 8, 2, 512, true, 0, 0, 0, true},
        {"d512_full_padded_keys", 2, 70, 70, 4, 1, 512, false, 0, 0, 0, false, 5},
        {"d392_window_softcap_offset", 1, 80, 80, 4, 2, 392, true, 24, 30.0f, -3},
        {"d512_sharp_growing_logits", 1, 150, 150, 4, 1, 512, true, 0, 0, 0, false, 0, false, 3.0f},
    });
  check_cases(d, cases, {DType::f32, DType::bf16, DType::f16}, 1e-4);
}
}  // namespace

// Head dims past 256: the CPU's fused kernels and Vulkan's tensor-core ones (above) take them; where neither runs,
// ops::attention composes the reference and ops::flash_attention refuses them. Decoding (forward only) takes the
// fused path on every device: on Vulkan the decode kernel's 512 class, also from rows off 8-element boundaries.
TEST_P(OpTest, FlashAttentionHeadDim512) {
  Tensor x = make_input({1, 70, 2, 512}, DType::bf16, dev(), 93);
  const FlashAttentionParams p = ops::attention_params(x, x, x, {});
  if (backend(dev()).runs_fused_attention(p, x.dtype(), true)) {
    // Vulkan's automatic choice takes the tensor cores for 16-bit inputs only.
    if (!dev().is_cpu()) {
      EXPECT_EQ(vk::flash_kernel_family(dev(), p, x.dtype()), "coopmat");
    }
    const std::vector<DType> dtypes = dev().is_cpu() ? std::vector{DType::f32, DType::bf16} : std::vector{DType::bf16};
    check_cases(dev(), {{"d512_gqa_window", 1, 70, 70, 4, 2, 512, true, 9}}, dtypes, 1e-4);
  } else {
    EXPECT_THROW(ops::flash_attention(x, x, x, {}), ShapeError);
    const Tensor want = ops::attention_reference(x, x, x, {});
    EXPECT_TRUE(near(ops::attention(x, x, x, {}), want, 0)) << "ops::attention composes the reference";
  }
  NoGrad no_grad;
  const int64_t B = 2, S = 90, H = 8, D = 512;
  auto input = [&](const Shape& s, uint64_t seed) {  // bf16-representable
    return ops::cast(ops::cast(make_input(s, DType::f32, dev(), seed, Layout::contiguous, 0.1f, 1.5f), DType::bf16),
                     DType::f32);
  };
  const Tensor q = input({B, 1, H, D}, 94);
  const Tensor k = ops::slice(input({B, S + 6, 1, D}, 95), 1, 0, S), v = ops::slice(input({B, S + 6, 1, D}, 96), 1, 0, S);
  ops::AttentionOptions opt;
  opt.q_offset = S - 1;
  opt.window = 40;
  opt.softcap = 30.0f;
  std::vector<int32_t> mask(static_cast<size_t>(B * S), 1);
  for (int64_t j = 60; j < 63; ++j) mask[size_t(S + j)] = 0;
  opt.key_mask = Tensor::from_ints(mask, {B, S}, dev());
  const Tensor want = ops::attention_reference(q, k, v, opt);
  for (DType dt : {DType::f32, DType::bf16})
    for (bool shifted : {false, true}) {
      LMTUNE_CASE(dtype_name(dt) << (shifted ? " q 3 elements off" : ""));
      Tensor qd = ops::cast(q, dt);
      if (shifted) {
        const Tensor flat = ops::concat({Tensor::zeros({3}, dt, dev()), ops::reshape(qd, {-1})}, 0);
        qd = ops::reshape(ops::slice(flat, 0, 3, 3 + qd.numel()), q.shape());
        EXPECT_EQ(qd.offset() % 8, 3);
      }
      const Tensor kd = ops::cast(k, dt), vd = ops::cast(v, dt);
      EXPECT_TRUE(backend(dev()).runs_fused_attention(ops::attention_params(qd, kd, vd, opt), dt, false));
      EXPECT_TRUE(near(ops::attention(qd, kd, vd, opt), want, dt == DType::f32 ? 1e-8 : 1e-4));
    }
}

TEST_P(OpTest, FlashAttentionTensorCoreKernels) {
  if (dev().is_cpu()) GTEST_SKIP() << "Vulkan only";
  for (vk::FlashKernel kind : {vk::FlashKernel::coopmat, vk::FlashKernel::coopmat_shared}) {
    SCOPED_TRACE(kind == vk::FlashKernel::coopmat ? "coopmat" : "coopmat_shared");
    check_tensor_core_kernels(dev(), kind);
    if (::testing::Test::IsSkipped()) return;
  }
}

// The LSE output is differentiable too (its cotangent enters the backward's Δ), and jvp goes through the
// composition: both against central finite differences of the f32 forward on the CPU-sized problem.
TEST_P(OpTest, FlashAttentionLseGradientAndJvp) {
  const int64_t B = 1, T = 6, S = 6, H = 2, KV = 1, D = 8;
  Tensor q = make_input({B, T, H, D}, DType::f32, dev(), 71, Layout::contiguous, 0.1f, 1.5f);
  Tensor k = make_input({B, S, KV, D}, DType::f32, dev(), 72, Layout::contiguous, 0.1f, 1.5f);
  Tensor v = make_input({B, S, KV, D}, DType::f32, dev(), 73);
  Tensor wo = make_input({B, T, H, D}, DType::f32, dev(), 74), wl = make_input({B, H, T}, DType::f32, dev(), 75);
  ops::AttentionOptions opt;
  opt.softcap = 3.0f;
  opt.q_offset = -1;  // query 0 sees no key
  auto loss = [&](const V& in) {
    auto [o, lse] = ops::flash_attention(in[0], in[1], in[2], opt);
    Tensor seen = ops::greater_equal(lse.detach(), Tensor::full({}, -1e30f, DType::f32, dev()));
    Tensor safe_lse = ops::where(seen, lse, Tensor::zeros({}, DType::f32, dev()));  // -inf rows: no gradient
    return V{ops::add(ops::sum_all(ops::mul(o, wo)), ops::sum_all(ops::mul(safe_lse, wl)))};
  };
  V grads = value_and_grad(loss)({q, k, v}).second;
  auto value = [&](const V& in) { return double(loss(in)[0].item()); };
  std::vector<Tensor> xs{q, k, v};
  const double h = 1e-2;
  for (size_t a = 0; a < 3; ++a) {
    std::vector<float> base = xs[a].to_floats(), g = grads[a].to_floats();
    for (size_t i = 0; i < base.size(); i += 7) {
      auto shifted = [&](float delta) {
        std::vector<float> x = base;
        x[i] += delta;
        V in = xs;
        in[a] = Tensor::from_floats(x, xs[a].shape(), DType::f32, dev());
        return value(in);
      };
      double fd = (shifted(float(h)) - shifted(float(-h))) / (2 * h);
      EXPECT_NEAR(g[i], fd, 2e-3 * (1 + std::abs(fd))) << "input " << a << " element " << i;
    }
  }
  // jvp: <J t, u> against the vjp's <t, Jᵀ u>.
  Tensor tq = make_input(q.shape(), DType::f32, dev(), 76), tk = make_input(k.shape(), DType::f32, dev(), 77);
  Tensor tv = make_input(v.shape(), DType::f32, dev(), 78);
  auto [prim, tang] = jvp(loss, {q, k, v}, {tq, tk, tv});
  double jv = tang[0].item();
  double vj = 0;
  V ts{tq, tk, tv};
  for (size_t a = 0; a < 3; ++a) vj += ops::sum_all(ops::mul(grads[a], ts[a])).item();
  EXPECT_NEAR(jv, vj, 1e-4 * (1 + std::abs(vj)));
}

// No keys at all (S = 0): every row sees nothing, so O is 0, LSE -inf and dQ 0.
TEST_P(OpTest, FlashAttentionWithoutKeys) {
  Tensor q = make_input({1, 3, 2, 8}, DType::f32, dev(), 81);
  Tensor kv = Tensor::zeros({1, 0, 1, 8}, DType::f32, dev());
  auto [o, lse] = ops::flash_attention(q, kv, kv, {});
  for (double x : o.to_doubles()) EXPECT_EQ(x, 0.0);
  for (double x : lse.to_doubles()) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
  V g = value_and_grad([&](const V& in) { return V{ops::sum_all(ops::flash_attention(in[0], kv, kv, {}).first)}; })({q}).second;
  for (double x : g[0].to_doubles()) EXPECT_EQ(x, 0.0);
}

TEST_P(OpTest, FlashAttentionErrors) {
  Tensor q = Tensor::zeros({1, 3, 4, 8}, DType::f32, dev()), k = Tensor::zeros({1, 3, 3, 8}, DType::f32, dev());
  EXPECT_THROW(ops::flash_attention(q, k, k, {}), ShapeError);  // 4 heads, 3 kv heads
  if (!dev().is_cpu()) {  // the Vulkan kernels stop at head dim 256
    Tensor big = Tensor::zeros({1, 2, 1, 260}, DType::f32, dev());
    EXPECT_THROW(ops::flash_attention(big, big, big, {}), ShapeError);
  }
}

}  // namespace
}  // namespace lmtune::test
