// The preference objectives (DPO, SimPO, ORPO) against an independent float64 PyTorch reference: for a fixed
// batch of 3 pairs on the Llama fixture with a LoRA adapter whose B is non-zero (so the policy differs from the
// adapter-off DPO reference), scripts/reference_preference.py wrote the losses, rewards and adapter gradients into
// tests/train/fixtures/preference/. lmtune packs the pairs into shared rows and must match on the CPU and on
// Vulkan, as one micro-batch and through the training step with the pairs split over two micro-batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/vulkan/vulkan_backend.h"
#include "core/autodiff.h"
#include "core/ops.h"
#include "io/safetensors.h"
#include "train/model_setup.h"
#include "train/preference.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

const fs::path kFixture = source_path("tests/train/fixtures/preference");

// The fixture's pairs as a PreferenceDataset: sequence 2p chosen, 2p + 1 rejected; responses after the prompt.
PreferenceDataset fixture_pairs() {
  SafetensorsFile f(kFixture / "pairs.safetensors");
  const SafetensorsTensor& ids = f.at("ids");
  const int64_t n = ids.shape[0], width = ids.shape[1];
  std::vector<int32_t> all(static_cast<size_t>(ids.numel()));
  std::vector<int32_t> prompt(static_cast<size_t>(n)), length(static_cast<size_t>(n));
  std::memcpy(all.data(), ids.data.data(), all.size() * 4);
  std::memcpy(prompt.data(), f.at("prompt_len").data.data(), prompt.size() * 4);
  std::memcpy(length.data(), f.at("length").data.data(), length.size() * 4);
  PreferenceDataset ds;
  for (int64_t p = 0; 2 * p < n; ++p) {
    PreferencePair pair;
    for (int64_t k : {2 * p, 2 * p + 1}) {
      Sample& s = k % 2 == 0 ? pair.chosen : pair.rejected;
      s.ids.assign(all.begin() + k * width, all.begin() + k * width + length[size_t(k)]);
      s.trainable.assign(s.ids.size(), 0);
      for (size_t i = size_t(prompt[size_t(k)]); i < s.ids.size(); ++i) s.trainable[i] = 1;
    }
    ds.pairs.push_back(std::move(pair));
  }
  return ds;
}

PreferenceSettings settings_for(const SafetensorsFile& expected, const std::string& name) {
  const std::vector<float> s = expected.at("settings." + name).to_f32();
  const Objective o = name == "dpo" ? Objective::dpo : name == "simpo" ? Objective::simpo : Objective::orpo;
  return {o, s[0], s[1], s[2]};
}

Recipe fixture_recipe(double lr = 0.1) {
  return parse_recipe("model: " + source_path("tests/models/fixtures/llama").string() +
                          "\ndata: {train: unused.jsonl}\n",
                      "preference.yaml",
                      {"precision=fp32", "lora.init_from=" + (kFixture / "adapter").string(), "lora.rank=4",
                       "lora.alpha=8", "lora.dropout=0", "optimizer.name=sgd", "optimizer.lr=" + std::to_string(lr),
                       "train.grad_clip=0"});
}

double max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, double(std::fabs(got[i] - want[i])));
    scale = std::max(scale, double(std::fabs(want[i])));
  }
  return err / scale;
}

class PreferenceReference : public ::testing::TestWithParam<std::string> {
 protected:
  Device device() const { return GetParam() == "cpu" ? Device::cpu() : Device::vulkan(0); }
  void SetUp() override {
    if (GetParam() == "vulkan" && vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  }
};

}  // namespace

