// Preference pairs: parsing, tokenization (through the SFT formats' tokenize_record), and pair batching.
#include "data/preference.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/random.h"
#include "io/atomic_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {
namespace {

using json = nlohmann::json;

const json& require(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw FileError(where + ": missing key \"" + key + "\" (a preference record has \"prompt\", "
                                       "\"chosen\" and \"rejected\")");
  return *it;
}

void check_messages(const json& list, const std::string& key, const std::string& where) {
  if (!list.is_array() || list.empty())
    throw FileError(where + ": \"" + key + "\" must be a non-empty list of messages");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw FileError(where + ": " + key + "[" + std::to_string(i) +
                      "] must be an object with string \"role\" and \"content\"");
  }
}

// A chat response: one assistant message, a list of messages, or a string (the assistant's content).
json response_messages(const json& r, const std::string& key, const std::string& where) {
  if (r.is_string()) return json::array({{{"role", "assistant"}, {"content", r}}});
  json list = r.is_object() ? json::array({r}) : r;
  if (!list.is_array())
    throw FileError(where + ": \"" + key + "\" must be a string, a message object or a list of messages");
  check_messages(list, key, where);
  return list;
}

// prompt + response rendered by the chat template; only assistant tokens after the rendered prompt (with its
// generation prompt) are trainable, so assistant turns inside the prompt are context, not response.
Sample chat_response(const json& prompt, const json& response, const Tokenizer& tok, const ChatTemplate& chat,
                     const std::string& where) {
  json messages = prompt;
  for (const json& m : response) messages.push_back(m);
  std::string format = "chat";
  Sample s = tokenize_record(json{{"messages", messages}}.dump(), tok, format, where, &chat);
  std::vector<int32_t> prefix;
  try {
    prefix = chat.encode_prompt(prompt);
  } catch (const Error& e) {
    throw FileError(where + ": " + e.what());
  }
  size_t k = 0;
  while (k < prefix.size() && k < s.ids.size() && prefix[k] == s.ids[k]) ++k;
  std::fill(s.trainable.begin(), s.trainable.begin() + int64_t(k), uint8_t(0));
  return s;
}

Sample text_response(const std::string& prompt, const std::string& response, const Tokenizer& tok,
                     const std::string& where) {
  std::string format = "completion";
  return tokenize_record(json{{"prompt", prompt}, {"completion", response}}.dump(), tok, format, where);
}

int64_t count(const std::vector<uint8_t>& v) { return std::count(v.begin(), v.end(), uint8_t(1)); }

}  // namespace

PreferencePair tokenize_preference_record(const std::string& line, const Tokenizer& tok, const std::string& where,
                                          const ChatTemplate* chat) {
  json obj;
  try {
    obj = json::parse(line);
  } catch (const json::parse_error& e) {
    throw FileError(where + ": invalid JSON: " + e.what());
  }
  if (!obj.is_object()) throw FileError(where + ": each line must be a JSON object");
  const json& prompt = require(obj, "prompt", where);
  const json& chosen = require(obj, "chosen", where);
  const json& rejected = require(obj, "rejected", where);
  PreferencePair p;
  if (prompt.is_string()) {
    for (const char* key : {"chosen", "rejected"})
      if (!obj[key].is_string())
        throw FileError(where + ": key \"" + key + "\" must be a string when \"prompt\" is a string");
    p.chosen = text_response(prompt.get<std::string>(), chosen.get<std::string>(), tok, where);
    p.rejected = text_response(prompt.get<std::string>(), rejected.get<std::string>(), tok, where);
    return p;
  }
  if (!prompt.is_array())
    throw FileError(where + ": key \"prompt\" must be a string or a list of chat messages");
  check_messages(prompt, "prompt", where);
  if (tok.chat_template().empty())
    throw FileError(where + ": chat-format pairs, but the model's tokenizer_config.json has no chat_template");
  std::optional<ChatTemplate> local;
  if (!chat) chat = &local.emplace(tok);
  p.chosen = chat_response(prompt, response_messages(chosen, "chosen", where), tok, *chat, where);
  p.rejected = chat_response(prompt, response_messages(rejected, "rejected", where), tok, *chat, where);
  return p;
}

