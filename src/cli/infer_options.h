// Options shared by the inference commands (generate, chat, eval): the model directory, adapters, dtypes and
// sampling flags, and loading the decoder + tokenizer they describe.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/quant.h"
#include "infer/adapters.h"
#include "infer/sampler.h"
#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace CLI {
class App;
}

namespace lmtune::cli {

struct ModelArgs {
  std::string model;
  std::vector<std::string> adapters;  // DIR[:scale]
  std::string dtype = "auto";         // weights on the device: auto = f32 on the CPU, the checkpoint's on Vulkan
  std::string compute_dtype = "f32";
  std::string quantize = "none";      // the decoder layers' projections: none | nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0
};
// --model, --adapter (repeatable), --dtype, --compute-dtype, --quantize.
void add_model_options(CLI::App& cmd, ModelArgs& args);
// A --quantize value as a format (nullopt for none); ConfigError for anything else.
std::optional<quant::Format> quantize_option(const std::string& name);
// The decoder on the default device with no adapters attached, its projections fused for inference
// (models::fuse_projections).
models::Decoder load_base_model(const ModelArgs& args);
// The tokenizer of the model directory.
Tokenizer load_model_tokenizer(const ModelArgs& args);

struct SamplingArgs {
  infer::SamplingParams params;
  int max_tokens = 256;
  std::vector<std::string> stops;
};
// --max-tokens, --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --seed, --stop (repeatable).
void add_sampling_options(CLI::App& cmd, SamplingArgs& args);

}  // namespace lmtune::cli
