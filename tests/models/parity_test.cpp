// Decoder parity against the independent float64 PyTorch reference (scripts/reference_models.py): logits, loss
// and gradients for every architecture, on every available device; a packed batch (documents) and a single
// sequence; gradient checkpointing; bf16 mixed precision.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::Reference;
using test::rel_err;

struct Case {
  std::string arch;
  std::string device;
};

class Parity : public ::testing::TestWithParam<Case> {
 protected:
  Device device() const { return parse_device(GetParam().device); }
  Decoder load(DType weights = DType::f32, DType compute = DType::f32) const {
    return load_decoder(fixture_dir(GetParam().arch), weights, compute, device());
  }
};

// Finds a weight tensor by HF name.
Tensor* slot(Decoder& model, const std::string& name) {
  DecoderWeights& w = model.weights();
  for (const ParamRef& p : parameter_map(model.config(), w))
    if (p.name == name) return p.slot;
  ADD_FAILURE() << "no parameter " << name;
  return nullptr;
}

TEST_P(Parity, LogitsLossAndGradients) {
  Reference ref(GetParam().arch);
  Decoder model = load();
  const Device d = device();
  Tensor ids = ref.int_tensor("ids", d), positions = ref.int_tensor("positions", d);
  Tensor doc_ids = ref.int_tensor("doc_ids", d), targets = ref.int_tensor("targets", d);

  std::vector<std::string> names = ref.grad_names();
  for (const std::string& n : names) slot(model, n)->set_requires_grad(true);
  // The tied lm_head is the embedding tensor itself, so it shares the flag (and the gradient).
  if (model.config().tie_word_embeddings) model.weights().lm_head = model.weights().embed;

  ForwardOptions opt;
  opt.doc_ids = doc_ids;
  Tensor logits = model.forward(ids, positions, opt);
  Tensor loss = mean_cross_entropy(logits, targets);
  double e_logits = rel_err(logits.to_floats(), ref.floats("logits"));
  double e_loss = std::fabs(double(loss.item()) - double(ref.floats("loss")[0])) / std::fabs(ref.floats("loss")[0]);
  backward(loss);
  double e_grad = 0;
  for (const std::string& n : names) {
    Tensor g = slot(model, n)->grad();
    ASSERT_TRUE(g.defined()) << n;
    double e = rel_err(g.to_floats(), ref.floats("grad." + n));
    EXPECT_LT(e, 1e-4) << n;
    e_grad = std::max(e_grad, e);
  }
  std::printf("[parity] %-12s %-9s logits %.2e  loss %.2e  grads %.2e\n", GetParam().arch.c_str(),
              GetParam().device.c_str(), e_logits, e_loss, e_grad);
  EXPECT_LT(e_logits, 1e-4);
  EXPECT_LT(e_loss, 1e-5);
}

// models::loss uses the fused lm_head + cross-entropy (here in vocabulary chunks of 48 rows: 48 + 48 + 32):
// loss and gradients — the tied embedding's included, soft-capping for Gemma — against the PyTorch reference
// and against the unfused path (DecoderPaths::fused_loss off: full logits, then cross_entropy).
TEST_P(Parity, FusedLossMatchesUnfused) {
  Reference ref(GetParam().arch);
  const Device d = device();
  std::vector<std::string> names = ref.grad_names();
  std::vector<double> losses;
  std::vector<std::vector<std::vector<float>>> grads;
  for (bool fused : {true, false}) {
    Decoder model = load();
    model.set_paths({.fused_loss = fused, .loss_vocab_chunk = 48});
    for (const std::string& n : names) slot(model, n)->set_requires_grad(true);
    if (model.config().tie_word_embeddings) model.weights().lm_head = model.weights().embed;
    ForwardOptions opt;
    opt.doc_ids = ref.int_tensor("doc_ids", d);
    Tensor l = loss(model, ref.int_tensor("ids", d), ref.int_tensor("targets", d), Tensor(),
                    ref.int_tensor("positions", d), opt);
    losses.push_back(l.item());
    backward(l);
    grads.emplace_back();
    for (const std::string& n : names) {
      Tensor g = slot(model, n)->grad();
      ASSERT_TRUE(g.defined()) << n;
      grads.back().push_back(g.to_floats());
    }
  }
  const double want = ref.floats("loss")[0];
  EXPECT_LT(std::fabs(losses[0] - want) / want, 1e-5);
  EXPECT_LT(std::fabs(losses[0] - losses[1]) / want, 1e-6);
  double e_ref = 0, e_unfused = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    e_ref = std::max(e_ref, rel_err(grads[0][i], ref.floats("grad." + names[i])));
    e_unfused = std::max(e_unfused, rel_err(grads[0][i], grads[1][i]));
    EXPECT_LT(rel_err(grads[0][i], ref.floats("grad." + names[i])), 1e-4) << names[i];
    EXPECT_LT(rel_err(grads[0][i], grads[1][i]), 1e-5) << names[i];
  }
  std::printf("[parity] %-12s %-9s fused loss: grads vs reference %.2e, vs unfused %.2e\n", GetParam().arch.c_str(),
              GetParam().device.c_str(), e_ref, e_unfused);
}

