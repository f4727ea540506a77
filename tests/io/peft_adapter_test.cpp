// PEFT adapter files: round trip, the key layout peft expects, and errors for inconsistent adapters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"

using namespace lmtune;
namespace fs = std::filesystem;

namespace {
PeftAdapter sample_adapter() {
  PeftAdapter a;
  a.rank = 2;
  a.alpha = 8;
  a.target_modules = {"q_proj", "v_proj"};
  a.base_model = "tiny-llama";
  for (const char* m : {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}) {
    LoraWeights w;
    w.a_shape = {2, 3};
    w.b_shape = {4, 2};
    for (int i = 0; i < 6; ++i) w.a.push_back(0.1f * float(i + 1));
    for (int i = 0; i < 8; ++i) w.b.push_back(-0.05f * float(i + 1));
    a.modules[m] = w;
  }
  return a;
}

fs::path temp_dir(const char* name) {
  auto d = fs::temp_directory_path() / (std::string("lmtune_peft_") + name + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

TEST(PeftAdapter, RoundTripWithPeftKeyNames) {
  auto dir = temp_dir("rt");
  PeftAdapter a = sample_adapter();
  save_peft_adapter(a, dir);
  SafetensorsFile st(dir / "adapter_model.safetensors");
  EXPECT_TRUE(st.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  EXPECT_TRUE(st.contains("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"));
  PeftAdapter b = load_peft_adapter(dir);
  EXPECT_EQ(b.rank, 2);
  EXPECT_DOUBLE_EQ(b.scale(), 4.0);
  EXPECT_EQ(b.base_model, "tiny-llama");
  ASSERT_EQ(b.modules.size(), 2u);
  for (const auto& [m, w] : a.modules) {
    EXPECT_EQ(b.modules.at(m).a, w.a);
    EXPECT_EQ(b.modules.at(m).b, w.b);
    EXPECT_EQ(b.modules.at(m).b_shape, w.b_shape);
  }
  b.rslora = true;
  EXPECT_DOUBLE_EQ(b.scale(), 8.0 / std::sqrt(2.0));
  fs::remove_all(dir);
}

TEST(PeftAdapter, InconsistentAdaptersAreRejected) {
  auto dir = temp_dir("bad");
  PeftAdapter a = sample_adapter();
  save_peft_adapter(a, dir);
  // Claim a different rank in the config.
  std::ofstream(dir / "adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8})";
  try {
    load_peft_adapter(dir);
    FAIL() << "expected an error";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "adapter_config.json") << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 8, "use_dora": true})";
  EXPECT_THROW(load_peft_adapter(dir), FileError);
  a.modules.begin()->second.b.clear();
  a.modules.begin()->second.b_shape = {0, 2};
  std::ofstream(dir / "adapter_config.json") << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 8})";
  EXPECT_THROW(load_peft_adapter(dir / "nope"), FileError);
  fs::remove_all(dir);
}

// Scales and weights that generate, eval and export would otherwise apply silently.
TEST(PeftAdapter, AbsurdScalesAndNonFiniteWeightsAreRejected) {
  auto dir = temp_dir("absurd");
  PeftAdapter a = sample_adapter();
  save_peft_adapter(a, dir);
  auto error_with = [&](const std::string& config) {
    std::ofstream(dir / "adapter_config.json") << config;
    try {
      load_peft_adapter(dir);
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const char* alpha : {"0", "-8", "1e308"})
    EXPECT_NE(error_with(std::string(R"({"peft_type": "LORA", "r": 2, "lora_alpha": )") + alpha + "}")
                  .find("key 'lora_alpha' must be in (0, 100000]"),
              std::string::npos)
        << alpha;
  EXPECT_NE(error_with(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 8, "lora_dropout": 1.5})").find("lora_dropout"),
            std::string::npos);
  EXPECT_EQ(error_with(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 8})"), "");
  a.modules.begin()->second.b[3] = std::nanf("");
  save_peft_adapter(a, dir);
  const std::string e = error_with(R"({"peft_type": "LORA", "r": 2, "lora_alpha": 8})");
  EXPECT_NE(e.find("lora_B.weight' holds a non-finite value"), std::string::npos) << e;
  fs::remove_all(dir);
}
