// `lmtune train`: runs a recipe end to end — data, model, adapters, the optimizer loop with accumulation,
// clipping, loss scaling and skip handling, validation, checkpoints (and resume), the PEFT adapter, metrics
// files and the progress line. The CLI (cli/cmd_train.cpp) only parses arguments. See docs/training.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "dist/communicator.h"
#include "train/recipe.h"

namespace lmtune {

struct TrainOptions {
  std::string device;      // --device; overrides the recipe's `device` when non-empty
  int log_every = 0;       // progress line every N steps; 0: every step, at most one line per 2 s in long runs
  bool overwrite = false;  // start afresh in a save.dir that already holds checkpoints
  // Data parallelism (docs/training.md, "Several devices"): this process is one of ranks->size() ranks, each on
  // its own device. Null: one device. Rank 0 alone validates and writes metrics, checkpoints and the output.
  dist::Communicator* ranks = nullptr;
};

struct TrainSummary {
  int64_t steps = 0;                  // optimizer steps completed (including resumed ones)
  int64_t steps_this_session = 0;
  double seconds = 0;                 // wall time of this session's steps
  double tokens_per_s = 0;            // of all ranks together
  double final_train_loss = 0;        // the last step's loss
  double final_valid_loss = 0;        // NaN without validation data
  double base_valid_loss = 0;         // before training (NaN when not measured)
  size_t peak_bytes = 0;              // the most device memory held during a step
  int64_t skipped_steps = 0;
  std::filesystem::path output;       // save.dir/adapter (LoRA) or save.dir/model (full)
};

// Runs the recipe. Throws lmtune::Error subclasses with context on bad input, and Error when training diverges
// (train.max_skipped_steps consecutive skipped steps).
TrainSummary train(const Recipe& recipe, const TrainOptions& options = {});

// --dry-run: validates the recipe, model files and data, and prints the resolved recipe, dataset statistics and
// the memory estimate to stdout. Writes nothing but the token cache.
void dry_run(const Recipe& recipe, const TrainOptions& options = {});

}  // namespace lmtune
