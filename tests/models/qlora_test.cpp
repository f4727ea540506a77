// QLoRA in the models layer: a Linear whose frozen weight is block-quantized (Linear::qweight) computes and trains
// its adapters exactly as a Linear holding the dequantized weight (forward, every gradient, row adapters, LoRA
// dropout, the merged weight), and load_weights quantizes the decoder layers' projections as it reads them.
#include <gtest/gtest.h>

#include <fstream>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/decoder.h"
#include "models/init_model.h"
#include "models/linear.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models::test {
namespace {

// The same layer twice: `quant` holds W quantized, `dense` the dequantized W; one adapter with equal factors (B
// not zero, so A's gradient is not zero either).
struct Twins {
  Linear quant, dense;
  Twins(quant::Format f, Device dev) {
    const Tensor w = Tensor::randn({48, 64}, 3, 0.3f, DType::f32, Device::cpu());
    quant.qweight = quant::quantize(w, f, dev);
    dense.weight = quant::dequantize(quant.qweight, DType::f32);
    for (Linear* l : {&quant, &dense}) {
      LoraAdapter& a = l->add_adapter(4, 0.5f, 11);
      a.B = Tensor::randn(a.B.shape(), 12, 0.2f, DType::f32, dev);
      a.B.set_requires_grad(true);
      a.dropout = 0.25f;
    }
  }
};

// Loss Σ u ⊙ layer(x) and its gradients with respect to x, A and B.
std::pair<Tensor, std::vector<Tensor>> run(const Linear& layer, const Tensor& x, const Tensor& u,
                                           const RowAdapters* rows = nullptr) {
  auto f = [&](const std::vector<Tensor>& in) {
    Linear l = layer;
    l.adapters[0].A = in[1];
    l.adapters[0].B = in[2];
    return std::vector<Tensor>{ops::sum_all(ops::mul(ops::cast(l(in[0], rows), DType::f32), u))};
  };
  return value_and_grad(f)({x, layer.adapters[0].A, layer.adapters[0].B});
}

void expect_same(const Twins& t, const Tensor& x, double tol, const RowAdapters* rows = nullptr) {
  const Tensor u = Tensor::randn({2, 3, 48}, 13, 1.0f, DType::f32, x.device());
  auto [vq, gq] = run(t.quant, x, u, rows);
  auto [vd, gd] = run(t.dense, x, u, rows);
  EXPECT_NEAR(vq.item(), vd.item(), tol * std::max(1.0, std::fabs(double(vd.item()))));
  const char* names[] = {"dx", "dA", "dB"};
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(rel_err(gq[i].to_floats(), gd[i].to_floats()), tol) << names[i];
}

TEST(QLoRALinear, TrainsAsOnTheDequantizedBase) {
  for (const std::string& device : test_devices()) {
    const Device dev = parse_device(device);
    for (quant::Format f : {quant::Format::q8_0, quant::Format::q4_0}) {
      SCOPED_TRACE(device + " " + std::string(quant::info(f).name));
      Twins t(f, dev);
      // f32: the same arithmetic up to summation order.
      expect_same(t, Tensor::randn({2, 3, 64}, 14, 1.0f, DType::f32, dev), 1e-4);
      // bf16 activations under autocast: the dense twin takes the fused LoRA kernel, the quantized one composes.
      expect_same(t, Tensor::randn({2, 3, 64}, 15, 1.0f, DType::bf16, dev), 3e-2);
      {
        LoraDropoutScope dropout(1, 2, 3);  // the same mask on both
        expect_same(t, Tensor::randn({2, 3, 64}, 16, 1.0f, DType::f32, dev), 1e-4);
      }
      RowAdapters rows;
      rows.groups.push_back({"default", 1, 2});  // only batch row 1 gets the adapter
      expect_same(t, Tensor::randn({2, 3, 64}, 17, 1.0f, DType::f32, dev), 1e-4, &rows);
      EXPECT_LT(rel_err(t.quant.merged_weight().to_floats(), t.dense.merged_weight().to_floats()), 1e-6);
      EXPECT_EQ(t.quant.in_features(), 64);
      EXPECT_EQ(t.quant.out_features(), 48);
    }
  }
}

TEST(QLoRALinear, LoadWeightsQuantizesTheProjections) {
  const ModelConfig c = load_model_config(fixture_dir("llama"));
  DecoderWeights dense = load_weights(c, fixture_dir("llama"), DType::f32, Device::cpu());
  DecoderWeights q = load_weights(c, fixture_dir("llama"), DType::f32, Device::cpu(), quant::Format::q8_0);
  const std::vector<Linear*> ql = q.linears(), dl = dense.linears();
  ASSERT_EQ(ql.size(), 14u);
  for (size_t i = 0; i < ql.size(); ++i) {
    EXPECT_FALSE(ql[i]->weight.defined());
    ASSERT_TRUE(ql[i]->qweight.defined());
    EXPECT_EQ(ql[i]->qweight.format, quant::Format::q8_0);
    EXPECT_EQ(ql[i]->qweight.shape, dl[i]->weight.shape());
    // q8_0 keeps 8 bits per element: within 1% of the layer's largest weight.
    EXPECT_LT(rel_err(quant::dequantize(ql[i]->qweight, DType::f32).to_floats(), dl[i]->weight.to_floats()), 0.01);
  }
  EXPECT_TRUE(q.embed.defined() && q.lm_head.defined() && q.final_norm.defined() && q.layers[0].input_norm.defined());
  // The decoder runs on it, close to the dense model.
  Decoder dd(c, dense), dq(c, q);
  const Tensor ids = Tensor::from_ints({5, 9, 17, 33, 65, 2}, {1, 6}, Device::cpu());
  const Tensor pos = default_positions(1, 6, Device::cpu());
  NoGrad no_grad;
  EXPECT_LT(rel_err(dq.forward(ids, pos).to_floats(), dd.forward(ids, pos).to_floats()), 0.05);
  // NF4's 256-element blocks do not divide hidden 32: the error names the tensor and the format.
  try {
    load_weights(c, fixture_dir("llama"), DType::f32, Device::cpu(), quant::Format::nf4);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("nf4"), std::string::npos) << m;
  }
}