// The MLP's fused act(gate) * up (ops::gated_activation; SwiGLU here, GeGLU for Gemma) against the composition
// of separate ops (DecoderPaths::fused_glu off): logits and gradients, and both against the PyTorch reference.
TEST_P(Parity, FusedGluMatchesComposition) {
  Reference ref(GetParam().arch);
  const Device d = device();
  std::vector<std::string> names = ref.grad_names();
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<std::vector<float>>> grads;
  for (bool fused : {true, false}) {
    Decoder model = load();
    model.set_paths({.fused_glu = fused});
    for (const std::string& n : names) slot(model, n)->set_requires_grad(true);
    if (model.config().tie_word_embeddings) model.weights().lm_head = model.weights().embed;
    ForwardOptions opt;
    opt.doc_ids = ref.int_tensor("doc_ids", d);
    Tensor y = model.forward(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
    logits.push_back(y.to_floats());
    backward(mean_cross_entropy(y, ref.int_tensor("targets", d)));
    grads.emplace_back();
    for (const std::string& n : names) {
      Tensor g = slot(model, n)->grad();
      ASSERT_TRUE(g.defined()) << n;
      grads.back().push_back(g.to_floats());
    }
  }
  double e_logits = rel_err(logits[0], logits[1]), e_grads = 0;
  EXPECT_LT(rel_err(logits[0], ref.floats("logits")), 1e-4);
  EXPECT_LT(e_logits, 1e-6);
  for (size_t i = 0; i < names.size(); ++i) {
    e_grads = std::max(e_grads, rel_err(grads[0][i], grads[1][i]));
    EXPECT_LT(rel_err(grads[0][i], ref.floats("grad." + names[i])), 1e-4) << names[i];
    EXPECT_LT(rel_err(grads[0][i], grads[1][i]), 1e-5) << names[i];
  }
  std::printf("[parity] %-12s %-9s fused GLU vs composition: logits %.2e, grads %.2e\n", GetParam().arch.c_str(),
              GetParam().device.c_str(), e_logits, e_grads);
}

// Row 0 of the reference batch is one document: without doc_ids, alone, it gives the same logits.
TEST_P(Parity, SingleSequenceWithoutDocIds) {
  Reference ref(GetParam().arch);
  Decoder model = load();
  const Device d = device();
  NoGrad no_grad;
  Tensor ids = ops::slice(ref.int_tensor("ids", d), 0, 0, 1);
  const int64_t T = ids.dim(1);
  Tensor logits = model.forward(ops::contiguous(ids), default_positions(1, T, d));
  std::vector<float> want = ref.floats("logits");
  want.resize(want.size() / 2);
  EXPECT_LT(rel_err(logits.to_floats(), want), 1e-4);
}

// Gradient checkpointing changes memory, not results.
TEST_P(Parity, CheckpointedGradientsMatch) {
  Reference ref(GetParam().arch);
  Decoder model = load();
  const Device d = device();
  std::vector<std::string> names = ref.grad_names();
  for (const std::string& n : names) slot(model, n)->set_requires_grad(true);
  if (model.config().tie_word_embeddings) model.weights().lm_head = model.weights().embed;
  ForwardOptions opt;
  opt.doc_ids = ref.int_tensor("doc_ids", d);
  opt.checkpoint_layers = true;
  Tensor l = loss(model, ref.int_tensor("ids", d), ref.int_tensor("targets", d), Tensor(),
                  ref.int_tensor("positions", d), opt);
  EXPECT_LT(std::fabs(double(l.item()) - ref.floats("loss")[0]) / ref.floats("loss")[0], 1e-5);
  backward(l);
  for (const std::string& n : names) {
    Tensor g = slot(model, n)->grad();
    ASSERT_TRUE(g.defined()) << n;
    EXPECT_LT(rel_err(g.to_floats(), ref.floats("grad." + n)), 1e-4) << n;
  }
}

// Mixed precision: bf16 weights and activations (norms, softmax, loss in f32 inside the kernels).
TEST_P(Parity, Bf16MixedPrecisionForward) {
  Reference ref(GetParam().arch);
  Decoder model = load(DType::bf16, DType::bf16);
  const Device d = device();
  NoGrad no_grad;
  ForwardOptions opt;
  opt.doc_ids = ref.int_tensor("doc_ids", d);
  Tensor logits = model.forward(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
  EXPECT_EQ(logits.dtype(), DType::f32);
  double e = rel_err(logits.to_floats(), ref.floats("logits"));
  double e_loss = std::fabs(double(mean_cross_entropy(logits, ref.int_tensor("targets", d)).item()) -
                            ref.floats("loss")[0]) / ref.floats("loss")[0];
  std::printf("[parity] %-12s %-9s bf16 logits %.2e  loss %.2e\n", GetParam().arch.c_str(),
              GetParam().device.c_str(), e, e_loss);
  EXPECT_LT(e, 5e-2);
  EXPECT_LT(e_loss, 2e-2);
}

// f32 weights with f16 activations: the mixed-dtype matmul path (weights are never copied to the compute dtype).
TEST_P(Parity, F16ActivationsWithF32Weights) {
  Reference ref(GetParam().arch);
  Decoder model = load(DType::f32, DType::f16);
  const Device d = device();
  NoGrad no_grad;
  ForwardOptions opt;
  opt.doc_ids = ref.int_tensor("doc_ids", d);
  Tensor logits = model.forward(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
  double e = rel_err(logits.to_floats(), ref.floats("logits"));
  std::printf("[parity] %-12s %-9s f16 logits %.2e\n", GetParam().arch.c_str(), GetParam().device.c_str(), e);
  EXPECT_LT(e, 1e-2);
}

// Gemma 4's per-layer-input table held in host memory (what loading does where it is larger than the device's
// kernels address, 4 GiB on NVIDIA): its rows gathered on the device from row blocks (what loading adds) give the
// logits of the whole table on the device; training it there is refused.
TEST(Gemma4, PerLayerTableInHostMemory) {
  for (const std::string& dev : test::test_devices()) {
    const Device d = parse_device(dev);
    if (!d.is_vulkan()) continue;
    Decoder model = load_decoder(fixture_dir("gemma4_text"), DType::f32, DType::f32, d);
    Reference ref("gemma4_text");
    const Tensor ids = ref.int_tensor("ids", d), positions = ref.int_tensor("positions", d);
    NoGrad no_grad;
    const std::vector<float> on_device = model.forward(ids, positions).to_floats();
    model.weights().ple_embed = model.weights().ple_embed.to(Device::cpu());
    EXPECT_THROW(model.forward(ids, positions), ShapeError) << "in host memory without its blocks";
    const Tensor& table = model.weights().ple_embed;  // its rows on the device in blocks of 3
    model.weights().ple_blocks = row_blocks(table, d, size_t(3 * table.dim(1)) * dtype_size(table.dtype()) + 5);
    EXPECT_EQ(model.weights().ple_blocks.size(), size_t((table.dim(0) + 2) / 3));
    EXPECT_EQ(model.forward(ids, positions).to_floats(), on_device) << dev;
    model.weights().ple_embed.set_requires_grad(true);
    EXPECT_THROW(model.forward(ids, positions), ConfigError);
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& d : test::test_devices())
    for (const std::string& a : test::fixture_names()) out.push_back({a, d});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, Parity, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string dev = info.param.device;
  for (char& c : dev)
    if (c == ':') c = '_';
  return info.param.arch + "_" + dev;
});

}  // namespace
}  // namespace lmtune::models
