// KV-cache decoding (greedy decode with the cache == full recompute, including bounded sliding-window layers
// and multi-token chunks) and LoRA adapters (zero-initialised B changes nothing, the adapter equals a merged
// weight, gradients reach A and B only).
#include <gtest/gtest.h>

#include <functional>

#include "backend/vulkan/context.h"
#include "common/dispatch_count.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::rel_err;

std::vector<float> last_row(const Tensor& logits) {
  const int64_t T = logits.dim(1);
  return ops::contiguous(ops::slice(logits, 1, T - 1, T)).to_floats();
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// Greedy decode with the cache (a prefill in two chunks, then one token per call) against a full recompute of
// the sequence at every step: the same argmax and logits within `tolerance`.
void expect_greedy_decode_matches_recompute(const Decoder& model, Device d, double tolerance) {
  NoGrad no_grad;
  std::vector<int32_t> tokens = {5, 17, 99, 3, 42, 7};  // prompt (longer than the window of 4)
  // Chunk 4: buffers grow several times; bounded sliding layers keep 3 tokens.
  KvCache cache(model.config(), 1, DType::f32, d, /*chunk=*/4, /*bound_sliding=*/true);
  ForwardOptions opt;
  opt.cache = &cache;
  auto positions = [&](int64_t start, int64_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(start + i);
    return Tensor::from_ints(p, {1, n}, d);
  };
  // Prefill in two chunks (the second one attends to cached keys with q_offset > 0 and T > 1).
  model.forward(Tensor::from_ints({tokens.begin(), tokens.begin() + 4}, {1, 4}, d), positions(0, 4), opt);
  Tensor logits =
      model.forward(Tensor::from_ints({tokens.begin() + 4, tokens.end()}, {1, 2}, d), positions(4, 2), opt);
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    const int64_t n = int64_t(tokens.size());
    Tensor full = model.forward(Tensor::from_ints(tokens, {1, n}, d), default_positions(1, n, d));
    std::vector<float> want = last_row(full), got = last_row(logits);
    worst = std::max(worst, rel_err(got, want));
    ASSERT_EQ(argmax(got), argmax(want)) << "step " << step;
    tokens.push_back(argmax(got));
    logits = model.forward(Tensor::from_ints({tokens.back()}, {1, 1}, d), positions(n, 1), opt);
  }
  EXPECT_EQ(cache.length(), int64_t(tokens.size()));
  EXPECT_LT(worst, tolerance);
}

class KvCacheDecode : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(KvCacheDecode, GreedyDecodeMatchesFullRecompute) {
  const auto& [arch, dev] = GetParam();
  const Device d = parse_device(dev);
  Decoder model = load_decoder(fixture_dir(arch), DType::f32, DType::f32, d);
  expect_greedy_decode_matches_recompute(model, d, 1e-5);
}

// Generation with an adapter (Linear::adapted: its delta inside the base product, the f32 factors as stored)
// decodes as a full recompute does, and gives the logits of the recorded training path (lora_linear's f16
// factors under bf16 autocast, the composed delta in f32) on every family: biases, q/k norms, soft-caps, windows.
TEST_P(KvCacheDecode, AdaptedDecodeMatchesRecomputeAndTrainingPath) {
  const auto& [arch, dev] = GetParam();
  const Device d = parse_device(dev);
  for (DType compute : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(compute));
    Decoder model = load_decoder(fixture_dir(arch), DType::f32, compute, d);
    uint64_t seed = 3;
    for (Linear* l : model.weights().linears()) {
      LoraAdapter& ad = l->add_adapter(4, 0.75f, seed++);
      ad.B = Tensor::randn(ad.B.shape(), seed++, 0.2f, DType::f32, d).set_requires_grad(true);
    }
    if (compute == DType::f32) expect_greedy_decode_matches_recompute(model, d, 1e-5);
    Tensor ids = Tensor::from_ints({5, 17, 99, 3, 42, 7, 1, 2}, {2, 4}, d), pos = default_positions(2, 4, d);
    std::vector<float> recorded = model.forward(ids, pos).to_floats(), inference;
    {
      NoGrad no_grad;
      inference = model.forward(ids, pos).to_floats();
    }
    // In bf16 a routed model is compared in f32 only: the two paths round differently (each product agrees to
    // bf16's precision), and with random adapters on every projection a token whose experts nearly tie can take
    // another expert (Qwen3.5-MoE on the H200: 8% apart, every product within 6e-3).
    if (compute == DType::f32 || model.config().num_experts == 0) {
      EXPECT_LT(rel_err(inference, recorded), compute == DType::f32 ? 1e-5 : 3e-2);
    }
  }
}

