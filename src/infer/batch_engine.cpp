// The continuous-batching engine (see batch_engine.h).
#include "infer/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune::infer {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// The ids a read_later ticket copied to the host (waiting for its step only).
std::vector<int32_t> take_ids(Device device, uint64_t ticket, size_t n) {
  std::vector<int32_t> ids(n);
  backend(device).take_read(ticket, ids.data(), n * sizeof(int32_t));
  return ids;
}
}  // namespace

BatchEngine::BatchEngine(const models::Decoder& decoder, int64_t max_batch, int64_t cache_chunk)
    : decoder_(decoder), max_batch_(max_batch), cache_chunk_(cache_chunk) {
  if (max_batch <= 0) throw ConfigError("serve: batch size must be positive");
}

bool BatchEngine::has_adapter(const std::string& name) const {
  if (name.empty()) return true;
  for (const auto& layer : decoder_.weights().layers)
    for (const models::Linear* l : {&layer.attn.q, &layer.attn.k, &layer.attn.v, &layer.attn.o, &layer.mlp.gate,
                                    &layer.mlp.up, &layer.mlp.down})
      for (const models::LoraAdapter& a : l->adapters)
        if (a.name == name) return true;
  return false;
}

models::RowAdapters BatchEngine::groups_of(const std::vector<Row>& rows) const {
  models::RowAdapters out;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i;
    while (j < rows.size() && rows[j].adapter == rows[i].adapter) ++j;
    if (!rows[i].adapter.empty()) out.groups.push_back({rows[i].adapter, int64_t(i), int64_t(j)});
    i = j;
  }
  return out;
}

Tensor BatchEngine::last_logits(const Tensor& ids, const Tensor& positions, const Tensor& mask,
                                models::KvCache& cache, const models::RowAdapters& groups, bool ids_on_device) const {
  models::ForwardOptions opt;
  opt.attend_mask = mask;
  opt.ids_on_device = ids_on_device;
  opt.cache = &cache;
  opt.row_adapters = &groups;
  Tensor hidden = decoder_.forward_hidden(ids, positions, opt);  // [B, T, C]
  const int64_t B = hidden.dim(0), T = hidden.dim(1), C = hidden.dim(2);
  // Left padding puts every row's last real token in the last column: lm_head runs on [B, C] only.
  return decoder_.logits(ops::reshape(ops::contiguous(ops::slice(hidden, 1, T - 1, T)), {B, C}));
}

std::vector<models::KvCache::RowRef> BatchEngine::regroup(std::vector<Row> keep, const std::vector<Row>& incoming,
                                                          const models::KvCache* from) {
  struct Placed {
    Row row;
    models::KvCache::RowRef ref;
  };
  std::vector<Placed> all;
  for (size_t i = 0; i < keep.size(); ++i) {
    auto it = std::find(rows_.begin(), rows_.end(), keep[i].seq);
    all.push_back({keep[i], {cache_.get(), int64_t(it - rows_.begin())}});
  }
  for (size_t i = 0; i < incoming.size(); ++i) all.push_back({incoming[i], {from, int64_t(i)}});
  all.erase(std::remove_if(all.begin(), all.end(), [](const Placed& p) { return p.row.seq == nullptr; }), all.end());
  std::stable_sort(all.begin(), all.end(), [](const Placed& a, const Placed& b) { return a.row.adapter < b.row.adapter; });
  if (!cache_)
    cache_ = std::make_unique<models::KvCache>(decoder_.config(), 0, decoder_.compute_dtype(), decoder_.device(),
                                               cache_chunk_, /*bound_sliding=*/false);
  std::vector<models::KvCache::RowRef> refs;
  std::vector<Row> rows;
  for (const Placed& p : all) {
    refs.push_back(p.ref);
    rows.push_back(p.row);
  }
  cache_->regroup(refs);
  rows_.clear();
  row_adapter_.clear();
  for (const Row& r : rows) {
    rows_.push_back(r.seq);
    row_adapter_.push_back(r.adapter);
  }
  groups_ = groups_of(rows);
  return refs;
}

