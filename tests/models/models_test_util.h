// Helpers for the decoder tests: fixture paths (tests/models/fixtures, written by scripts/reference_models.py),
// the reference outputs, the devices to run on, and error measures.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace lmtune::models::test {

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(LMTUNE_SOURCE_DIR) / "tests" / "models" / "fixtures" / name;
}

inline const std::vector<std::string>& fixture_names() {
  static const std::vector<std::string> names = {"llama",  "llama3",      "mistral",        "qwen2",
                                                 "qwen3",  "gemma2",      "gemma3_text",    "llama_yarn",
                                                 "qwen2_longrope", "llama_dynamic", "mixtral", "qwen3_moe",
                                                 "gemma4_text", "gemma4_moe", "qwen3_next", "qwen3_5_moe"};
  return names;
}

// reference.safetensors of one fixture, as host vectors / tensors.
struct Reference {
  explicit Reference(const std::string& name) : file(fixture_dir(name) / "reference.safetensors") {}
  SafetensorsFile file;
  const SafetensorsTensor& at(const std::string& n) const { return file.at(n); }
  std::vector<float> floats(const std::string& n) const { return at(n).to_f32(); }
  std::vector<int32_t> ints(const std::string& n) const {
    const SafetensorsTensor& t = at(n);
    std::vector<int32_t> v(size_t(t.numel()));
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  }
  Tensor int_tensor(const std::string& n, Device d) const { return Tensor::from_ints(ints(n), at(n).shape, d); }
  std::vector<std::string> grad_names() const {
    std::vector<std::string> out;
    for (const auto& t : file.tensors())
      if (t.name.rfind("grad.", 0) == 0) out.push_back(t.name.substr(5));
    return out;
  }
};

// max |a - b| / max |b|: the error relative to the reference's scale (robust to entries near zero).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

// The devices tests run on: the CPU, and the first Vulkan device when one is present.
inline std::vector<std::string> test_devices() {
  std::vector<std::string> d = {"cpu"};
  if (!vk::list_devices().empty()) d.push_back("vulkan:0");
  return d;
}

}  // namespace lmtune::models::test
