// `lmtune init` (models::init_model_dir): every tiny preset gives a loadable model in HF layout; vocab size and
// special tokens come from the tokenizer; the real presets have the published parameter counts.
#include <gtest/gtest.h>

#include "core/autodiff.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "models/decoder.h"
#include "models/init_model.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {
namespace fs = std::filesystem;

fs::path preset_path(const std::string& name) {
  return fs::path(LMTUNE_SOURCE_DIR) / "configs" / "presets" / (name + ".yaml");
}

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::path(LMTUNE_BINARY_DIR) / "test_models_tmp" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A minimal BPE tokenizer.json: 60 byte-ish pieces + <s> (60) and </s> (61).
fs::path tiny_tokenizer() {
  fs::path dir = fresh_dir("tokenizer");
  std::string vocab;
  for (int i = 0; i < 60; ++i) vocab += (i ? "," : "") + std::string("\"t") + std::to_string(i) + "\":" + std::to_string(i);
  write_file_atomic(dir / "tokenizer.json",
                    R"({"version":"1.0","added_tokens":[{"id":60,"content":"<s>","special":true},)"
                    R"({"id":61,"content":"</s>","special":true}],"model":{"type":"BPE","vocab":{)" +
                        vocab + R"(},"merges":[]}})");
  write_file_atomic(dir / "tokenizer_config.json", std::string(R"({"bos_token":"<s>","eos_token":{"content":"</s>"}})"));
  return dir;
}

TEST(Init, TinyPresetsGiveLoadableModels) {
  fs::path tok = tiny_tokenizer();
  EXPECT_EQ(tokenizer_vocab_size(tok), 62);
  for (const char* preset : {"tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3",
                             "tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen3-next"}) {
    InitOptions o;
    o.preset = preset_path(preset);
    o.tokenizer_dir = tok;
    o.out = fresh_dir(std::string("init_") + preset);
    o.seed = 3;
    InitResult r = init_model_dir(o);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json"})
      EXPECT_TRUE(fs::exists(o.out / f)) << preset << " " << f;
    ModelConfig c = load_model_config(o.out);
    EXPECT_EQ(c.vocab_size, 62) << preset;
    EXPECT_EQ(c.bos_token_id, 60) << preset;
    EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{61}) << preset;
    EXPECT_FALSE(c.architecture.empty());
    EXPECT_EQ(load_generation_config(o.out).eos_token_ids, std::vector<int64_t>{61});
    Decoder m = load_decoder(o.out, DType::f32, DType::f32, Device::cpu());
    EXPECT_EQ(parameter_count(c), r.parameters);
    NoGrad no_grad;
    Tensor ids = Tensor::from_ints({60, 1, 2, 3}, {1, 4}, Device::cpu());
    Tensor logits = m.forward(ids, default_positions(1, 4, Device::cpu()));
    for (float v : logits.to_floats()) ASSERT_TRUE(std::isfinite(v)) << preset;
    const float norm = c.norm_style == NormStyle::one_plus_weight ? 0.0f : 1.0f;
    EXPECT_EQ(m.weights().final_norm.to_floats()[0], norm) << preset;
    // An existing model is not overwritten by accident.
    EXPECT_THROW(init_model_dir(o), FileError);
  }
}

// `lmtune init` draws each tensor on all threads while writing it (save_random_weights): the files hold the same
// bytes as drawing the whole model in memory (init_weights, Tensor::randn's sequential draw) and saving it, also
// when shards split the model and for odd tensor sizes (a normal pair straddling two threads' chunks).
TEST(Init, StreamedRandomWeightsEqualTheInMemoryModel) {
  nlohmann::json j = yaml_file_to_json(preset_path("tiny-gemma2"));
  j["vocab_size"] = 1001;  // an odd embedding past one 64K-element chunk
  j["hidden_size"] = 131;
  ModelConfig c = parse_model_config(j.dump(), "tiny-gemma2");
  for (DType dt : {DType::bf16, DType::f32}) {
    fs::path a = fresh_dir("random_streamed"), b = fresh_dir("random_in_memory");
    save_random_weights(c, 7, 0.02, a, dt, 200000);
    save_weights(c, init_weights(c, 7, 0.02, dt, Device::cpu()), b, dt, 200000);
    EXPECT_TRUE(fs::exists(a / "model.safetensors.index.json"));
    int files = 0;
    for (const auto& e : fs::directory_iterator(b)) {
      ++files;
      EXPECT_EQ(read_file_bytes(a / e.path().filename()), read_file_bytes(e.path())) << e.path().filename();
    }
    EXPECT_GT(files, 2);
  }
}

