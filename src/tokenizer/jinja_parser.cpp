// Jinja lexer and parser: splits the template into text and {{ }} / {% %} / {# #} tags (applying whitespace
// control, trim_blocks and lstrip_blocks as transformers configures them) and parses expressions with Jinja2's
// precedence: ternary < or < and < not < comparisons/in/is < + - < ~ < * / // % < ** < unary < postfix/filters.
#include <cctype>
#include <charconv>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace lmtune::jinja {

std::string describe_position(const std::string& source, const std::string& name, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') ++line, column = 1;
    else ++column;
  }
  return name + ": line " + std::to_string(line) + ", column " + std::to_string(column);
}

namespace {

struct Token {
  enum Type { Name, String, Int, Float, Op, End } type;
  std::string text;
  size_t pos;
};

// One piece of the template: literal text or the tokens inside a tag.
struct Piece {
  enum Type { Text, Expr, Stmt } type;
  std::string text;
  std::vector<Token> tokens;
  size_t pos;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Piece> run() {
    std::vector<Piece> pieces;
    size_t i = 0;
    bool strip_next_text = false;  // previous tag ended with '-'
    bool trim_newline = false;     // previous block tag ended (trim_blocks)
    while (i < src_.size()) {
      size_t open = find_tag(i);
      std::string text = src_.substr(i, open - i);
      size_t text_pos = i;
      if (strip_next_text) {
        size_t k = 0;
        while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
        text.erase(0, k);
        text_pos += k;
      } else if (trim_newline && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
        ++text_pos;
      } else if (trim_newline && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
        text.erase(0, 2);
        text_pos += 2;
      }
      strip_next_text = trim_newline = false;
      if (open == src_.size()) {
        if (!text.empty()) pieces.push_back({Piece::Text, text, {}, text_pos});
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      size_t body = open + 2;
      char modifier = body < src_.size() ? src_[body] : 0;
      if (modifier == '-') {
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
        ++body;
      } else if (modifier == '+') {
        ++body;
      } else if (kind != '{') {
        lstrip_block(text, i);
      }
      if (!text.empty()) pieces.push_back({Piece::Text, text, {}, text_pos});

      if (kind == '#') {
        size_t close = src_.find("#}", body);
        if (close == std::string::npos) fail(open, "unterminated comment");
        strip_next_text = close > 0 && src_[close - 1] == '-';
        trim_newline = true;
        i = close + 2;
        continue;
      }
      const std::string closer = kind == '{' ? "}}" : "%}";
      Piece piece{kind == '{' ? Piece::Expr : Piece::Stmt, "", {}, open};
      size_t k = body;
      while (true) {
        while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
        if (k >= src_.size()) fail(open, "unterminated tag");
        if (src_.compare(k, 1, "-") == 0 && src_.compare(k + 1, 2, closer) == 0) {
          strip_next_text = true;
          k += 3;
          break;
        }
        if (src_.compare(k, 2, closer) == 0) {
          k += 2;
          break;
        }
        piece.tokens.push_back(next_token(k));
      }
      if (kind == '%') {
        trim_newline = !strip_next_text;
        // {% raw %} ... {% endraw %}: the text between is copied verbatim.
        if (piece.tokens.size() == 1 && piece.tokens[0].text == "raw") {
          size_t end = src_.find("endraw", k);
          size_t tag_start = end == std::string::npos ? end : src_.rfind("{%", end);
          if (tag_start == std::string::npos) fail(open, "unterminated raw block");
          std::string raw = src_.substr(k, tag_start - k);
          if (src_.compare(tag_start + 2, 1, "-") == 0)
            while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.pop_back();
          pieces.push_back({Piece::Text, raw, {}, k});
          size_t close = src_.find("%}", end);
          if (close == std::string::npos) fail(open, "unterminated raw block");
          strip_next_text = src_[close - 1] == '-';
          trim_newline = !strip_next_text;
          i = close + 2;
          continue;
        }
      }
      piece.tokens.push_back({Token::End, "", k});
      pieces.push_back(std::move(piece));
      i = k;
    }
    return pieces;
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  // lstrip_blocks: drop spaces/tabs between the start of the line and a block or comment tag.
  void lstrip_block(std::string& text, size_t text_start) const {
    size_t line_start = text.rfind('\n');
    size_t from;
    if (line_start != std::string::npos) from = line_start + 1;
    else if (text_start == 0 || src_[text_start - 1] == '\n') from = 0;
    else return;
    for (size_t k = from; k < text.size(); ++k)
      if (text[k] != ' ' && text[k] != '\t') return;
    text.erase(from);
  }

  Token next_token(size_t& k) {
    size_t start = k;
    char c = src_[k];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (k < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
      return {Token::Name, src_.substr(start, k - start), start};
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
      bool is_float = false;
      if (k + 1 < src_.size() && src_[k] == '.' && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
        is_float = true;
        ++k;
        while (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) ++k;
      }
      std::string text = src_.substr(start, k - start);
      std::erase(text, '_');
      return {is_float ? Token::Float : Token::Int, text, start};
    }
    if (c == '\'' || c == '"') {
      std::string out;
      ++k;
      while (k < src_.size() && src_[k] != c) {
        if (src_[k] == '\\' && k + 1 < src_.size()) {
          char e = src_[++k];
          switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            default: out += '\\'; out += e;
          }
          ++k;
        } else {
          out += src_[k++];
        }
      }
      if (k >= src_.size()) fail(start, "unterminated string");
      ++k;
      return {Token::String, out, start};
    }
    static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                      "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
    for (const char* op : ops) {
      size_t n = std::char_traits<char>::length(op);
      if (src_.compare(k, n, op) == 0) {
        k += n;
        return {Token::Op, op, start};
      }
    }
    fail(start, std::string("unexpected character '") + c + "'");
  }

  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw ConfigError(describe_position(src_, name_, pos) + ": syntax error: " + msg);
  }

