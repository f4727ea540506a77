// Jinja interpreter: evaluates the parsed template against variables, with the filters, tests, string/dict/list
// methods and globals (namespace, range, raise_exception, strftime_now, ...) that HF chat templates use.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/tokenizer_internal.h"

namespace lmtune::jinja {
namespace {

// A chat template is code from the internet: rendering it is bounded in recursion, work and memory.
constexpr int kMaxMacroDepth = 100;             // nested macro calls
constexpr int64_t kMaxLoopIterations = 1000000;  // for-loop iterations in one render, all loops together
constexpr size_t kMaxStringBytes = 64u << 20;    // any string a template builds, the output included

using Kind = Value::Kind;

enum class Flow { Normal, Break, Continue };

// Python-style string helpers working on code points where it matters.
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(tok::utf8_char_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  auto strip_this = [&](char c) { return chars.is_string() ? chars.s.find(c) != std::string::npos : is_space_char(c); };
  size_t begin = 0, end = s.size();
  if (left) while (begin < end && strip_this(s[begin])) ++begin;
  if (right) while (end > begin && strip_this(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count = -1) {
  if (from.empty()) return s;
  size_t pos = 0;
  while (count != 0 && (pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
    if (count > 0) --count;
  }
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = s;
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (auto& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = !std::isalnum(u);
    }
  }
  return out;
}

bool equal(const Value& a, const Value& b, int depth = 0) {
  check_nesting(depth);
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.kind == Kind::Bool && b.is_number()) return a.as_double() == b.as_double();
  if (b.kind == Kind::Bool && a.is_number()) return a.as_double() == b.as_double();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::Bool: return a.b == b.b;
    case Kind::String: return a.s == b.s;
    case Kind::Array:
      if (a.array == b.array) return true;  // the same list (Python compares identity first)
      if (a.array->size() != b.array->size()) return false;
      for (size_t k = 0; k < a.array->size(); ++k)
        if (!equal((*a.array)[k], (*b.array)[k], depth + 1)) return false;
      return true;
    case Kind::Object:
      if (a.object == b.object) return true;
      if (a.object->items.size() != b.object->items.size()) return false;
      for (auto& [k, v] : a.object->items) {
        Value* other = b.object->find(k);
        if (!other || !equal(v, *other, depth + 1)) return false;
      }
      return true;
    case Kind::Function: return a.function == b.function;
    default: return false;
  }
}

class Interpreter {
 public:
  Interpreter(const std::string& source, const std::string& name) : source_(source), name_(name) {}

  std::vector<std::map<std::string, Value>> scopes;

  [[noreturn]] void fail(const Node& node, const std::string& msg) const {
    throw ConfigError(describe_position(source_, name_, node.pos) + ": " + msg);
  }