TEST(Init, ArchMustAgreeWithThePresetAndVocabMustBeKnown) {
  InitOptions o;
  o.preset = preset_path("tiny-llama");
  o.out = fresh_dir("init_bad");
  o.arch = "qwen2";
  o.tokenizer_dir = tiny_tokenizer();
  EXPECT_THROW(init_model_dir(o), ConfigError);
  o.arch = "";
  o.tokenizer_dir.clear();  // tiny-llama has no vocab_size
  EXPECT_THROW(init_model_dir(o), ConfigError);
}

TEST(Init, VocabFromVocabJsonAndYamlScalars) {
  fs::path dir = fresh_dir("tokenizer_vocab_json");
  write_file_atomic(dir / "vocab.json", std::string(R"({"a": 0, "b": 1, "c": 7})"));
  write_file_atomic(dir / "added_tokens.json", std::string(R"({"<x>": 9})"));
  EXPECT_EQ(tokenizer_vocab_size(dir), 10);
  write_file_atomic(dir / "p.yaml", std::string("a: 1\nb: 1.5e-6\nc: true\nd: null\ne: '12'\nf: silu\ng: [1, 2]\n"));
  nlohmann::json j = yaml_file_to_json(dir / "p.yaml");
  EXPECT_EQ(j["a"], 1);
  EXPECT_TRUE(j["a"].is_number_integer());
  EXPECT_DOUBLE_EQ(j["b"].get<double>(), 1.5e-6);
  EXPECT_EQ(j["c"], true);
  EXPECT_TRUE(j["d"].is_null());
  EXPECT_EQ(j["e"], "12");
  EXPECT_EQ(j["f"], "silu");
  EXPECT_EQ(j["g"], nlohmann::json({1, 2}));
}

TEST(Init, RealPresetsHavePublishedParameterCounts) {
  auto count = [](const char* name) {
    return parameter_count(parse_model_config(yaml_file_to_json(preset_path(name)).dump(), name));
  };
  EXPECT_EQ(count("qwen2.5-0.5b"), 494032768);
  EXPECT_EQ(count("llama-3.2-1b"), 1235814400);
  EXPECT_EQ(count("qwen3-1.7b"), 1720574976);
  EXPECT_EQ(count("gemma-3-1b"), 999885952);
  EXPECT_EQ(count("llama-3.1-8b"), 8030261248);
  EXPECT_EQ(count("qwen3-30b-a3b"), 30532122624);
  EXPECT_EQ(count("mixtral-8x7b"), 46702792704);
  EXPECT_EQ(count("gemma-4-e2b"), 4628569344);  // transformers' count of Gemma4ForCausalLM at this config
  auto active = [](const char* name) {
    return active_parameter_count(parse_model_config(yaml_file_to_json(preset_path(name)).dump(), name));
  };
  EXPECT_EQ(active("qwen3-30b-a3b"), 3353032704);  // "3.3B activated"
  EXPECT_EQ(active("mixtral-8x7b"), 12879925248);  // "12.9B active"
  EXPECT_EQ(active("llama-3.1-8b"), 8030261248);
  EXPECT_EQ(count("gemma-4-26b-a4b"), 25233141760);  // transformers' count at this config
  EXPECT_EQ(active("gemma-4-26b-a4b"), 3822530560);  // "3.8B active"
  ModelConfig l = parse_model_config(yaml_file_to_json(preset_path("llama-3.2-1b")).dump());
  EXPECT_EQ(l.rope.type, RopeType::llama3);
  EXPECT_EQ(l.rope.original_max_pos, 8192);
}

}  // namespace
}  // namespace lmtune::models
