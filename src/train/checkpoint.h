// Training checkpoints: save.dir/checkpoints/step-N.h5, written atomically (temporary file, fsync, rename) and
// sealed with CRC-32 checksums, with the last two good ones kept. A checkpoint holds everything needed to continue
// bit-for-bit: trainable weights, optimizer moments, the step, the data cursor, the loss-scale state, skip
// counters, the seed, the resolved recipe and the dataset hash. Layout in docs/training.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

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
  int64_t ranks = 1;                // data-parallel ranks of the run (1 in checkpoints older than the attribute)
};

std::filesystem::path checkpoint_dir(const std::filesystem::path& save_dir);
// Every step-N.h5 in save_dir/checkpoints, readable or not, newest (highest N) first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& save_dir);

// Writes step-<progress.step>.h5 sealed with checksums, verifies it, then applies retention: keeps it and the
// newest keep-1 older checkpoints that verify, and removes the rest (older good ones beyond `keep`, damaged ones,
// and any with a higher step, which belong to a run this one replaced) and stale temporary files. A new file that
// fails verification is removed and the earlier checkpoints are kept.
std::filesystem::path save_checkpoint(const std::filesystem::path& save_dir, const TrainProgress& progress,
                                      const Optimizer& optimizer, const CheckpointMeta& meta, int keep = 2);

// Opens a checkpoint and checks its format, version and checksums (every dataset and attribute); returns its
// metadata. Throws FileError naming the file and the damaged dataset or attribute.
CheckpointMeta verify_checkpoint(const std::filesystem::path& file);

struct ResumePoint {
  std::filesystem::path file;
  CheckpointMeta meta;
};
// The newest checkpoint that verifies, with a warning naming each newer one skipped and why; nullopt when
// save_dir holds no checkpoint at all. Throws Error listing every checkpoint and its problem when none verifies.
std::optional<ResumePoint> find_resume_checkpoint(const std::filesystem::path& save_dir);

// Restores trainable weights and optimizer state into `optimizer` and returns the progress.
TrainProgress load_checkpoint(const std::filesystem::path& file, Optimizer& optimizer);

// Test hook (never set in normal use): LMTUNE_TEST_CRASH_AT=<point>[@<step>] makes the process SIGKILL itself
// when it reaches `point` (at that step, or at any step without @). Points: step-start (before a step's work),
// checkpoint-write (half-way through writing a checkpoint file), checkpoint-done (after a checkpoint and the
// adapter are published). tests/train uses it to kill the trainer at exact moments.
void test_crash_point(const char* point, int64_t step);

}  // namespace lmtune
