// One LoRA SGD step (with gradient clipping that bites) from a given adapter on a given packed batch equals the
// update of an independent float64 PyTorch model: scripts/reference_sgd_step.py wrote the adapter and the
// expected loss, gradient norm and updated weights into tests/train/fixtures/sgd_step/ (the llama fixture) and
// sgd_step_qwen3_moe/ (a mixture of experts: attention adapters on every layer, down_proj on its dense layer), and
// sgd_step_qwen3_next/ (Gated DeltaNet layers' projections among the adapted ones).
#include <gtest/gtest.h>

#include <cmath>

#include "io/safetensors.h"
#include "train/model_setup.h"
#include "train/train_step.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

std::vector<int32_t> ints(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsTensor& t = f.at(name);
  std::vector<int32_t> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data.data(), v.size() * 4);
  return v;
}

}  // namespace

struct StepCase {
  std::string model, fixture;
  size_t params;             // adapter tensors
  double tolerance = 2e-6;   // of the updated factors, relative to each tensor's largest entry
};

class ReferenceStep : public ::testing::TestWithParam<StepCase> {};

TEST_P(ReferenceStep, LoraSgdStepMatchesPyTorch) {
  const fs::path fixture = source_path("tests/train/fixtures/" + GetParam().fixture);
  const fs::path model = source_path("tests/models/fixtures/" + GetParam().model);
  SafetensorsFile expected(fixture / "expected.safetensors");
  SafetensorsFile batch_ref(model / "reference.safetensors");
  const double max_norm = expected.at("max_norm").to_f32()[0], lr = expected.at("lr").to_f32()[0];

  Recipe r = parse_recipe("model: " + model.string() +
                              "\ndata: {train: unused.jsonl}\n",
                          "reference.yaml",
                          {"precision=fp32", "lora.init_from=" + (fixture / "adapter").string(), "lora.rank=4",
                           "lora.alpha=8", "lora.dropout=0", "optimizer.name=sgd", "optimizer.lr=" + std::to_string(lr),
                           "train.grad_clip=" + std::to_string(max_norm)});
  TrainableModel tm = build_trainable_model(r, Device::cpu());
  ASSERT_EQ(tm.params.size(), GetParam().params);

  Batch b;
  b.B = 2;
  b.T = 11;
  b.ids = ints(batch_ref, "ids");
  b.positions = ints(batch_ref, "positions");
  b.doc_ids = ints(batch_ref, "doc_ids");
  b.targets = ints(batch_ref, "targets");
  for (int32_t t : b.targets) b.trainable_tokens += t != -100;

  Optimizer opt(tm.params, r.optimizer);
  LossScaler scaler;
  StepOptions so;
  so.lr = lr;
  so.grad_clip = r.train.grad_clip;
  StepResult res = train_step(*tm.decoder, opt, scaler, {b}, so);
  ASSERT_TRUE(res.applied);
  const double want_loss = expected.at("loss").to_f32()[0], want_norm = expected.at("grad_norm").to_f32()[0];
  EXPECT_NEAR(res.loss, want_loss, 1e-5 * want_loss);
  EXPECT_NEAR(res.grad_norm, want_norm, 1e-5 * want_norm);
  for (const NamedParam& p : tm.params) {
    std::vector<float> got = p.tensor.to_floats(), want = expected.at("new." + p.name).to_f32();
    ASSERT_EQ(got.size(), want.size()) << p.name;
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    EXPECT_LT(err, GetParam().tolerance * scale) << p.name;
  }
}

// llama: q_proj and v_proj of 2 layers; qwen3_moe: q_proj and v_proj of 3 layers and layer 1's down_proj;
// qwen3_next: q_proj of its 2 attention layers, in_proj_qkvz and out_proj of its 2 Gated DeltaNet layers and
// layer 2's down_proj (A and B).
INSTANTIATE_TEST_SUITE_P(Models, ReferenceStep,
                         ::testing::Values(StepCase{"llama", "sgd_step", 8},
                                           StepCase{"qwen3_moe", "sgd_step_qwen3_moe", 14},
                                           // f32 gradients through the chunked delta rule: within ~1e-5
                                           StepCase{"qwen3_next", "sgd_step_qwen3_next", 14, 2e-5}),
                         [](const auto& info) { return info.param.model; });
