// The scoring reference (scripts/reference_logprobs.py, tests/infer/fixtures/logprobs/): the Llama fixture model
// with the character-level tokenizer written there, its prompt/completion and multiple-choice records, and the
// float64 log-probs expected for them (base model, and with the sgd_step LoRA adapter). Shared by the infer, cli
// and serve tests.
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "infer/infer_test_util.h"

namespace lmtune::infer::test {

inline fs::path logprobs_fixture(const std::string& name = "") {
  fs::path dir = fs::path(LMTUNE_SOURCE_DIR) / "tests/infer/fixtures/logprobs";
  return name.empty() ? dir : dir / name;
}

inline fs::path logprobs_adapter() { return fs::path(LMTUNE_SOURCE_DIR) / "tests/train/fixtures/sgd_step/adapter"; }

// A model directory (written once per process): the llama fixture's config and weights + the fixture tokenizer.
inline const fs::path& logprobs_model_dir() {
  static TempDir dir;
  static fs::path model = [] {
    fs::path out = dir.path / "charllama";
    fs::create_directories(out);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(model_fixture("llama") / f, out / f);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(logprobs_fixture(f), out / f);
    return out;
  }();
  return model;
}

inline const nlohmann::json& logprobs_expected() {
  static nlohmann::json j = [] {
    std::ifstream in(logprobs_fixture("expected.json"));
    return nlohmann::json::parse(in);
  }();
  return j;
}

// Σ of the expected log-probs of record `i` ("base" or "lora").
inline double expected_sum(const std::string& which, size_t i) {
  double s = 0;
  for (const auto& t : logprobs_expected()[which][i]) s += t["logprob"].get<double>();
  return s;
}

// fp32 tolerance for a log-prob (the reference is float64).
constexpr double kLogprobTol = 2e-4;

}  // namespace lmtune::infer::test
