// Added tokens (tokenizer.json "added_tokens") and post-processors. The matcher splits input text on added
// tokens before normalization/pre-tokenization, leftmost match first and longest token at that position (HF's
// leftmost-longest Aho-Corasick), honouring single_word, lstrip and rstrip.
#include <utf8proc.h>

#include <algorithm>
#include <cstdint>

#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {

void AddedTokenMatcher::add(const std::string& pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    auto& children = nodes_[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), c,
                               [](const auto& child, unsigned char v) { return child.first < v; });
    if (it != children.end() && it->first == c) {
      node = it->second;
    } else {
      int32_t next = static_cast<int32_t>(nodes_.size());
      children.insert(it, {c, next});
      nodes_.emplace_back();
      node = next;
    }
  }
  nodes_[node].token = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
}

namespace {
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}
char32_t last_char(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return next_code_point(s, start);
}
}  // namespace

std::vector<AddedTokenMatcher::Segment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> out;
  if (empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  size_t segment_start = 0;  // start of the ordinary text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest token starting at pos.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& children = nodes_[node].children;
      auto c = static_cast<unsigned char>(text[i]);
      auto it = std::lower_bound(children.begin(), children.end(), c,
                                 [](const auto& child, unsigned char v) { return child.first < v; });
      if (it == children.end() || it->first != c) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_end = i + 1;
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[best];
    size_t start = pos, stop = best_end;
    if (token.single_word) {
      bool space_before = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      size_t after = stop;
      bool space_after = stop == text.size() || !is_word_char(next_code_point(text, after));
      if (!space_before || !space_after) {
        pos = stop;  // like Aho-Corasick's find_iter, a rejected match is not re-scanned
        continue;
      }
    }
    if (token.lstrip) {
      while (start > segment_start) {
        size_t prev = start - 1;
        while (prev > segment_start && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t i = prev;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t i = stop;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        stop = i;
      }
    }
    if (start > segment_start) out.push_back({text.substr(segment_start, start - segment_start), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    segment_start = pos = stop;
  }
  if (segment_start < text.size()) out.push_back({text.substr(segment_start), -1});
  return out;
}

// ---- Post-processors -------------------------------------------------------------------------------------------
namespace {

struct TemplateProcessing : PostProcessor {
  // The "single" template flattened: ids to insert, with -1 marking where the sequence goes.
  std::vector<int32_t> layout;
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + layout.size());
    for (int32_t item : layout) {
      if (item == -1) out.insert(out.end(), ids.begin(), ids.end());
      else out.push_back(item);
    }
    ids = std::move(out);
  }
};

struct Wrap : PostProcessor {  // BertProcessing / RobertaProcessing: cls + A + sep
  int32_t cls = 0, sep = 0;
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), cls);
    ids.push_back(sep);
  }
};

struct Identity : PostProcessor {  // ByteLevel only trims offsets
  void process(std::vector<int32_t>&) const override {}
};

struct Sequence : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> steps;
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps) s->process(ids);
  }
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const Origin& origin) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) origin.fail("expected an object with a 'type'");
  const std::string type = j["type"];
  if (type == "ByteLevel") return std::make_unique<Identity>();
  if (type == "TemplateProcessing") {
    auto t = std::make_unique<TemplateProcessing>();
    const json& single = j.value("single", json());
    const json& specials = j.value("special_tokens", json::object());
    if (!single.is_array()) origin.at("single").fail("missing or not an array");
    for (size_t i = 0; i < single.size(); ++i) {
      Origin where = origin.at("single").at(i);
      const json& item = single[i];
      if (item.contains("Sequence")) {
        t->layout.push_back(-1);
      } else if (item.contains("SpecialToken")) {
        const json& token = item["SpecialToken"];
        if (!token.is_object() || !token.contains("id") || !token["id"].is_string())
          where.at("SpecialToken").fail("expected an object with a string 'id'");
        const std::string name = token["id"];
        if (!specials.is_object() || !specials.contains(name) || !specials[name].is_object() ||
            !specials[name].contains("ids") || !specials[name]["ids"].is_array())
          where.fail("special token '" + name + "' is not listed in special_tokens");
        for (const auto& id : specials[name]["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
            origin.at("special_tokens").at(name).fail("ids must be non-negative integers, got " + id.dump());
          t->layout.push_back(id.get<int32_t>());
        }
      } else {
        where.fail("expected a Sequence or SpecialToken item");
      }
    }
    return t;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto w = std::make_unique<Wrap>();
    auto id_of = [&](const char* key) {
      const json& pair = j.value(key, json());
      if (!pair.is_array() || pair.size() != 2) origin.at(key).fail("expected [token, id]");
      return token_id(pair[1], origin.at(key), "[token, id]");
    };
    w->cls = id_of("cls");
    w->sep = id_of("sep");
    return w;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<Sequence>();
    const json& list = j.value("processors", json());
    if (!list.is_array()) origin.fail("Sequence needs a 'processors' array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_post_processor(list[i], origin.at("processors").at(i));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  origin.fail("unsupported post_processor type '" + type + "'");
}

}  // namespace lmtune::tok
