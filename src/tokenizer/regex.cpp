// PCRE2 wrapper for the Split / Replace patterns of tokenizer.json. HF compiles these with Oniguruma-style
// Unicode semantics; PCRE2 in UTF + UCP mode gives the same \s \p{L} \p{N} (?i:...) behaviour, and JIT keeps
// pre-tokenization fast.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {

void Origin::fail(const std::string& problem) const {
  throw FileError(file + ": " + (path.empty() ? "" : path + ": ") + problem);
}

int32_t token_id(const json& v, const Origin& origin, const std::string& what) {
  if (!v.is_number_integer()) origin.fail(what + ": id " + v.dump() + " is not an integer");
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(kMaxTokenId)
                                               : v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMaxTokenId;
  if (!in_range)
    origin.fail(what + ": id " + v.dump() + " is outside [0, " + std::to_string(kMaxTokenId) + "]");
  return int32_t(v.get<int64_t>());
}

Regex::Regex(const std::string& pattern, bool literal, const Origin& origin) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // UCP is not allowed with LITERAL
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error_code,
                             &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    origin.fail("bad regex '" + pattern + "' at offset " + std::to_string(error_offset) + ": " +
                reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::next_match(std::string_view text, size_t from, size_t& start, size_t& end) const {
  // One match-data block per thread: encode() may run concurrently on a shared tokenizer.
  struct MatchData {
    pcre2_match_data* data = pcre2_match_data_create(8, nullptr);
    ~MatchData() { pcre2_match_data_free(data); }
  };
  thread_local MatchData match;
  auto* code = static_cast<pcre2_code*>(code_);
  // Pipeline::encode validates its input once; NO_UTF_CHECK avoids re-validating it on every call.
  int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from, PCRE2_NO_UTF_CHECK,
                       match.data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error("regex match failed (code " + std::to_string(rc) + ")");
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.data);
  start = ovector[0];
  end = ovector[1];
  return true;
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t last = 0;
  for_each_match(text, [&](size_t start, size_t end) {
    out.append(text.substr(last, start - last));
    out.append(replacement);
    last = end;
  });
  out.append(text.substr(last));
  return out;
}

std::unique_ptr<Regex> make_pattern(const json& pattern, const Origin& origin) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
    return std::make_unique<Regex>(pattern["String"].get<std::string>(), true, origin);
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
    return std::make_unique<Regex>(pattern["Regex"].get<std::string>(), false, origin);
  origin.fail("pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace lmtune::tok
