// Training checkpoints: save.dir/checkpoints/step-N.h5, written atomically (temporary file, fsync, rename) with
// the last two kept. A checkpoint holds everything needed to continue bit-for-bit: trainable weights, optimizer
// moments, the step, the data cursor, the loss-scale state, skip counters, the seed, the resolved recipe and the
// dataset hash. Layout in docs/training.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "data/batcher.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"

namespace lmtune {

// Where a run stands between optimizer steps.
struct TrainProgress {
  int64_t step = 0;                 // optimizer steps completed (the scheduler's position)
  Batcher::Cursor cursor;           // next training sample
  LossScaler scaler;
  int64_t consecutive_skips = 0;
  int64_t skipped_steps = 0;
  int64_t tokens_seen = 0;
  double elapsed_s = 0;             // training time before this session
  uint64_t seed = 0;                // the RNG seed (data order, LoRA init and dropout masks derive from it)
};

struct CheckpointMeta {
  std::string recipe_yaml;          // the resolved recipe that wrote it
  std::string dataset_hash;         // of the training data (file, tokenizer, options) and the split
};

std::filesystem::path checkpoint_dir(const std::filesystem::path& save_dir);
// Writes step-<progress.step>.h5 and removes all but the newest `keep` checkpoints and stale temporary files.
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir, const TrainProgress& progress,
                                      const Optimizer& optimizer, const CheckpointMeta& meta, int keep = 2);
// The newest complete checkpoint in save_dir, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& save_dir);
// Reads the metadata only (to validate a resume before touching the model).
CheckpointMeta read_checkpoint_meta(const std::filesystem::path& file);
// Restores trainable weights and optimizer state into `optimizer` and returns the progress.
TrainProgress load_checkpoint(const std::filesystem::path& file, Optimizer& optimizer);

// Test hook (never set in normal use): LMTUNE_TEST_CRASH_AT=<point>[@<step>] makes the process SIGKILL itself
// when it reaches `point` (at that step, or at any step without @). Points: step-start (before a step's work),
// checkpoint-write (half-way through writing a checkpoint file), checkpoint-done (after a checkpoint and the
// adapter are published). tests/train uses it to kill the trainer at exact moments.
void test_crash_point(const char* point, int64_t step);

}  // namespace lmtune