// Greedy tokens and last-row logits of a cached decode: a prefill of 5 tokens, then `steps` calls of one token.
std::pair<std::vector<int>, std::vector<std::vector<float>>> cached_decode(const Decoder& model, Device d,
                                                                           int steps) {
  NoGrad no_grad;
  KvCache cache(model.config(), 1, DType::f32, d, /*chunk=*/4);
  ForwardOptions opt;
  opt.cache = &cache;
  std::vector<int> tokens = {5, 17, 99, 3, 42};
  std::vector<std::vector<float>> rows;
  Tensor logits = model.forward(Tensor::from_ints(tokens, {1, 5}, d), default_positions(1, 5, d), opt);
  for (int step = 0; step < steps; ++step) {
    rows.push_back(last_row(logits));
    tokens.push_back(argmax(rows.back()));
    const int32_t at = int32_t(tokens.size() - 1);
    logits = model.forward(Tensor::from_ints({tokens.back()}, {1, 1}, d), Tensor::from_ints({at}, {1, 1}, d), opt);
  }
  return {tokens, rows};
}

// fuse_projections (inference: q, k, v and gate, up as one product each, one rope over queries and keys) decodes
// the tokens and logits of the separate products, with and without an adapter on some of the parts (k and up
// without one: their rows of the fused factors are zero), and keeps each weight once (the parts become views).
TEST_P(KvCacheDecode, FusedProjectionsDecodeAsSeparate) {
  const auto& [arch, dev] = GetParam();
  const Device d = parse_device(dev);
  for (bool adapted : {false, true}) {
    SCOPED_TRACE(adapted ? "adapter" : "base");
    Decoder model = load_decoder(fixture_dir(arch), DType::f32, DType::f32, d);
    if (adapted) {
      uint64_t seed = 11;
      for (LayerWeights& l : model.weights().layers)
        for (Linear* lin : {&l.attn.q, &l.attn.v, &l.attn.o, &l.mlp.gate, &l.mlp.down}) {
          if (!lin->weight.defined()) continue;
          LoraAdapter& ad = lin->add_adapter(4, 0.5f, seed++);
          ad.B = Tensor::randn(ad.B.shape(), seed++, 0.2f, DType::f32, d);
        }
    }
    const auto [want_tokens, want_logits] = cached_decode(model, d, 6);
    // Counted where the device has timestamps (none elsewhere).
    const bool counted = d.is_vulkan() && vk::context_for(d).features().timestamps;
    auto dispatches = [&](const char* kernel) {
      return lmtune::test::count_dispatches(vk::context_for(d), kernel, [&] { cached_decode(model, d, 3); });
    };
    lmtune::test::DispatchCount separate, separate_glu;
    if (counted) {
      separate = dispatches("rope");
      separate_glu = dispatches("gated_activation");
    }
    fuse_projections(model.weights());
    // One product for q, k, v, one for gate and up with the activation in its epilogue (where the gemv takes it),
    // and (without q/k norms between) one rope: fewer dispatches per decoded token.
    if (counted) {
      const lmtune::test::DispatchCount fused = dispatches("rope"), fused_glu = dispatches("gated_activation");
      EXPECT_LT(fused.all, separate.all) << fused.report;
      if (!model.config().qk_norm) {
        EXPECT_LT(fused.matching, separate.matching) << fused.report;
      }
      bool dense_mlp = false;  // (Qwen3.5-MoE has experts on every layer: no group of gate and up)
      for (const LayerWeights& l : model.weights().layers) dense_mlp |= l.mlp.gate.weight.defined();
      if (dense_mlp && vk::context_for(d).features().subgroup_arithmetic) {
        EXPECT_LT(fused_glu.matching, separate_glu.matching) << fused_glu.report;
      }
    }
    // The parts become views of their group's weight (on the first layer with attention, with a dense MLP).
    for (const LayerWeights& l : model.weights().layers)
      if (l.attn.q.weight.defined()) {
        ASSERT_TRUE(l.attn.qkv.defined());
        EXPECT_EQ(l.attn.q.weight.buffer(), l.attn.v.weight.buffer());
        break;
      }
    for (const LayerWeights& l : model.weights().layers)
      if (l.mlp.gate.weight.defined()) {
        EXPECT_EQ(l.mlp.gate.weight.buffer(), l.mlp.up.weight.buffer());
        break;
      }
    const auto [tokens, logits] = cached_decode(model, d, 6);
    EXPECT_EQ(tokens, want_tokens);
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_LT(rel_err(logits[i], want_logits[i]), 1e-5) << "step " << i;
  }
}