void BatchEngine::move_next_ids(const std::vector<models::KvCache::RowRef>& refs, const Tensor& incoming_ids) {
  Tensor ids = Tensor::empty({int64_t(refs.size())}, DType::i32, decoder_.device());
  std::vector<CopyRegion> running, fresh;
  const size_t to = size_t(ids.offset()) * 4;
  for (size_t i = 0; i < refs.size(); ++i) {
    const bool new_row = refs[i].cache != cache_.get();
    const Tensor& src = new_row ? incoming_ids : next_ids_;
    (new_row ? fresh : running).push_back({size_t(src.offset() + refs[i].row * src.strides()[0]) * 4, to + i * 4, 4});
  }
  if (!running.empty()) backend(ids.device()).copy(*next_ids_.buffer(), *ids.buffer(), running);
  if (!fresh.empty()) backend(ids.device()).copy(*incoming_ids.buffer(), *ids.buffer(), fresh);
  next_ids_ = refs.empty() ? Tensor() : ids;
}

void BatchEngine::join(const std::vector<Sequence*>& seqs, const std::vector<std::string>& adapters) {
  if (seqs.empty()) return;
  if (adapters.size() != seqs.size())
    throw ConfigError("serve: " + std::to_string(seqs.size()) + " sequences with " + std::to_string(adapters.size()) +
                      " adapter names");
  if (size() + int64_t(seqs.size()) > max_batch_)
    throw ConfigError("serve: " + std::to_string(seqs.size()) + " new sequences do not fit a batch of " +
                      std::to_string(max_batch_) + " holding " + std::to_string(size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i]->finished()) throw ConfigError("serve: a finished sequence cannot join the batch");
    if (!has_adapter(adapters[i])) throw ConfigError("serve: no adapter named '" + adapters[i] + "' is loaded");
  }
  NoGrad no_grad;
  const Device dev = decoder_.device();
  auto t0 = Clock::now();

  // The newcomers, sorted by adapter so that their prefill is grouped too.
  std::vector<size_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return adapters[a] < adapters[b]; });
  std::vector<Row> incoming;
  std::vector<Sequence*> batch;
  for (size_t i : order) {
    incoming.push_back({seqs[i], adapters[i]});
    batch.push_back(seqs[i]);
  }
  PaddedPrompts pp = left_pad_prompts(batch);
  const int64_t B = pp.B, P = pp.P;
  const std::vector<int32_t>&ids = pp.ids, &pos = pp.positions, &mask = pp.mask;
  const bool padded = pp.padded;
  stats_.prefill_tokens += pp.tokens;
  models::KvCache fresh(decoder_.config(), B, decoder_.compute_dtype(), dev, cache_chunk_, /*bound_sliding=*/false);
  Tensor logits = last_logits(Tensor::from_ints(ids, {B, P}, dev), Tensor::from_ints(pos, {B, P}, dev),
                              padded ? Tensor::from_ints(mask, {B, P}, dev) : Tensor(), fresh, groups_of(incoming));
  std::vector<Row> keep;
  for (size_t i = 0; i < rows_.size(); ++i) keep.push_back({rows_[i], row_adapter_[i]});
  // Greedy newcomers joining rows whose next ids are on the device (or no rows): their first tokens stay there too.
  if (greedy_on_device(batch) && (rows_.empty() || next_ids_.defined())) {
    const Tensor first = ops::argmax(logits, -1);
    pending_.push_back({backend(dev).read_later(*first.buffer(), size_t(first.offset()) * 4, size_t(B) * 4), batch,
                        false});
    move_next_ids(regroup(std::move(keep), incoming, &fresh), first);
  } else {
    sample_rows(logits, batch);
    // Sequences already done (one token asked for, or a stop id first) never enter the batch.
    for (Row& r : incoming)
      if (r.seq->finished()) r.seq = nullptr;
    accept_pending();  // the newcomers' sampling above waited for those steps already
    next_ids_ = Tensor();
    regroup(std::move(keep), incoming, &fresh);
  }
  stats_.prefill_seconds += seconds_since(t0);
}

