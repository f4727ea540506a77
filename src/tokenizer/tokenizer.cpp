// Tokenizer loading (tokenizer.json, tokenizer_config.json, generation_config.json) and the encode/decode
// pipeline: split on added tokens → normalize each piece → split on normalized added tokens → pre-tokenize →
// BPE per word → post-process; decoding runs the decoder chain. Mirrors HF `tokenizers` step by step.
#include "tokenizer/tokenizer.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer_internal.h"

namespace lmtune {
namespace fs = std::filesystem;
using tok::json;

namespace {

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FileError(file.string() + ": cannot open file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json parse_json(std::string_view text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double (1e400)
    throw FileError(name + ": invalid JSON: " + e.what());
  }
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...} (AddedToken).
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

namespace tok {

std::vector<int32_t> Pipeline::encode(std::string_view text, bool add_special_tokens) const {
  if (!is_valid_utf8(text)) throw Error(name + ": encode: input text is not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (const auto& segment : raw_matcher.split(text)) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    std::string normalized(segment.text);
    if (normalizer) normalizer->normalize(normalized);
    bool first_sub = true;
    for (const auto& sub : normalized_matcher.split(normalized)) {
      if (sub.token_id >= 0) {
        ids.push_back(sub.token_id);
        first_sub = false;
        continue;
      }
      pieces.assign(1, std::string(sub.text));
      bool at_start = first_sub && segment.text.data() == text.data();
      first_sub = false;
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces, at_start);
      for (const auto& piece : pieces) model->encode_word(piece, ids);
    }
  }
  if (add_special_tokens && post_processor) post_processor->process(ids);
  return ids;
}

std::string Pipeline::decode_bytes(const std::vector<int32_t>& ids, bool skip_special_tokens, bool streaming) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    // Ids without a token decode to nothing, as in HF tokenizers. Models often pad their embedding past the
    // tokenizer's vocabulary (Qwen: 151936 rows for 151669 tokens), and a sampler can pick such a row.
    if (id < 0 || static_cast<size_t>(id) >= id_to_token.size() || id_to_token[id].empty()) continue;
    if (skip_special_tokens && special[id]) continue;
    tokens.push_back(id_to_token[id]);
  }
  if (!decoder) {  // HF joins the token strings with spaces
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder->decode_chain(tokens, streaming);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace tok

namespace {

// id -> token, refusing two tokens for one id: encode and decode would disagree about what the id means. An added
// token may repeat its own vocab entry (HF files list <s>, </s>, <unk> in both).
void fill_id_tables(tok::Pipeline& p, const std::vector<tok::AddedToken>& added, const tok::Origin& origin) {
  int32_t max_id = -1;
  for (const auto& [token, id] : p.model->vocab()) max_id = std::max(max_id, id);
  for (const auto& t : added) max_id = std::max(max_id, t.id);
  p.id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  p.special.assign(p.id_to_token.size(), 0);
  p.added.assign(p.id_to_token.size(), 0);
  std::vector<uint8_t> taken(p.id_to_token.size(), 0);
  for (const auto& [token, id] : p.model->vocab()) {
    if (taken[id])
      origin.at("model.vocab").fail("tokens '" + p.id_to_token[id] + "' and '" + token + "' have the same id " +
                                    std::to_string(id));
    taken[id] = 1;
    p.id_to_token[id] = token;
  }
  for (size_t i = 0; i < added.size(); ++i) {
    const tok::AddedToken& t = added[i];
    if (taken[t.id] && p.id_to_token[t.id] != t.content)
      origin.at("added_tokens").at(i).fail("token '" + t.content + "' has id " + std::to_string(t.id) +
                                           ", already the id of '" + p.id_to_token[t.id] + "'" +
                                           (p.added[t.id] ? " in added_tokens" : " in model.vocab"));
    taken[t.id] = p.added[t.id] = 1;
    p.id_to_token[t.id] = t.content;
  }
  for (const auto& t : added) {
    p.id_to_token[t.id] = t.content;
    p.special[t.id] = t.special;
    p.added[t.id] = 1;
    p.added_ids[t.content] = t.id;
    if (t.normalized) {
      std::string pattern = t.content;
      if (p.normalizer) p.normalizer->normalize(pattern);
      p.normalized_matcher.add(pattern, t);
    } else {
      p.raw_matcher.add(t.content, t);
    }
  }
}

// Runs f, turning nlohmann's type and range errors (value() or get() of a field holding another type) into the
// file's error naming the section being read (fuzz_tokenizer found them escaping as foreign exceptions).
template <class F>
auto in_section(const tok::Origin& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::type_error& e) {
    where.fail(std::string("a field has the wrong type (") + e.what() + ")");
  } catch (const json::out_of_range& e) {
    where.fail(std::string("a field is out of range (") + e.what() + ")");
  }
}

}  // namespace

