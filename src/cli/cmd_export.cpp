// `lmtune export`: re-saves an adapter as PEFT (validated against its model), or with --merge writes a full
// HF-layout model with the adapter folded into the weights (infer/export.h); with --format gguf the same as GGUF
// files for llama.cpp / Ollama, each with a Modelfile beside it (infer/export_gguf.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "infer/export.h"
#include "infer/export_gguf.h"

namespace lmtune::cli {
namespace {

struct ExportArgs {
  std::string model, out, dtype, format, quantize;
  std::vector<std::string> adapters;
  bool merge = false;
};

void export_gguf(const ExportArgs& a, const std::vector<infer::AdapterSpec>& specs) {
  if (!a.dtype.empty()) throw ConfigError("export: --dtype applies to --format hf; use --quantize with gguf");
  if (a.merge) {
    const auto quant = infer::parse_gguf_quant(a.quantize.empty() ? "f16" : a.quantize);
    const auto file = infer::gguf_output_file(a.out, "model.gguf");
    infer::export_merged_gguf(a.model, specs, file, quant);
    spdlog::info("wrote {} and a Modelfile beside it", file.string());
    return;
  }
  if (specs.size() != 1) throw ConfigError("export: without --merge, give exactly one --adapter");
  if (!a.quantize.empty()) throw ConfigError("export: --quantize applies to --merge (GGUF LoRA adapters are f32)");
  const auto file = infer::gguf_output_file(a.out, "adapter.gguf");
  infer::export_adapter_gguf(a.model, specs[0], file);
  spdlog::info("wrote {} and a Modelfile beside it", file.string());
}

void export_hf(const ExportArgs& a, const std::vector<infer::AdapterSpec>& specs) {
  if (!a.quantize.empty()) throw ConfigError("export: --quantize applies to --format gguf");
  if (a.merge) {
    std::optional<DType> dtype;
    if (!a.dtype.empty()) {
      dtype = parse_dtype(a.dtype);
      if (!is_float(*dtype)) throw ConfigError("export: --dtype must be f32, f16 or bf16");
    }
    infer::export_merged(a.model, specs, a.out, dtype);
    spdlog::info("wrote merged model to {}", a.out);
  } else {
    if (specs.size() != 1) throw ConfigError("export: without --merge, give exactly one --adapter");
    if (!a.dtype.empty()) throw ConfigError("export: --dtype applies to --merge only (PEFT adapters are f32)");
    infer::export_adapter(a.model, specs[0], a.out);
    spdlog::info("wrote adapter to {}", a.out);
  }
}

}  // namespace

void add_export_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("export", "Export an adapter (PEFT or GGUF LoRA) or, with --merge, a model with the "
                                           "adapter merged into its weights (HF directory or one GGUF file)");
  auto a = std::make_shared<ExportArgs>();
  cmd->add_option("--model", a->model, "base model (HF directory or GGUF)")->required()->check(CLI::ExistingPath);
  cmd->add_option("--adapter", a->adapters, "PEFT adapter directory, DIR[:scale] (repeatable with --merge)")->required();
  cmd->add_option("--out", a->out, "output directory (gguf: a .gguf file, or a directory for model.gguf / "
                                   "adapter.gguf)")->required();
  cmd->add_flag("--merge", a->merge, "write the full model with the adapter(s) merged");
  cmd->add_option("--format", a->format, "hf (PEFT adapter / HF model directory, default) | gguf")
      ->check(CLI::IsMember({"hf", "peft", "gguf"}));
  cmd->add_option("--dtype", a->dtype, "hf --merge: f32 | f16 | bf16 (default: the base model's)");
  cmd->add_option("--quantize", a->quantize, "gguf --merge: f32 | f16 (default) | q8_0 | q4_k");
  cmd->callback([&device, a] {
    apply_device_option(device);
    std::vector<infer::AdapterSpec> specs;
    for (const auto& s : a->adapters) specs.push_back(infer::parse_adapter_spec(s));
    if (a->format == "gguf") export_gguf(*a, specs);
    else export_hf(*a, specs);
  });
}

}  // namespace lmtune::cli
