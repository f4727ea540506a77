// Mixtures of experts (models/moe.h): the routing plan, the load-balancing loss and its gradient against the
// float64 reference (scripts/reference_models.py, transformers' load_balancing_loss_func) on every device, the
// token mask, the expert MLP's gradients against finite differences of a float64 reference, and the two checkpoint
// layouts (per expert, stacked) giving the same model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "autodiff/gradcheck.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/moe.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

namespace fs = std::filesystem;
using test::fixture_dir;
using test::Reference;
using test::rel_err;

TEST(RouteTokens, RowsGroupedByExpertThenToken) {
  // 3 tokens, k = 2, 4 experts: token 0 -> {2, 0}, token 1 -> {0, 3}, token 2 -> {2, 3}.
  ExpertRouting r = route_tokens({2, 0, 0, 3, 2, 3}, 3, 2, 4);
  EXPECT_EQ(r.offsets, (std::vector<int64_t>{0, 2, 2, 4, 6}));
  EXPECT_EQ(r.token_of_row, (std::vector<int32_t>{0, 1, 0, 2, 1, 2}));
  EXPECT_EQ(r.row_of_choice, (std::vector<int32_t>{2, 0, 1, 4, 3, 5}));
  EXPECT_THROW(route_tokens({0, 4}, 1, 2, 4), ShapeError);
  EXPECT_THROW(route_tokens({0, 1, 2}, 1, 2, 4), ShapeError);
}

class MoeFixture : public ::testing::TestWithParam<std::string> {};

// The load-balancing loss over the router logits of every expert layer, and its gradient w.r.t. layer 0's router.
TEST_P(MoeFixture, RouterAuxLossMatchesReference) {
  for (const std::string& dev : test::test_devices()) {
    const Device d = parse_device(dev);
    Reference ref(GetParam());
    Decoder model = load_decoder(fixture_dir(GetParam()), DType::f32, DType::f32, d);
    Tensor& router = model.weights().layers[0].moe.router;
    router.set_requires_grad(true);
    std::vector<Tensor> logits;
    ForwardOptions opt;
    opt.doc_ids = ref.int_tensor("doc_ids", d);
    opt.router_logits = &logits;
    model.forward_hidden(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
    int64_t moe_layers = 0;
    for (const LayerConfig& l : model.config().layers) moe_layers += l.moe;
    ASSERT_EQ(int64_t(logits.size()), moe_layers);
    Tensor aux = router_aux_loss(logits, model.config().experts_per_token);
    const double want = ref.floats("aux_loss")[0];
    EXPECT_NEAR(aux.item(), want, 1e-5 * want) << dev;
    backward(aux);
    const std::string name = "grad_aux.model.layers.0.mlp.gate.weight";
    EXPECT_LT(rel_err(router.grad().to_floats(), ref.floats(name)), 1e-4) << dev;
  }
}

// With checkpointed layers the router logits come out of the recomputed layers too, unchanged.
TEST_P(MoeFixture, RouterLogitsUnderCheckpointing) {
  Reference ref(GetParam());
  const Device d = Device::cpu();
  Decoder model = load_decoder(fixture_dir(GetParam()), DType::f32, DType::f32, d);
  model.weights().layers[0].moe.router.set_requires_grad(true);
  std::vector<Tensor> plain, checked;
  ForwardOptions opt;
  opt.doc_ids = ref.int_tensor("doc_ids", d);
  opt.router_logits = &plain;
  model.forward_hidden(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
  opt.router_logits = &checked;
  opt.checkpoint_layers = true;
  model.forward_hidden(ref.int_tensor("ids", d), ref.int_tensor("positions", d), opt);
  ASSERT_EQ(plain.size(), checked.size());
  const int64_t k = model.config().experts_per_token;
  EXPECT_FLOAT_EQ(router_aux_loss(plain, k).item(), router_aux_loss(checked, k).item());
  Tensor aux = router_aux_loss(checked, k);
  backward(aux);
  EXPECT_LT(rel_err(model.weights().layers[0].moe.router.grad().to_floats(),
                    ref.floats("grad_aux.model.layers.0.mlp.gate.weight")),
            1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, MoeFixture, ::testing::Values("mixtral", "qwen3_moe"));

// A token mask restricts both means to its rows: the loss equals the unmasked loss of those rows alone.
TEST(RouterAuxLoss, TokenMaskSelectsRows) {
  const int64_t N = 7, E = 5, k = 2;
  std::vector<Tensor> all, kept;
  const std::vector<float> mask = {1, 0, 1, 1, 0, 0, 1};
  for (uint64_t layer = 0; layer < 2; ++layer) {
    Tensor l = Tensor::randn({N, E}, 11 + layer, 1.5f);
    all.push_back(l);
    std::vector<Tensor> rows;
    for (int64_t i = 0; i < N; ++i)
      if (mask[size_t(i)] != 0) rows.push_back(ops::slice(l, 0, i, i + 1));
    kept.push_back(ops::concat(rows, 0));
  }
  EXPECT_NEAR(router_aux_loss(all, k, mask).item(), router_aux_loss(kept, k).item(), 1e-6);
  EXPECT_EQ(router_aux_loss(all, k, std::vector<float>(N, 0.0f)).item(), 0.0f);
  EXPECT_THROW(router_aux_loss(all, k, {1, 0}), ShapeError);
}

// moe_mlp's vjp and jvp w.r.t. the hidden states, the router and both expert tensors, against central differences
// of a float64 implementation (the routing is piecewise constant: the inputs keep their top-k away from ties).
TEST(MoeMlp, GradientsMatchFiniteDifferences) {
  const int64_t N = 5, C = 6, E = 4, EI = 3, k = 2;
  ModelConfig c;
  c.num_experts = E;
  c.experts_per_token = k;
  c.norm_topk_prob = true;
  Tensor h = lmtune::test::random_like({N, C}, 1), router = Tensor::randn({E, C}, 2, 2.0f);
  Tensor gate_up = lmtune::test::random_like({E, 2 * EI, C}, 3), down = lmtune::test::random_like({E, C, EI}, 4);
  auto f = [&](const std::vector<Tensor>& in) {
    MoeWeights w;
    w.router = in[1], w.gate_up = in[2], w.down = in[3];
    return std::vector<Tensor>{moe_mlp(w, in[0], c, ops::GateActivation::silu)};
  };
  auto rf = [&](const std::vector<ref::Array>& in) {
    const ref::Array &x = in[0], &wr = in[1], &gu = in[2], &dn = in[3];
    ref::Array y({N, C});
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> p(static_cast<size_t>(E), 0.0);
      double mx = -1e300, z = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t j = 0; j < C; ++j) p[size_t(e)] += x[n * C + j] * wr[e * C + j];
        mx = std::max(mx, p[size_t(e)]);
      }
      for (double& v : p) z += (v = std::exp(v - mx));
      for (double& v : p) v /= z;
      std::vector<int64_t> order(static_cast<size_t>(E), 0);
      for (int64_t e = 0; e < E; ++e) order[size_t(e)] = e;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
      double total = 0;
      for (int64_t s = 0; s < k; ++s) total += p[size_t(order[size_t(s)])];
      for (int64_t s = 0; s < k; ++s) {
        const int64_t e = order[size_t(s)];
        std::vector<double> a(static_cast<size_t>(EI), 0.0);
        for (int64_t i = 0; i < EI; ++i) {
          double g = 0, u = 0;
          for (int64_t j = 0; j < C; ++j) {
            g += gu[(e * 2 * EI + i) * C + j] * x[n * C + j];
            u += gu[(e * 2 * EI + EI + i) * C + j] * x[n * C + j];
          }
          a[size_t(i)] = g / (1 + std::exp(-g)) * u;
        }
        for (int64_t j = 0; j < C; ++j) {
          double o = 0;
          for (int64_t i = 0; i < EI; ++i) o += dn[(e * C + j) * EI + i] * a[size_t(i)];
          y[n * C + j] += p[size_t(e)] / total * o;
        }
      }
    }
    return std::vector<ref::Array>{y};
  };
  lmtune::test::check_gradients(f, rf, {h, router, gate_up, down}, 1e-5);
}