void BatchEngine::accept_pending() {
  std::vector<PendingTokens> pending = std::move(pending_);
  pending_.clear();
  for (const PendingTokens& p : pending) {
    const std::vector<int32_t> chosen = take_ids(decoder_.device(), p.ticket, p.rows.size());
    for (size_t b = 0; b < p.rows.size(); ++b) {
      if (!p.rows[b] || p.rows[b]->finished()) continue;
      p.rows[b]->accept(chosen[b]);
      stats_.decode_tokens += p.decode;
    }
  }
}

void BatchEngine::step_pipelined() {
  const Device dev = decoder_.device();
  auto t0 = Clock::now();
  const int64_t B = size();
  const bool on_device = next_ids_.defined();
  if (!on_device) accept_pending();  // the host's ids: every token fed first
  // Rows finished by the tokens still pending are computed once more (and ignored), as finished rows are.
  DecodeInputs in = decode_inputs(rows_);
  const Tensor ids = on_device ? ops::reshape(next_ids_, {B, 1}) : Tensor::from_ints(in.ids, {B, 1}, dev);
  Tensor next = ops::argmax(
      last_logits(ids, Tensor::from_ints(in.positions, {B, 1}, dev), Tensor(), *cache_, groups_, on_device), -1);
  const uint64_t read = backend(dev).read_later(*next.buffer(), size_t(next.offset()) * sizeof(int32_t),
                                                size_t(B) * sizeof(int32_t));
  accept_pending();
  pending_.push_back({read, rows_, true});
  next_ids_ = std::move(next);
  stats_.decode_seconds += seconds_since(t0);
}

void BatchEngine::step() {
  if (rows_.empty()) return;
  NoGrad no_grad;
  if (greedy_on_device(rows_)) return step_pipelined();
  accept_pending();
  next_ids_ = Tensor();
  const Device dev = decoder_.device();
  auto t0 = Clock::now();
  const int64_t B = size();
  DecodeInputs in = decode_inputs(rows_);
  stats_.decode_tokens += in.running;
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<int32_t>& pos = in.positions;
  Tensor logits = last_logits(Tensor::from_ints(ids, {B, 1}, dev), Tensor::from_ints(pos, {B, 1}, dev), Tensor(),
                              *cache_, groups_);
  sample_rows(logits, rows_);
  stats_.decode_seconds += seconds_since(t0);
}

void BatchEngine::remove(const std::vector<Sequence*>& seqs) {
  std::vector<Row> keep;
  for (size_t i = 0; i < rows_.size(); ++i)
    if (std::find(seqs.begin(), seqs.end(), rows_[i]) == seqs.end()) keep.push_back({rows_[i], row_adapter_[i]});
  if (keep.size() == rows_.size()) return;
  NoGrad no_grad;
  for (PendingTokens& p : pending_)  // the sequences that leave may be gone before their tokens arrive
    for (Sequence*& s : p.rows)
      if (std::find(seqs.begin(), seqs.end(), s) != seqs.end()) s = nullptr;
  const std::vector<models::KvCache::RowRef> refs = regroup(std::move(keep), {}, nullptr);
  if (next_ids_.defined()) move_next_ids(refs, Tensor());
}

void BatchEngine::reset() {
  for (const PendingTokens& p : pending_) {
    try {  // the steps in flight, if the device still answers
      take_ids(decoder_.device(), p.ticket, p.rows.size());
    } catch (const std::exception&) {
    }
  }
  pending_.clear();
  next_ids_ = Tensor();
  rows_.clear();
  row_adapter_.clear();
  groups_ = {};
  cache_.reset();
}

}  // namespace lmtune::infer
