// `lmtune init`: a randomly initialised model in HuggingFace layout (config.json, generation_config.json,
// model.safetensors, tokenizer files) from a preset YAML whose keys are config.json keys
// (configs/presets/*.yaml). The CLI only parses arguments; everything else is here so that tests can run it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/hf_config.h"

namespace lmtune::models {

struct InitOptions {
  std::string arch;                    // model_type; may be empty when the preset names it
  std::filesystem::path preset;        // YAML file
  std::filesystem::path tokenizer_dir; // optional: tokenizer files to copy, vocab size and bos/eos from it
  std::filesystem::path out;
  uint64_t seed = 0;
  std::optional<DType> dtype;          // default: the preset's torch_dtype, else f32
  bool overwrite = false;              // replace an existing model in `out`
};

struct InitResult {
  ModelConfig config;
  int64_t parameters = 0;
  DType dtype = DType::f32;
};

// Converts YAML (a preset) to JSON: plain scalars become booleans, null, integers or floats when they read as
// such; quoted scalars stay strings. Throws ConfigError naming the file.
nlohmann::json yaml_file_to_json(const std::filesystem::path& path);

// The vocabulary size of a tokenizer directory: 1 + the largest id in tokenizer.json (model vocab and
// added_tokens), or vocab.json + added_tokens.json. Throws FileError when neither exists.
int64_t tokenizer_vocab_size(const std::filesystem::path& dir);

InitResult init_model_dir(const InitOptions& options);

}  // namespace lmtune::models
