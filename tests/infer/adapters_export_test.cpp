// Adapters: --adapter DIR[:scale] parsing, several adapters at once, export and re-import (identical logits),
// merged export (logits of base + adapter within 1e-4 in f32; config and dtype), and clear errors for adapters
// that do not fit the model or cannot be read.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/autodiff.h"
#include "core/error.h"
#include "infer/adapters.h"
#include "infer/export.h"
#include "infer_test_util.h"
#include "io/safetensors.h"
#include "models/adapters.h"
#include "models/weights.h"

namespace lmtune::infer {
namespace {

using test::model_fixture;
using test::rel_err;
using test::TempDir;

const char* kArch = "qwen2";  // biases + GQA

// A trained-looking adapter (random B) on `targets`, saved as PEFT into dir.
void make_adapter(const std::filesystem::path& dir, const std::vector<std::string>& targets, uint64_t seed) {
  models::Decoder m = models::load_decoder(model_fixture(kArch), DType::f32, DType::f32, Device::cpu());
  models::add_lora(m.weights(), targets, 2, 1.0f, seed, "t");
  uint64_t s = seed * 100;
  for (models::Linear* l : m.weights().linears())
    for (auto& a : l->adapters) a.B = Tensor::randn(a.B.shape(), s++, 0.2f);
  PeftAdapter p = models::extract_peft(m.weights(), "t", 2, 4.0, false, 0.0, "fixture");
  save_peft_adapter(p, dir);
}

std::vector<float> logits_of(const models::Decoder& m) {
  NoGrad no_grad;
  Tensor ids = Tensor::from_ints({5, 17, 99, 3, 42, 7, 1, 2, 64, 100, 11, 9}, {2, 6}, Device::cpu());
  return m.forward(ids, models::default_positions(2, 6, Device::cpu())).to_floats();
}

models::Decoder base() { return models::load_decoder(model_fixture(kArch), DType::f32, DType::f32, Device::cpu()); }

struct Adapters {
  TempDir dir;
  std::filesystem::path a = dir.path / "a", b = dir.path / "b";
  Adapters() {
    make_adapter(a, {"q_proj", "v_proj"}, 1);
    make_adapter(b, {"all-linear"}, 2);
  }
};

Adapters& adapters() {
  static Adapters a;
  return a;
}

TEST(AdapterSpec, ParsesDirectoryAndScale) {
  AdapterSpec s = parse_adapter_spec("runs/x/adapter:0.5");
  EXPECT_EQ(s.dir, "runs/x/adapter");
  EXPECT_FLOAT_EQ(s.multiplier, 0.5f);
  EXPECT_EQ(s.name, "adapter");
  s = parse_adapter_spec("runs/x/adapter");
  EXPECT_FLOAT_EQ(s.multiplier, 1.0f);
  EXPECT_THROW(parse_adapter_spec("runs/x:abc"), ConfigError);
  EXPECT_THROW(parse_adapter_spec(":2"), ConfigError);
}

TEST(Adapters, ExportedAndReimportedGivesIdenticalLogits) {
  TempDir out;
  models::Decoder m1 = base();
  load_adapter(m1, parse_adapter_spec(adapters().b.string()));
  std::vector<float> want = logits_of(m1);
  EXPECT_GT(rel_err(want, logits_of(base())), 1e-3);  // the adapter changes the model
  export_adapter(model_fixture(kArch), parse_adapter_spec(adapters().b.string()), out.path / "re");
  models::Decoder m2 = base();
  load_adapter(m2, parse_adapter_spec((out.path / "re").string()));
  EXPECT_EQ(logits_of(m2), want);
  PeftAdapter orig = load_peft_adapter(adapters().b), re = load_peft_adapter(out.path / "re");
  EXPECT_EQ(re.rank, orig.rank);
  EXPECT_EQ(re.alpha, orig.alpha);
  EXPECT_EQ(re.target_modules, orig.target_modules);
  // A multiplier is folded into lora_B.
  export_adapter(model_fixture(kArch), parse_adapter_spec((adapters().a.string()) + ":0.5"), out.path / "half");
  models::Decoder m3 = base(), m4 = base();
  load_adapter(m3, parse_adapter_spec(adapters().a.string() + ":0.5"));
  load_adapter(m4, parse_adapter_spec((out.path / "half").string()));
  EXPECT_LT(rel_err(logits_of(m4), logits_of(m3)), 1e-6);
}

TEST(Adapters, MergedModelMatchesBasePlusAdapters) {
  TempDir out;
  std::vector<AdapterSpec> specs = {parse_adapter_spec(adapters().a.string() + ":0.5"),
                                    parse_adapter_spec(adapters().b.string())};
  models::Decoder m = base();
  for (const auto& s : specs) load_adapter(m, s);  // two adapters at once, summed
  std::vector<float> want = logits_of(m);
  export_merged(model_fixture(kArch), specs, out.path / "merged");
  models::Decoder merged = models::load_decoder(out.path / "merged", DType::f32, DType::f32, Device::cpu());
  EXPECT_LT(rel_err(logits_of(merged), want), 1e-4);
  // Same config keys as the input; generation config present; f32 like the base.
  auto read = [](const std::filesystem::path& f) { return nlohmann::json::parse(std::ifstream(f)); };
  EXPECT_EQ(read(out.path / "merged/config.json"), read(model_fixture(kArch) / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(out.path / "merged/generation_config.json"));
  SafetensorsFile f(out.path / "merged/model.safetensors");
  EXPECT_EQ(f.at("model.layers.0.self_attn.q_proj.weight").dtype(), DType::f32);
  // --dtype bf16: the weights and config say bf16, and the model still loads.
  export_merged(model_fixture(kArch), specs, out.path / "bf16", DType::bf16);
  EXPECT_EQ(read(out.path / "bf16/config.json")["torch_dtype"], "bfloat16");
  EXPECT_EQ(SafetensorsFile(out.path / "bf16/model.safetensors").at("model.embed_tokens.weight").dtype(), DType::bf16);
  models::Decoder b16 = models::load_decoder(out.path / "bf16", DType::f32, DType::f32, Device::cpu());
  EXPECT_LT(rel_err(logits_of(b16), want), 3e-2);
}

void expect_file_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const FileError& e) {
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(Adapters, MismatchedOrUnreadableAdaptersAreClearErrors) {
  PeftAdapter p = load_peft_adapter(adapters().a);
  models::Decoder m = base();
  // Wrong shapes (an adapter for a wider model).
  PeftAdapter wide = p;
  auto& lw = wide.modules.begin()->second;
  lw.a_shape = {2, 48};
  lw.a.assign(96, 0.0f);
  expect_file_error([&] { validate_adapter(wide, m.weights(), "adapter x"); },
                    {"adapter x", wide.modules.begin()->first, "[2, 48]"});
  // A module the model does not have (more layers).
  PeftAdapter deep = p;
  deep.modules["model.layers.99.self_attn.q_proj"] = p.modules.begin()->second;
  expect_file_error([&] { validate_adapter(deep, m.weights(), "adapter x"); }, {"model.layers.99.self_attn.q_proj"});
  // A target module of another architecture.
  PeftAdapter gpt2 = p;
  gpt2.target_modules = {"c_attn"};
  expect_file_error([&] { validate_adapter(gpt2, m.weights(), "adapter x"); }, {"c_attn"});
  // Unreadable directories and files.
  TempDir t;
  expect_file_error([&] { load_adapter(m, parse_adapter_spec((t.path / "missing").string())); }, {"missing"});
  std::filesystem::copy(adapters().a, t.path / "broken");
  std::ofstream(t.path / "broken/adapter_model.safetensors") << "not a safetensors file";
  expect_file_error([&] { load_adapter(m, parse_adapter_spec((t.path / "broken").string())); },
                    {"adapter_model.safetensors"});
  expect_file_error([&] { export_merged(t.path / "nomodel", {}, t.path / "o"); }, {"nomodel"});
}

}  // namespace
}  // namespace lmtune::infer
