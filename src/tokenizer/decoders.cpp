// tokenizer.json "decoder" components: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence.
// They turn token strings back into text (HF decode_chain). In streaming mode an unfinished UTF-8 character at
// the very end is kept as raw bytes so that StreamDecoder can wait for the token that completes it.
#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {
namespace {

const char* const kReplacementChar = "\xEF\xBF\xBD";

// Raw bytes become text: valid UTF-8 as is; in streaming mode an unfinished tail is kept for later.
std::string finish_bytes(const std::string& bytes, bool streaming, bool at_end) {
  if (streaming && at_end) {
    size_t complete = complete_utf8_prefix(bytes);
    return to_valid_utf8(std::string_view(bytes).substr(0, complete)) + bytes.substr(complete);
  }
  return to_valid_utf8(bytes);
}

struct ByteLevel : Decoder {
  void decode_chain(std::vector<std::string>& tokens, bool streaming) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      // A token whose characters are all byte stand-ins maps to those bytes; any other (e.g. an added token
      // with other characters) is taken verbatim, as HF does.
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < token.size() && all;) {
        int b = unicode_to_byte(next_code_point(token, i));
        if (b < 0) all = false;
        else mapped += static_cast<char>(b);
      }
      bytes += all ? mapped : token;
    }
    tokens.assign(1, finish_bytes(bytes, streaming, true));
  }
};

struct ByteFallback : Decoder {
  void decode_chain(std::vector<std::string>& tokens, bool streaming) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&](bool at_end) {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else if (streaming && at_end && is_valid_utf8(pending.substr(0, complete_utf8_prefix(pending)))) {
        out.push_back(pending);  // an unfinished character: StreamDecoder waits for its remaining bytes
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.push_back(kReplacementChar);  // HF: one per byte
      }
      pending.clear();
    };
    for (auto& token : tokens) {
      int value = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
        int hi = hex(token[3]), lo = hex(token[4]);
        if (hi >= 0 && lo >= 0) value = hi * 16 + lo;
      }
      if (value >= 0) {
        pending += static_cast<char>(value);
      } else {
        flush(false);
        out.push_back(std::move(token));
      }
    }
    flush(true);
    tokens = std::move(out);
  }
};

struct Fuse : Decoder {
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

struct Strip : Decoder {
  std::string content;  // one character
  size_t start = 0, stop = 0;
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (auto& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t n = 0; n < start && token.compare(begin, content.size(), content) == 0 && begin < end; ++n)
        begin += content.size();
      for (size_t n = 0; n < stop && end - begin >= content.size() &&
                         token.compare(end - content.size(), content.size(), content) == 0;
           ++n)
        end -= content.size();
      token = token.substr(begin, end - begin);
    }
  }
};

struct Replace : Decoder {
  std::unique_ptr<Regex> pattern;
  std::string content;
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (auto& token : tokens) token = pattern->replace_all(token, content);
  }
};

struct Metaspace : Decoder {
  std::string replacement;
  bool strip_first_space = true;  // prepend_scheme != never
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      for (size_t k = 0; k < tokens[i].size();) {
        if (tokens[i].compare(k, replacement.size(), replacement) == 0) {
          out += ' ';
          k += replacement.size();
        } else {
          out += tokens[i][k++];
        }
      }
      if (i == 0 && strip_first_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }
};

struct Sequence : Decoder {
  std::vector<std::unique_ptr<Decoder>> steps;
  void decode_chain(std::vector<std::string>& tokens, bool streaming) const override {
    for (const auto& step : steps) step->decode_chain(tokens, streaming);
  }
};

// A non-negative integer at `key` (0 when absent): a float such as 1.5e28 must not reach a size_t conversion.
size_t count_at(const json& j, const char* key, const Origin& origin) {
  if (!j.contains(key)) return 0;
  const json& v = j[key];
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    origin.at(key).fail("expected a non-negative integer, got " + v.dump());
  return size_t(v.get<uint64_t>());
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const Origin& origin) {
  if (j.is_null()) return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) origin.fail("expected an object with a 'type'");
  const std::string type = j["type"];
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    auto s = std::make_unique<Strip>();
    s->content = j.value("content", std::string(" "));
    s->start = count_at(j, "start", origin);
    s->stop = count_at(j, "stop", origin);
    if (s->content.empty()) origin.at("content").fail("must not be empty");
    return s;
  }
  if (type == "Replace") {
    auto r = std::make_unique<Replace>();
    r->pattern = make_pattern(j.value("pattern", json()), origin.at("pattern"));
    if (!j.contains("content") || !j["content"].is_string()) origin.fail("missing string field 'content'");
    r->content = j["content"].get<std::string>();
    return r;
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<Metaspace>();
    m->replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = j.value("prepend_scheme", std::string());
    m->strip_first_space = scheme.empty() ? j.value("add_prefix_space", true) : scheme != "never";
    return m;
  }
  if (type == "Sequence") {
    auto seq = std::make_unique<Sequence>();
    const json& list = j.value("decoders", json());
    if (!list.is_array()) origin.fail("Sequence needs a 'decoders' array");
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_decoder(list[i], origin.at("decoders").at(i));
      if (step) seq->steps.push_back(std::move(step));
    }
    return seq;
  }
  origin.fail("unsupported decoder type '" + type + "'");
}

}  // namespace lmtune::tok