// A random model (lmtune init) of configs/presets/<preset>.yaml with `extra` YAML keys appended, in the build tree.
std::filesystem::path random_model(const std::string& preset, const std::string& extra, const std::string& name,
                                   uint64_t seed) {
  const std::filesystem::path dir = std::filesystem::path(LMTUNE_BINARY_DIR) / "test_models_tmp";
  std::filesystem::create_directories(dir);
  std::ifstream in(std::filesystem::path(LMTUNE_SOURCE_DIR) / "configs" / "presets" / (preset + ".yaml"));
  std::ofstream(dir / (name + ".yaml")) << in.rdbuf() << "\n" << extra;
  InitOptions o;
  o.preset = dir / (name + ".yaml");
  o.out = dir / name;
  o.seed = seed;
  o.overwrite = true;
  init_model_dir(o);
  return o.out;
}

// The Gated DeltaNet hybrids: a random tiny-qwen3-next model loads with every projection quantized (DeltaNet's
// in_proj_* and out_proj, gated attention, the shared expert and its gate) and computes what the model with the
// dequantized weights computes, on every device.
TEST(QLoRALinear, LoadWeightsQuantizesTheGatedDeltaNetHybrid) {
  const std::filesystem::path model = random_model("tiny-qwen3-next", "vocab_size: 96\n", "qlora_qwen3_next", 5);
  for (const std::string& dev : test_devices()) {
    const Device d = parse_device(dev);
    Decoder dense = load_decoder(model, DType::f32, DType::f32, d);
    Decoder quant = load_decoder(model, DType::f32, DType::f32, d, quant::Format::q8_0);
    const std::vector<Linear*> ql = quant.weights().linears();
    size_t deltanet = 0;
    for (const LayerWeights& l : quant.weights().layers) deltanet += l.delta.out.qweight.defined();
    EXPECT_EQ(deltanet, 3u) << dev;
    // The dense twin holds the dequantized weights (a random router's near-ties would flip between the dense and
    // the quantized weights' values, so only the same values can be compared).
    const std::vector<Linear*> dl = dense.weights().linears();
    ASSERT_EQ(dl.size(), ql.size());
    for (size_t i = 0; i < ql.size(); ++i) {
      ASSERT_TRUE(ql[i]->qweight.defined() && !ql[i]->weight.defined()) << dev << " linear " << i;
      dl[i]->weight = quant::dequantize(ql[i]->qweight, DType::f32);
    }
    const Tensor ids = Tensor::from_ints({5, 9, 17, 33, 41, 2, 7, 11}, {2, 4}, d);
    const Tensor pos = default_positions(2, 4, d);
    NoGrad no_grad;
    const std::vector<float> want = dense.forward(ids, pos).to_floats(), got = quant.forward(ids, pos).to_floats();
    EXPECT_LT(rel_err(got, want), 1e-5) << dev;
  }
}

// Gemma 4: a random tiny-gemma4 model with the 26B-A4B block added loads with its projections quantized (the
// shared layers' q and o, double-wide MLPs, the per-layer-input gate, the dense MLP beside the experts) and
// computes what the model with the dequantized weights computes; the experts stay in the weight dtype.
TEST(QLoRALinear, LoadWeightsQuantizesGemma4) {
  const std::filesystem::path model =
      random_model("tiny-gemma4",
                   "vocab_size: 96\nenable_moe_block: true\nnum_experts: 4\ntop_k_experts: 2\n"
                   "moe_intermediate_size: 32\n",
                   "qlora_gemma4", 6);
  for (const std::string& dev : test_devices()) {
    SCOPED_TRACE(dev);
    const Device d = parse_device(dev);
    Decoder dense = load_decoder(model, DType::f32, DType::f32, d);
    Decoder quant = load_decoder(model, DType::f32, DType::f32, d, quant::Format::q8_0);
    size_t experts = 0;
    for (const LayerWeights& l : quant.weights().layers) experts += l.moe.gate_up.defined();
    EXPECT_EQ(experts, 6u);
    const std::vector<Linear*> ql = quant.weights().linears(), dl = dense.weights().linears();
    ASSERT_EQ(dl.size(), ql.size());
    size_t quantized = 0;
    for (size_t i = 0; i < ql.size(); ++i) {
      if (!ql[i]->qweight.defined()) continue;
      EXPECT_FALSE(ql[i]->weight.defined()) << "linear " << i;
      dl[i]->weight = quant::dequantize(ql[i]->qweight, DType::f32);
      ++quantized;
    }
    EXPECT_GT(quantized, ql.size() / 2);
    const Tensor ids = Tensor::from_ints({5, 9, 17, 33, 41, 2, 7, 11, 3, 60, 61, 62}, {2, 6}, d);
    const Tensor pos = default_positions(2, 6, d);
    NoGrad no_grad;
    const std::vector<float> want = dense.forward(ids, pos).to_floats(), got = quant.forward(ids, pos).to_floats();
    EXPECT_LT(rel_err(got, want), 1e-5);
  }
}

}  // namespace
}  // namespace lmtune::models::test
