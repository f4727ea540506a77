// LoRA on the experts of a mixture of experts (lora.targets: experts; PEFT's target_parameters):
// scripts/reference_peft_lora.py (transformers 5.17 and peft 0.21) attached an adapter on q_proj, v_proj and both
// stacked expert weights of the qwen3_moe fixture, with random A and B (tests/models/fixtures/qwen3_moe_expert_lora;
// its logits, loss and gradients are checked in peft_lora_test.cpp). Here: PEFT export gives back PEFT's keys and
// layout, the merged weights give the adapted model's logits, and a fresh adapter changes nothing until B moves.
#include <gtest/gtest.h>

#include <numeric>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/decoder.h"
#include "models/memory.h"
#include "models/moe.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::Reference;
using test::rel_err;

const char* kAdapter = "qwen3_moe_expert_lora";

class ExpertLora : public ::testing::TestWithParam<std::string> {
 protected:
  Device device() const { return parse_device(GetParam()); }
  Decoder adapted(bool trainable = false) const {
    Decoder model = load_decoder(fixture_dir("qwen3_moe"), DType::f32, DType::f32, device());
    attach_peft(model.weights(), load_peft_adapter(fixture_dir(kAdapter)), "default", 1.0f, trainable);
    return model;
  }
  // The fixture's two rows of ids, each one document from position 0 (as the reference ran them).
  Tensor logits(const Decoder& model) const {
    Reference base("qwen3_moe");
    const Tensor ids = base.int_tensor("ids", device());
    const int64_t B = ids.dim(0), T = ids.dim(1);
    std::vector<int32_t> pos(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = int32_t(i % T);
    return model.forward(ids, Tensor::from_ints(pos, {B, T}, device()), ForwardOptions{});
  }
};

TEST_P(ExpertLora, PeftExportGivesBackPeftsKeysAndLayout) {
  Decoder model = adapted();
  const PeftAdapter in = load_peft_adapter(fixture_dir(kAdapter));
  const PeftAdapter out = extract_peft(model.weights(), "default", in.rank, in.alpha, false, 0, "");
  EXPECT_EQ(out.target_parameters, (std::vector<std::string>{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  ASSERT_EQ(out.modules.size(), in.modules.size());
  for (const auto& [module, lw] : in.modules) {
    ASSERT_TRUE(out.modules.count(module)) << module;
    EXPECT_EQ(out.modules.at(module).a, lw.a) << module;
    EXPECT_EQ(out.modules.at(module).b, lw.b) << module;
    EXPECT_EQ(out.modules.at(module).b_shape, lw.b_shape) << module;
  }
}

TEST_P(ExpertLora, MergedWeightsGiveTheAdaptedModel) {
  NoGrad no_grad;
  Decoder model = adapted();
  const std::vector<float> want = logits(model).to_floats();
  for (Linear* lin : model.weights().linears()) {
    if (lin->adapters.empty()) continue;
    lin->weight = lin->merged_weight();
    lin->adapters.clear();
  }
  for (const NamedExperts& ne : named_experts(model.weights())) {
    *ne.weight = merged_expert_weight(*ne.weight, *ne.adapters);
    ne.adapters->clear();
  }
  EXPECT_LT(rel_err(logits(model).to_floats(), want), 1e-5);
}

TEST_P(ExpertLora, FreshAdapterChangesNothingAndTrainsBothFactors) {
  Decoder model = load_decoder(fixture_dir("qwen3_moe"), DType::f32, DType::f32, device());
  const std::vector<float> before = logits(model).to_floats();
  const std::vector<Tensor> params = add_lora(model.weights(), {"experts"}, 4, 2.0f, 7);
  ASSERT_EQ(params.size(), size_t(8));  // A and B of gate_up_proj and down_proj in layers 0 and 2
  EXPECT_EQ(params[0].shape(), (Shape{8, 4, 32}));  // [E, R, in] of gate_up_proj
  EXPECT_EQ(params[3].shape(), (Shape{8, 32, 4}));  // [E, out, R] of down_proj
  EXPECT_EQ(model.weights().trainable().size(), params.size());
  const Tensor out = logits(model);
  EXPECT_EQ(out.to_floats(), before);
  backward(ops::sum_all(ops::mul(out, out)));
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    ASSERT_TRUE(g.defined()) << i;
    const std::vector<float> v = g.to_floats();
    const double norm = std::inner_product(v.begin(), v.end(), v.begin(), 0.0);
    // B = 0: A's gradient is zero, B's is not (as for any fresh LoRA factor pair).
    if (i % 2 == 0) EXPECT_EQ(norm, 0.0) << i;
    else EXPECT_GT(norm, 0.0) << i;
  }
}

// Serving batches requests with different adapters: the experts' adapter reaches only its own batch rows.
TEST_P(ExpertLora, RowAdaptersReachOnlyTheirRows) {
  NoGrad no_grad;
  Decoder model = adapted();
  const std::vector<float> with = logits(model).to_floats();
  Decoder base = load_decoder(fixture_dir("qwen3_moe"), DType::f32, DType::f32, device());
  const std::vector<float> without = logits(base).to_floats();
  RowAdapters rows;
  rows.groups.push_back({"default", 1, 2});  // row 1 only
  Reference ref("qwen3_moe");
  const Tensor ids = ref.int_tensor("ids", device());
  const int64_t B = ids.dim(0), T = ids.dim(1);
  std::vector<int32_t> pos(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = int32_t(i % T);
  ForwardOptions opt;
  opt.row_adapters = &rows;
  const std::vector<float> mixed = model.forward(ids, Tensor::from_ints(pos, {B, T}, device()), opt).to_floats();
  const size_t half = mixed.size() / 2;
  auto part = [&](const std::vector<float>& v, size_t from) {
    return std::vector<float>(v.begin() + int64_t(from), v.begin() + int64_t(from + half));
  };
  EXPECT_LT(rel_err(part(mixed, 0), part(without, 0)), 1e-6);
  // The attention adapters of a mixed batch take each row's factors by id (Linear::by_row_ids): f32 sums in
  // another order than the whole batch's fused product.
  EXPECT_LT(rel_err(part(mixed, half), part(with, half)), 1e-5);
  EXPECT_GT(rel_err(part(with, 0), part(without, 0)), 1e-3);  // the adapter does change row 0 when it applies
}

INSTANTIATE_TEST_SUITE_P(Devices, ExpertLora, ::testing::ValuesIn(test::test_devices()),
                         [](const auto& info) { return info.param == "cpu" ? std::string("cpu") : "vulkan"; });

// The training-memory estimate counts the experts' adapters exactly as add_lora makes them.
TEST(ExpertLoraTargets, MemoryEstimateCountsTheExpertAdapters) {
  Decoder model = load_decoder(fixture_dir("qwen3_moe"), DType::f32, DType::f32, Device::cpu());
  int64_t made = 0;
  for (const Tensor& t : add_lora(model.weights(), {"experts"}, 4, 2.0f, 1)) made += t.numel();
  TrainingMemoryOptions o;
  o.rank = 4;
  const int64_t without = estimate_training_memory(model.config(), o).lora_param_count;
  o.expert_lora = true;
  EXPECT_EQ(estimate_training_memory(model.config(), o).lora_param_count - without, made);
}

TEST(ExpertLoraTargets, ModelWithoutExpertsRefusesThem) {
  Decoder model = load_decoder(fixture_dir("llama"), DType::f32, DType::f32, Device::cpu());
  try {
    add_lora(model.weights(), {"q_proj", "experts"}, 4, 2.0f, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no mixture-of-experts layer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmtune::models

namespace lmtune::models {
namespace {

// peft 0.21 under transformers 5 reads gate_proj / up_proj / down_proj as the experts' fused weights on the Qwen MoE
// and Mixtral types (checked on the GPU machine: even "model.layers.2.mlp.down_proj" becomes the experts'
// target_parameters "down_proj"), so an adapter on a shared expert's or a dense layer's MLP does not load there:
// the export names those modules, and only on those types.
TEST(PeftExport, NamesTheMlpModulesPeftSkipsOnFusedExpertTypes) {
  Decoder model = load_decoder(test::fixture_dir("qwen3_next"), DType::f32, DType::f32, Device::cpu());
  add_lora(model.weights(), {"q_proj", "in_proj_qkvz", "down_proj"}, 4, 2.0f, 7);
  const PeftAdapter p = extract_peft(model.weights(), "default", 4, 8, false, 0, "");
  const std::vector<std::string> skipped = modules_peft_skips("qwen3_next", p);
  // The shared experts' down_proj of layers 0, 1, 3 and the dense layer 2's.
  EXPECT_EQ(skipped, (std::vector<std::string>{"model.layers.0.mlp.shared_expert.down_proj",
                                               "model.layers.1.mlp.shared_expert.down_proj",
                                               "model.layers.2.mlp.down_proj",
                                               "model.layers.3.mlp.shared_expert.down_proj"}));
  EXPECT_TRUE(modules_peft_skips("qwen3_5_moe_text", p).empty());
  EXPECT_TRUE(modules_peft_skips("llama", p).empty());
}

}  // namespace
}  // namespace lmtune::models