// The groups' fused adapters follow the parts' adapters: replaced adapters (new tensors) are fused anew, and
// without adapters the groups run the base products.
TEST_P(KvCacheDecode, FusedAdaptersFollowReplacedAdapters) {
  const auto& [arch, dev] = GetParam();
  if (arch != "llama3") GTEST_SKIP() << "one family covers the groups' adapter cache";
  const Device d = parse_device(dev);
  Decoder model = load_decoder(fixture_dir(arch), DType::f32, DType::f32, d);
  auto adapt = [&](uint64_t seed, bool on) {
    for (LayerWeights& l : model.weights().layers)
      for (Linear* lin : {&l.attn.q, &l.attn.v, &l.mlp.gate}) {
        lin->adapters.clear();
        if (!on) continue;
        LoraAdapter& ad = lin->add_adapter(4, 0.5f, seed++);
        ad.B = Tensor::randn(ad.B.shape(), seed++, 0.2f, DType::f32, d);
      }
  };
  auto same = [](const auto& got, const auto& want) {
    EXPECT_EQ(got.first, want.first);
    for (size_t i = 0; i < got.second.size(); ++i) EXPECT_LT(rel_err(got.second[i], want.second[i]), 1e-5);
  };
  const auto base = cached_decode(model, d, 4);
  adapt(11, true);
  const auto first = cached_decode(model, d, 4);
  adapt(31, true);
  const auto second = cached_decode(model, d, 4);
  fuse_projections(model.weights());
  same(cached_decode(model, d, 4), second);
  adapt(11, true);  // the same values as `first`, in new tensors
  same(cached_decode(model, d, 4), first);
  adapt(0, false);
  same(cached_decode(model, d, 4), base);
}

// Gemma's norms multiply by (1 + w) in f32: made once per frozen weight, not per call (a cast and an add per norm,
// six norms per Gemma 3 layer). A second decode runs none of those passes and gives the same tokens and logits;
// a weight that requires grad still gets its shift per call, so its gradient flows.
TEST_P(KvCacheDecode, ShiftedNormWeightsMadeOnce) {
  const auto& [arch, dev] = GetParam();
  if (arch != "gemma2" && arch != "gemma3_text") GTEST_SKIP() << "norms of (1 + w): Gemma";
  const Device d = parse_device(dev);
  Decoder model = load_decoder(fixture_dir(arch), DType::f32, DType::f32, d);
  ASSERT_EQ(model.config().norm_style, NormStyle::one_plus_weight);
  const bool counted = d.is_vulkan() && vk::context_for(d).features().timestamps;
  std::pair<std::vector<int>, std::vector<std::vector<float>>> first, second;
  auto adds = [&](auto& out) {
    return lmtune::test::count_dispatches(vk::context_for(d), "unary", [&] { out = cached_decode(model, d, 3); });
  };
  if (counted) {
    const lmtune::test::DispatchCount a = adds(first), b = adds(second);
    EXPECT_LT(b.matching, a.matching) << b.report;
    EXPECT_LT(b.all, a.all) << b.report;
  } else {
    first = cached_decode(model, d, 3);
    second = cached_decode(model, d, 3);
  }
  EXPECT_EQ(second.first, first.first);
  for (size_t i = 0; i < first.second.size(); ++i) EXPECT_EQ(second.second[i], first.second[i]) << "step " << i;
  // A trained norm weight: its gradient reaches it through the shift.
  Tensor& w = model.weights().layers[0].input_norm;
  w.set_requires_grad(true);
  const Tensor ids = Tensor::from_ints({1, 2, 3}, {1, 3}, d);
  const Tensor loss = ops::sum_all(model.forward(ids, default_positions(1, 3, d), ForwardOptions{}));
  backward(loss);
  ASSERT_TRUE(w.grad().defined());
  double norm = 0;
  for (double g : w.grad().to_doubles()) norm += g * g;
  EXPECT_GT(norm, 0.0);
}

std::vector<std::tuple<std::string, std::string>> decode_cases() {
  std::vector<std::tuple<std::string, std::string>> out;
  for (const std::string& dev : test::test_devices())
    for (const char* a :
         {"llama3", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "llama_yarn", "gemma4_text", "qwen3_next",
          "qwen3_5_moe", "mixtral", "qwen3_moe", "gemma4_moe"})
      out.emplace_back(a, dev);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheDecode, ::testing::ValuesIn(decode_cases()), [](const auto& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
});

