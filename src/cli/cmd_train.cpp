// `lmtune train RECIPE [key=value ...] [--dry-run]`: parses arguments; train/trainer.h does the work.
#include <CLI/CLI.hpp>

#include <memory>

#include "cli/commands.h"
#include "cli/ranks.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace lmtune::cli {

void add_train_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("train", "Fine-tune a model (LoRA or full) as a recipe says (docs/training.md)");
  struct Args {
    std::string recipe;
    std::vector<std::string> overrides;
    bool dry_run = false;
    std::string devices;
    TrainOptions options;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("recipe", args->recipe, "recipe YAML (docs/recipes.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("overrides", args->overrides, "key=value overrides, e.g. lora.rank=8 train.steps=100");
  cmd->add_flag("--dry-run", args->dry_run,
                "validate the recipe, model and data; print the resolved recipe, dataset statistics and a memory "
                "estimate; train nothing");
  cmd->add_option("--log-every", args->options.log_every,
                  "progress line every N steps (default: every step, at most one per 2 s in runs over 200 steps)");
  cmd->add_flag("--overwrite", args->options.overwrite,
                "start afresh even if save.dir already holds checkpoints (they are replaced as the run saves)");
  cmd->add_option("--devices", args->devices,
                  "train on several devices of this host, one rank each, e.g. 0,1 (runs mpirun; docs/training.md)");
  cmd->callback([args, &device] {
    apply_device_option(device);
    Recipe recipe = load_recipe(args->recipe, args->overrides);
    if (args->dry_run) {
      args->options.device = device;
      return dry_run(recipe, args->options);
    }
    run_on_ranks(args->devices, device.empty() ? recipe.device : device, [&](const RankSetup& setup) {
      apply_device_option(setup.device);
      TrainOptions options = args->options;
      options.device = setup.device;
      options.ranks = setup.ranks;
      train(recipe, options);
    });
  });
}

}  // namespace lmtune::cli