Tokenizer Tokenizer::from_json_string(std::string_view text, const std::string& name) {
  json root = parse_json(text, name);
  if (!root.is_object()) throw FileError(name + ": expected a JSON object at the top level");
  if (!root.contains("model") || !root["model"].is_object()) throw FileError(name + ": missing 'model' object");
  tok::Origin origin{name, ""};
  auto p = std::make_shared<tok::Pipeline>();
  p->name = name;
  p->normalizer_spec = root.value("normalizer", json());
  p->pre_tokenizer_spec = root.value("pre_tokenizer", json());
  const tok::Origin norm = origin.at("normalizer"), pre = origin.at("pre_tokenizer"), model = origin.at("model");
  const tok::Origin post = origin.at("post_processor"), dec = origin.at("decoder");
  p->normalizer = in_section(norm, [&] { return tok::make_normalizer(p->normalizer_spec, norm); });
  p->pre_tokenizer = in_section(pre, [&] { return tok::make_pre_tokenizer(p->pre_tokenizer_spec, pre); });
  p->model = in_section(model, [&] { return std::make_unique<tok::Bpe>(root["model"], model); });
  p->post_processor =
      in_section(post, [&] { return tok::make_post_processor(root.value("post_processor", json()), post); });
  p->decoder = in_section(dec, [&] { return tok::make_decoder(root.value("decoder", json()), dec); });

  std::vector<tok::AddedToken> added;
  const json& list = root.value("added_tokens", json::array());
  if (!list.is_array()) origin.at("added_tokens").fail("not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    tok::Origin where = origin.at("added_tokens").at(i);
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      where.fail("needs an integer 'id' and a string 'content'");
    tok::AddedToken t;
    t.id = tok::token_id(a["id"], where, "token '" + a["content"].get<std::string>() + "'");
    t.content = a["content"].get<std::string>();
    in_section(where, [&] {
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
    });
    added.push_back(std::move(t));
  }
  fill_id_tables(*p, added, origin);

  Tokenizer tokenizer;
  tokenizer.pipeline_ = std::move(p);
  return tokenizer;
}


Tokenizer Tokenizer::load(const fs::path& file_or_dir) {
  if (auto gguf = find_gguf_model(file_or_dir)) return from_gguf(GgufFile(*gguf));
  fs::path file = file_or_dir;
  bool is_dir = fs::is_directory(file_or_dir);
  if (is_dir) file = file_or_dir / "tokenizer.json";
  if (!fs::exists(file)) throw FileError(file.string() + ": file not found");
  Tokenizer t = from_json_string(read_file(file), file.string());
  if (is_dir) {
    if (fs::exists(file_or_dir / "tokenizer_config.json")) t.read_tokenizer_config(file_or_dir / "tokenizer_config.json");
    if (fs::exists(file_or_dir / "chat_template.jinja")) t.chat_template_ = read_file(file_or_dir / "chat_template.jinja");
    if (fs::exists(file_or_dir / "generation_config.json"))
      t.read_generation_config(file_or_dir / "generation_config.json");
  }
  return t;
}

std::optional<int32_t> Tokenizer::id_of_config_token(const std::string& token, const std::string& where) const {
  auto id = token_to_id(token);
  if (!id) throw ConfigError(where + ": token '" + token + "' is not in the vocabulary");
  return id;
}

void Tokenizer::read_tokenizer_config(const fs::path& file) {
  const std::string name = file.string();
  json config = parse_json(read_file(file), name);
  if (!config.is_object()) throw FileError(name + ": expected a JSON object");
  if (auto bos = config_token(config, "bos_token")) {
    bos_token_ = *bos;
    bos_id_ = id_of_config_token(*bos, name + ": bos_token");
  }
  if (auto eos = config_token(config, "eos_token")) {
    eos_token_ = *eos;
    eos_ids_.push_back(*id_of_config_token(*eos, name + ": eos_token"));
  }
  if (auto pad = config_token(config, "pad_token")) pad_id_ = id_of_config_token(*pad, name + ": pad_token");
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) add_bos_token_ = config["add_bos_token"];
  if (config.contains("chat_template")) {
    const json& ct = config["chat_template"];
    if (ct.is_string()) {
      chat_template_ = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{name, template}, ...]: the "default" one is the chat template
      for (const auto& entry : ct) {
        if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string())
          throw ConfigError(name + ": chat_template: list entries need 'name' and 'template'");
        if (entry.value("name", std::string()) == "default" || chat_template_.empty())
          chat_template_ = entry["template"].get<std::string>();
      }
    } else if (!ct.is_null()) {
      throw ConfigError(name + ": chat_template must be a string or a list of {name, template}");
    }
  }
}