TEST(KvCache, RejectsDocIdsAndWrongBatch) {
  Decoder model = load_decoder(fixture_dir("llama"), DType::f32, DType::f32, Device::cpu());
  KvCache cache(model.config(), 2, DType::f32, Device::cpu());
  NoGrad no_grad;
  ForwardOptions opt;
  opt.cache = &cache;
  Tensor ids = Tensor::from_ints({1, 2, 3}, {1, 3}, Device::cpu());
  EXPECT_THROW(model.forward(ids, default_positions(1, 3, Device::cpu()), opt), ShapeError);  // batch 2 cache
  KvCache one(model.config(), 1, DType::f32, Device::cpu());
  opt.cache = &one;
  opt.doc_ids = Tensor::from_ints({0, 0, 1}, {1, 3}, Device::cpu());
  EXPECT_THROW(model.forward(ids, default_positions(1, 3, Device::cpu()), opt), ShapeError);
}

// ---- LoRA ----

Tensor batch_ids() { return Tensor::from_ints({5, 17, 99, 3, 42, 7, 1, 2, 64, 100, 11, 9}, {2, 6}, Device::cpu()); }

TEST(Lora, ZeroBChangesNothingAndAdapterEqualsMergedWeight) {
  Decoder base = load_decoder(fixture_dir("qwen2"), DType::f32, DType::f32, Device::cpu());
  Decoder lora = load_decoder(fixture_dir("qwen2"), DType::f32, DType::f32, Device::cpu());
  NoGrad no_grad;
  Tensor ids = batch_ids(), pos = default_positions(2, 6, Device::cpu());
  std::vector<float> want = base.forward(ids, pos).to_floats();
  uint64_t seed = 1;
  for (Linear* l : lora.weights().linears()) l->add_adapter(2, 0.5f, seed++);
  EXPECT_EQ(rel_err(lora.forward(ids, pos).to_floats(), want), 0.0);

  // Random B: the adapted model equals the base model with merged weights.
  for (Linear* l : lora.weights().linears())
    l->adapters[0].B = Tensor::randn(l->adapters[0].B.shape(), seed++, 0.3f);
  std::vector<Linear*> a = lora.weights().linears(), b = base.weights().linears();
  for (size_t i = 0; i < a.size(); ++i) b[i]->weight = a[i]->merged_weight();
  std::vector<float> adapted = lora.forward(ids, pos).to_floats(), merged = base.forward(ids, pos).to_floats();
  EXPECT_GT(rel_err(adapted, want), 1e-3);  // the adapters do something
  EXPECT_LT(rel_err(adapted, merged), 1e-5);
}

TEST(Lora, GradientsReachAdaptersOnlyAndMatchFiniteDifferences) {
  Decoder model = load_decoder(fixture_dir("gemma2"), DType::f32, DType::f32, Device::cpu());
  uint64_t seed = 1;
  for (Linear* l : model.weights().linears()) {
    LoraAdapter& ad = l->add_adapter(2, 2.0f, seed++);
    ad.B = Tensor::randn(ad.B.shape(), seed++, 0.1f).set_requires_grad(true);
  }
  std::vector<Tensor> params = model.weights().trainable();
  EXPECT_EQ(params.size(), model.weights().linears().size() * 2);  // A and B only: the base stays frozen
  Tensor ids = batch_ids();
  Tensor targets = Tensor::from_ints({17, 99, 3, 42, 7, -100, 2, 64, 100, 11, 9, 1}, {2, 6}, Device::cpu());
  ForwardOptions opt;
  opt.checkpoint_layers = true;  // layer 0 (input from the frozen embedding) must still get its gradients
  Tensor l = loss(model, ids, targets, Tensor(), Tensor(), opt);
  backward(l);
  Linear& q0 = model.weights().layers[0].attn.q;
  Linear& down = model.weights().layers.back().mlp.down;
  EXPECT_FALSE(q0.weight.grad().defined());
  for (Tensor* t : {&q0.adapters[0].A, &down.adapters[0].B}) {
    ASSERT_TRUE(t->grad().defined()) << (t == &q0.adapters[0].A ? "q0.A" : "down.B");
    std::vector<float> g = t->grad().to_floats(), v = t->to_floats();
    NoGrad no_grad;
    for (size_t i : {size_t(0), v.size() / 2}) {
      auto eval = [&](float delta) {
        std::vector<float> w = v;
        w[i] += delta;
        Tensor saved = *t;
        *t = Tensor::from_floats(w, saved.shape());
        double r = loss(model, ids, targets).item();
        *t = saved;
        return r;
      };
      double num = (eval(1e-3f) - eval(-1e-3f)) / 2e-3;
      EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << i;
    }
  }
}

