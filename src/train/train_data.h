// The data a recipe trains on: the tokenized training file (cached in save.dir/cache), the validation set
// (data.valid, or a seed-determined data.valid_split of the training samples) and the statistics --dry-run
// prints.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "data/dataset.h"
#include "train/recipe.h"

namespace lmtune {

class Tokenizer;

struct TrainData {
  Dataset train;
  Dataset valid;                // empty when there is no validation data
  std::string hash;             // training data + split settings; checkpoints record it
  bool has_valid() const { return !valid.samples.empty(); }
};

// The recipe's data.* keys that reading a file takes (SFT and preference data alike).
DataOptions data_options(const Recipe& recipe);
// Token cache directory of a recipe: <save.dir>/cache.
std::filesystem::path token_cache_dir(const Recipe& recipe);
TrainData load_train_data(const Recipe& recipe, const Tokenizer& tokenizer);

// Packed (or padded) sequences that one epoch of `data` makes, in the seed's epoch-0 order.
int64_t sequences_per_epoch(const Dataset& data, int seq_len, bool packing, uint64_t seed);

}  // namespace lmtune
