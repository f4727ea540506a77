// The generation engine (see generator.h).
#include "infer/generator.h"

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune::infer {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::running: return "running";
    case FinishReason::length: return "length";
    case FinishReason::stop_id: return "stop";
    case FinishReason::stop_string: return "stop_string";
  }
  return "?";
}

void GenerationStats::add(const GenerationStats& o) {
  prefill_tokens += o.prefill_tokens;
  decode_tokens += o.decode_tokens;
  prefill_seconds += o.prefill_seconds;
  decode_seconds += o.decode_seconds;
  peak_bytes = std::max(peak_bytes, o.peak_bytes);
}

// ---------------------------------------------------------------------------------------------------------------
// Sequence

Sequence::Sequence(std::vector<int32_t> prompt, const SamplingParams& sampling, StopParams stop,
                   const Tokenizer* tokenizer)
    : prompt_(std::move(prompt)), sampler_(sampling), stop_(std::move(stop)) {
  if (prompt_.empty()) throw ConfigError("generate: the prompt is empty (no tokens)");
  if (stop_.max_tokens < 0) throw ConfigError("generate: max_tokens must be >= 0");
  if (tokenizer) stream_.emplace(*tokenizer, stop_.stop_strings);
  else if (!stop_.stop_strings.empty()) throw ConfigError("generate: stop strings need a tokenizer");
  if (stop_.max_tokens == 0) finish(FinishReason::length);
}

const std::string& Sequence::text() const {
  static const std::string none;
  return stream_ ? stream_->text() : none;
}

std::vector<TokenScore> Sequence::take_logprobs() {
  std::vector<TokenScore> out(logprobs_.begin() + std::ptrdiff_t(logprobs_read_), logprobs_.end());
  logprobs_read_ = logprobs_.size();
  return out;
}

std::string Sequence::take_text() {
  std::string out;
  out.swap(unread_);
  return out;
}

void Sequence::finish(FinishReason reason) {
  if (finished()) return;
  finish_ = reason;
  if (stream_) unread_ += stream_->finish();
}

std::vector<int32_t> Sequence::history() const {
  std::vector<int32_t> h = prompt_;
  h.insert(h.end(), generated_.begin(), generated_.end());
  return h;
}

void Sequence::accept(int32_t id) {
  if (finished()) return;
  if (std::find(stop_.stop_ids.begin(), stop_.stop_ids.end(), id) != stop_.stop_ids.end()) {
    finish(FinishReason::stop_id);
    return;
  }
  generated_.push_back(id);
  last_ = id;
  if (stream_) {
    unread_ += stream_->push(id);
    if (stream_->stopped()) {
      finish(FinishReason::stop_string);
      return;
    }
  }
  if (int(generated_.size()) >= stop_.max_tokens) finish(FinishReason::length);
}

// ---------------------------------------------------------------------------------------------------------------
// Session

Session::Session(const models::Decoder& decoder, int64_t max_batch, SessionOptions options)
    : decoder_(decoder), max_batch_(max_batch), options_(options) {
  if (max_batch <= 0) throw ConfigError("generate: batch size must be positive");
}

Session::~Session() {
  try {
    drop_pending();
  } catch (const std::exception& e) {
    spdlog::warn("generate: while ending a session: {}", e.what());
  }
}

std::vector<int32_t> Session::take_pending() {
  std::vector<int32_t> ids(size_t(pending_.numel()));
  backend(pending_.device()).take_read(pending_read_, ids.data(), ids.size() * sizeof(int32_t));
  pending_ = Tensor();
  return ids;
}

void Session::drop_pending() {
  if (pending_.defined()) take_pending();
}

int64_t Session::running() const {
  int64_t n = 0;
  for (const Sequence* s : rows_) n += !s->finished();
  return n;
}

