// Strict JSON parsing shared by the io readers: syntax errors and duplicate object keys (which nlohmann::json
// would silently resolve to the last value) become FileError("<path>: ..."); and the UTF-8 check they share.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lmtune {

// `where` names the file in error messages. Duplicate keys anywhere in the document are rejected.
nlohmann::json parse_json_strict(std::string_view text, const std::string& where);
// A short name for a JSON value's type in messages: "a string", "a number", "null", ...
std::string json_type_name(const nlohmann::json& v);
// Position of the first invalid UTF-8 byte (overlong forms, surrogates and code points past U+10FFFF are
// invalid, as in Rust's str::from_utf8), or npos. Shared by the safetensors and GGUF readers.
size_t find_invalid_utf8(std::string_view s);

}  // namespace lmtune
