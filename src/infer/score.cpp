// Log-likelihood scoring (see score.h).
#include "infer/score.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"

namespace lmtune::infer {
namespace {

using Clock = std::chrono::steady_clock;

// Progress through spdlog, at most every 5 s (long runs only; a short one logs nothing).
class Progress {
 public:
  Progress(std::string label, size_t total) : label_(std::move(label)), total_(total) {}
  void update(size_t done) {
    if (label_.empty()) return;
    auto now = Clock::now();
    if (now - last_ < std::chrono::seconds(5) && done < total_) return;
    if (done == total_ && now - start_ < std::chrono::seconds(5)) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - start_).count();
    spdlog::info("{}: {}/{} records ({:.1f} records/s)", label_, done, total_, s > 0 ? double(done) / s : 0.0);
  }

 private:
  std::string label_;
  size_t total_;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// The hidden state rows that predict each continuation token, with their targets, for one right-padded batch.
struct ScoredRows {
  std::vector<int32_t> rows, targets;
};

// lm_head + log-softmax on the gathered rows, read back in chunks of at most 64 MiB of f32 logits.
void score_with_logits(const models::Decoder& decoder, const Tensor& hidden, const ScoredRows& sr, int top_n,
                       std::vector<TokenScore>& out) {
  const Device dev = decoder.device();
  const int64_t V = decoder.config().vocab_size;
  const int64_t chunk = std::max<int64_t>(1, (int64_t(64) << 20) / (4 * V));
  for (size_t first = 0; first < sr.rows.size(); first += size_t(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(sr.rows.size() - first));
    auto b = sr.rows.begin() + std::ptrdiff_t(first);
    Tensor idx = Tensor::from_ints({b, b + n}, {n}, dev);
    std::vector<float> lp = ops::log_softmax(decoder.logits(ops::embedding(hidden, idx)), -1).to_floats();
    for (int64_t r = 0; r < n; ++r) {
      TokenScore& t = out[first + size_t(r)];
      t.logprob = lp[size_t(r * V + t.id)];
      t.top = top_logprobs(lp.data() + r * V, V, top_n);
    }
  }
}

// Cross-entropy through Decoder::token_losses (fused: the [rows, V] logits never exist); -loss is the log-prob.
void score_with_losses(const models::Decoder& decoder, const Tensor& hidden, const ScoredRows& sr,
                       std::vector<TokenScore>& out) {
  const Device dev = decoder.device();
  const bool fused = decoder.paths().fused_loss;
  const int64_t chunk = fused ? std::max<int64_t>(1, int64_t(sr.rows.size()))
                              : std::max<int64_t>(1, (int64_t(64) << 20) / (4 * decoder.config().vocab_size));
  for (size_t first = 0; first < sr.rows.size(); first += size_t(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(sr.rows.size() - first));
    auto r = sr.rows.begin() + std::ptrdiff_t(first);
    auto t = sr.targets.begin() + std::ptrdiff_t(first);
    Tensor idx = Tensor::from_ints({r, r + n}, {n}, dev);
    Tensor tgt = Tensor::from_ints({t, t + n}, {n}, dev);
    std::vector<float> loss = decoder.token_losses(ops::embedding(hidden, idx), tgt).to_floats();
    for (int64_t i = 0; i < n; ++i) out[first + size_t(i)].logprob = -loss[size_t(i)];
  }
}

}  // namespace

std::vector<TopLogprob> top_logprobs(const float* row, int64_t V, int top_n) {
  const int64_t k = std::min<int64_t>(std::max(top_n, 0), V);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [row](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  std::vector<TopLogprob> out;
  for (int64_t i = 0; i < k; ++i) out.push_back({ids[size_t(i)], row[ids[size_t(i)]]});
  return out;
}

std::vector<std::vector<TokenScore>> score_tokens(const models::Decoder& decoder,
                                                  const std::vector<ScoreRequest>& requests,
                                                  const ScoreOptions& options) {
  if (options.batch_size <= 0) throw ConfigError("score: the batch size must be positive");
  for (const ScoreRequest& r : requests)
    if (r.context.empty()) throw ConfigError("score: a request has no context token");
  NoGrad no_grad;
  const Device dev = decoder.device();
  const int64_t C = decoder.config().hidden_size;
  std::vector<std::vector<TokenScore>> out(requests.size());
  Progress progress(options.progress, requests.size());
  for (size_t first = 0; first < requests.size(); first += size_t(options.batch_size)) {
    const size_t n = std::min(requests.size() - first, size_t(options.batch_size));
    int64_t T = 0;
    for (size_t i = first; i < first + n; ++i)
      T = std::max<int64_t>(T, int64_t(requests[i].context.size() + requests[i].continuation.size()));
    const int64_t B = int64_t(n);
    std::vector<int32_t> ids(size_t(B * T), 0), pos(size_t(B * T), 0);
    ScoredRows sr;
    std::vector<TokenScore> flat;
    for (int64_t b = 0; b < B; ++b) {
      const ScoreRequest& r = requests[first + size_t(b)];
      std::vector<int32_t> row = r.context;
      row.insert(row.end(), r.continuation.begin(), r.continuation.end());
      for (int64_t t = 0; t < T; ++t) {
        ids[size_t(b * T + t)] = t < int64_t(row.size()) ? row[size_t(t)] : 0;
        pos[size_t(b * T + t)] = int32_t(t);
      }
      for (size_t j = 0; j < r.continuation.size(); ++j) {
        sr.rows.push_back(int32_t(b * T + int64_t(r.context.size() + j) - 1));  // the row before token j
        sr.targets.push_back(r.continuation[j]);
        flat.push_back({r.continuation[j], 0, {}});
      }
    }
    if (!sr.rows.empty()) {
      models::ForwardOptions opt;
      models::RowAdapters groups;
      if (options.adapter) {
        if (!options.adapter->empty()) groups.groups.push_back({*options.adapter, 0, B});
        opt.row_adapters = &groups;
      }
      Tensor hidden = decoder.forward_hidden(Tensor::from_ints(ids, {B, T}, dev),
                                             Tensor::from_ints(pos, {B, T}, dev), opt);
      hidden = ops::reshape(ops::contiguous(hidden), {B * T, C});
      if (options.top_n > 0)
        score_with_logits(decoder, hidden, sr, options.top_n, flat);
      else
        score_with_losses(decoder, hidden, sr, flat);
    }
    size_t k = 0;
    for (size_t i = first; i < first + n; ++i)
      for (size_t j = 0; j < requests[i].continuation.size(); ++j) out[i].push_back(std::move(flat[k++]));
    progress.update(first + n);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Records

namespace {

// Calls fn(obj, line, where) for every non-blank line of a JSONL file.
template <typename Fn>
void for_each_record(const std::filesystem::path& file, Fn fn) {
  std::ifstream in(file);
  if (!in) throw FileError(file.string() + ": cannot open");
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file.string() + ":" + std::to_string(n);
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw FileError(where + ": invalid JSON: " + e.what());
    }
    if (!obj.is_object()) throw FileError(where + ": expected a JSON object");
    fn(obj, n, where);
  }
}

std::string string_key(const nlohmann::json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) throw FileError(where + ": expected a string \"" + key + "\"");
  return it->get<std::string>();
}

}  // namespace

std::vector<CompletionRecord> read_completion_records(const std::filesystem::path& file) {
  std::vector<CompletionRecord> out;
  for_each_record(file, [&](const nlohmann::json& obj, int64_t line, const std::string& where) {
    if (obj.contains("choices"))
      throw FileError(where + ": a multiple-choice record (\"choices\"); score it with --choices");
    out.push_back({string_key(obj, "prompt", where), string_key(obj, "completion", where), line});
  });
  if (out.empty()) throw FileError(file.string() + ": no records");
  return out;
}

std::vector<ChoiceRecord> read_choice_records(const std::filesystem::path& file) {
  std::vector<ChoiceRecord> out;
  for_each_record(file, [&](const nlohmann::json& obj, int64_t line, const std::string& where) {
    ChoiceRecord r;
    r.prompt = string_key(obj, "prompt", where);
    r.line = line;
    auto c = obj.find("choices");
    if (c == obj.end() || !c->is_array() || c->size() < 2)
      throw FileError(where + ": expected \"choices\": an array of at least 2 strings");
    for (const auto& v : *c) {
      if (!v.is_string()) throw FileError(where + ": expected \"choices\": an array of at least 2 strings");
      r.choices.push_back(v.get<std::string>());
    }
    auto a = obj.find("answer");
    if (a == obj.end() || !a->is_number_integer() || a->get<int64_t>() < 0 ||
        a->get<int64_t>() >= int64_t(r.choices.size()))
      throw FileError(where + ": expected \"answer\": an index into \"choices\" (0.." +
                      std::to_string(r.choices.size() - 1) + ")");
    r.answer = int(a->get<int64_t>());
    out.push_back(std::move(r));
  });
  if (out.empty()) throw FileError(file.string() + ": no records");
  return out;
}

bool is_choice_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json obj = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    return obj.is_object() && obj.contains("choices");
  }
  return false;
}

