// tokenizer.json "normalizer" components: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Replace, Prepend, Strip,
// Sequence. HF applies the normalizer to each piece of text between added tokens, and so does Pipeline.
#include <utf8proc.h>

#include <cstdlib>

#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {
namespace {

struct UnicodeNormalizer : Normalizer {
  int options;
  explicit UnicodeNormalizer(int opts) : options(opts) {}
  void normalize(std::string& text) const override {
    if (text.empty()) return;
    utf8proc_uint8_t* out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
    if (n < 0) return;  // only on invalid UTF-8, which Pipeline rejects earlier
    text.assign(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
  }
};

struct Lowercase : Normalizer {
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) append_utf8(out, static_cast<char32_t>(utf8proc_tolower(next_code_point(text, i))));
    text = std::move(out);
  }
};

struct Replace : Normalizer {
  std::unique_ptr<Regex> pattern;
  std::string content;
  void normalize(std::string& text) const override { text = pattern->replace_all(text, content); }
};

struct Prepend : Normalizer {
  std::string prefix;
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix);
  }
};

struct Strip : Normalizer {
  bool left = true, right = true;
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left) {
      while (begin < end) {
        size_t i = begin;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }
};

struct Sequence : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> steps;
  void normalize(std::string& text) const override {
    for (const auto& step : steps) step->normalize(text);
  }
};

std::string string_field(const json& j, const char* key, const Origin& origin) {
  if (!j.contains(key) || !j[key].is_string()) origin.fail(std::string("missing string field '") + key + "'");
  return j[key].get<std::string>();
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const Origin& origin) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) origin.fail("expected an object with a 'type'");
  const std::string type = j["type"];
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Replace") {
    auto r = std::make_unique<Replace>();
    r->pattern = make_pattern(j.value("pattern", json()), origin.at("pattern"));
    r->content = string_field(j, "content", origin);
    return r;
  }
  if (type == "Prepend") {
    auto p = std::make_unique<Prepend>();
    p->prefix = string_field(j, "prepend", origin);
    return p;
  }
  if (type == "Strip") {
    auto s = std::make_unique<Strip>();
    s->left = j.value("strip_left", true);
    s->right = j.value("strip_right", true);
    return s;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<Sequence>();
    const json& list = j.value("normalizers", json());
    if (!list.is_array()) origin.fail("Sequence needs a 'normalizers' array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_normalizer(list[i], origin.at("normalizers").at(i));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  origin.fail("unsupported normalizer type '" + type + "'");
}

}  // namespace lmtune::tok
