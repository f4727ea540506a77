// Adapter and merged-model export (see export.h).
#include "infer/export.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/quant.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "models/adapters.h"
#include "models/hf_config_writer.h"
#include "models/moe.h"
#include "models/weights.h"

namespace lmtune::infer {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw FileError(file.string() + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (1e400)
    throw FileError(file.string() + ": invalid JSON: " + e.what());
  }
}

void write_json(const fs::path& file, const nlohmann::json& j) {
  std::ofstream out(file);
  out << j.dump(2) << "\n";
  if (!out) throw FileError(file.string() + ": cannot write");
}

const char* torch_name(DType t) {
  switch (t) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

}  // namespace

void export_adapter(const fs::path& model_dir, const AdapterSpec& spec, const fs::path& out) {
  NoGrad no_grad;
  models::Decoder decoder = models::load_decoder(model_dir, DType::f32, DType::f32, Device::cpu());
  PeftAdapter in = load_adapter(decoder, spec);
  PeftAdapter p = models::extract_peft(decoder.weights(), spec.name, in.rank, in.alpha, in.rslora, in.dropout,
                                       in.base_model.empty() ? model_dir.string() : in.base_model);
  p.target_modules = in.target_modules;
  if (spec.multiplier != 1)
    for (auto& [module, lw] : p.modules)
      for (float& v : lw.b) v *= spec.multiplier;
  models::warn_unless_peft_reads(decoder.config().model_type, p);
  save_peft_adapter(p, out);
}

void merge_adapters(models::Decoder& decoder, const std::vector<AdapterSpec>& adapters) {
  NoGrad no_grad;
  for (const AdapterSpec& spec : adapters) load_adapter(decoder, spec);
  for (models::Linear* lin : decoder.weights().linears()) {
    if (lin->adapters.empty()) continue;
    if (!lin->weight.defined() && lin->qweight.defined()) {
      lin->weight = quant::dequantize(lin->qweight, DType::f32);
      lin->qweight = {};
    }
    lin->weight = lin->merged_weight();
    lin->adapters.clear();
  }
  for (const models::NamedExperts& ne : models::named_experts(decoder.weights())) {
    if (ne.adapters->empty()) continue;
    *ne.weight = models::merged_expert_weight(*ne.weight, *ne.adapters);
    ne.adapters->clear();
  }
}

void export_merged(const fs::path& model_dir, const std::vector<AdapterSpec>& adapters, const fs::path& out,
                   std::optional<DType> dtype) {
  NoGrad no_grad;
  if (fs::exists(out) && fs::equivalent(out, model_dir))
    throw ConfigError("export: --out must differ from --model (" + out.string() + ")");
  ModelConfig config = load_model_config(model_dir / "config.json");
  DType out_dtype = dtype ? *dtype : config.torch_dtype.empty() ? DType::f32 : parse_dtype(config.torch_dtype);
  // Merge in f32 on the CPU, whatever the output dtype: W + scale · B A is rounded once, at the end.
  models::Decoder decoder = models::load_decoder(model_dir, DType::f32, DType::f32, Device::cpu());
  merge_adapters(decoder, adapters);
  fs::create_directories(out);
  models::save_weights(decoder.config(), decoder.weights(), out, out_dtype);
  // config.json: the input's own keys (so transformers reads the same model), with the new dtype.
  nlohmann::json cfg = read_json(model_dir / "config.json");
  if (cfg.contains("dtype")) cfg["dtype"] = torch_name(out_dtype);
  else cfg["torch_dtype"] = torch_name(out_dtype);
  write_json(out / "config.json", cfg);
  if (fs::exists(model_dir / "generation_config.json"))
    fs::copy_file(model_dir / "generation_config.json", out / "generation_config.json",
                  fs::copy_options::overwrite_existing);
  else
    write_json(out / "generation_config.json", models::hf_generation_config_json(decoder.config()));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                        "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                        "chat_template.json"})
    if (fs::exists(model_dir / f)) fs::copy_file(model_dir / f, out / f, fs::copy_options::overwrite_existing);
}

}  // namespace lmtune::infer