  const std::string& src_;
  const std::string& name_;
};

class Parser {
 public:
  Parser(const std::string& src, const std::string& name, std::vector<Piece> pieces)
      : src_(src), name_(name), pieces_(std::move(pieces)) {}

  std::unique_ptr<Node> run() {
    // Bounds on what a template (code from the internet) can make the parser and the renderer recurse through:
    // an operator chain is as deep as it is long, so each {{ }} / {% %} is limited in tokens, and brackets,
    // unary operators and blocks in nesting.
    for (const Piece& p : pieces_)
      if (p.tokens.size() > kMaxTokens) fail(p.pos, "more than 4,000 tokens in one {{ }} or {% %}");
    auto body = parse_body({});
    if (index_ < pieces_.size()) fail(pieces_[index_].pos, "unexpected '" + pieces_[index_].tokens[0].text + "'");
    return body;
  }

 private:
  using Ptr = std::unique_ptr<Node>;

  // Parses statements until a {% tag %} whose keyword is in `stops` (left unconsumed) or the end.
  Ptr parse_body(const std::vector<std::string>& stops) {
    Nest nest(*this, index_ < pieces_.size() ? pieces_[index_].pos : 0);
    auto body = std::make_unique<Node>(NodeKind::Body, index_ < pieces_.size() ? pieces_[index_].pos : 0);
    while (index_ < pieces_.size()) {
      Piece& p = pieces_[index_];
      if (p.type == Piece::Text) {
        auto t = std::make_unique<Node>(NodeKind::Text, p.pos);
        t->name = p.text;
        body->children.push_back(std::move(t));
        ++index_;
        continue;
      }
      tokens_ = &p.tokens;
      at_ = 0;
      if (p.type == Piece::Expr) {
        auto out = std::make_unique<Node>(NodeKind::Output, p.pos);
        out->children.push_back(expression());
        expect_end();
        body->children.push_back(std::move(out));
        ++index_;
        continue;
      }
      const Token& keyword = peek();
      if (keyword.type != Token::Name) fail(keyword.pos, "expected a statement keyword");
      for (const auto& s : stops)
        if (keyword.text == s) return body;
      ++index_;
      ++at_;
      body->children.push_back(statement(keyword));
    }
    if (!stops.empty()) fail(src_.size(), "missing {% " + stops.back() + " %}");
    return body;
  }

  // Consumes the {% keyword %} that ended a body (checking it is one of `allowed`), returns the keyword.
  std::string close_tag(const std::vector<std::string>& allowed) {
    if (index_ >= pieces_.size()) fail(src_.size(), "missing {% " + allowed.back() + " %}");
    tokens_ = &pieces_[index_].tokens;
    at_ = 0;
    std::string kw = next().text;
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == kw;
    if (!ok) fail(pieces_[index_].pos, "unexpected '" + kw + "'");
    ++index_;
    return kw;
  }

