// Turns tokenized samples into fixed-size batches: packed (several samples per row, with per-document positions
// and doc ids so attention never crosses documents) or one sample per padded row. Shuffles per epoch from a seed,
// and exposes a cursor so training can resume exactly where it stopped.
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace lmtune {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> ids;        // [B*T]; padding uses id 0
  std::vector<int32_t> targets;    // [B*T]; next token where it is trainable and in the same document, else -100
  std::vector<int32_t> positions;  // [B*T]; restart at 0 for each document
  std::vector<int32_t> doc_ids;    // [B*T]; distinct per document within a row; each padding slot its own id
  int64_t trainable_tokens = 0;    // targets != -100
};

// Rows of samples laid out as a Batch of width T: each row's samples one after another (a sample cut where the row
// ends), the rest padding. When `sequence` is given it receives, for each of the B*T slots, the index of the
// sample (counted over all rows in order) whose target the slot holds, or -1 where the target is -100.
Batch layout_batch(const std::vector<std::vector<const Sample*>>& rows, int T,
                   std::vector<int32_t>* sequence = nullptr);

// The order in which an epoch visits n items: 0..n-1, or a Fisher-Yates shuffle drawn from (seed, epoch), the same
// on every platform.
std::vector<int64_t> epoch_order(size_t n, uint64_t seed, int64_t epoch, bool shuffle);

class Batcher {
 public:
  struct Cursor {
    int64_t epoch = 0;
    int64_t index = 0;  // next sample within the epoch's order
  };

  // shuffle=false visits samples in file order (evaluation).
  Batcher(const Dataset& data, int batch_size, int seq_len, bool packing, uint64_t seed, bool shuffle = true);

  Batch next();                       // wraps into the next epoch (reshuffled) when the data runs out
  bool epoch_finished() const { return cursor_.index >= int64_t(order_.size()); }
  Cursor cursor() const { return cursor_; }
  void set_cursor(Cursor c);

 private:
  void start_epoch(int64_t epoch);
  const Sample& take();

  const Dataset& data_;
  int batch_size_, seq_len_;
  bool packing_, shuffle_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  Cursor cursor_;
};

}  // namespace lmtune
