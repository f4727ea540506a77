// Packing and batching.
#include "data/batcher.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/random.h"

namespace lmtune {

Batcher::Batcher(const Dataset& data, int batch_size, int seq_len, bool packing, uint64_t seed, bool shuffle)
    : data_(data), batch_size_(batch_size), seq_len_(seq_len), packing_(packing), shuffle_(shuffle), seed_(seed) {
  if (data.samples.empty()) throw ConfigError("batcher: the dataset is empty");
  if (batch_size <= 0 || seq_len <= 1) throw ConfigError("batcher: batch size and sequence length must be positive");
  start_epoch(0);
}

std::vector<int64_t> epoch_order(size_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (shuffle) {  // Fisher-Yates with our portable RNG: the same seed gives the same order everywhere
    Rng rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(epoch) + 1);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.next_u64() % i]);
  }
  return order;
}

void Batcher::start_epoch(int64_t epoch) {
  order_ = epoch_order(data_.samples.size(), seed_, epoch, shuffle_);
  cursor_ = {epoch, 0};
}

void Batcher::set_cursor(Cursor c) {
  start_epoch(c.epoch);
  cursor_.index = std::min<int64_t>(c.index, int64_t(order_.size()));
}

const Sample& Batcher::take() {
  if (epoch_finished()) start_epoch(cursor_.epoch + 1);
  return data_.samples[size_t(order_[size_t(cursor_.index++)])];
}

Batch Batcher::next() {
  std::vector<std::vector<const Sample*>> rows(static_cast<size_t>(batch_size_));
  int T = 0;
  for (auto& row : rows) {
    if (!shuffle_ && epoch_finished()) break;  // evaluation: the last batch may be short
    int used = 0;
    for (;;) {
      const Sample& s = take();
      row.push_back(&s);
      used += int(std::min<size_t>(s.ids.size(), size_t(seq_len_)));
      // A row never spans epochs, so cursors stay simple.
      if (!packing_ || epoch_finished()) break;
      const Sample& peek = data_.samples[size_t(order_[size_t(cursor_.index)])];
      if (used + int(peek.ids.size()) > seq_len_) break;
    }
    T = std::max(T, used);
  }
  rows.erase(std::remove_if(rows.begin(), rows.end(), [](const auto& r) { return r.empty(); }), rows.end());
  if (packing_) T = seq_len_;
  return layout_batch(rows, T);
}

Batch layout_batch(const std::vector<std::vector<const Sample*>>& rows, int T, std::vector<int32_t>* sequence) {
  Batch b;
  b.B = int(rows.size());
  b.T = T;
  size_t n = size_t(b.B) * size_t(T);
  b.ids.assign(n, 0);
  b.targets.assign(n, -100);
  b.positions.assign(n, 0);
  b.doc_ids.assign(n, 0);
  if (sequence) sequence->assign(n, -1);
  int32_t index = 0;
  for (int r = 0; r < b.B; ++r) {
    int t = 0, doc = 0;
    size_t base = size_t(r) * size_t(T);
    for (const Sample* s : rows[size_t(r)]) {
      int len = int(std::min<size_t>(s->ids.size(), size_t(T - t)));
      for (int i = 0; i < len; ++i) {
        b.ids[base + size_t(t + i)] = s->ids[size_t(i)];
        b.positions[base + size_t(t + i)] = i;
        b.doc_ids[base + size_t(t + i)] = doc;
        if (i + 1 < len && s->trainable[size_t(i + 1)]) {
          b.targets[base + size_t(t + i)] = s->ids[size_t(i + 1)];
          if (sequence) (*sequence)[base + size_t(t + i)] = index;
          ++b.trainable_tokens;
        }
      }
      t += len;
      ++doc;
      ++index;
    }
    for (; t < T; ++t) b.doc_ids[base + size_t(t)] = doc++;  // each padding slot attends only to itself
  }
  return b;
}

}  // namespace lmtune
