// Helpers for the inference tests: the decoder fixtures (tests/models/fixtures), a tiny Qwen3-shaped model with
// the qwen3 tokenizer fixture written once per test binary, and temporary directories.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/init_model.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::infer::test {

namespace fs = std::filesystem;

inline fs::path model_fixture(const std::string& name) {
  return fs::path(LMTUNE_SOURCE_DIR) / "tests" / "models" / "fixtures" / name;
}

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"llama",  "llama3",      "mistral", "qwen2",    "qwen3",
                                                 "gemma2", "gemma3_text", "mixtral", "qwen3_moe",
                                                 "gemma4_text", "gemma4_moe", "qwen3_next", "qwen3_5_moe"};
  return names;
}

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("lmtune_infer_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  TempDir(const TempDir&) = delete;
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

inline fs::path tokenizer_fixture() {
  fs::path dir = fs::path(LMTUNE_SOURCE_DIR) / "tests/fixtures/npm/qwen3/models";
  if (!fs::exists(dir / "tokenizer.json")) throw std::runtime_error("run scripts/fetch_fixtures.sh: missing " + dir.string());
  return dir;
}

// A tiny random qwen3 model (2 layers, hidden 64) with the qwen3 tokenizer, written once per process.
inline const fs::path& tiny_model_dir() {
  static TempDir dir;
  static fs::path model = [] {
    models::InitOptions o;
    o.preset = fs::path(LMTUNE_SOURCE_DIR) / "configs/presets/tiny-qwen3.yaml";
    o.tokenizer_dir = tokenizer_fixture();
    o.out = dir.path / "tiny";
    o.seed = 3;
    o.dtype = DType::f32;
    models::init_model_dir(o);
    return o.out;
  }();
  return model;
}

inline const Tokenizer& tiny_tokenizer() {
  static Tokenizer t = Tokenizer::load(tiny_model_dir());
  return t;
}

// max |a - b| / max |b|.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace lmtune::infer::test
