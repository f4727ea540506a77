// `lmtune export`: re-saves an adapter as PEFT (validated against its model), or with --merge writes a full
// HF-layout model with the adapter folded into the weights (infer/export.h).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "infer/export.h"

namespace lmtune::cli {

void add_export_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("export", "Export an adapter (PEFT) or, with --merge, a model with the adapter "
                                           "merged into its weights");
  struct Args {
    std::string model, out, dtype;
    std::vector<std::string> adapters;
    bool merge = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model, "base model directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--adapter", a->adapters, "PEFT adapter directory, DIR[:scale] (repeatable with --merge)")->required();
  cmd->add_option("--out", a->out, "output directory")->required();
  cmd->add_flag("--merge", a->merge, "write the full model with the adapter(s) merged");
  cmd->add_option("--dtype", a->dtype, "merged weights: f32 | f16 | bf16 (default: the base model's)");
  cmd->callback([&device, a] {
    apply_device_option(device);
    std::vector<infer::AdapterSpec> specs;
    for (const auto& s : a->adapters) specs.push_back(infer::parse_adapter_spec(s));
    if (a->merge) {
      std::optional<DType> dtype;
      if (!a->dtype.empty()) {
        dtype = parse_dtype(a->dtype);
        if (!is_float(*dtype)) throw ConfigError("export: --dtype must be f32, f16 or bf16");
      }
      infer::export_merged(a->model, specs, a->out, dtype);
      spdlog::info("wrote merged model to {}", a->out);
    } else {
      if (specs.size() != 1) throw ConfigError("export: without --merge, give exactly one --adapter");
      if (!a->dtype.empty()) throw ConfigError("export: --dtype applies to --merge only (PEFT adapters are f32)");
      infer::export_adapter(a->model, specs[0], a->out);
      spdlog::info("wrote adapter to {}", a->out);
    }
  });
}

}  // namespace lmtune::cli