Tensor Session::forward_last(const Tensor& ids, const Tensor& positions, const Tensor& mask, bool ids_on_device) {
  models::ForwardOptions opt;
  opt.attend_mask = mask;
  opt.ids_on_device = ids_on_device;
  opt.cache = options_.use_cache ? cache_.get() : nullptr;
  Tensor hidden = decoder_.forward_hidden(ids, positions, opt);  // [B, T, C]
  const int64_t B = hidden.dim(0), T = hidden.dim(1), C = hidden.dim(2);
  // Left padding puts every row's last real token in the last column: lm_head runs on [B, C] only.
  Tensor last = ops::reshape(ops::contiguous(ops::slice(hidden, 1, T - 1, T)), {B, C});
  return decoder_.logits(last);
}

PaddedPrompts left_pad_prompts(const std::vector<Sequence*>& seqs) {
  PaddedPrompts r;
  r.B = int64_t(seqs.size());
  for (const Sequence* s : seqs) r.P = std::max<int64_t>(r.P, int64_t(s->prompt().size()));
  const size_t n = size_t(r.B * r.P);
  r.ids.assign(n, 0);
  r.positions.assign(n, 0);
  r.mask.assign(n, 0);
  for (int64_t b = 0; b < r.B; ++b) {
    const auto& p = seqs[size_t(b)]->prompt();
    const int64_t pad = r.P - int64_t(p.size());
    r.padded |= pad > 0;
    for (int64_t j = 0; j < int64_t(p.size()); ++j) {
      size_t i = size_t(b * r.P + pad + j);
      r.ids[i] = p[size_t(j)];
      r.positions[i] = int32_t(j);
      r.mask[i] = 1;
    }
    seqs[size_t(b)]->position_ = int64_t(p.size());
    r.tokens += int64_t(p.size());
  }
  return r;
}

DecodeInputs decode_inputs(const std::vector<Sequence*>& rows) {
  DecodeInputs r;
  r.ids.reserve(rows.size());
  r.positions.reserve(rows.size());
  for (Sequence* s : rows) {
    r.ids.push_back(s->last_);
    r.positions.push_back(int32_t(s->position_));
    if (!s->finished()) {
      ++s->position_;
      ++r.running;
    }
  }
  return r;
}

void sample_rows(const Tensor& logits, const std::vector<Sequence*>& rows) {
  const int64_t B = logits.dim(0), V = logits.dim(1);
  bool full = false, want_logprobs = false;
  int k = 1;
  for (const Sequence* s : rows) {
    if (s->finished()) continue;
    full |= s->sampling().needs_full_row();
    want_logprobs |= s->logprobs_top_ >= 0;
    if (!s->sampling().greedy()) k = std::max(k, s->sampling().top_k);
  }
  std::vector<int32_t> chosen(size_t(B), -1);  // -1: finished row
  if (!full && k == 1) {
    chosen = ops::argmax(logits, -1).to_ints();  // B ints cross to the host
  } else if (!full) {
    k = int(std::min<int64_t>(k, V));
    auto [values, indices] = ops::topk(logits, k);  // B * k candidates cross to the host
    std::vector<float> v = values.to_floats();
    std::vector<int32_t> ids = indices.to_ints();
    for (int64_t b = 0; b < B; ++b) {
      Sequence* s = rows[size_t(b)];
      if (s->finished()) continue;
      int kb = s->sampling().greedy() ? 1 : std::min(s->sampling().top_k, k);
      auto vb = v.begin() + b * k;
      auto ib = ids.begin() + b * k;
      chosen[size_t(b)] = s->sampler_.sample_candidates({vb, vb + kb}, {ib, ib + kb});
    }
  } else {
    std::vector<float> all = logits.to_floats();
    for (int64_t b = 0; b < B; ++b) {
      Sequence* s = rows[size_t(b)];
      if (s->finished()) continue;
      auto row = all.begin() + b * V;
      chosen[size_t(b)] = s->sampler_.sample({row, row + V}, s->sampling().repetition_penalty != 1
                                                                 ? s->history()
                                                                 : std::vector<int32_t>{});
    }
  }
  // Log-probs of the raw distribution (not the sampled one): the whole [B, V] log-softmax crosses to the host.
  std::vector<float> lp;
  if (want_logprobs) lp = ops::log_softmax(logits, -1).to_floats();
  for (int64_t b = 0; b < B; ++b) {
    Sequence* s = rows[size_t(b)];
    const int32_t id = chosen[size_t(b)];
    if (s->finished() || id < 0) continue;
    const size_t before = s->generated_.size();
    s->accept(id);
    if (s->logprobs_top_ >= 0 && s->generated_.size() > before) {
      const float* row = lp.data() + b * V;
      s->logprobs_.push_back({id, row[id], top_logprobs(row, V, s->logprobs_top_)});
    }
  }
}

