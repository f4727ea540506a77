// Strict JSON parsing shared by the io readers: syntax errors and duplicate object keys (which nlohmann::json
// would silently resolve to the last value) become FileError("<path>: ...").
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lmtune {

// `where` names the file in error messages. Duplicate keys anywhere in the document are rejected.
nlohmann::json parse_json_strict(std::string_view text, const std::string& where);
// A short name for a JSON value's type in messages: "a string", "a number", "null", ...
std::string json_type_name(const nlohmann::json& v);

}  // namespace lmtune
