// Shared options of the inference commands (see infer_options.h).
#include "cli/infer_options.h"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "infer/model_checks.h"
#include "io/hf_config.h"
#include "models/weights.h"

namespace lmtune::cli {

std::optional<quant::Format> quantize_option(const std::string& name) {
  if (name == "none") return std::nullopt;
  std::optional<quant::Format> f = quant::parse_format(name);
  if (!f) throw ConfigError("--quantize: '" + name + "' is not one of none, nf4, q4_0, q4_k, q5_k, q6_k, q8_0");
  return f;
}

void add_model_options(CLI::App& cmd, ModelArgs& a) {
  cmd.add_option("--model", a.model, "model directory (config.json, safetensors, tokenizer files) or GGUF file")
      ->required()
      ->check(CLI::ExistingPath);
  cmd.add_option("--adapter", a.adapters, "PEFT LoRA adapter directory, optionally with a scale: DIR[:scale] "
                                          "(repeatable)");
  cmd.add_option("--dtype", a.dtype, "weight dtype on the device: auto | f32 | f16 | bf16 "
                                     "(auto: f32 on the CPU, the checkpoint's dtype on Vulkan)");
  cmd.add_option("--compute-dtype", a.compute_dtype,
                 "activation dtype: f32 | f16 | bf16 | auto (the weights' dtype)");
  cmd.add_option("--quantize", a.quantize,
                 "quantize the decoder layers' projections at load: none | nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0")
      ->check(CLI::IsMember({"none", "nf4", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"}));
}

models::Decoder load_base_model(const ModelArgs& a) {
  const Device dev = default_device();
  DType weights = DType::f32;
  if (a.dtype != "auto") {
    weights = parse_dtype(a.dtype);
  } else if (dev.is_vulkan()) {
    ModelConfig c = load_model_config(a.model);
    if (!c.torch_dtype.empty()) weights = parse_dtype(c.torch_dtype);
  }
  DType compute = a.compute_dtype == "auto" ? weights : parse_dtype(a.compute_dtype);
  if (!is_float(weights) || !is_float(compute)) throw ConfigError("--dtype / --compute-dtype must be f32, f16 or bf16");
  spdlog::debug("loading {} on {} ({} weights, {} compute, quantize {})", a.model, dev.str(), dtype_name(weights),
                dtype_name(compute), a.quantize);
  models::Decoder decoder = models::load_decoder(a.model, weights, compute, dev, quantize_option(a.quantize));
  models::fuse_projections(decoder.weights());
  return decoder;
}

Tokenizer load_model_tokenizer(const ModelArgs& a) {
  Tokenizer t = Tokenizer::load(a.model);
  infer::check_tokenizer_fits(t, load_model_config(a.model), a.model);
  return t;
}

void add_sampling_options(CLI::App& cmd, SamplingArgs& s) {
  cmd.add_option("--max-tokens", s.max_tokens, "most tokens to generate")->default_val(256);
  cmd.add_option("--temperature", s.params.temperature, "0 = greedy")->default_val(0);
  cmd.add_option("--top-k", s.params.top_k, "keep the k most likely tokens (0 = off)")->default_val(0);
  cmd.add_option("--top-p", s.params.top_p, "nucleus sampling, in (0, 1]")->default_val(1);
  cmd.add_option("--min-p", s.params.min_p, "drop tokens below min_p x the top probability, in [0, 1]")->default_val(0);
  cmd.add_option("--repetition-penalty", s.params.repetition_penalty, "HF repetition penalty (1 = off)")->default_val(1);
  cmd.add_option("--seed", s.params.seed, "sampling seed")->default_val(0);
  cmd.add_option("--stop", s.stops, "stop string (repeatable); not included in the output");
}

}  // namespace lmtune::cli