PreferenceDataset load_preference_dataset(const std::filesystem::path& file, const Tokenizer& tok,
                                          const DataOptions& opt) {
  if (opt.max_seq_len < 2) throw ConfigError("data.max_seq_len must be at least 2");
  if (opt.format != "auto" && opt.format != "text" && opt.format != "chat")
    throw ConfigError("data.format: '" + opt.format + "' is not a preference format (auto, text or chat; "
                      "each record's prompt type decides)");
  const std::string text = read_file_text(file);
  PreferenceDataset ds;
  ds.hash = data_hash(text, tok, "preference|" + std::to_string(opt.max_seq_len) + "|" + opt.overlong);
  std::optional<ChatTemplate> chat;  // parsed once for the whole file
  if (!tok.chat_template().empty()) chat.emplace(tok);
  DatasetStats& st = ds.stats;
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++st.lines;
    const std::string where = file.string() + ":" + std::to_string(line_no);
    PreferencePair p = tokenize_preference_record(line, tok, where, chat ? &*chat : nullptr);
    const size_t longest = std::max(p.chosen.ids.size(), p.rejected.ids.size());
    if (int64_t(longest) > opt.max_seq_len) {
      if (opt.overlong == "error")
        throw FileError(where + ": a response has " + std::to_string(longest) + " tokens with its prompt, more than "
                        "data.max_seq_len = " + std::to_string(opt.max_seq_len) +
                        " (set data.overlong to truncate or drop)");
      if (opt.overlong == "drop") {
        ++st.dropped_overlong;
        continue;
      }
      for (Sample* s : {&p.chosen, &p.rejected}) {
        s->ids.resize(std::min(s->ids.size(), size_t(opt.max_seq_len)));
        s->trainable.resize(s->ids.size());
      }
      ++st.truncated;
    }
    const int64_t nc = count(p.chosen.trainable), nr = count(p.rejected.trainable);
    if (nc == 0 || nr == 0) {  // an empty (or cut off) response has no log-probability to compare
      ++st.rejected_untrainable;
      continue;
    }
    st.tokens += int64_t(p.chosen.ids.size() + p.rejected.ids.size());
    st.trainable_tokens += nc + nr;
    ++st.samples;
    ds.pairs.push_back(std::move(p));
  }
  st.format = "preference";
  if (ds.pairs.empty())
    throw FileError(file.string() + ": no usable preference pairs (" + std::to_string(st.lines) + " lines read, " +
                    std::to_string(st.rejected_untrainable) + " with an empty response after the prompt, " +
                    std::to_string(st.dropped_overlong) + " dropped as over-long)");
  if (st.rejected_untrainable)
    spdlog::warn("{}: rejected {} pair(s) with an empty or cut-off response", file.string(), st.rejected_untrainable);
  return ds;
}

PreferenceDataset split_preference_dataset(PreferenceDataset& train, double fraction, uint64_t seed) {
  const size_t n = train.pairs.size();
  if (n < 2)
    throw ConfigError("data.valid_split: only " + std::to_string(n) + " usable preference pair(s), too few to split");
  const size_t k = std::clamp<size_t>(size_t(std::llround(double(n) * fraction)), 1, n - 1);
  std::vector<int64_t> order = epoch_order(n, seed ^ 0x5b1d5eedull, -1, true);
  std::vector<uint8_t> to_valid(n, 0);
  for (size_t i = 0; i < k; ++i) to_valid[size_t(order[i])] = 1;
  PreferenceDataset valid;
  valid.hash = train.hash;
  std::vector<PreferencePair> kept;
  for (size_t i = 0; i < n; ++i) (to_valid[i] ? valid.pairs : kept).push_back(std::move(train.pairs[i]));
  train.pairs = std::move(kept);
  for (PreferenceDataset* d : {&train, &valid}) {
    d->stats.format = "preference";
    d->stats.samples = int64_t(d->pairs.size());
    d->stats.tokens = d->stats.trainable_tokens = 0;
    for (const PreferencePair& p : d->pairs) {
      d->stats.tokens += int64_t(p.chosen.ids.size() + p.rejected.ids.size());
      d->stats.trainable_tokens += count(p.chosen.trainable) + count(p.rejected.trainable);
    }
  }
  return valid;
}

PairBatcher::PairBatcher(const PreferenceDataset& data, int pairs_per_batch, int seq_len, bool packing,
                         uint64_t seed, bool shuffle)
    : data_(data), pairs_per_batch_(pairs_per_batch), seq_len_(seq_len), packing_(packing), shuffle_(shuffle),
      seed_(seed) {
  if (data.pairs.empty()) throw ConfigError("pair batcher: the preference dataset is empty");
  if (pairs_per_batch <= 0 || seq_len <= 1)
    throw ConfigError("pair batcher: batch size and sequence length must be positive");
  start_epoch(0);
}

void PairBatcher::start_epoch(int64_t epoch) {
  order_ = epoch_order(data_.pairs.size(), seed_, epoch, shuffle_);
  cursor_ = {epoch, 0};
}

void PairBatcher::set_cursor(Batcher::Cursor c) {
  start_epoch(c.epoch);
  cursor_.index = std::min<int64_t>(c.index, int64_t(order_.size()));
}

PairBatch PairBatcher::next() {
  std::vector<const Sample*> seqs;
  for (int i = 0; i < pairs_per_batch_; ++i) {
    if (epoch_finished()) {
      if (!shuffle_) break;  // evaluation: the last batch may be short
      start_epoch(cursor_.epoch + 1);
    }
    const PreferencePair& p = data_.pairs[size_t(order_[size_t(cursor_.index++)])];
    seqs.push_back(&p.chosen);
    seqs.push_back(&p.rejected);
  }
  std::vector<std::vector<const Sample*>> rows;
  int T = 0, used = 0;
  for (const Sample* s : seqs) {
    const int len = int(std::min<size_t>(s->ids.size(), size_t(seq_len_)));
    if (rows.empty() || !packing_ || used + len > seq_len_) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(s);
    used += len;
    T = std::max(T, used);
  }
  if (packing_) T = seq_len_;
  PairBatch pb;
  pb.pairs = int64_t(seqs.size() / 2);
  pb.batch = layout_batch(rows, T, &pb.sequence);
  pb.response_tokens.assign(seqs.size(), 0);
  for (int32_t s : pb.sequence)
    if (s >= 0) ++pb.response_tokens[size_t(s)];
  return pb;
}

}  // namespace lmtune
