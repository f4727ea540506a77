// Jinja values with Python semantics: truthiness, str()/repr(), json.dumps(ensure_ascii=False), and conversion
// from nlohmann::json (messages and other template variables arrive as JSON).
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja.h"

namespace lmtune::jinja {

Value Value::new_object() {
  Value v;
  v.kind = Kind::Object;
  v.object = std::make_shared<jinja::Object>();
  return v;
}

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja::Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Value o = new_object();
      for (auto it = j.begin(); it != j.end(); ++it) o.object->items.emplace_back(it.key(), from_json(it.value()));
      return o;
    }
    default: return Value();
  }
}

Value* Object::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  if (Value* slot = find(key)) *slot = std::move(v);
  else items.emplace_back(key, std::move(v));
}

Value Args::get(size_t index, const char* name, Value fallback) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  if (index < positional.size()) return positional[index];
  return fallback;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s.empty();
    case Kind::Array: return !array->empty();
    case Kind::Object: return !object->items.empty();
    case Kind::Function: return true;
  }
  return false;
}

// Lists and objects are shared, so a template can make one hold itself: nesting has a limit.
void check_nesting(int depth) {
  if (depth > Value::kMaxNesting)
    throw ConfigError("chat template: a value nests more than " + std::to_string(Value::kMaxNesting) +
                      " levels deep (a list or namespace that holds itself?)");
}

void check_storable(const Value& v, const void* container, int depth) {
  check_nesting(depth);
  switch (v.kind) {
    case Value::Kind::Function: throw ConfigError("chat template: a list or namespace cannot hold a function");
    case Value::Kind::Array:
      if (v.array.get() == container) throw ConfigError("chat template: a list cannot hold itself");
      for (const Value& x : *v.array) check_storable(x, container, depth + 1);
      return;
    case Value::Kind::Object:
      if (v.object.get() == container) throw ConfigError("chat template: a namespace cannot hold itself");
      for (const auto& [k, x] : v.object->items) check_storable(x, container, depth + 1);
      return;
    default: return;
  }
}

static std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f);  // shortest round-trip, like Python's repr
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string Value::str() const {
  switch (kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b ? "True" : "False";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return float_repr(f);
    case Kind::String: return s;
    default: return repr();
  }
}

std::string Value::repr(int depth) const {
  check_nesting(depth);
  switch (kind) {
    case Kind::String: {
      // Python prefers single quotes unless the string contains one and no double quote.
      char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
      std::string out(1, q);
      for (char c : s) {
        if (c == q || c == '\\') out += '\\', out += c;
        else if (c == '\n') out += "\\n";
        else if (c == '\t') out += "\\t";
        else if (c == '\r') out += "\\r";
        else out += c;
      }
      return out + q;
    }
    case Kind::Array: {
      std::string out = "[";
      for (size_t k = 0; k < array->size(); ++k) out += (k ? ", " : "") + (*array)[k].repr(depth + 1);
      return out + "]";
    }
    case Kind::Object: {
      std::string out = "{";
      for (size_t k = 0; k < object->items.size(); ++k)
        out += (k ? ", " : "") + Value(object->items[k].first).repr() + ": " + object->items[k].second.repr(depth + 1);
      return out + "}";
    }
    case Kind::Function: return "<function>";
    default: return str();
  }
}

static void json_escape(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string Value::to_json(int indent, int depth) const {
  // Python json.dumps: separators (", ", ": ") without indent, ("," + newline, ": ") with it.
  auto newline = [&](int d) { return indent < 0 ? std::string() : "\n" + std::string(static_cast<size_t>(indent * d), ' '); };
  const char* item_sep = indent < 0 ? ", " : ",";
  check_nesting(depth);
  std::string out;
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return "null";
    case Kind::Bool: return b ? "true" : "false";
    case Kind::Int: return std::to_string(i);
    case Kind::Float: return std::isfinite(f) ? float_repr(f) : (std::isnan(f) ? "NaN" : f > 0 ? "Infinity" : "-Infinity");
    case Kind::String: json_escape(s, out); return out;
    case Kind::Array:
      if (array->empty()) return "[]";
      out = "[";
      for (size_t k = 0; k < array->size(); ++k)
        out += (k ? item_sep : "") + newline(depth + 1) + (*array)[k].to_json(indent, depth + 1);
      return out + newline(depth) + "]";
    case Kind::Object:
      if (object->items.empty()) return "{}";
      out = "{";
      for (size_t k = 0; k < object->items.size(); ++k) {
        out += (k ? item_sep : "") + newline(depth + 1);
        json_escape(object->items[k].first, out);
        out += ": " + object->items[k].second.to_json(indent, depth + 1);
      }
      return out + newline(depth) + "}";
    case Kind::Function: return "null";
  }
  return "null";
}

}  // namespace lmtune::jinja
