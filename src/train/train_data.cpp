// Training and validation data for a recipe (see train_data.h).
#include "train/train_data.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/random.h"
#include "data/batcher.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {
namespace fs = std::filesystem;

fs::path token_cache_dir(const Recipe& r) { return fs::path(r.save.dir) / "cache"; }

DataOptions data_options(const Recipe& r) {
  DataOptions o;
  o.format = r.data.format;
  o.max_seq_len = r.data.max_seq_len;
  o.overlong = r.data.overlong;
  return o;
}

namespace {

// Moves a seed-determined fraction of `train`'s samples into `valid` (at least one, and at least one left).
void split(Dataset& train, Dataset& valid, double fraction, uint64_t seed) {
  const size_t n = train.samples.size();
  size_t k = size_t(std::llround(double(n) * fraction));
  k = std::clamp<size_t>(k, 1, n - 1);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  Rng rng(seed ^ 0x5b1d5eedull);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.next_u64() % i]);
  std::vector<uint8_t> to_valid(n, 0);
  for (size_t i = 0; i < k; ++i) to_valid[order[i]] = 1;
  std::vector<Sample> kept;
  for (size_t i = 0; i < n; ++i) (to_valid[i] ? valid.samples : kept).push_back(std::move(train.samples[i]));
  train.samples = std::move(kept);
  auto recount = [](Dataset& d) {
    d.stats.samples = int64_t(d.samples.size());
    d.stats.tokens = d.stats.trainable_tokens = 0;
    for (const Sample& s : d.samples) {
      d.stats.tokens += int64_t(s.ids.size());
      for (uint8_t t : s.trainable) d.stats.trainable_tokens += t;
    }
  };
  valid.stats = train.stats;
  valid.stats.lines = 0;
  valid.stats.truncated = valid.stats.dropped_overlong = valid.stats.rejected_untrainable = 0;
  recount(train);
  recount(valid);
}

}  // namespace

TrainData load_train_data(const Recipe& r, const Tokenizer& tok) {
  TrainData d;
  const fs::path cache = token_cache_dir(r);
  d.train = load_dataset(r.data.train, tok, data_options(r), cache);
  d.hash = d.train.hash;
  if (!r.data.valid.empty()) {
    d.valid = load_dataset(r.data.valid, tok, data_options(r), cache);
    d.hash += "+valid:" + d.valid.hash;
  } else if (r.data.valid_split > 0) {
    if (d.train.samples.size() < 2)
      throw ConfigError("data.valid_split: " + r.data.train + " has only " + std::to_string(d.train.samples.size()) +
                        " usable sample(s), too few to split");
    split(d.train, d.valid, r.data.valid_split, r.train.seed);
    d.hash += "+split:" + std::to_string(r.data.valid_split) + ":" + std::to_string(r.train.seed);
  }
  return d;
}

int64_t sequences_per_epoch(const Dataset& data, int seq_len, bool packing, uint64_t seed) {
  Batcher b(data, 1, seq_len, packing, seed);
  int64_t n = 0;
  while (!b.epoch_finished()) {
    b.next();
    ++n;
  }
  return n;
}

}  // namespace lmtune