  Ptr statement(const Token& kw) {
    const std::string& k = kw.text;
    if (k == "if") {
      auto node = std::make_unique<Node>(NodeKind::If, kw.pos);
      node->children.push_back(expression());
      expect_end();
      node->children.push_back(parse_body({"elif", "else", "endif"}));
      while (true) {
        std::string tag = close_tag({"elif", "else", "endif"});
        if (tag == "endif") { expect_end(); break; }
        if (tag == "elif") {
          node->children.push_back(expression());
          expect_end();
          node->children.push_back(parse_body({"elif", "else", "endif"}));
        } else {
          expect_end();
          node->children.push_back(parse_body({"endif"}));
          close_tag({"endif"});
          expect_end();
          break;
        }
      }
      return node;  // children: cond, body, cond, body, ..., [else body]
    }
    if (k == "for") {
      auto node = std::make_unique<Node>(NodeKind::For, kw.pos);
      do node->targets.push_back(expect_name()); while (accept(","));
      if (next().text != "in") fail(kw.pos, "expected 'in' in for loop");
      node->children.push_back(expression(false));  // iterable (no ternary: `if` filters items)
      node->children.push_back(accept("if") ? expression(false) : nullptr);
      if (accept("recursive")) fail(kw.pos, "recursive loops are not supported");
      expect_end();
      node->children.push_back(parse_body({"else", "endfor"}));
      if (close_tag({"else", "endfor"}) == "else") {
        expect_end();
        node->children.push_back(parse_body({"endfor"}));
        close_tag({"endfor"});
      } else {
        node->children.push_back(nullptr);
      }
      expect_end();
      return node;  // children: iterable, filter, body, else body
    }
    if (k == "set") {
      std::vector<std::string> targets{expect_name()};
      std::string attribute;
      if (accept(".")) attribute = expect_name();
      while (accept(",")) targets.push_back(expect_name());
      if (accept("=")) {
        auto node = std::make_unique<Node>(NodeKind::Set, kw.pos);
        node->targets = targets;
        node->name = attribute;  // non-empty: {% set ns.attr = ... %}
        node->children.push_back(expression());
        expect_end();
        return node;
      }
      expect_end();
      auto node = std::make_unique<Node>(NodeKind::SetBlock, kw.pos);
      node->targets = targets;
      node->children.push_back(parse_body({"endset"}));
      close_tag({"endset"});
      expect_end();
      return node;
    }
    if (k == "macro") {
      auto node = std::make_unique<Node>(NodeKind::Macro, kw.pos);
      node->name = expect_name();
      expect("(");
      while (!accept(")")) {
        std::string param = expect_name();
        node->keywords.emplace_back(param, accept("=") ? expression() : nullptr);
        if (!accept(",")) { expect(")"); break; }
      }
      expect_end();
      node->children.push_back(parse_body({"endmacro"}));
      close_tag({"endmacro"});
      expect_end();
      return node;
    }
    if (k == "break" || k == "continue") {
      expect_end();
      return std::make_unique<Node>(k == "break" ? NodeKind::Break : NodeKind::Continue, kw.pos);
    }
    if (k == "generation") {  // transformers' {% generation %} marker: rendered as its content
      expect_end();
      auto body = parse_body({"endgeneration"});
      close_tag({"endgeneration"});
      expect_end();
      return body;
    }
    fail(kw.pos, "unsupported statement '" + k + "'");
  }