void Session::prefill(const std::vector<Sequence*>& seqs) {
  if (running() > 0) throw ConfigError("generate: prefill while a batch is still running");
  if (seqs.empty() || int64_t(seqs.size()) > max_batch_)
    throw ConfigError("generate: prefill of " + std::to_string(seqs.size()) + " sequences (batch size " +
                      std::to_string(max_batch_) + ")");
  for (const Sequence* s : seqs)
    if (s->finished()) throw ConfigError("generate: prefill of a finished sequence");
  NoGrad no_grad;
  const Device dev = decoder_.device();
  if (!peak_reset_) {
    backend(dev).reset_peak();
    peak_reset_ = true;
  }
  auto t0 = Clock::now();
  rows_ = seqs;
  drop_pending();  // the last batch's step, computed in vain
  PaddedPrompts pp = left_pad_prompts(seqs);
  const int64_t B = pp.B, P = pp.P;
  const std::vector<int32_t>&ids = pp.ids, &pos = pp.positions, &mask = pp.mask;
  const bool padded = pp.padded;
  stats_.prefill_tokens += pp.tokens;
  if (options_.use_cache) {
    if (!cache_ || cache_->batch() != B)
      cache_ = std::make_unique<models::KvCache>(decoder_.config(), B, decoder_.compute_dtype(), dev,
                                                 options_.cache_chunk);
    cache_->clear();
  } else {
    all_ids_.assign(size_t(B), {});
    all_pos_.assign(size_t(B), {});
    all_mask_.assign(size_t(B), {});
    for (int64_t b = 0; b < B; ++b) {
      all_ids_[size_t(b)].assign(ids.begin() + b * P, ids.begin() + (b + 1) * P);
      all_pos_[size_t(b)].assign(pos.begin() + b * P, pos.begin() + (b + 1) * P);
      all_mask_[size_t(b)].assign(mask.begin() + b * P, mask.begin() + (b + 1) * P);
    }
  }
  Tensor logits = forward_last(Tensor::from_ints(ids, {B, P}, dev), Tensor::from_ints(pos, {B, P}, dev),
                               padded ? Tensor::from_ints(mask, {B, P}, dev) : Tensor());
  sample_rows(logits, rows_);
  stats_.prefill_seconds += seconds_since(t0);
  stats_.peak_bytes = std::max(stats_.peak_bytes, backend(dev).peak_bytes());
}

bool greedy_on_device(const std::vector<Sequence*>& rows) {
  for (const Sequence* s : rows)
    if (!s->finished() && (!s->sampling().greedy() || s->sampling().needs_full_row() || s->logprobs_top_ >= 0))
      return false;
  return true;
}

bool Session::pipelines() const { return options_.use_cache && greedy_on_device(rows_); }

void Session::accept_pending() {
  const std::vector<int32_t> chosen = take_pending();
  for (size_t b = 0; b < rows_.size(); ++b) {
    Sequence* s = rows_[b];
    if (s->finished()) continue;
    s->accept(chosen[b]);
    ++stats_.decode_tokens;
  }
}