TEST_P(PreferenceReference, LossesRewardsAndGradientsMatchPyTorch) {
  SafetensorsFile expected(kFixture / "expected.safetensors");
  const PreferenceDataset data = fixture_pairs();
  TrainableModel tm = build_trainable_model(fixture_recipe(), device());
  ASSERT_EQ(tm.params.size(), 8u);  // q_proj and v_proj of 2 layers, A and B each
  // Packed: the six sequences share rows of 16, so the per-sequence sums must keep them apart.
  PairBatcher batcher(data, 3, 16, true, 0, false);
  const PairBatch pb = batcher.next();
  ASSERT_EQ(pb.pairs, 3);
  ASSERT_LT(pb.batch.B, 6);
  {
    NoGrad no_grad;
    EXPECT_LT(max_rel_err(sequence_logps(*tm.decoder, pb, false, 0, true).to_floats(),
                          expected.at("ref_logps").to_f32()), 1e-5);
    EXPECT_LT(max_rel_err(sequence_logps(*tm.decoder, pb).to_floats(), expected.at("logps").to_f32()), 1e-5);
  }
  for (const std::string name : {"dpo", "simpo", "orpo"}) {
    SCOPED_TRACE(name);
    const PreferenceSettings s = settings_for(expected, name);
    PreferenceTerms t = batch_preference_terms(*tm.decoder, pb, s);
    Tensor loss = ops::scale(t.pair_loss, 1.0f / 3);
    if (t.nll.defined()) loss = ops::add(loss, ops::scale(t.nll, 1.0f / float(t.chosen_tokens)));
    EXPECT_EQ(t.nll.defined(), name == "orpo");
    const double want = expected.at(name + ".loss").to_f32()[0];
    EXPECT_NEAR(loss.item(), want, 1e-5 * std::fabs(want));
    EXPECT_LT(max_rel_err(t.chosen_reward.to_floats(), expected.at(name + ".chosen_reward").to_f32()), 1e-5);
    EXPECT_LT(max_rel_err(t.rejected_reward.to_floats(), expected.at(name + ".rejected_reward").to_f32()), 1e-5);
    backward(loss);
    for (NamedParam& p : tm.params) {
      const std::vector<float> want_grad = expected.at(name + ".grad." + p.name).to_f32();
      ASSERT_TRUE(p.tensor.grad().defined()) << p.name;
      EXPECT_LT(max_rel_err(p.tensor.grad().to_floats(), want_grad), 2e-4) << p.name;
      p.tensor.zero_grad();
    }
  }
}

// preference_train_step over two micro-batches (2 pairs, then 1, unpacked, with gradient checkpointing) takes the
// same SGD step as the reference's gradient of the mean over all 3 pairs (ORPO: its NLL over all chosen tokens of
// the step).
TEST_P(PreferenceReference, AccumulatedStepMatchesOneBatchGradient) {
  SafetensorsFile expected(kFixture / "expected.safetensors");
  const PreferenceDataset data = fixture_pairs();
  const double lr = 0.1;
  for (const std::string name : {"dpo", "simpo", "orpo"}) {
    SCOPED_TRACE(name);
    Recipe r = fixture_recipe(lr);
    TrainableModel tm = build_trainable_model(r, device());
    std::vector<std::vector<float>> before;
    for (const NamedParam& p : tm.params) before.push_back(p.tensor.to_floats());
    Optimizer opt(tm.params, r.optimizer);
    LossScaler scaler;
    PairBatcher batcher(data, 2, 16, false, 0, false);
    std::vector<PairBatch> micro{batcher.next(), batcher.next()};
    ASSERT_EQ(micro[0].pairs + micro[1].pairs, 3);
    StepOptions so;
    so.lr = lr;
    so.checkpoint_layers = true;  // the policy's layers recompute in backward, as with train.grad_checkpointing
    StepResult res = preference_train_step(*tm.decoder, opt, scaler, micro, so, settings_for(expected, name));
    ASSERT_TRUE(res.applied) << res.skip_reason;
    const double want = expected.at(name + ".loss").to_f32()[0];
    EXPECT_NEAR(res.loss, want, 1e-5 * std::fabs(want));
    ASSERT_EQ(res.metrics.size(), 4u);
    EXPECT_EQ(res.metrics[1].first, "accuracy");
    for (size_t i = 0; i < tm.params.size(); ++i) {
      const std::vector<float> g = expected.at(name + ".grad." + tm.params[i].name).to_f32();
      std::vector<float> want_new(g.size());
      for (size_t j = 0; j < g.size(); ++j) want_new[j] = float(before[i][j] - lr * g[j]);
      EXPECT_LT(max_rel_err(tm.params[i].tensor.to_floats(), want_new), 1e-5) << tm.params[i].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, PreferenceReference, ::testing::Values("cpu", "vulkan"));

// log σ is computed by logsumexp: margins far beyond float's exp range give the exact losses (0 and |z|) and
// finite gradients, where log(sigmoid(z)) would give -inf.
TEST(PreferenceTerms, ExtremeMarginsStayFinite) {
  PairBatch pb;
  pb.pairs = 2;
  pb.response_tokens = {1, 1, 1, 1};
  Tensor logps = Tensor::from_floats({0, -1000, -1000, 0}, {4});
  logps.set_requires_grad(true);
  Tensor reference = Tensor::zeros({4});
  PreferenceTerms t = preference_terms(logps, reference, pb, {Objective::dpo, 1.0, 0.0, 0.0});
  EXPECT_NEAR(t.pair_loss.item(), 1000.0, 1e-3);  // pair 0: z = 1000, loss 0; pair 1: z = -1000, loss 1000
  backward(t.pair_loss);
  const std::vector<float> g = logps.grad().to_floats();
  const std::vector<float> want{0, 0, -1, 1};  // d/dlogp of -log σ(lc - lr): -(1 - σ(z)) for c, +(1 - σ(z)) for r
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(g[i], want[i], 1e-6) << i;
}
