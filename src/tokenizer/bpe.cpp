// The BPE model of tokenizer.json: vocab + ranked merges, applied per word with a priority queue over a
// linked list of symbols (O(n log n), as HF's Word::merge_all), with byte_fallback, unk/fuse_unk,
// ignore_merges, continuing_subword_prefix / end_of_word_suffix and a word → ids cache.
#include <algorithm>
#include <queue>

#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {
namespace {
uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

std::string json_string(const json& j, const Origin& origin) {
  if (!j.is_string()) origin.fail("expected a string");
  return j.get<std::string>();
}
}  // namespace

Bpe::Bpe(const json& model, const Origin& origin) {
  if (!model.is_object()) origin.fail("expected an object");
  std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") origin.at("type").fail("unsupported model type '" + type + "' (only BPE is implemented)");
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() != 0.0)
    origin.at("dropout").fail("BPE dropout is not supported");

  const json& vocab = model.value("vocab", json());
  if (!vocab.is_object()) origin.at("vocab").fail("missing or not an object");
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    vocab_.emplace(it.key(), token_id(it.value(), origin.at("vocab"), "token '" + it.key() + "'"));
  }

  auto optional_string = [&](const char* key) -> std::string {
    if (!model.contains(key) || model[key].is_null()) return {};
    return json_string(model[key], origin.at(key));
  };
  continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  end_of_word_suffix_ = optional_string("end_of_word_suffix");
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  std::string unk = optional_string("unk_token");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) origin.at("unk_token").fail("unk_token '" + unk + "' is not in the vocab");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(std::string_view(name));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const std::string metaspace = "\xE2\x96\x81";  // ▁
  const json& merges = model.value("merges", json::array());
  if (!merges.is_array()) origin.at("merges").fail("not an array");
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    Origin where = origin.at("merges").at(i);
    std::string a, b;
    if (merges[i].is_string()) {  // "a b"
      const std::string& line = merges[i].get_ref<const std::string&>();
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        where.fail("expected two tokens separated by one space, got '" + line + "'");
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (merges[i].is_array() && merges[i].size() == 2) {  // ["a", "b"]
      a = json_string(merges[i][0], where);
      b = json_string(merges[i][1], where);
    } else {
      where.fail("expected \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end()) where.fail("names unknown token '" + a + "'");
    if (ib == vocab_.end()) where.fail("names unknown token '" + b + "'");
    std::string merged = a + b.substr(std::min(b.size(), continuing_subword_prefix_.size()));
    auto im = vocab_.find(merged);
    if (im == vocab_.end()) where.fail("merged token '" + merged + "' is not in the vocab");
    for (size_t at = merged.find(metaspace, 1); at != std::string::npos; at = merged.find(metaspace, at + 1)) {
      size_t prev = at - 1;
      while (prev > 0 && (static_cast<unsigned char>(merged[prev]) & 0xC0) == 0x80) --prev;
      std::string joiner = merged.substr(prev, at - prev);
      if (joiner != metaspace && std::find(metaspace_joiners_.begin(), metaspace_joiners_.end(), joiner) == metaspace_joiners_.end())
        metaspace_joiners_.push_back(joiner);
    }
    // A repeated pair keeps the later rank, as HF's HashMap collect does.
    merges_[pair_key(ia->second, ib->second)] = Merge{static_cast<int32_t>(i), im->second};
  }
  split_before_metaspace_ = !ignore_merges_ && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty() &&
                            vocab_.count(metaspace) > 0;
}

std::vector<std::pair<int32_t, int32_t>> Bpe::ranked_merges() const {
  std::vector<std::pair<int32_t, uint64_t>> by_rank;  // (rank, pair key)
  by_rank.reserve(merges_.size());
  for (const auto& [key, merge] : merges_) by_rank.emplace_back(merge.rank, key);
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::pair<int32_t, int32_t>> out;
  out.reserve(by_rank.size());
  for (const auto& [rank, key] : by_rank) out.emplace_back(int32_t(key >> 32), int32_t(key & 0xffffffffu));
  return out;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (!split_before_metaspace_) {
    encode_cached(word, out);
    return;
  }
  static constexpr std::string_view kMetaspace = "\xE2\x96\x81";
  size_t start = 0;
  for (size_t at = word.find(kMetaspace, 1); at != std::string_view::npos; at = word.find(kMetaspace, at + 3)) {
    size_t prev = at - 1;
    while (prev > start && (static_cast<unsigned char>(word[prev]) & 0xC0) == 0x80) --prev;
    std::string_view before = word.substr(prev, at - prev);
    if (at == start || before == kMetaspace) continue;
    if (std::find(metaspace_joiners_.begin(), metaspace_joiners_.end(), before) != metaspace_joiners_.end()) continue;
    encode_cached(word.substr(start, at - start), out);
    start = at;
  }
  encode_cached(word.substr(start), out);
}

void Bpe::encode_cached(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(first), out.end()));
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol { int32_t id; int32_t prev, next; bool alive; };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1, true});
    if (index > 0) symbols[index - 1].next = index;
  };

  // Initial symbols: one per character (HF BPE::merge_word), with byte fallback and unknown handling.
  int32_t pending_unk = -1;  // an unknown-character token not yet added (fuse_unk grows it)
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    i += std::min(utf8_char_length(static_cast<unsigned char>(word[i])), word.size() - i);
    piece.clear();
    if (start > 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(start, i - start));
    if (i == word.size()) piece += end_of_word_suffix_;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : piece) all = all && byte_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : piece) add(byte_ids_[c]);
        continue;  // HF leaves a pending unk pending here too
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token HF drops the character; so do we.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) consider(pos);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale entry: the pair at this position changed since it was queued.
    auto it = merges_.find(pair_key(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.id != top.new_id || it->second.rank != top.rank) continue;
    Symbol& right = symbols[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

}  // namespace lmtune::tok
