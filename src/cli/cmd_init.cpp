// `lmtune init`: writes a randomly initialised model in HuggingFace layout from a preset
// (configs/presets/*.yaml). The work is models::init_model_dir; this file parses the arguments.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <memory>

#include "cli/commands.h"
#include "io/hf_config.h"
#include "models/init_model.h"

namespace lmtune::cli {

void add_init_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("init", "Write a randomly initialised model (config.json, model.safetensors, "
                                         "generation_config.json, tokenizer files) from a preset");
  struct Args {
    models::InitOptions init;
    std::string preset, tokenizer, out, dtype;
  };
  auto args = std::make_shared<Args>();
  std::string types;
  for (const std::string& t : supported_model_types()) types += (types.empty() ? "" : ", ") + t;
  cmd->add_option("--arch", args->init.arch, "model_type: " + types + " (default: the preset's model_type)");
  cmd->add_option("--config", args->preset, "preset YAML with config.json keys (configs/presets/*.yaml)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--tokenizer", args->tokenizer,
                  "directory with tokenizer files to copy; gives vocab_size and bos/eos ids unless the preset does")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--out", args->out, "output model directory")->required();
  cmd->add_option("--seed", args->init.seed, "random seed")->default_val(0);
  cmd->add_option("--dtype", args->dtype, "f32 | bf16 | f16 (default: the preset's torch_dtype, else f32)");
  cmd->add_flag("--overwrite", args->init.overwrite, "replace a model already in --out");
  cmd->callback([args, &device] {
    apply_device_option(device);
    args->init.preset = args->preset;
    args->init.tokenizer_dir = args->tokenizer;
    args->init.out = args->out;
    if (!args->dtype.empty()) args->init.dtype = parse_dtype(args->dtype);
    models::InitResult r = models::init_model_dir(args->init);
    spdlog::info("wrote {}: {} ({}), {} layers, hidden {}, vocab {}, {:.2f}M parameters in {}", args->out,
                 r.config.model_type, r.config.architecture.empty() ? "-" : r.config.architecture,
                 r.config.num_hidden_layers, r.config.hidden_size, r.config.vocab_size, double(r.parameters) / 1e6,
                 dtype_name(r.dtype));
  });
}

}  // namespace lmtune::cli
