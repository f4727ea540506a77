// JSONL loading, tokenization per format, over-long handling, and the HDF5 token cache.
#include "data/dataset.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hdf5_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {
namespace {

using json = nlohmann::json;

constexpr int kMaxRecordDepth = 64;  // JSON nesting of one JSONL record

uint64_t fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A fingerprint of everything that decides how text becomes ids.
uint64_t tokenizer_fingerprint(const Tokenizer& tok) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    h = fnv1a(h, tok.token(id));
    h = fnv1a(h, tok.is_special(id) ? "\x01" : "\x00");
  }
  h = fnv1a(h, tok.bos_token() + "|" + tok.eos_token() + "|" + tok.chat_template());
  // Probe the whole pipeline (normalizer, pre-tokenizer, post-processor) with a fixed text.
  for (int32_t id : tok.encode(" Hello, World! 123 \t\n ünïcode 漢字 <0x41>", true)) h = fnv1a(h, std::to_string(id) + ",");
  return h;
}

std::string get_string(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) throw FileError(where + ": missing key \"" + key + "\"");
  if (!it->is_string()) throw FileError(where + ": key \"" + key + "\" must be a string");
  return it->get<std::string>();
}

std::string detect_format(const json& obj, const std::string& where) {
  if (obj.contains("messages")) return "chat";
  if (obj.contains("prompt") || obj.contains("completion")) return "completion";
  if (obj.contains("text")) return "text";
  throw FileError(where + ": cannot tell the format: expected a \"text\", \"prompt\"/\"completion\" or \"messages\" key");
}

void append_eos(const Tokenizer& tok, Sample& s, uint8_t trainable) {
  auto eos = tok.eos_ids();
  if (eos.empty()) return;
  if (!s.ids.empty() && s.ids.back() == eos[0]) return;
  s.ids.push_back(eos[0]);
  s.trainable.push_back(trainable);
}

Sample tokenize_chat(const json& obj, const Tokenizer& tok, const ChatTemplate* chat, const std::string& where);

}  // namespace

std::string data_hash(const std::string& text, const Tokenizer& tok, const std::string& settings) {
  uint64_t h = fnv1a(0xcbf29ce484222325ull, text);
  h = fnv1a(h, settings);
  h ^= tokenizer_fingerprint(tok) * 0x9e3779b97f4a7c15ull;
  return hex64(h);
}

Sample tokenize_record(const std::string& line, const Tokenizer& tok, std::string& format, const std::string& where,
                       const ChatTemplate* chat) {
  // A record nests a few levels (messages, tool_calls, function, arguments); a deeper one would overflow the stack
  // where the chat template copies it recursively (30,000 '[' did, found by fuzz_dataset), so it is refused here.
  auto limit = [&where](int depth, json::parse_event_t, json&) {
    if (depth > kMaxRecordDepth)
      throw FileError(where + ": invalid JSON: nested deeper than " + std::to_string(kMaxRecordDepth) + " levels");
    return true;
  };
  json obj;
  try {
    obj = json::parse(line, limit);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double (1e400)
    throw FileError(where + ": invalid JSON: " + e.what());
  }
  if (!obj.is_object()) throw FileError(where + ": each line must be a JSON object");
  std::string fmt = format == "auto" ? detect_format(obj, where) : format;
  if (format == "auto") format = fmt;
  Sample s;
  if (fmt == "text") {
    s.ids = tok.encode(get_string(obj, "text", where), true);
    s.trainable.assign(s.ids.size(), 1);
    if (!s.trainable.empty()) s.trainable[0] = 0;  // the first token is never predicted
    append_eos(tok, s, 1);
  } else if (fmt == "completion") {
    std::vector<int32_t> prompt = tok.encode(get_string(obj, "prompt", where), true);
    std::vector<int32_t> completion = tok.encode(get_string(obj, "completion", where), false);
    s.ids = prompt;
    s.trainable.assign(prompt.size(), 0);
    s.ids.insert(s.ids.end(), completion.begin(), completion.end());
    s.trainable.resize(s.ids.size(), 1);
    append_eos(tok, s, 1);
  } else if (fmt == "chat") {
    s = tokenize_chat(obj, tok, chat, where);
  } else {
    throw FileError(where + ": unknown data format '" + fmt + "'");
  }
  if (!s.trainable.empty()) s.trainable[0] = 0;  // nothing precedes the first token, so it is never a target
  return s;
}

namespace {

Sample tokenize_chat(const json& obj, const Tokenizer& tok, const ChatTemplate* chat, const std::string& where) {
  // const operator[] on a missing key is undefined behaviour in nlohmann::json: look the key up.
  const auto found = obj.find("messages");
  if (found == obj.end() || !found->is_array() || found->empty())
    throw FileError(where + ": \"messages\" must be a non-empty array");
  const json& messages = *found;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw FileError(where + ": messages[" + std::to_string(i) + "] must be an object with string \"role\" and \"content\"");
  }
  if (tok.chat_template().empty())
    throw FileError(where + ": chat-format data, but the model's tokenizer_config.json has no chat_template");
  try {
    std::optional<ChatTemplate> local;
    if (!chat) chat = &local.emplace(tok);
    ChatTemplate::Example ex = chat->encode_with_assistant_mask(messages);
    return Sample{std::move(ex.ids), std::move(ex.assistant_mask)};
  } catch (const Error& e) {
    throw FileError(where + ": " + e.what());
  }
}

