// UTF-8 helpers shared by the tokenizer components, plus the GPT-2 byte-level character table.
#include <array>

#include "tokenizer/tokenizer_internal.h"

namespace lmtune::tok {

size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 1;
}

// Length of the valid sequence starting at text[i] (0 when invalid), following the Unicode
// well-formedness table so overlong forms and surrogates are rejected. `partial` reports a valid but cut prefix.
static size_t valid_sequence_length(std::string_view text, size_t i, bool& partial) {
  partial = false;
  auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return 1;
  size_t n = utf8_char_length(b0);
  if (n == 1) return 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= text.size()) {
      partial = true;
      return 0;
    }
    auto b = static_cast<unsigned char>(text[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return n;
}

char32_t next_code_point(std::string_view text, size_t& i) {
  bool partial;
  size_t n = valid_sequence_length(text, i, partial);
  if (n == 0) {
    ++i;
    return 0xFFFD;
  }
  auto b0 = static_cast<unsigned char>(text[i]);
  char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t complete_utf8_prefix(std::string_view bytes) {
  // Only the last (up to 3) bytes can start an unfinished character.
  size_t start = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t i = start; i < bytes.size(); ++i) {
    auto b = static_cast<unsigned char>(bytes[i]);
    if ((b & 0xC0) == 0x80) continue;
    bool partial;
    if (valid_sequence_length(bytes, i, partial) == 0 && partial) return i;
  }
  return bytes.size();
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool partial;
    size_t n = valid_sequence_length(bytes, i, partial);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
      continue;
    }
    // Maximal subpart: skip the lead byte and the continuation bytes that were still valid.
    size_t skip = 1;
    size_t len = utf8_char_length(static_cast<unsigned char>(bytes[i]));
    if (len > 1) {
      std::string_view rest = bytes.substr(i, std::min(len, bytes.size() - i));
      for (size_t k = 2; k <= rest.size(); ++k) {
        bool p2;
        std::string_view probe = rest.substr(0, k);
        if (valid_sequence_length(probe, 0, p2) == 0 && p2) skip = k; else break;
      }
    }
    out += "\xEF\xBF\xBD";
    i += skip;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    bool partial;
    size_t n = valid_sequence_length(bytes, i, partial);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool is_unicode_whitespace(char32_t c) {
  // Unicode White_Space property (what Rust's char::is_whitespace uses).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
struct ByteTable {
  std::array<std::string, 256> to_unicode;
  std::array<int, 324> to_byte;  // stand-ins are all < 324
  ByteTable() {
    to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      append_utf8(to_unicode[b], cp);
      to_byte[cp] = b;
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}
}  // namespace

const std::string& byte_to_unicode(unsigned char byte) { return byte_table().to_unicode[byte]; }
int unicode_to_byte(char32_t cp) { return cp < 324 ? byte_table().to_byte[cp] : -1; }

}  // namespace lmtune::tok