  void append(const Node& node, std::string& out, const std::string& s) const {
    if (out.size() + s.size() > kMaxStringBytes) fail(node, "the rendered text passes 64 MiB");
    out += s;
  }
  Value checked(const Node& node, std::string s) const {
    if (s.size() > kMaxStringBytes) fail(node, "a string passes 64 MiB");
    return Value(std::move(s));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  // ---- statements ----
  Flow exec(const Node& node, std::string& out) {
    switch (node.kind) {
      case NodeKind::Body:
        for (const auto& child : node.children) {
          Flow f = exec(*child, out);
          if (f != Flow::Normal) return f;
        }
        return Flow::Normal;
      case NodeKind::Text: append(node, out, node.name); return Flow::Normal;
      case NodeKind::Output: append(node, out, eval(*node.children[0]).str()); return Flow::Normal;
      case NodeKind::If: {
        size_t k = 0;
        for (; k + 1 < node.children.size(); k += 2)
          if (eval(*node.children[k]).truthy()) return exec(*node.children[k + 1], out);
        if (k < node.children.size()) return exec(*node.children[k], out);
        return Flow::Normal;
      }
      case NodeKind::For: return exec_for(node, out);
      case NodeKind::Set: {
        Value v = eval(*node.children[0]);
        if (!node.name.empty()) {  // {% set ns.attr = v %}
          Value target = lookup(node.targets[0]);
          if (!target.is_object()) fail(node, "cannot set attribute '" + node.name + "' on '" + node.targets[0] + "'");
          check_storable(v, target.object.get());
          target.object->set(node.name, v);
        } else {
          assign(node, node.targets, v);
        }
        return Flow::Normal;
      }
      case NodeKind::SetBlock: {
        std::string captured;
        exec(*node.children[0], captured);
        assign(node, node.targets, Value(captured));
        return Flow::Normal;
      }
      case NodeKind::Macro: {
        const Node* macro = &node;
        scopes.back()[node.name] = Value(Function([this, macro](Args& args) { return call_macro(*macro, args); }));
        return Flow::Normal;
      }
      case NodeKind::Break: return Flow::Break;
      case NodeKind::Continue: return Flow::Continue;
      default: fail(node, "not a statement");
    }
  }

  void assign(const Node& node, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scopes.back()[targets[0]] = v;
      return;
    }
    if (!v.is_array() || v.array->size() != targets.size()) fail(node, "cannot unpack value into " + std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scopes.back()[targets[k]] = (*v.array)[k];
  }

  std::vector<Value> iterate(const Node& node, const Value& v) {
    switch (v.kind) {
      case Kind::Array: return *v.array;
      case Kind::Object: {
        std::vector<Value> keys;
        for (auto& [k, val] : v.object->items) keys.emplace_back(k);
        return keys;
      }
      case Kind::String: {
        std::vector<Value> chars;
        for (auto& c : code_points(v.s)) chars.emplace_back(c);
        return chars;
      }
      case Kind::Undefined:
      case Kind::None: return {};
      default: fail(node, "value of type " + v.repr() + " is not iterable");
    }
  }

  Flow exec_for(const Node& node, std::string& out) {
    std::vector<Value> items = iterate(node, eval(*node.children[0]));
    if (node.children[1]) {  // {% for x in xs if cond %}: filter before counting
      std::vector<Value> kept;
      for (auto& item : items) {
        scopes.emplace_back();
        assign(node, node.targets, item);
        bool keep = eval(*node.children[1]).truthy();
        scopes.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (node.children[3]) return exec(*node.children[3], out);
      return Flow::Normal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      if (++iterations_ > kMaxLoopIterations) fail(node, "loops ran more than 1,000,000 iterations");
      scopes.emplace_back();
      assign(node, node.targets, items[k]);
      Value loop = Value::new_object();
      auto& o = *loop.object;
      o.set("index0", Value(k));
      o.set("index", Value(k + 1));
      o.set("revindex0", Value(n - k - 1));
      o.set("revindex", Value(n - k));
      o.set("first", Value(k == 0));
      o.set("last", Value(k == n - 1));
      o.set("length", Value(n));
      o.set("previtem", k > 0 ? items[k - 1] : Value());
      o.set("nextitem", k + 1 < n ? items[k + 1] : Value());
      o.set("cycle", Value(Function([k](Args& a) { return a.positional.empty() ? Value() : a.positional[k % a.positional.size()]; })));
      scopes.back()["loop"] = loop;
      Flow f = exec(*node.children[2], out);
      scopes.pop_back();
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value call_macro(const Node& macro, Args& args) {
    if (macro_depth_ >= kMaxMacroDepth) fail(macro, "macros nest deeper than 100 calls");
    struct Depth {
      int& d;
      explicit Depth(int& d) : d(++d) {}
      ~Depth() { --d; }
    } depth(macro_depth_);
    // Macros see the globals and top-level variables (the two bottom scopes) and their parameters, not the
    // caller's loop locals.
    std::vector<std::map<std::string, Value>> saved;
    saved.swap(scopes);
    scopes.assign(saved.begin(), saved.begin() + std::min<ptrdiff_t>(2, static_cast<ptrdiff_t>(saved.size())));
    scopes.emplace_back();
    for (size_t k = 0; k < macro.keywords.size(); ++k) {
      const auto& [param, default_expr] = macro.keywords[k];
      Value v = args.get(k, param.c_str());
      if (v.is_undefined() && default_expr) v = eval(*default_expr);
      scopes.back()[param] = v;
    }
    std::string out;
    try {
      exec(*macro.children[0], out);
    } catch (...) {
      scopes.swap(saved);
      throw;
    }
    scopes.swap(saved);
    return Value(out);
  }

  // ---- expressions ----
  Args eval_args(const Node& node, size_t first_positional) {
    Args args;
    for (size_t k = first_positional; k < node.children.size(); ++k) args.positional.push_back(eval(*node.children[k]));
    for (const auto& [key, expr] : node.keywords) args.keyword.emplace_back(key, eval(*expr));
    return args;
  }

  Value eval(const Node& node) {
    switch (node.kind) {
      case NodeKind::Literal: return node.literal;
      case NodeKind::Name: return lookup(node.name);
      case NodeKind::GetAttr: {
        Value obj = eval(*node.children[0]);
        return get_attribute(node, obj, node.name);
      }
      case NodeKind::GetItem: {
        Value obj = eval(*node.children[0]);
        Value key = eval(*node.children[1]);
        if (key.is_string()) return get_attribute(node, obj, key.s);
        return get_index(node, obj, key);
      }
      case NodeKind::Slice: return slice(node);
      case NodeKind::Call: {
        Value callee = eval(*node.children[0]);
        if (callee.kind != Kind::Function) fail(node, "'" + describe(*node.children[0]) + "' is not callable");
        Args args = eval_args(node, 1);
        return (*callee.function)(args);
      }
      case NodeKind::Filter: {
        Value v = eval(*node.children[0]);
        Args args = eval_args(node, 1);
        return apply_filter(node, node.name, v, args);
      }
      case NodeKind::Test: {
        Value v = eval(*node.children[0]);
        Args args = eval_args(node, 1);
        bool r = apply_test(node, node.name, v, args);
        return Value(node.negated ? !r : r);
      }
      case NodeKind::Unary: {
        Value v = eval(*node.children[0]);
        if (node.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail(node, "bad operand for unary " + node.name);
        if (node.name == "+") return v;
        return v.kind == Kind::Int ? Value(-v.i) : Value(-v.f);
      }
      case NodeKind::Binary: return binary(node);
      case NodeKind::Ternary:
        if (eval(*node.children[0]).truthy()) return eval(*node.children[1]);
        return node.children[2] ? eval(*node.children[2]) : Value();
      case NodeKind::ListLit:
      case NodeKind::TupleLit: {
        Array a;
        for (const auto& c : node.children) a.push_back(eval(*c));
        return Value(std::move(a));
      }
      case NodeKind::DictLit: {
        Value o = Value::new_object();
        for (size_t k = 0; k + 1 < node.children.size(); k += 2)
          o.object->set(eval(*node.children[k]).str(), eval(*node.children[k + 1]));
        return o;
      }
      default: fail(node, "not an expression");
    }
  }

  std::string describe(const Node& node) const {
    if (node.kind == NodeKind::Name || node.kind == NodeKind::GetAttr) return node.name;
    return "expression";
  }

  Value get_index(const Node& node, const Value& obj, const Value& key) {
    if (!key.is_number()) return Value();
    auto index = static_cast<int64_t>(key.as_double());
    if (obj.is_array()) {
      auto n = static_cast<int64_t>(obj.array->size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value();
      return (*obj.array)[index];
    }
    if (obj.is_string()) {
      auto chars = code_points(obj.s);
      auto n = static_cast<int64_t>(chars.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value();
      return Value(chars[index]);
    }
    if (obj.is_undefined()) fail(node, "cannot index an undefined value");
    return Value();
  }

  Value slice(const Node& node) {
    Value obj = eval(*node.children[0]);
    auto bound = [&](size_t k) -> std::optional<int64_t> {
      if (!node.children[k]) return std::nullopt;
      Value v = eval(*node.children[k]);
      if (v.is_none() || v.is_undefined()) return std::nullopt;
      return static_cast<int64_t>(v.as_double());
    };
    auto start = bound(1), stop = bound(2), step_opt = bound(3);
    int64_t step = step_opt.value_or(1);
    if (step == 0) fail(node, "slice step cannot be zero");
    std::vector<Value> items;
    bool is_string = obj.is_string();
    if (is_string) for (auto& c : code_points(obj.s)) items.emplace_back(c);
    else if (obj.is_array()) items = *obj.array;
    else fail(node, "cannot slice this value");
    auto n = static_cast<int64_t>(items.size());
    // Python slice index normalisation.
    auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    int64_t a = clamp(start, step > 0 ? 0 : n - 1), b = clamp(stop, step > 0 ? n : -1);
    std::vector<Value> result;
    for (int64_t k = a; step > 0 ? k < b : k > b; k += step) result.push_back(items[k]);
    if (is_string) {
      std::string s;
      for (auto& v : result) s += v.s;
      return Value(s);
    }
    return Value(std::move(result));
  }

  Value binary(const Node& node) {
    const std::string& op = node.name;
    if (op == "and") {
      Value l = eval(*node.children[0]);
      return l.truthy() ? eval(*node.children[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*node.children[0]);
      return l.truthy() ? l : eval(*node.children[1]);
    }
    Value l = eval(*node.children[0]), r = eval(*node.children[1]);
    if (op == "~") return checked(node, l.str() + r.str());
    if (op == "==") return Value(equal(l, r));
    if (op == "!=") return Value(!equal(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) found = l.is_string() && r.s.find(l.s) != std::string::npos;
      else if (r.is_array()) found = std::any_of(r.array->begin(), r.array->end(), [&](const Value& x) { return equal(x, l); });
      else if (r.is_object()) found = l.is_string() && r.object->find(l.s) != nullptr;
      else if (!r.is_undefined() && !r.is_none()) fail(node, "'in' needs a string, list or dict on the right");
      return Value(op == "in" ? found : !found);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (l.is_number() && r.is_number()) c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
      else if (l.is_string() && r.is_string()) c = l.s.compare(r.s);
      else fail(node, "cannot compare " + l.repr() + " and " + r.repr());
      return Value(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) return checked(node, l.s + r.s);
      if (l.is_array() && r.is_array()) {
        Array a = *l.array;
        a.insert(a.end(), r.array->begin(), r.array->end());
        return Value(std::move(a));
      }
    }
    if (op == "*" && l.is_string() && r.kind == Kind::Int) {
      if (r.i > 0 && l.s.size() > kMaxStringBytes / size_t(r.i)) fail(node, "a string passes 64 MiB");
      std::string s;
      for (int64_t k = 0; k < r.i; ++k) s += l.s;
      return Value(s);
    }
    bool numeric = (l.is_number() || l.kind == Kind::Bool) && (r.is_number() || r.kind == Kind::Bool);
    if (!numeric) fail(node, "unsupported operand types for " + op + ": " + l.repr() + " and " + r.repr());
    bool ints = l.kind != Kind::Float && r.kind != Kind::Float;
    int64_t li = l.kind == Kind::Bool ? l.b : l.i, ri = r.kind == Kind::Bool ? r.b : r.i;
    double lf = l.as_double(), rf = r.as_double();
    // Python's integers do not overflow; a template whose integers pass 64 bits is refused rather than wrapped.
    auto check = [&](bool overflowed) {
      if (overflowed) fail(node, "integer overflow in " + std::to_string(li) + " " + op + " " + std::to_string(ri));
    };
    int64_t v = 0;
    if (op == "+" && ints) return check(__builtin_add_overflow(li, ri, &v)), Value(v);
    if (op == "-" && ints) return check(__builtin_sub_overflow(li, ri, &v)), Value(v);
    if (op == "*" && ints) return check(__builtin_mul_overflow(li, ri, &v)), Value(v);
    if (op == "+") return Value(lf + rf);
    if (op == "-") return Value(lf - rf);
    if (op == "*") return Value(lf * rf);
    if (op == "/") {
      if (rf == 0) fail(node, "division by zero");
      return Value(lf / rf);
    }
    if (op == "//" || op == "%") {
      if (rf == 0) fail(node, "division by zero");
      if (ints) {
        check(li == INT64_MIN && ri == -1);
        int64_t q = li / ri, m = li % ri;
        if (m != 0 && ((m < 0) != (ri < 0))) --q, m += ri;  // Python floors
        return op == "//" ? Value(q) : Value(m);
      }
      double q = std::floor(lf / rf);
      return op == "//" ? Value(q) : Value(lf - q * rf);
    }
    if (op == "**") {
      if (ints && ri >= 0) {  // by squaring: a huge exponent of 0, 1 or -1 ends as fast as any other
        int64_t p = 1, base = li;
        for (int64_t e = ri; e > 0; e >>= 1) {
          if (e & 1) check(__builtin_mul_overflow(p, base, &p));
          if (e > 1) check(__builtin_mul_overflow(base, base, &base));  // a later bit needs base² anyway
        }
        return Value(p);
      }
      return Value(std::pow(lf, rf));
    }
    fail(node, "unknown operator " + op);
  }

  Value get_attribute(const Node& node, const Value& obj, const std::string& name);
  Value apply_filter(const Node& node, const std::string& name, const Value& v, Args& args);
  bool apply_test(const Node& node, const std::string& name, const Value& v, Args& args);

 private:
  const std::string& source_;
  const std::string& name_;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
};

Value method(std::function<Value(Args&)> fn) { return Value(Function(std::move(fn))); }

Value Interpreter::get_attribute(const Node& node, const Value& obj, const std::string& name) {
  if (obj.is_object()) {
    if (Value* v = obj.object->find(name)) return *v;
    auto o = obj.object;
    if (name == "items") return method([o](Args&) { Array a; for (auto& [k, v] : o->items) a.push_back(Value(Array{Value(k), v})); return Value(std::move(a)); });
    if (name == "keys") return method([o](Args&) { Array a; for (auto& kv : o->items) a.emplace_back(kv.first); return Value(std::move(a)); });
    if (name == "values") return method([o](Args&) { Array a; for (auto& kv : o->items) a.push_back(kv.second); return Value(std::move(a)); });
    if (name == "get") return method([o](Args& a) { Value key = a.get(0, "key"); Value* v = key.is_string() ? o->find(key.s) : nullptr; return v ? *v : a.get(1, "default", Value::none()); });
    return Value();
  }
  if (obj.is_string()) {
    const std::string s = obj.s;
    if (name == "strip") return method([s](Args& a) { return Value(strip_chars(s, a.get(0, "chars"), true, true)); });
    if (name == "lstrip") return method([s](Args& a) { return Value(strip_chars(s, a.get(0, "chars"), true, false)); });
    if (name == "rstrip") return method([s](Args& a) { return Value(strip_chars(s, a.get(0, "chars"), false, true)); });
    if (name == "upper") return method([s](Args&) { std::string r = s; for (auto& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c))); return Value(r); });
    if (name == "lower") return method([s](Args&) { std::string r = s; for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); return Value(r); });
    if (name == "title") return method([s](Args&) { return Value(title(s)); });
    if (name == "capitalize") return method([s](Args&) { return Value(capitalize(s)); });
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return method([s, starts](Args& a) {
        Value p = a.get(0, "prefix");
        std::vector<std::string> options;
        if (p.is_string()) options.push_back(p.s);
        else if (p.is_array()) for (auto& x : *p.array) options.push_back(x.str());
        for (auto& o : options)
          if (o.size() <= s.size() && (starts ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)) return Value(true);
        return Value(false);
      });
    }
    if (name == "split") {
      return method([s](Args& a) {
        Value sep = a.get(0, "sep");
        int64_t max_split = a.get(1, "maxsplit", Value(int64_t{-1})).i;
        Array parts;
        if (!sep.is_string()) {  // split on runs of whitespace, dropping empty parts
          size_t k = 0;
          while (k < s.size()) {
            while (k < s.size() && is_space_char(s[k])) ++k;
            if (k >= s.size()) break;
            if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) { parts.emplace_back(strip_chars(s.substr(k), Value(), false, true)); break; }
            size_t e = k;
            while (e < s.size() && !is_space_char(s[e])) ++e;
            parts.emplace_back(s.substr(k, e - k));
            k = e;
          }
          return Value(std::move(parts));
        }
        if (sep.s.empty()) throw ConfigError("chat template: split(): empty separator");
        size_t start = 0, pos;
        while ((max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) && (pos = s.find(sep.s, start)) != std::string::npos) {
          parts.emplace_back(s.substr(start, pos - start));
          start = pos + sep.s.size();
        }
        parts.emplace_back(s.substr(start));
        return Value(std::move(parts));
      });
    }
    if (name == "replace") return method([s](Args& a) { return Value(replace_all(s, a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value(int64_t{-1})).i)); });
    if (name == "find") return method([s](Args& a) { size_t p = s.find(a.get(0, "sub").str()); return Value(p == std::string::npos ? int64_t{-1} : static_cast<int64_t>(p)); });
    if (name == "count") return method([s](Args& a) { std::string sub = a.get(0, "sub").str(); int64_t n = 0; if (!sub.empty()) for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n; return Value(n); });
    if (name == "join") return method([s](Args& a) { std::string r; Value items = a.get(0, "iterable"); if (items.is_array()) for (size_t k = 0; k < items.array->size(); ++k) r += (k ? s : "") + (*items.array)[k].str(); return Value(r); });
    if (name == "isdigit") return method([s](Args&) { return Value(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })); });
    if (name == "splitlines") return method([s](Args&) { Array parts; size_t start = 0; while (start < s.size()) { size_t e = s.find('\n', start); if (e == std::string::npos) e = s.size(); std::string line = s.substr(start, e - start); if (!line.empty() && line.back() == '\r') line.pop_back(); parts.emplace_back(line); start = e + 1; } return Value(std::move(parts)); });
    return Value();
  }
  if (obj.is_array()) {
    auto arr = obj.array;
    if (name == "append")
      return method([arr](Args& a) {
        Value item = a.get(0, "item");
        check_storable(item, arr.get());
        arr->push_back(std::move(item));
        return Value::none();
      });
    if (name == "pop") return method([arr](Args& a) { if (arr->empty()) throw ConfigError("chat template: pop from empty list"); int64_t k = a.get(0, "index", Value(static_cast<int64_t>(arr->size()) - 1)).i; if (k < 0) k += static_cast<int64_t>(arr->size()); Value v = (*arr)[k]; arr->erase(arr->begin() + k); return v; });
    return Value();
  }
  (void)node;
  return Value();  // attribute of undefined/none/number: undefined (lenient, so `x.y is defined` works)
}

Value Interpreter::apply_filter(const Node& node, const std::string& name, const Value& v, Args& args) {
  auto as_items = [&](const Value& x) { return iterate(node, x); };
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(static_cast<int64_t>(code_points(v.s).size()));
    if (v.is_array()) return Value(static_cast<int64_t>(v.array->size()));
    if (v.is_object()) return Value(static_cast<int64_t>(v.object->items.size()));
    if (v.is_undefined()) return Value(int64_t{0});
    fail(node, "object has no length");
  }
  if (name == "trim") return Value(strip_chars(v.str(), args.get(0, "chars"), true, true));
  if (name == "upper" || name == "lower") {
    std::string r = v.str();
    for (auto& c : r) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    return Value(r);
  }
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "title") return Value(title(v.str()));
  if (name == "string") return Value(v.str());
  if (name == "safe" || (name == "list" && v.is_array())) return v;
  if (name == "list") return Value(as_items(v));
  if (name == "int") {
    if (v.is_number()) return Value(static_cast<int64_t>(v.as_double()));
    try { return Value(static_cast<int64_t>(std::stoll(v.str()))); } catch (...) { return args.get(0, "default", Value(int64_t{0})); }
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.as_double());
    try { return Value(std::stod(v.str())); } catch (...) { return args.get(0, "default", Value(0.0)); }
  }
  if (name == "abs") return v.kind == Kind::Int ? Value(v.i < 0 ? -v.i : v.i) : Value(std::fabs(v.as_double()));
  if (name == "default" || name == "d") {
    bool boolean = args.get(1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return args.get(0, "default_value", Value(""));
    return v;
  }
  if (name == "tojson") {
    Value indent = args.get(0, "indent");
    return Value(v.to_json(indent.is_number() ? static_cast<int>(indent.as_double()) : -1));
  }
  if (name == "items") {
    if (!v.is_object()) fail(node, "items filter needs a dict");
    Array a;
    for (auto& [k, x] : v.object->items) a.push_back(Value(Array{Value(k), x}));
    return Value(std::move(a));
  }
  if (name == "join") {
    std::string sep = args.get(0, "d", Value("")).str();
    Value attribute = args.get(1, "attribute");
    std::string r;
    auto items = as_items(v);
    for (size_t k = 0; k < items.size(); ++k) {
      Value item = attribute.is_string() ? get_attribute(node, items[k], attribute.s) : items[k];
      r += (k ? sep : "") + item.str();
    }
    return Value(r);
  }
  if (name == "first" || name == "last") {
    auto items = as_items(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cps = code_points(v.s);
      std::string r;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
      return Value(r);
    }
    auto items = as_items(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "replace") return Value(replace_all(v.str(), args.get(0, "old").str(), args.get(1, "new").str(), args.get(2, "count", Value(int64_t{-1})).i));
  if (name == "unique") {
    Array out;
    for (auto& x : as_items(v))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value(std::move(out));
  }
  if (name == "map") {
    Value attribute = args.get(99, "attribute");
    Array out;
    for (auto& x : as_items(v)) {
      if (attribute.is_string()) {
        out.push_back(get_attribute(node, x, attribute.s));
      } else {
        if (args.positional.empty()) fail(node, "map needs a filter name or attribute=");
        Args rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        out.push_back(apply_filter(node, args.positional[0].str(), x, rest));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool by_attr = name.ends_with("attr");
    bool keep_when = name.starts_with("select");
    size_t test_index = by_attr ? 1 : 0;
    Array out;
    for (auto& x : as_items(v)) {
      Value subject = by_attr ? get_attribute(node, x, args.get(0, "attribute").str()) : x;
      bool passed;
      if (args.positional.size() <= test_index) {
        passed = subject.truthy();
      } else {
        Args rest;
        rest.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(test_index) + 1, args.positional.end());
        passed = apply_test(node, args.positional[test_index].str(), subject, rest);
      }
      if (passed == keep_when) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "indent") {
    int64_t width = args.get(0, "width", Value(int64_t{4})).i;
    bool first = args.get(1, "first", Value(false)).truthy();
    std::string pad(static_cast<size_t>(width), ' '), s = v.str(), out;
    for (size_t k = 0; k < s.size(); ++k) {
      out += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') out += pad;
    }
    return Value(first ? pad + out : out);
  }
  if (name == "wordcount") return Value(static_cast<int64_t>((*get_attribute(node, Value(v.str()), "split").function)(args).array->size()));
  fail(node, "unknown filter '" + name + "'");
}

bool Interpreter::apply_test(const Node& node, const std::string& name, const Value& v, Args& args) {
  Value arg = args.get(0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_string();
  if (name == "iterable") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.kind == Kind::Function;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::Int) fail(node, "test '" + name + "' needs an integer");
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") return v.kind == Kind::Int && arg.kind == Kind::Int && arg.i != 0 && v.i % arg.i == 0;
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return equal(v, arg);
  if (name == "ne" || name == "!=") return !equal(v, arg);
  if (name == "in") {
    if (arg.is_array()) return std::any_of(arg.array->begin(), arg.array->end(), [&](const Value& x) { return equal(x, v); });
    if (arg.is_string()) return v.is_string() && arg.s.find(v.s) != std::string::npos;
    if (arg.is_object()) return v.is_string() && arg.object->find(v.s);
    return false;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    for (char c : v.s)
      if (name == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c))) return false;
    return true;
  }
  fail(node, "unknown test '" + name + "'");
}

}  // namespace

