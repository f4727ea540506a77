// Parsed form of a Jinja template (internal to jinja_parser.cpp and jinja_eval.cpp). One generic node type keeps
// the parser and evaluator short; `kind` says which fields are used.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace lmtune::jinja {

enum class NodeKind {
  // expressions
  Literal, Name, GetAttr, GetItem, Slice, Call, Filter, Test, Unary, Binary, Ternary, ListLit, DictLit, TupleLit,
  // statements
  Body, Text, Output, If, For, Set, SetBlock, Macro, Break, Continue,
};

struct Node {
  NodeKind kind;
  size_t pos = 0;       // offset in the template source, for error messages
  Value literal;        // Literal; Text holds its text in `name`
  std::string name;     // Name, GetAttr attribute, Filter/Test name, operator, Set target, Macro name, Text
  bool negated = false; // Test: "is not"
  std::vector<std::unique_ptr<Node>> children;  // operands / statement bodies (see parser for each layout)
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> keywords;  // call kwargs, dict items, macro params
  std::vector<std::string> targets;  // For loop variables, Set tuple targets
  Node(NodeKind k, size_t p) : kind(k), pos(p) {}
};

std::unique_ptr<Node> parse_template(const std::string& source, const std::string& name);
// "name: line L, column C" for an offset.
std::string describe_position(const std::string& source, const std::string& name, size_t pos);

}  // namespace lmtune::jinja
