// The serving engine: continuous batching over one decoder, with a LoRA adapter (or none) per sequence.
//
// Unlike Session (a fixed batch run to completion), sequences join and leave between decode steps:
//   join(seqs)   prefills the new prompts together (left-padded, padding masked out of attention) in a KV cache
//                of their own, samples each one's first token, then regroups that cache's rows and the running
//                rows into the batch cache (models::KvCache::regroup: right-aligned rows, trimmed timeline).
//   step()       one decode forward [B, 1] over every row, then one sample per running sequence. When every
//                running row is greedy (infer::greedy_on_device), steps are pipelined as Session's are: each
//                call records the next step on the device's argmax of the one before, and only then reads that
//                argmax and feeds the tokens, so the device does not wait for the host between steps. The
//                sequences then lag one step. Greedy newcomers' first tokens stay on the device too (fed with
//                the next step's), and join and remove move the next step's ids on the device with the rows:
//                joins and leaves do not stop the pipeline.
//   remove(seqs) drops finished or cancelled sequences (another regroup).
// Rows are kept sorted by adapter name so that each adapter's rows form one contiguous group: every Linear runs
// its base product once over the whole batch and adds each group's (x Aᵀ) Bᵀ · scale to that group's rows
// (models::RowAdapters). A sequence therefore computes the same thing in any batch as alone.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infer/generator.h"
#include "models/decoder.h"

namespace lmtune::infer {

class BatchEngine {
 public:
  // `decoder` (with every adapter a request may name already attached) must outlive the engine.
  BatchEngine(const models::Decoder& decoder, int64_t max_batch, int64_t cache_chunk = 256);

  // Adds sequences (not finished; they must outlive their time in the batch) with their adapter names ("" = the
  // base model alone). Prefills them and samples their first tokens: greedy ones on the device, fed at the next
  // step; others at once, and those that finish at once (max_tokens 1, a stop id) are not kept. Throws
  // ConfigError when the batch would exceed max_batch or an adapter is unknown.
  void join(const std::vector<Sequence*>& seqs, const std::vector<std::string>& adapters);
  // One decode step for every sequence in the batch (finished ones stay until removed; their row is wasted).
  // Pipelined (above), the first step after a join or remove feeds no tokens, and a sequence finishes one call
  // after the step that computed its last token.
  void step();
  // Drops these sequences from the batch (unknown ones are ignored).
  void remove(const std::vector<Sequence*>& seqs);
  // Forgets every sequence and the cache (after a failure).
  void reset();

  const std::vector<Sequence*>& sequences() const { return rows_; }
  int64_t size() const { return int64_t(rows_.size()); }
  int64_t max_batch() const { return max_batch_; }
  bool has_adapter(const std::string& name) const;
  const GenerationStats& stats() const { return stats_; }
  size_t cache_bytes() const { return cache_ ? cache_->bytes() : 0; }

 private:
  struct Row {
    Sequence* seq;
    std::string adapter;
  };
  // Places `incoming` (rows of `from`, or null for none) among the running rows, sorted by adapter; returns where
  // each new row comes from (the running cache or `from`, and its row there).
  std::vector<models::KvCache::RowRef> regroup(std::vector<Row> keep, const std::vector<Row>& incoming,
                                               const models::KvCache* from);
  // next_ids_ for the new rows: each from the running rows' ids or the newcomers' `incoming_ids` (i32 [n]).
  void move_next_ids(const std::vector<models::KvCache::RowRef>& refs, const Tensor& incoming_ids);
  models::RowAdapters groups_of(const std::vector<Row>& rows) const;
  Tensor last_logits(const Tensor& ids, const Tensor& positions, const Tensor& mask, models::KvCache& cache,
                     const models::RowAdapters& groups, bool ids_on_device = false) const;  // -> [B, V]
  void step_pipelined();
  // Reads the recorded argmaxes (waiting for those steps only) and feeds each its rows' tokens.
  void accept_pending();

  const models::Decoder& decoder_;
  int64_t max_batch_, cache_chunk_;
  std::unique_ptr<models::KvCache> cache_;
  std::vector<Sequence*> rows_;
  std::vector<std::string> row_adapter_;
  models::RowAdapters groups_;
  // A device argmax on its way to the host (Backend::read_later) whose tokens are not fed yet: a step's, or
  // greedy newcomers' first ones. Rows that left since are null.
  struct PendingTokens {
    uint64_t ticket = 0;
    std::vector<Sequence*> rows;
    bool decode = true;  // counted as decode tokens
  };
  std::vector<PendingTokens> pending_;
  Tensor next_ids_;  // i32 [B]: the next step's ids on the device, rows_ order (undefined: the host's)
  GenerationStats stats_;
};

}  // namespace lmtune::infer
