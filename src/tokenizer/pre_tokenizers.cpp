// tokenizer.json "pre_tokenizer" components: Split (all five behaviours + invert), ByteLevel, Metaspace and
// Sequence. They cut normalized text into words that the BPE model encodes independently.
#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {
namespace {

// The GPT-2 pattern ByteLevel uses when use_regex is true.
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// Splits `text` around the matches of `regex` as HF's NormalizedString::split does.
void split_piece(const std::string& text, const Regex& regex, Behavior behavior, bool invert,
                 std::vector<std::string>& out) {
  struct Span { size_t start, end; bool match; };
  std::vector<Span> spans;
  size_t last = 0;
  regex.for_each_match(text, [&](size_t start, size_t end) {
    if (start > last) spans.push_back({last, start, false});
    if (end > start) spans.push_back({start, end, true});
    last = end;
  });
  if (last < text.size()) spans.push_back({last, text.size(), false});
  if (invert)
    for (auto& s : spans) s.match = !s.match;

  std::vector<std::pair<size_t, size_t>> pieces;
  switch (behavior) {
    case Behavior::Isolated:
      for (auto& s : spans) pieces.emplace_back(s.start, s.end);
      break;
    case Behavior::Removed:
      for (auto& s : spans)
        if (!s.match) pieces.emplace_back(s.start, s.end);
      break;
    case Behavior::MergedWithPrevious: {
      bool previous_was_match = false;
      for (auto& s : spans) {
        if (s.match && !pieces.empty() && !previous_was_match) pieces.back().second = s.end;
        else pieces.emplace_back(s.start, s.end);
        previous_was_match = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous_was_match = false;
      for (auto& s : spans) {
        if (!s.match && !pieces.empty() && previous_was_match) pieces.back().second = s.end;
        else pieces.emplace_back(s.start, s.end);
        previous_was_match = s.match;
      }
      break;
    }
    case Behavior::Contiguous: {
      bool previous_was_match = false;
      for (auto& s : spans) {
        if (s.match && previous_was_match && !pieces.empty()) pieces.back().second = s.end;
        else pieces.emplace_back(s.start, s.end);
        previous_was_match = s.match;
      }
      break;
    }
  }
  for (auto [start, end] : pieces)
    if (end > start) out.emplace_back(text, start, end - start);
}

struct Split : PreTokenizer {
  std::unique_ptr<Regex> regex;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    for (const auto& p : pieces) split_piece(p, *regex, behavior, invert, out);
    pieces = std::move(out);
  }
};

struct ByteLevel : PreTokenizer {
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // null when use_regex is false
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> split;
    split.reserve(pieces.size());
    for (auto& p : pieces) {
      // HF prepends the space to every piece present at this point, not only the first one.
      if (add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(0, " ");
      if (regex) split_piece(p, *regex, Behavior::Isolated, false, split);
      else if (!p.empty()) split.push_back(std::move(p));
    }
    for (auto& p : split) {
      std::string mapped;
      mapped.reserve(p.size() * 2);
      for (unsigned char c : p) mapped += byte_to_unicode(c);
      p = std::move(mapped);
    }
    pieces = std::move(split);
  }
};

struct Metaspace : PreTokenizer {
  std::string replacement;
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;
  bool split = true;
  std::unique_ptr<Regex> replacement_regex;
  void pre_tokenize(std::vector<std::string>& pieces, bool at_start) const override {
    std::vector<std::string> out;
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string p;
      p.reserve(pieces[k].size() + replacement.size());
      for (char c : pieces[k]) {
        if (c == ' ') p += replacement;
        else p += c;
      }
      bool first = at_start && k == 0;
      if ((prepend == Prepend::Always || (prepend == Prepend::First && first)) &&
          p.compare(0, replacement.size(), replacement) != 0)
        p.insert(0, replacement);
      if (split) split_piece(p, *replacement_regex, Behavior::MergedWithNext, false, out);
      else if (!p.empty()) out.push_back(std::move(p));
    }
    pieces = std::move(out);
  }
};

struct Sequence : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void pre_tokenize(std::vector<std::string>& pieces, bool at_start) const override {
    for (const auto& step : steps) step->pre_tokenize(pieces, at_start);
  }
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const Origin& origin) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) origin.fail("expected an object with a 'type'");
  const std::string type = j["type"];
  if (type == "Split") {
    auto s = std::make_unique<Split>();
    s->regex = make_pattern(j.value("pattern", json()), origin.at("pattern"));
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior == "Removed") s->behavior = Behavior::Removed;
    else if (behavior == "Isolated") s->behavior = Behavior::Isolated;
    else if (behavior == "MergedWithPrevious") s->behavior = Behavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext") s->behavior = Behavior::MergedWithNext;
    else if (behavior == "Contiguous") s->behavior = Behavior::Contiguous;
    else origin.at("behavior").fail("unsupported split behavior '" + behavior + "'");
    s->invert = j.value("invert", false);
    return s;
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevel>();
    b->add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) b->regex = std::make_unique<Regex>(kGpt2Pattern, false, origin);
    return b;  // trim_offsets only affects offsets, which we do not report
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<Metaspace>();
    m->replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";  // older files
    if (scheme == "always") m->prepend = Metaspace::Prepend::Always;
    else if (scheme == "first") m->prepend = Metaspace::Prepend::First;
    else if (scheme == "never") m->prepend = Metaspace::Prepend::Never;
    else origin.at("prepend_scheme").fail("unsupported prepend_scheme '" + scheme + "'");
    m->split = j.value("split", true);
    m->replacement_regex = std::make_unique<Regex>(m->replacement, true, origin);
    return m;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<Sequence>();
    const json& list = j.value("pretokenizers", json());
    if (!list.is_array()) origin.fail("Sequence needs a 'pretokenizers' array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_pre_tokenizer(list[i], origin.at("pretokenizers").at(i));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  origin.fail("unsupported pre_tokenizer type '" + type + "'");
}

}  // namespace lmtune::tok