// Every trainable tensor's gradient of the loss, concatenated (each zeroed first).
std::vector<float> trainable_grads(Decoder& model, const Tensor& ids, const Tensor& targets,
                                   const ForwardOptions& opt) {
  for (Tensor& p : model.weights().trainable()) p.zero_grad();
  backward(loss(model, ids, targets, Tensor(), Tensor(), opt));
  std::vector<float> all;
  for (Tensor& p : model.weights().trainable()) {
    std::vector<float> g = p.grad().to_floats();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

// train.checkpoint_layers auto leaves the last layers unchecked: every split gives the gradients of the others.
TEST(Lora, PartlyCheckpointedLayersGiveTheSameGradients) {
  Decoder model = load_decoder(fixture_dir("gemma2"), DType::f32, DType::f32, Device::cpu());
  uint64_t seed = 1;
  for (Linear* l : model.weights().linears()) {
    LoraAdapter& ad = l->add_adapter(2, 2.0f, seed++);
    ad.B = Tensor::randn(ad.B.shape(), seed++, 0.1f).set_requires_grad(true);
  }
  const int64_t layers = int64_t(model.weights().layers.size());
  ASSERT_GE(layers, 2);
  Tensor ids = batch_ids();
  Tensor targets = Tensor::from_ints({17, 99, 3, 42, 7, -100, 2, 64, 100, 11, 9, 1}, {2, 6}, Device::cpu());
  auto grads = [&](bool checkpoint, int64_t unchecked) {
    ForwardOptions opt;
    opt.checkpoint_layers = checkpoint;
    opt.unchecked_layers = unchecked;
    return trainable_grads(model, ids, targets, opt);
  };
  const std::vector<float> want = grads(false, 0);
  EXPECT_LT(rel_err(grads(true, 0), want), 1e-6);
  EXPECT_LT(rel_err(grads(true, 1), want), 1e-6);
  EXPECT_LT(rel_err(grads(true, layers), want), 1e-6);
}

// A checkpointed layer's recomputation ends in the down projection and the residual add, whose results carry only
// cotangents: their kernels are dropped (Primitive::may_defer), and the gradients stay those of layers that keep
// their activations. bf16 activations take LoRA's fused product (ops::lora_linear), as training does.
TEST(Lora, RecomputedLayersDropTheirUnreadProductsAndKeepTheGradients) {
  for (const std::string& dev_name : test::test_devices()) {
    SCOPED_TRACE(dev_name);
    const Device d = parse_device(dev_name);
    Decoder model = load_decoder(fixture_dir("llama"), DType::bf16, DType::bf16, d);
    uint64_t seed = 1;
    for (Linear* l : model.weights().linears()) {
      LoraAdapter& ad = l->add_adapter(8, 2.0f, seed++);
      ad.B = Tensor::randn(ad.B.shape(), seed++, 0.1f, DType::f32, d).set_requires_grad(true);
    }
    const Tensor ids = batch_ids().to(d);
    const Tensor targets = Tensor::from_ints({17, 99, 3, 42, 7, -100, 2, 64, 100, 11, 9, 1}, {2, 6}, d);
    auto grads = [&](bool checkpoint) {
      ForwardOptions opt;
      opt.checkpoint_layers = checkpoint;
      return trainable_grads(model, ids, targets, opt);
    };
    const std::vector<float> want = grads(false);
    const uint64_t before = recomputed_ops_dropped();
    // 4.6e-3: the first pass, recording nothing, takes the inference products, whose bf16 sums round apart.
    EXPECT_LT(rel_err(grads(true), want), 1e-2);
    EXPECT_EQ(recomputed_ops_dropped() - before, 2 * model.weights().layers.size());  // down_proj, the add
  }
}

TEST(Loss, MaskExcludesTargetsLikeIgnoreIndex) {
  Tensor logits = Tensor::randn({2, 3, 5}, 3);
  Tensor targets = Tensor::from_ints({1, 2, 3, 4, 0, 1}, {2, 3}, Device::cpu());
  Tensor mask = Tensor::from_ints({1, 0, 1, 1, 1, 0}, {2, 3}, Device::cpu());
  Tensor ignored = Tensor::from_ints({1, -100, 3, 4, 0, -100}, {2, 3}, Device::cpu());
  EXPECT_FLOAT_EQ(mean_cross_entropy(logits, targets, mask).item(), mean_cross_entropy(logits, ignored).item());
  Tensor none = Tensor::from_ints(std::vector<int32_t>(6, -100), {2, 3}, Device::cpu());
  EXPECT_EQ(mean_cross_entropy(logits, none).item(), 0.0f);
}

}  // namespace
}  // namespace lmtune::models