struct Node;
Template::Template(std::string source, std::string name)
    : source_(std::move(source)), name_(std::move(name)), root_(parse_template(source_, name_)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const nlohmann::json& variables, const std::map<std::string, Value>& extra) const {
  Interpreter interp(source_, name_);
  std::map<std::string, Value> globals;
  globals["namespace"] = Value(Function([](Args& a) {
    Value ns = Value::new_object();
    for (auto& p : a.positional)
      if (p.is_object()) for (auto& [k, v] : p.object->items) ns.object->set(k, v);
    for (auto& [k, v] : a.keyword) ns.object->set(k, v);
    return ns;
  }));
  globals["dict"] = Value(Function([](Args& a) {
    Value d = Value::new_object();
    for (auto& [k, v] : a.keyword) d.object->set(k, v);
    return d;
  }));
  globals["range"] = Value(Function([](Args& a) {
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) stop = a.positional[0].i;
    else if (a.positional.size() >= 2) start = a.positional[0].i, stop = a.positional[1].i, step = a.positional.size() > 2 ? a.positional[2].i : 1;
    else throw ConfigError("chat template: range() needs arguments");
    if (step == 0) throw ConfigError("chat template: range() step must not be zero");
    const double length = (double(stop) - double(start)) / double(step);
    if (length > double(kMaxLoopIterations))
      throw ConfigError("chat template: range() of more than 1,000,000 numbers");
    Array out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.emplace_back(k);
    return Value(std::move(out));
  }));
  globals["raise_exception"] = Value(Function([](Args& a) -> Value {
    throw ConfigError("chat template raised an exception: " + a.get(0, "message").str());
  }));
  globals["strftime_now"] = Value(Function([](Args& a) {
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    size_t n = std::strftime(buf, sizeof(buf), a.get(0, "format").str().c_str(), &local);
    return Value(std::string(buf, n));
  }));
  if (variables.is_object())
    for (auto it = variables.begin(); it != variables.end(); ++it) globals[it.key()] = Value::from_json(it.value());
  for (const auto& [k, v] : extra) globals[k] = v;
  interp.scopes.push_back(std::move(globals));
  interp.scopes.emplace_back();  // template-level {% set %} goes here, above the globals
  std::string out;
  interp.exec(*root_, out);
  return out;
}

}  // namespace lmtune::jinja