void Tokenizer::read_generation_config(const fs::path& file) {
  const std::string name = file.string();
  json config = parse_json(read_file(file), name);
  if (!config.is_object()) throw FileError(name + ": expected a JSON object");
  // Ids compared as JSON values before narrowing: 2^32 + 2 must not pass as 2.
  auto vocab_id = [&](const json& v, const char* key) {
    if (!v.is_number_integer()) throw ConfigError(name + ": " + key + " must be an integer or a list of integers");
    const bool in_vocab = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(vocab_size())
                                                 : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size();
    if (!in_vocab)
      throw ConfigError(name + ": " + key + " " + v.dump() + " is outside the tokenizer's vocabulary [0, " +
                        std::to_string(vocab_size()) + ")");
    return int32_t(v.get<int64_t>());
  };
  auto add_eos = [&](const json& v) {
    int32_t id = vocab_id(v, "eos_token_id");
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  };
  if (config.contains("eos_token_id") && !config["eos_token_id"].is_null()) {
    const json& eos = config["eos_token_id"];
    if (eos.is_array()) for (const auto& v : eos) add_eos(v);
    else add_eos(eos);
  }
  if (!bos_id_ && config.contains("bos_token_id") && config["bos_token_id"].is_number_integer())
    bos_id_ = vocab_id(config["bos_token_id"], "bos_token_id");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return pipeline_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return tok::to_valid_utf8(pipeline_->decode_bytes(ids, skip_special_tokens, false));
}

int Tokenizer::vocab_size() const { return static_cast<int>(pipeline_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = pipeline_->added_ids.find(token); it != pipeline_->added_ids.end()) return it->second;
  const auto& vocab = pipeline_->model->vocab();
  if (auto it = vocab.find(token); it != vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || pipeline_->id_to_token[id].empty())
    throw ConfigError(pipeline_->name + ": token id " + std::to_string(id) + " is not in the vocabulary");
  return pipeline_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && pipeline_->special[id];
}

// ---- StreamDecoder -------------------------------------------------------------------------------------------
StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::step(int32_t id) {
  // Ids kept as left context once everything before them is emitted: decoders such as Strip or Metaspace treat
  // the first token specially, so the window must not restart at a token that the full decode sees mid-text.
  constexpr size_t kContext = 4;
  window_.push_back(id);
  const auto& p = tokenizer_.pipeline();
  std::string bytes = p.decode_bytes(window_, skip_special_, true);
  size_t complete = tok::complete_utf8_prefix(bytes);
  std::string piece;
  if (complete > emitted_bytes_) {
    piece = tok::to_valid_utf8(std::string_view(bytes).substr(emitted_bytes_, complete - emitted_bytes_));
    emitted_bytes_ = complete;
  }
  if (complete == bytes.size() && window_.size() > 2 * kContext) {
    // Restart the window at a clean token: the context alone must decode to valid text that ends the window's
    // text (it would not when cut inside a run of <0xXX> byte tokens, whose group ByteFallback judges whole).
    for (size_t keep = kContext; keep < std::min(window_.size(), 4 * kContext); ++keep) {
      std::vector<int32_t> context(window_.end() - static_cast<ptrdiff_t>(keep), window_.end());
      std::string context_bytes = p.decode_bytes(context, skip_special_, true);
      if (tok::is_valid_utf8(context_bytes) && context_bytes.size() <= bytes.size() &&
          bytes.compare(bytes.size() - context_bytes.size(), context_bytes.size(), context_bytes) == 0) {
        window_ = std::move(context);
        emitted_bytes_ = context_bytes.size();
        break;
      }
    }
  }
  return piece;
}

std::string StreamDecoder::flush() {
  std::string all = tokenizer_.decode(window_, skip_special_);
  std::string rest = all.size() > emitted_bytes_ ? all.substr(emitted_bytes_) : std::string();
  window_.clear();
  emitted_bytes_ = 0;
  return rest;
}

double bench_encode_mb_per_s(const Tokenizer& tokenizer, std::string_view corpus) {
  auto start = std::chrono::steady_clock::now();
  size_t bytes = 0, ids = 0;
  while (!corpus.empty()) {
    size_t end = corpus.find('\n');
    std::string_view line = corpus.substr(0, end == std::string_view::npos ? corpus.size() : end + 1);
    corpus.remove_prefix(line.size());
    ids += tokenizer.encode(line, false).size();
    bytes += line.size();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ids > 0 && seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0;
}

}  // namespace lmtune