ScoreRequest completion_request(const Tokenizer& tok, const std::string& prompt, const std::string& completion,
                                const std::string& where) {
  ScoreRequest r{tok.encode(prompt, true), tok.encode(completion, false)};
  if (r.context.empty())
    throw FileError(where + ": the prompt has no tokens (and the tokenizer adds no BOS to condition on)");
  if (r.continuation.empty()) throw FileError(where + ": the completion has no tokens");
  return r;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<ChoiceScores> score_choices(const models::Decoder& decoder, const Tokenizer& tok,
                                        const std::vector<ChoiceRecord>& records, const std::string& file,
                                        int batch_size) {
  std::vector<ScoreRequest> requests;
  for (const ChoiceRecord& r : records)
    for (size_t c = 0; c < r.choices.size(); ++c)
      requests.push_back(completion_request(tok, r.prompt, r.choices[c],
                                            file + ":" + std::to_string(r.line) + ": choice " + std::to_string(c)));
  ScoreOptions opt;
  opt.batch_size = batch_size;
  opt.progress = "score (choices)";
  std::vector<std::vector<TokenScore>> scores = score_tokens(decoder, requests, opt);
  std::vector<ChoiceScores> out;
  size_t k = 0;
  for (const ChoiceRecord& r : records) {
    ChoiceScores res;
    for (const std::string& choice : r.choices) {
      ChoiceScore cs;
      for (const TokenScore& t : scores[k]) cs.logprob += double(t.logprob);
      cs.tokens = int64_t(scores[k++].size());
      cs.chars = std::max<int64_t>(1, utf8_length(choice));
      res.choices.push_back(cs);
    }
    for (size_t c = 1; c < res.choices.size(); ++c) {
      const ChoiceScore &a = res.choices[c], &best = res.choices[size_t(res.predicted)],
                        &best_norm = res.choices[size_t(res.predicted_norm)];
      if (a.logprob > best.logprob) res.predicted = int(c);
      if (a.logprob / double(a.chars) > best_norm.logprob / double(best_norm.chars)) res.predicted_norm = int(c);
    }
    out.push_back(std::move(res));
  }
  return out;
}

ChoiceAccuracy choice_accuracy(const std::vector<ChoiceRecord>& records, const std::vector<ChoiceScores>& results) {
  ChoiceAccuracy a;
  a.examples = int64_t(records.size());
  if (records.empty()) return a;
  int64_t acc = 0, norm = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    acc += results[i].predicted == records[i].answer;
    norm += results[i].predicted_norm == records[i].answer;
  }
  a.acc = double(acc) / double(a.examples);
  a.acc_norm = double(norm) / double(a.examples);
  return a;
}

}  // namespace lmtune::infer
