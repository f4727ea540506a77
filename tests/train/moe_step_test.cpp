// The training step of a mixture of experts adds coef x the router's load-balancing loss, averaged over the
// micro-batches, to the token-mean cross-entropy: one SGD step on the router equals the step computed by hand from
// the two gradients, and the loss is logged as router_aux_loss. The coefficient's default follows transformers.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/autodiff.h"
#include "core/ops.h"
#include "io/safetensors.h"
#include "models/moe.h"
#include "models/weights.h"
#include "train/optimizer.h"
#include "train/recipe.h"
#include "train/train_step.h"

namespace lmtune {
namespace {

namespace fs = std::filesystem;

fs::path fixture() { return fs::path(LMTUNE_SOURCE_DIR) / "tests" / "models" / "fixtures" / "qwen3_moe"; }

// The fixture's reference batch (B = 2, T = 11, row 1 packing three documents), split into its two rows.
std::vector<Batch> rows() {
  SafetensorsFile ref(fixture() / "reference.safetensors");
  auto ints = [&](const char* n) {
    const SafetensorsTensor& t = ref.at(n);
    std::vector<int32_t> v(size_t(t.numel()));
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  };
  const std::vector<int32_t> ids = ints("ids"), pos = ints("positions"), docs = ints("doc_ids"), tg = ints("targets");
  std::vector<Batch> out(2);
  for (int b = 0; b < 2; ++b) {
    Batch& m = out[size_t(b)];
    m.B = 1;
    m.T = 11;
    m.ids.assign(ids.begin() + b * 11, ids.begin() + (b + 1) * 11);
    m.positions.assign(pos.begin() + b * 11, pos.begin() + (b + 1) * 11);
    m.doc_ids.assign(docs.begin() + b * 11, docs.begin() + (b + 1) * 11);
    m.targets.assign(tg.begin() + b * 11, tg.begin() + (b + 1) * 11);
    for (int32_t t : m.targets) m.trainable_tokens += t != -100;
  }
  return out;
}

TEST(MoeTrainStep, RouterAuxLossJoinsTheObjective) {
  const double coef = 0.5, lr = 0.1;
  const std::vector<Batch> micro = rows();
  const int64_t tokens = micro[0].trainable_tokens + micro[1].trainable_tokens;
  auto load = [] {
    models::Decoder m = models::load_decoder(fixture(), DType::f32, DType::f32, Device::cpu());
    m.weights().layers[0].moe.router.set_requires_grad(true);
    return m;
  };
  // By hand: d/dW [Σ CE / tokens + coef · mean over micro-batches of aux].
  models::Decoder a = load();
  const int64_t k = a.config().experts_per_token;
  Tensor& wa = a.weights().layers[0].moe.router;
  double aux_mean = 0;
  for (const Batch& b : micro) {
    std::vector<Tensor> logits;
    Tensor ce = batch_loss_sum(a, b, false, 0, &logits);
    Tensor aux = models::router_aux_loss(logits, k);
    aux_mean += aux.item() / 2;
    backward(ops::add(ops::scale(ce, float(1.0 / double(tokens))), ops::scale(aux, float(coef / 2))));
  }
  std::vector<float> want = wa.to_floats(), g = wa.grad().to_floats();
  for (size_t i = 0; i < want.size(); ++i) want[i] -= float(lr) * g[i];

  models::Decoder b = load();
  Recipe::Optimizer sgd;
  sgd.name = OptimizerName::sgd;
  Optimizer opt({{"router", b.weights().layers[0].moe.router}}, sgd);
  LossScaler scaler;
  StepOptions so;
  so.lr = lr;
  so.router_aux_loss_coef = coef;
  StepResult r = train_step(b, opt, scaler, micro, so);
  ASSERT_TRUE(r.applied) << r.skip_reason;
  std::vector<float> got = b.weights().layers[0].moe.router.to_floats();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  ASSERT_EQ(r.metrics.size(), 1u);
  EXPECT_EQ(r.metrics[0].first, "router_aux_loss");
  EXPECT_NEAR(r.metrics[0].second, aux_mean, 1e-6);
}

TEST(MoeTrainStep, CoefficientDefaultsAsTransformersTrains) {
  ModelConfig c = load_model_config(fixture());  // router_aux_loss_coef 0.001, output_router_logits unset
  Recipe r;
  EXPECT_EQ(router_aux_loss_coef(r, c), 0.0);
  c.output_router_logits = true;
  EXPECT_DOUBLE_EQ(router_aux_loss_coef(r, c), 0.001);
  r.train.router_aux_loss_coef = 0.25;
  EXPECT_DOUBLE_EQ(router_aux_loss_coef(r, c), 0.25);
  c.num_experts = 0;  // a dense model has no router
  EXPECT_EQ(router_aux_loss_coef(r, c), 0.0);
}

}  // namespace
}  // namespace lmtune