// The per-expert layout (the mixtral fixture) saved in the stacked layout and read back: the same logits, and the
// file holds transformers 5's names.
TEST(MoeWeights, PerExpertAndStackedLayoutsGiveTheSameModel) {
  const fs::path dir = fs::temp_directory_path() / "lmtune_moe_stacked";
  fs::remove_all(dir);
  Reference ref("mixtral");
  Decoder a = load_decoder(fixture_dir("mixtral"), DType::f32, DType::f32, Device::cpu());
  save_weights(a.config(), a.weights(), dir, DType::f32);
  fs::copy_file(fixture_dir("mixtral") / "config.json", dir / "config.json");
  SafetensorsFile f(dir / "model.safetensors");
  EXPECT_TRUE(f.contains("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(f.contains("model.layers.1.block_sparse_moe.experts.0.w1.weight"));
  Decoder b = load_decoder(dir, DType::f32, DType::f32, Device::cpu());
  NoGrad no_grad;
  ForwardOptions opt;
  opt.doc_ids = ref.int_tensor("doc_ids", Device::cpu());
  Tensor ids = ref.int_tensor("ids", Device::cpu()), pos = ref.int_tensor("positions", Device::cpu());
  EXPECT_EQ(a.forward(ids, pos, opt).to_floats(), b.forward(ids, pos, opt).to_floats());
  fs::remove_all(dir);
}

// A per-expert checkpoint missing one expert's tensor names both layouts in its error.
TEST(MoeWeights, MissingExpertNamesBothLayouts) {
  const fs::path dir = fs::temp_directory_path() / "lmtune_moe_missing";
  fs::remove_all(dir);
  fs::create_directories(dir);
  SafetensorsFile src(fixture_dir("mixtral") / "model.safetensors");
  std::vector<TensorToWrite> keep;
  for (const SafetensorsTensor& t : src.tensors())
    if (t.name != "model.layers.1.block_sparse_moe.experts.3.w3.weight")
      keep.push_back({t.name, t.st_dtype, t.shape, t.data});
  write_safetensors(dir / "model.safetensors", keep);
  fs::copy_file(fixture_dir("mixtral") / "config.json", dir / "config.json");
  try {
    load_decoder(dir, DType::f32, DType::f32, Device::cpu());
    ADD_FAILURE() << "loaded a checkpoint with an expert missing";
  } catch (const FileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.1.mlp.experts.gate_up_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.1.block_sparse_moe.experts.3.w3.weight"), std::string::npos) << msg;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lmtune::models
