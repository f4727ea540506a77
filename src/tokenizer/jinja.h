// A Jinja2 subset large enough for HF chat templates (Llama 2/3, Qwen 2/3, Gemma 2/3, Mistral, ...), with the
// environment transformers uses: trim_blocks=True, lstrip_blocks=True, loop controls, tojson without HTML
// escaping, raise_exception and strftime_now. Values follow Python semantics (lists and dicts by reference).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace lmtune::jinja {

struct Value;
using Array = std::vector<Value>;
struct Object;
struct Args;
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<jinja::Array> array;
  std::shared_ptr<jinja::Object> object;
  std::shared_ptr<jinja::Function> function;

  Value() = default;
  static Value none() { Value v; v.kind = Kind::None; return v; }
  Value(bool v) : kind(Kind::Bool), b(v) {}
  Value(int v) : kind(Kind::Int), i(v) {}
  Value(int64_t v) : kind(Kind::Int), i(v) {}
  Value(double v) : kind(Kind::Float), f(v) {}
  Value(std::string v) : kind(Kind::String), s(std::move(v)) {}
  Value(const char* v) : kind(Kind::String), s(v) {}
  Value(jinja::Array v) : kind(Kind::Array), array(std::make_shared<jinja::Array>(std::move(v))) {}
  Value(Function fn) : kind(Kind::Function), function(std::make_shared<jinja::Function>(std::move(fn))) {}
  static Value new_object();
  static Value from_json(const nlohmann::json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(kind == Kind::Bool ? b : i); }
  bool truthy() const;
  std::string str() const;   // Python str()
  // Python repr() and json.dumps(ensure_ascii=False). A template can make a value hold itself ({% set ns.n = ns
  // %}); past kMaxNesting levels these throw ConfigError instead of recursing without end.
  std::string repr(int depth = 0) const;
  std::string to_json(int indent = -1, int depth = 0) const;
  static constexpr int kMaxNesting = 64;
};

// Insertion-ordered dict, like Python's.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Argument `index` or keyword `name`, else `fallback`.
  Value get(size_t index, const char* name, Value fallback = Value()) const;
};

// Throws ConfigError past Value::kMaxNesting levels (walks of values that may hold themselves).
void check_nesting(int depth);
// Before v is stored into the list or namespace `container` ({% set ns.a = v %}, list.append(v)): throws
// ConfigError if v reaches that container or holds a function (a bound method or macro may hold any container).
// Lists and namespaces are shared, so a cycle would never be freed.
void check_storable(const Value& v, const void* container, int depth = 0);

struct Node;  // parsed template (jinja_parser.cpp)

class Template {
 public:
  // Parses `source`; syntax errors throw ConfigError naming `name`, line and column.
  Template(std::string source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...) plus `extra`
  // values that JSON cannot carry.
  std::string render(const nlohmann::json& variables, const std::map<std::string, Value>& extra = {}) const;

 private:
  std::string source_, name_;
  std::unique_ptr<Node> root_;
};

}  // namespace lmtune::jinja
