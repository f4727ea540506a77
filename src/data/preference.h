// Preference data for DPO, ORPO and SimPO: JSONL records of a prompt and a chosen and a rejected response.
//   {"prompt": "...", "chosen": "...", "rejected": "..."}             plain text: prompt (with BOS), then the
//                                                                      response and EOS, as completion data
//   {"prompt": [messages], "chosen": msg | [messages] | "...", ...}   rendered with the model's chat template
// Each response becomes one Sample (prompt + response) whose trainable mask marks the response tokens only: those
// are the tokens whose log-probabilities the objectives sum. Pairs are batched together (PairBatcher), the chosen
// and rejected sequence of a pair always in the same micro-batch.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "data/dataset.h"

namespace lmtune {

struct PreferencePair {
  Sample chosen, rejected;
};

struct PreferenceDataset {
  std::vector<PreferencePair> pairs;
  DatasetStats stats;  // counts pairs (samples), and tokens over both sequences
  std::string hash;
};

// Tokenizes one JSONL record (from `where`, e.g. "pairs.jsonl:12"). `chat` is the parsed chat template, needed
// for message-list records (parsed on demand when null). Throws FileError naming `where` for bad records.
PreferencePair tokenize_preference_record(const std::string& json_line, const Tokenizer& tokenizer,
                                          const std::string& where, const ChatTemplate* chat = nullptr);

// Reads a JSONL file of pairs. options.overlong applies per pair (a pair is dropped or an error when either
// sequence is longer than max_seq_len; truncate cuts each); options.format must be auto, text or chat.
PreferenceDataset load_preference_dataset(const std::filesystem::path& file, const Tokenizer& tokenizer,
                                          const DataOptions& options);

// Moves a seed-determined fraction of the pairs (at least one, leaving at least one) into a new dataset.
PreferenceDataset split_preference_dataset(PreferenceDataset& train, double fraction, uint64_t seed);

// One micro-batch of pairs: sequence 2p is pair p's chosen response, 2p + 1 its rejected one.
struct PairBatch {
  Batch batch;
  int64_t pairs = 0;
  std::vector<int32_t> sequence;         // [B*T]: the sequence whose target each slot holds, -1 for none
  std::vector<int64_t> response_tokens;  // [2·pairs]: targets of each sequence
};

// Visits pairs in a seed-shuffled order per epoch (file order without shuffle), `pairs_per_batch` pairs per
// micro-batch. Unpacked, each sequence gets a row padded to the longest; packed, the sequences fill rows of
// seq_len one after another (attention stays within each, as Batcher's packing).
class PairBatcher {
 public:
  PairBatcher(const PreferenceDataset& data, int pairs_per_batch, int seq_len, bool packing, uint64_t seed,
              bool shuffle = true);

  PairBatch next();  // wraps into the next epoch when shuffling; without shuffle the last batch may be short
  bool epoch_finished() const { return cursor_.index >= int64_t(order_.size()); }
  Batcher::Cursor cursor() const { return cursor_; }
  void set_cursor(Batcher::Cursor c);

 private:
  void start_epoch(int64_t epoch);

  const PreferenceDataset& data_;
  int pairs_per_batch_, seq_len_;
  bool packing_, shuffle_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  Batcher::Cursor cursor_;
};

}  // namespace lmtune
