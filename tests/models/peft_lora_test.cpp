// LoRA on the newer architectures against PEFT itself: scripts/reference_peft_lora.py (transformers 5.17 and peft
// 0.21, float64 on the CPU) attached a random adapter to a model fixture and wrote it with the logits, the loss and
// every factor's gradient (tests/models/fixtures/<case>/). lmtune loads the adapter, computes the same logits and
// loss, and its gradients, written out in PEFT's layout, give PEFT's keys and values: the same gradients mean the
// same optimizer step.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <set>

#include "core/autodiff.h"
#include "core/ops.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/decoder.h"
#include "models/moe.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::Reference;
using test::rel_err;

struct PeftCase {
  std::string adapter, model;
  double grad_tolerance = 1e-4;    // relative to each factor's largest gradient
  double logits_tolerance = 1e-5;  // relative to the largest logit
};
void PrintTo(const PeftCase& c, std::ostream* os) { *os << c.adapter; }

// qwen3_moe: q, v and both stacked expert weights; gemma4_text: q, o, up, down (shared key/value layers, per-layer
// inputs, double-wide MLPs); gemma4_moe: q, o, the dense down_proj and the experts beside it (layers.N.experts);
// qwen3_next: gated attention's q and o, the Gated DeltaNet projections, the shared expert's gate and the experts'
// down_proj (peft's target_parameters "down_proj"); qwen3_5_moe: Qwen3.5's separate DeltaNet projections and
// attention; mixtral (stored in the per-expert layout): q, k, v, o.
const PeftCase kCases[] = {{"qwen3_moe_expert_lora", "qwen3_moe"},
                           {"gemma4_text_lora", "gemma4_text"},
                           {"gemma4_moe_lora", "gemma4_moe"},
                           // f32 sums through the chunked delta rule: within ~1e-5 of the recurrent form
                           {"qwen3_next_lora", "qwen3_next", 2e-4, 5e-5},
                           {"qwen3_5_moe_lora", "qwen3_5_moe", 2e-4, 5e-5},
                           {"mixtral_lora", "mixtral"}};

using Param = std::tuple<PeftCase, std::string>;

class PeftLora : public ::testing::TestWithParam<Param> {};

TEST_P(PeftLora, LogitsLossAndGradientsMatchPeft) {
  const PeftCase& c = std::get<0>(GetParam());
  const Device device = parse_device(std::get<1>(GetParam()));
  Reference ref(c.adapter), base(c.model);
  Decoder model = load_decoder(fixture_dir(c.model), DType::f32, DType::f32, device);
  const PeftAdapter adapter = load_peft_adapter(fixture_dir(c.adapter));
  attach_peft(model.weights(), adapter, "default", 1.0f, /*trainable=*/true);

  // The fixture's two rows of ids, each one document from position 0 (as the reference ran them).
  const Tensor ids = base.int_tensor("ids", device);
  const Tensor out = model.forward(ids, default_positions(ids.dim(0), ids.dim(1), device), ForwardOptions{});
  const Tensor loss = mean_cross_entropy(out, base.int_tensor("targets", device));
  EXPECT_LT(rel_err(out.to_floats(), ref.floats("logits")), c.logits_tolerance);
  EXPECT_NEAR(loss.item(), ref.floats("loss")[0], 1e-5 * std::fabs(ref.floats("loss")[0]));
  backward(loss);

  // Every factor replaced by its gradient, then written out as PEFT writes factors: the keys and layouts are
  // PEFT's own from the reference, so this checks the gradients and the conversion to PEFT's layout together.
  DecoderWeights& w = model.weights();
  for (const NamedLinear& nl : named_linears(w))
    for (LoraAdapter& a : nl.linear->adapters) a.A = a.A.grad(), a.B = a.B.grad();
  for (const NamedExperts& ne : named_experts(w))
    for (ExpertAdapter& a : *ne.adapters) a.A = a.A.grad(), a.B = a.B.grad();
  const PeftAdapter grads = extract_peft(w, "default", adapter.rank, adapter.alpha, false, 0, "");
  std::set<std::string> got, want;
  for (const auto& [module, lw] : grads.modules) got.insert(module);
  for (const auto& [module, lw] : adapter.modules) want.insert(module);
  EXPECT_EQ(got, want);
  for (const auto& [module, lw] : grads.modules) {
    const std::string key = "grad.base_model.model." + module;
    EXPECT_LT(rel_err(lw.a, ref.floats(key + ".lora_A.weight")), c.grad_tolerance) << module;
    EXPECT_LT(rel_err(lw.b, ref.floats(key + ".lora_B.weight")), c.grad_tolerance) << module;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftLora,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::ValuesIn(test::test_devices())),
                         [](const auto& info) {
                           const std::string dev = std::get<1>(info.param);
                           return std::get<0>(info.param).adapter + "_" + (dev == "cpu" ? "cpu" : "vulkan");
                         });

}  // namespace
}  // namespace lmtune::models
