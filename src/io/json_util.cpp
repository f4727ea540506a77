// Strict JSON parsing (duplicate keys rejected) on top of nlohmann::json's parser callback.
#include "io/json_util.h"

#include <set>
#include <vector>

#include "core/error.h"

namespace lmtune {

using nlohmann::json;

nlohmann::json parse_json_strict(std::string_view text, const std::string& where) {
  // One key set per open object; the callback sees keys in document order.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = depth;
        }
        break;
      default: break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input and would accept "{}\0garbage"; raw NULs are
  // never valid JSON (not even inside strings), so they are rejected here.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw FileError(where + ": not valid JSON: NUL byte at position " + std::to_string(nul));
  json j;
  try {
    j = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    throw FileError(where + ": not valid JSON: " + e.what());
  }
  if (!duplicate.empty())
    throw FileError(where + ": duplicate key '" + duplicate + "'" +
                    (duplicate_depth <= 1 ? std::string(" at the top level") : std::string(" in a nested object")));
  return j;
}

std::string json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number with a fraction or exponent";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    default: return "an unsupported value";
  }
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += len;
  }
  return std::string_view::npos;
}

}  // namespace lmtune