bool read_cache(const std::filesystem::path& file, Dataset& ds) {
  if (!std::filesystem::exists(file)) return false;
  try {
    Hdf5File h5 = Hdf5File::open(file);
    if (h5.attr_string("/", "hash") != ds.hash) return false;
    auto ids = h5.read<int32_t>("ids");
    auto trainable = h5.read<uint8_t>("trainable");
    auto offsets = h5.read<int64_t>("offsets");
    auto stats = h5.read<int64_t>("stats");
    if (stats.size() != 7 || offsets.empty() || ids.size() != trainable.size() || size_t(offsets.back()) != ids.size())
      return false;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      Sample s;
      s.ids.assign(ids.begin() + offsets[i], ids.begin() + offsets[i + 1]);
      s.trainable.assign(trainable.begin() + offsets[i], trainable.begin() + offsets[i + 1]);
      ds.samples.push_back(std::move(s));
    }
    ds.stats = {stats[0], stats[1], stats[2], stats[3], stats[4], stats[5], stats[6], h5.attr_string("/", "format")};
    return true;
  } catch (const Error& e) {
    spdlog::warn("ignoring unreadable token cache {}: {}", file.string(), e.what());
    ds.samples.clear();
    return false;
  }
}

void write_cache(const std::filesystem::path& file, const Dataset& ds) {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trainable;
  std::vector<int64_t> offsets{0};
  for (const auto& s : ds.samples) {
    ids.insert(ids.end(), s.ids.begin(), s.ids.end());
    trainable.insert(trainable.end(), s.trainable.begin(), s.trainable.end());
    offsets.push_back(int64_t(ids.size()));
  }
  const DatasetStats& st = ds.stats;
  std::vector<int64_t> stats{st.lines, st.samples, st.tokens, st.trainable_tokens, st.truncated, st.dropped_overlong,
                             st.rejected_untrainable};
  // The cache only saves tokenizing again: a write that fails (a full disk) leaves no file behind and the run
  // goes on with the samples in memory.
  try {
    std::filesystem::create_directories(file.parent_path());
    save_hdf5_atomic(file, [&](Hdf5File& h5) {
      h5.write<int32_t>("ids", ids, {int64_t(ids.size())});
      h5.write<uint8_t>("trainable", trainable, {int64_t(trainable.size())});
      h5.write<int64_t>("offsets", offsets, {int64_t(offsets.size())});
      h5.write<int64_t>("stats", stats, {int64_t(stats.size())});
      h5.set_attr("/", "hash", ds.hash);
      h5.set_attr("/", "format", ds.stats.format);
    });
  } catch (const std::exception& e) {
    spdlog::warn("token cache {} not written ({}); continuing without it", file.string(), e.what());
  }
}

}  // namespace

Dataset load_dataset(const std::filesystem::path& file, const Tokenizer& tok, const DataOptions& opt,
                     const std::filesystem::path& cache_dir) {
  if (opt.max_seq_len < 2) throw ConfigError("data.max_seq_len must be at least 2");
  std::string text = read_file_text(file);
  Dataset ds;
  ds.hash = data_hash(text, tok, opt.format + "|" + std::to_string(opt.max_seq_len) + "|" + opt.overlong);
  std::filesystem::path cache_file = cache_dir.empty() ? std::filesystem::path() : cache_dir / ("tokenized-" + ds.hash + ".h5");
  if (!cache_dir.empty() && read_cache(cache_file, ds)) {
    spdlog::debug("token cache hit: {}", cache_file.string());
    return ds;
  }
  std::string format = opt.format;
  std::optional<ChatTemplate> chat;  // parsed once for the whole file
  if (!tok.chat_template().empty()) chat.emplace(tok);
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  DatasetStats& st = ds.stats;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++st.lines;
    std::string where = file.string() + ":" + std::to_string(line_no);
    Sample s = tokenize_record(line, tok, format, where, chat ? &*chat : nullptr);
    if (int64_t(s.ids.size()) > opt.max_seq_len) {
      if (opt.overlong == "error")
        throw FileError(where + ": sample has " + std::to_string(s.ids.size()) + " tokens, more than data.max_seq_len = " +
                        std::to_string(opt.max_seq_len) + " (set data.overlong to truncate or drop)");
      if (opt.overlong == "drop") {
        ++st.dropped_overlong;
        continue;
      }
      s.ids.resize(size_t(opt.max_seq_len));
      s.trainable.resize(size_t(opt.max_seq_len));
      ++st.truncated;
    }
    int64_t n_train = 0;
    for (uint8_t t : s.trainable) n_train += t;
    if (n_train == 0) {
      ++st.rejected_untrainable;
      continue;
    }
    st.tokens += int64_t(s.ids.size());
    st.trainable_tokens += n_train;
    ++st.samples;
    ds.samples.push_back(std::move(s));
  }
  st.format = format;
  if (ds.samples.empty())
    throw FileError(file.string() + ": no usable samples (" + std::to_string(st.lines) + " lines read, " +
                    std::to_string(st.rejected_untrainable) + " with no trainable token, e.g. chat data without an "
                    "assistant turn, " + std::to_string(st.dropped_overlong) + " dropped as over-long)");
  if (st.rejected_untrainable)
    spdlog::warn("{}: rejected {} sample(s) with no trainable token", file.string(), st.rejected_untrainable);
  if (!cache_dir.empty()) write_cache(cache_file, ds);
  return ds;
}

}  // namespace lmtune