  // ---- expressions ----
  Ptr expression(bool allow_ternary = true) {
    Nest nest(*this, peek().pos);
    Ptr value = or_expr();
    if (allow_ternary && accept("if")) {
      auto node = std::make_unique<Node>(NodeKind::Ternary, value->pos);
      node->children.push_back(or_expr());  // condition
      node->children.push_back(std::move(value));
      node->children.push_back(accept("else") ? expression() : nullptr);
      return node;  // children: cond, then, else
    }
    return value;
  }
  Ptr binary(Ptr left, const std::string& op, Ptr right) {
    auto node = std::make_unique<Node>(NodeKind::Binary, left->pos);
    node->name = op;
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }
  Ptr or_expr() {
    Ptr left = and_expr();
    while (accept("or")) left = binary(std::move(left), "or", and_expr());
    return left;
  }
  Ptr and_expr() {
    Ptr left = not_expr();
    while (accept("and")) left = binary(std::move(left), "and", not_expr());
    return left;
  }
  Ptr not_expr() {
    if (peek().type == Token::Name && peek().text == "not") {
      size_t pos = next().pos;
      auto node = std::make_unique<Node>(NodeKind::Unary, pos);
      node->name = "not";
      Nest nest(*this, pos);
      node->children.push_back(not_expr());
      return node;
    }
    return compare();
  }
  Ptr compare() {
    Ptr left = math1();
    while (true) {
      const Token& t = peek();
      if (t.type == Token::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                  t.text == "<=" || t.text == ">=")) {
        std::string op = next().text;
        left = binary(std::move(left), op, math1());
      } else if (t.type == Token::Name && t.text == "in") {
        next();
        left = binary(std::move(left), "in", math1());
      } else if (t.type == Token::Name && t.text == "not" && at_ + 1 < tokens_->size() &&
                 (*tokens_)[at_ + 1].text == "in") {
        next(), next();
        left = binary(std::move(left), "not in", math1());
      } else {
        return left;
      }
    }
  }
  Ptr math1() {
    Ptr left = concat();
    while (peek().type == Token::Op && (peek().text == "+" || peek().text == "-")) {
      std::string op = next().text;
      left = binary(std::move(left), op, concat());
    }
    return left;
  }
  Ptr concat() {
    Ptr left = math2();
    while (accept("~")) left = binary(std::move(left), "~", math2());
    return left;
  }
  Ptr math2() {
    Ptr left = power();
    while (peek().type == Token::Op &&
           (peek().text == "*" || peek().text == "/" || peek().text == "//" || peek().text == "%")) {
      std::string op = next().text;
      left = binary(std::move(left), op, power());
    }
    return left;
  }
  Ptr power() {
    Ptr left = unary();
    while (accept("**")) left = binary(std::move(left), "**", unary());
    return left;
  }
  Ptr unary() {
    if (peek().type == Token::Op && (peek().text == "-" || peek().text == "+")) {
      const Token& t = next();
      auto node = std::make_unique<Node>(NodeKind::Unary, t.pos);
      node->name = t.text;
      Nest nest(*this, t.pos);
      node->children.push_back(unary());
      return filters(std::move(node));
    }
    return filters(postfix(primary()));
  }
  // `x | f(args)` and `x is [not] test(args)`, left to right.
  Ptr filters(Ptr node) {
    while (true) {
      if (accept("|")) {
        auto f = std::make_unique<Node>(NodeKind::Filter, peek().pos);
        f->name = expect_name();
        f->children.push_back(std::move(node));
        if (accept("(")) call_args(*f);
        node = std::move(f);
      } else if (peek().type == Token::Name && peek().text == "is") {
        auto t = std::make_unique<Node>(NodeKind::Test, next().pos);
        t->negated = accept("not");
        const Token& name = next();
        if (name.type != Token::Name) fail(name.pos, "expected a test name after 'is'");
        t->name = name.text;
        t->children.push_back(std::move(node));
        if (accept("(")) {
          call_args(*t);
        } else if (peek().type != Token::End && peek().type != Token::Op && peek().text != "and" &&
                   peek().text != "or" && peek().text != "else" && peek().text != "if") {
          t->children.push_back(primary());  // `is sameas false`, `is divisibleby 3`
        }
        node = std::move(t);
      } else {
        return node;
      }
    }
  }
  Ptr postfix(Ptr node) {
    while (true) {
      if (accept(".")) {
        auto g = std::make_unique<Node>(NodeKind::GetAttr, node->pos);
        g->name = expect_name();
        g->children.push_back(std::move(node));
        node = std::move(g);
      } else if (peek().type == Token::Op && peek().text == "[") {
        size_t pos = next().pos;
        Ptr parts[3];
        int colons = 0;
        while (!accept("]")) {
          if (accept(":")) {
            if (++colons > 2) fail(pos, "too many ':' in slice");
          } else {
            parts[colons] = expression();
          }
        }
        if (colons == 0) {
          if (!parts[0]) fail(pos, "empty subscript");
          auto g = std::make_unique<Node>(NodeKind::GetItem, pos);
          g->children.push_back(std::move(node));
          g->children.push_back(std::move(parts[0]));
          node = std::move(g);
        } else {
          auto s = std::make_unique<Node>(NodeKind::Slice, pos);
          s->children.push_back(std::move(node));
          for (auto& p : parts) s->children.push_back(std::move(p));
          node = std::move(s);
        }
      } else if (peek().type == Token::Op && peek().text == "(") {
        auto c = std::make_unique<Node>(NodeKind::Call, next().pos);
        c->children.push_back(std::move(node));
        call_args(*c);
        node = std::move(c);
      } else {
        return node;
      }
    }
  }
  // After "(": positional args appended to children, kwargs to keywords, up to ")".
  void call_args(Node& node) {
    while (!accept(")")) {
      if (peek().type == Token::Name && at_ + 1 < tokens_->size() && (*tokens_)[at_ + 1].text == "=") {
        std::string key = next().text;
        next();
        node.keywords.emplace_back(key, expression());
      } else {
        node.children.push_back(expression());
      }
      if (!accept(",")) { expect(")"); break; }
    }
  }
  // A numeric literal's value; one that does not fit (e.g. 99999999999999999999) is a syntax error, not a
  // std::out_of_range escaping from stoll/stod.
  template <typename T>
  T number(const Token& t) const {
    T v{};
    auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || end != t.text.data() + t.text.size())
      fail(t.pos, "number literal " + t.text.substr(0, 40) + (t.text.size() > 40 ? "..." : "") + " is out of range");
    return v;
  }
  Ptr primary() {
    const Token& t = next();
    auto literal = [&](Value v) {
      auto n = std::make_unique<Node>(NodeKind::Literal, t.pos);
      n->literal = std::move(v);
      return n;
    };
    switch (t.type) {
      case Token::String: {
        std::string s = t.text;
        while (peek().type == Token::String) s += next().text;  // adjacent literals concatenate
        return literal(s);
      }
      case Token::Int: return literal(Value(number<int64_t>(t)));
      case Token::Float: return literal(Value(number<double>(t)));
      case Token::Name:
        if (t.text == "true" || t.text == "True") return literal(true);
        if (t.text == "false" || t.text == "False") return literal(false);
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        {
          auto n = std::make_unique<Node>(NodeKind::Name, t.pos);
          n->name = t.text;
          return n;
        }
      case Token::Op:
        if (t.text == "(") {
          if (accept(")")) return std::make_unique<Node>(NodeKind::TupleLit, t.pos);
          Ptr first = expression();
          if (accept(")")) return first;
          auto tuple = std::make_unique<Node>(NodeKind::TupleLit, t.pos);
          tuple->children.push_back(std::move(first));
          while (accept(",")) {
            if (peek().text == ")") break;
            tuple->children.push_back(expression());
          }
          expect(")");
          return tuple;
        }
        if (t.text == "[") {
          auto list = std::make_unique<Node>(NodeKind::ListLit, t.pos);
          while (!accept("]")) {
            list->children.push_back(expression());
            if (!accept(",")) { expect("]"); break; }
          }
          return list;
        }
        if (t.text == "{") {
          auto dict = std::make_unique<Node>(NodeKind::DictLit, t.pos);
          while (!accept("}")) {
            dict->children.push_back(expression());
            expect(":");
            dict->children.push_back(expression());
            if (!accept(",")) { expect("}"); break; }
          }
          return dict;  // children: key, value, key, value, ...
        }
        break;
      case Token::End: fail(t.pos, "unexpected end of tag");
    }
    fail(t.pos, "unexpected '" + t.text + "'");
  }

  // ---- token helpers ----
  const Token& peek() const { return (*tokens_)[at_]; }
  const Token& next() {
    const Token& t = (*tokens_)[at_];
    if (t.type != Token::End) ++at_;
    return t;
  }
  bool accept(const std::string& text) {
    const Token& t = peek();
    if ((t.type == Token::Op || t.type == Token::Name) && t.text == text) {
      ++at_;
      return true;
    }
    return false;
  }
  void expect(const std::string& text) {
    if (!accept(text)) fail(peek().pos, "expected '" + text + "', found '" + peek().text + "'");
  }
  std::string expect_name() {
    const Token& t = next();
    if (t.type != Token::Name) fail(t.pos, "expected a name, found '" + t.text + "'");
    return t.text;
  }
  void expect_end() {
    if (peek().type != Token::End) fail(peek().pos, "unexpected '" + peek().text + "'");
  }
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw ConfigError(describe_position(src_, name_, pos) + ": syntax error: " + msg);
  }

  static constexpr size_t kMaxTokens = 4000;
  static constexpr int kMaxNesting = 100;
  // One level of brackets, unary operator or block; more than kMaxNesting is a syntax error.
  struct Nest {
    Parser& p;
    Nest(Parser& p, size_t pos) : p(p) {
      if (++p.nesting_ > kMaxNesting) p.fail(pos, "nested deeper than 100 levels");
    }
    ~Nest() { --p.nesting_; }
  };

  const std::string& src_;
  const std::string& name_;
  std::vector<Piece> pieces_;
  int nesting_ = 0;
  size_t index_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  size_t at_ = 0;
};

}  // namespace

std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name) {
  // Jinja drops a single trailing newline of the template (keep_trailing_newline=False).
  std::string src = source;
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src, name);
  Parser parser(src, name, lexer.run());
  return parser.run();
}

}  // namespace lmtune::jinja
