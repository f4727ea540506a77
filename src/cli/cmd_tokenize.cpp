// `lmtune tokenize`: encodes text (--text, or --jsonl with one {"text": ...} per line) with a HuggingFace
// tokenizer and prints {"ids": [...], "tokens": [...]} per input, or decodes comma-separated ids (--decode).
// Errors are lmtune errors (FileError / ConfigError) that main turns into a message and exit code.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool add_special = false;
  bool skip_special = false;
  std::string text;
  std::string jsonl;
  std::string decode;
};

nlohmann::json encoding_json(const Tokenizer& tokenizer, const std::string& text, bool add_special) {
  auto ids = tokenizer.encode(text, add_special);
  nlohmann::json tokens = nlohmann::json::array();
  for (int32_t id : ids) tokens.push_back(tokenizer.token(id));
  return {{"ids", ids}, {"tokens", tokens}};
}

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) {
      size_t used = 0;
      long value = -1;
      try {
        value = std::stol(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || value < 0 || value > INT32_MAX)
        throw ConfigError("--decode: '" + item + "' is not a token id");
      ids.push_back(static_cast<int32_t>(value));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

void run_tokenize(const TokenizeOptions& opts) {
  const Tokenizer tokenizer = Tokenizer::load(opts.tokenizer);
  // Token strings are valid UTF-8, but replace rather than throw if a hand-made vocab has odd bytes.
  auto print = [](const nlohmann::json& j) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  };
  if (!opts.decode.empty()) {
    std::cout << tokenizer.decode(parse_ids(opts.decode), opts.skip_special) << '\n';
    return;
  }
  if (!opts.jsonl.empty()) {
    std::ifstream in(opts.jsonl);
    if (!in) throw FileError(opts.jsonl + ": cannot open file");
    std::string line;
    for (size_t line_no = 1; std::getline(in, line); ++line_no) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      const std::string where = opts.jsonl + ":" + std::to_string(line_no);
      nlohmann::json record;
      try {
        record = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {  // parse_error, out_of_range (1e400)
        throw FileError(where + ": invalid JSON: " + e.what());
      }
      if (!record.is_object() || !record.contains("text") || !record["text"].is_string())
        throw FileError(where + ": expected an object with a string \"text\"");
      try {
        print(encoding_json(tokenizer, record["text"].get<std::string>(), opts.add_special));
      } catch (const Error& e) {
        throw FileError(where + ": " + e.what());
      }
    }
    return;
  }
  print(encoding_json(tokenizer, opts.text, opts.add_special));
}

}  // namespace

namespace cli {

void add_tokenize_command(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text or decode ids with a HuggingFace tokenizer");
  cmd->add_option("--tokenizer", opts->tokenizer, "tokenizer.json, or a model directory holding it")->required();
  cmd->add_flag("--add-special", opts->add_special, "Add the special tokens of the post-processor (e.g. <bos>)");
  cmd->add_flag("--skip-special", opts->skip_special, "With --decode: leave special tokens out of the text");
  auto* text = cmd->add_option("--text", opts->text, "Text to encode");
  auto* jsonl = cmd->add_option("--jsonl", opts->jsonl, "JSONL file with one {\"text\": ...} per line");
  auto* decode = cmd->add_option("--decode", opts->decode, "Comma-separated ids to decode, e.g. 1,2,3");
  text->excludes(jsonl)->excludes(decode);
  jsonl->excludes(decode);
  cmd->callback([opts, cmd] {
    if (cmd->count("--text") + cmd->count("--jsonl") + cmd->count("--decode") == 0)
      throw ConfigError("tokenize: give one of --text, --jsonl or --decode");
    run_tokenize(*opts);
  });
}

}  // namespace cli
}  // namespace lmtune