int64_t Session::step_pipelined() {
  const Device dev = decoder_.device();
  auto t0 = Clock::now();
  const int64_t B = int64_t(rows_.size());
  // Rows finished by the tokens still pending are computed once more (and ignored), as finished rows are.
  DecodeInputs in = decode_inputs(rows_);
  const bool on_device = pending_.defined();
  const Tensor ids = on_device ? ops::reshape(pending_, {B, 1}) : Tensor::from_ints(in.ids, {B, 1}, dev);
  Tensor next = ops::argmax(forward_last(ids, Tensor::from_ints(in.positions, {B, 1}, dev), Tensor(), on_device), -1);
  const uint64_t read = backend(dev).read_later(*next.buffer(), size_t(next.offset()) * sizeof(int32_t),
                                                size_t(B) * sizeof(int32_t));
  if (on_device) accept_pending();
  pending_ = std::move(next);
  pending_read_ = read;
  stats_.decode_seconds += seconds_since(t0);
  stats_.peak_bytes = std::max(stats_.peak_bytes, backend(dev).peak_bytes());
  return running();
}

int64_t Session::step() {
  if (running() == 0) return 0;
  NoGrad no_grad;
  if (pipelines()) return step_pipelined();
  if (pending_.defined()) {  // no longer pipelined (cannot happen within a batch): take the recorded step's tokens
    accept_pending();
    if (running() == 0) return 0;
  }
  const Device dev = decoder_.device();
  auto t0 = Clock::now();
  const int64_t B = int64_t(rows_.size());
  DecodeInputs in = decode_inputs(rows_);
  stats_.decode_tokens += in.running;
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<int32_t>& pos = in.positions;
  Tensor logits;
  if (options_.use_cache) {
    logits = forward_last(Tensor::from_ints(ids, {B, 1}, dev), Tensor::from_ints(pos, {B, 1}, dev), Tensor());
  } else {
    std::vector<int32_t> fi, fp, fm;
    for (int64_t b = 0; b < B; ++b) {
      all_ids_[size_t(b)].push_back(ids[size_t(b)]);
      all_pos_[size_t(b)].push_back(pos[size_t(b)]);
      all_mask_[size_t(b)].push_back(1);
      fi.insert(fi.end(), all_ids_[size_t(b)].begin(), all_ids_[size_t(b)].end());
      fp.insert(fp.end(), all_pos_[size_t(b)].begin(), all_pos_[size_t(b)].end());
      fm.insert(fm.end(), all_mask_[size_t(b)].begin(), all_mask_[size_t(b)].end());
    }
    const int64_t W = int64_t(all_ids_[0].size());
    bool padded = std::find(fm.begin(), fm.end(), 0) != fm.end();
    logits = forward_last(Tensor::from_ints(fi, {B, W}, dev), Tensor::from_ints(fp, {B, W}, dev),
                          padded ? Tensor::from_ints(fm, {B, W}, dev) : Tensor());
  }
  sample_rows(logits, rows_);
  stats_.decode_seconds += seconds_since(t0);
  stats_.peak_bytes = std::max(stats_.peak_bytes, backend(dev).peak_bytes());
  return running();
}

GenerationStats generate(const models::Decoder& decoder, std::vector<Sequence>& seqs, int64_t max_batch,
                         const std::function<void(size_t, const std::string&)>& on_text, SessionOptions options) {
  Session session(decoder, max_batch, options);
  auto flush = [&](size_t first, size_t n) {
    if (!on_text) return;
    for (size_t i = first; i < first + n; ++i)
      if (std::string piece = seqs[i].take_text(); !piece.empty()) on_text(i, piece);
  };
  for (size_t first = 0; first < seqs.size(); first += size_t(max_batch)) {
    size_t n = std::min(seqs.size() - first, size_t(max_batch));
    std::vector<Sequence*> batch;
    for (size_t i = first; i < first + n; ++i)
      if (!seqs[i].finished()) batch.push_back(&seqs[i]);
    if (batch.empty()) continue;
    session.prefill(batch);
    flush(first, n);
    while (session.step() > 0) flush(first, n);
    flush(first, n);
  }
  return session.stats();
}

}  // namespace lmtune::infer
