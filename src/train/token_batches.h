// Token batches for benchmarks that need no dataset (`lmtune bench train`): random ids from a fixed seed, and
// a safetensors file of them ("input_ids", i32 [steps, B, T]) so another framework (bench/peft_baseline.py)
// trains on identical data. Each row is one document: the target of position t is the id at t + 1, as a
// causal-LM trainer with labels = input_ids computes it (the last position has no target).
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "data/batcher.h"

namespace lmtune {

struct TokenBatches {
  int64_t steps = 0, B = 0, T = 0;
  std::vector<int32_t> ids;  // [steps, B, T]

  Batch batch(int64_t step) const { return batch(step, 0, B); }  // the causal-LM batch of one step
  // Rows [first_row, first_row + rows) of it: one rank's share when the B rows are several ranks' batches.
  Batch batch(int64_t step, int64_t first_row, int64_t rows) const;
};

// Ids drawn from a Zipf distribution over [0, vocab) (p(id) ∝ 1 / (id + 1)), as natural text roughly is, so a
// model has something to learn: the loss falls from about ln(vocab) towards the distribution's entropy.
TokenBatches random_token_batches(int64_t vocab, int64_t steps, int64_t B, int64_t T, uint64_t seed);

void save_token_batches(const std::filesystem::path& file, const TokenBatches& batches);
// Throws FileError naming the file when it has no i32 "input_ids" of rank 3, or an id outside [0, vocab).
TokenBatches load_token_batches(const std::filesystem::path& file, int64_t vocab);

}  // namespace lmtune
