// A GGUF model's tokenizer (tokenizer.ggml.*) as the tokenizer.json that describes the same tokenizer in HF
// `tokenizers`, run by lmtune's pipeline: model "gpt2" is byte-level BPE with the file's merges and the pre-tokenizer
// regex that tokenizer.ggml.pre names (as llama.cpp's llama-vocab.cpp chooses it); model "llama" is SentencePiece BPE
// with byte fallback, its merges rebuilt from the scores as transformers' GGUF loader does (a merge ranks by the
// score of the piece it makes). Control tokens become special added tokens, user-defined ones non-special added
// tokens. Writing (gguf_tokenizer_metadata) is the inverse: it names the pre-tokenizer from the same table and
// refuses what the reader would rebuild differently.
#include "tokenizer/gguf_vocab.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"

namespace lmtune {
using nlohmann::json;

namespace {

// tokenizer.ggml.tokens / merges; the tokenizer is built through tokenizer.json, whose strings must be UTF-8, so an
// invalid one is a FileError naming the key and index here rather than a json::type_error from dump().
std::vector<std::string> utf8_strings(const GgufFile& f, const std::string& key) {
  std::vector<std::string> out = f.get_strings(key);
  for (size_t i = 0; i < out.size(); ++i)
    if (!tok::is_valid_utf8(out[i])) f.fail_key(key, "element " + std::to_string(i) + " is not valid UTF-8");
  return out;
}

// llama_token_type / gguf-py TokenType.
enum TokenType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Pre-tokenizer regexes of llama.cpp's byte-level pre-tokenizer types (identical to the HF tokenizer.json ones).
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
};

json byte_level_split(const char* regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
}

// The byte-level pieces of a "gpt2" tokenizer: pre-tokenizer (and normalizer) by tokenizer.ggml.pre.
void gpt2_pipeline(const GgufFile& f, json& tj) {
  const std::string pre = f.opt_string("tokenizer.ggml.pre").value_or("default");
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    tj["pre_tokenizer"] = byte_level_split(kLlama3Regex);
    tj["model"]["ignore_merges"] = true;  // llama.cpp's LLAMA3 pre-type and Llama 3's tokenizer.json
  } else if (pre == "qwen2") {
    tj["pre_tokenizer"] = byte_level_split(kQwen2Regex);
    tj["normalizer"] = {{"type", "NFC"}};  // Qwen2's tokenizer.json normalizes to NFC
  } else if (pre == "default" || pre == "gpt-2" || pre == "gpt2") {
    tj["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    f.fail_key("tokenizer.ggml.pre", "unsupported pre-tokenizer '" + pre + "' (supported: llama-bpe, qwen2, gpt-2)");
  }
  tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json merges = json::array();
  if (f.contains("tokenizer.ggml.merges"))
    for (std::string& m : utf8_strings(f, "tokenizer.ggml.merges")) merges.push_back(std::move(m));
  tj["model"]["merges"] = std::move(merges);
}

// Byte offsets of the UTF-8 character boundaries inside s (excluding 0 and s.size()).
std::vector<size_t> char_boundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  return out;
}

// SentencePiece merges from scores, as transformers' GGUFTokenizerSkeleton builds them: every split of a piece into
// two pieces of the vocabulary is a merge with the piece's score; within a piece, splits whose halves score higher
// come first; then all merges are ordered by score, highest first (stable).
json spm_merges(const Vocab& v, const std::vector<float>& scores) {
  std::unordered_map<std::string, size_t> id;
  for (size_t i = 0; i < v.tokens.size(); ++i) id.emplace(v.tokens[i], i);
  struct Merge {
    size_t left, right, piece;
  };
  std::vector<Merge> merges;
  for (size_t p = 0; p < v.tokens.size(); ++p) {
    if (id.at(v.tokens[p]) != p) continue;  // a duplicate piece: its first id wins, as in a Python dict
    const std::string& piece = v.tokens[p];
    const size_t begin = merges.size();
    for (size_t cut : char_boundaries(piece)) {
      auto l = id.find(piece.substr(0, cut)), r = id.find(piece.substr(cut));
      if (l != id.end() && r != id.end()) merges.push_back({l->second, r->second, p});
    }
    std::stable_sort(merges.begin() + int64_t(begin), merges.end(), [&](const Merge& a, const Merge& b) {
      return std::pair(scores[a.left], scores[a.right]) > std::pair(scores[b.left], scores[b.right]);
    });
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [&](const Merge& a, const Merge& b) { return scores[a.piece] > scores[b.piece]; });
  json out = json::array();
  for (const Merge& m : merges) out.push_back(json::array({v.tokens[m.left], v.tokens[m.right]}));
  return out;
}

std::optional<int64_t> token_id(const GgufFile& f, const char* key, size_t n) {
  auto id = f.opt_int(key);
  if (id && (*id < 0 || *id >= int64_t(n)))
    f.fail_key(key, std::to_string(*id) + " is outside the vocabulary [0, " + std::to_string(n) + ")");
  return id;
}

// The SentencePiece pieces of a "llama" tokenizer.
void spm_pipeline(const GgufFile& f, const Vocab& v, json& tj) {
  std::vector<float> scores = f.get_floats("tokenizer.ggml.scores");
  if (scores.size() != v.tokens.size())
    f.fail_key("tokenizer.ggml.scores",
               std::to_string(scores.size()) + " scores for " + std::to_string(v.tokens.size()) + " tokens");
  const bool prefix = f.opt_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  tj["normalizer"] =
      prefix ? json{{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace}}}
             : replace;
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  tj["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  tj["model"]["byte_fallback"] = true;
  tj["model"]["fuse_unk"] = true;
  auto unk = token_id(f, "tokenizer.ggml.unknown_token_id", v.tokens.size());  // out of range: FileError
  if (!unk)
    for (size_t i = 0; i < v.types.size() && !unk; ++i)
      if (v.types[i] == kUnknown) unk = int64_t(i);
  if (unk) tj["model"]["unk_token"] = v.tokens.at(size_t(*unk));
  tj["model"]["merges"] = spm_merges(v, scores);
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  Vocab v{utf8_strings(f, "tokenizer.ggml.tokens"), {}};
  if (v.tokens.empty()) f.fail_key("tokenizer.ggml.tokens", "empty vocabulary");
  v.types = f.contains("tokenizer.ggml.token_type") ? f.get_ints("tokenizer.ggml.token_type")
                                                    : std::vector<int64_t>(v.tokens.size(), kNormal);
  if (v.types.size() != v.tokens.size())
    f.fail_key("tokenizer.ggml.token_type",
               std::to_string(v.types.size()) + " types for " + std::to_string(v.tokens.size()) + " tokens");
  json tj = {{"version", "1.0"}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}};
  tj["model"] = {{"type", "BPE"},     {"dropout", nullptr},     {"unk_token", nullptr},
                 {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false}};
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const bool is_added = v.types[i] == kControl || v.types[i] == kUserDefined;
    if (is_added)
      added.push_back({{"id", i},
                       {"content", v.tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", v.types[i] == kControl}});
    // Byte-level vocabularies keep added tokens out of the model, as HF's do; SentencePiece ones keep every piece.
    if (!is_added || model == "llama") vocab.emplace(v.tokens[i], i);
  }
  tj["model"]["vocab"] = std::move(vocab);
  tj["added_tokens"] = std::move(added);
  if (model == "gpt2")
    gpt2_pipeline(f, tj);
  else if (model == "llama")
    spm_pipeline(f, v, tj);
  else
    f.fail_key("tokenizer.ggml.model", "unsupported tokenizer model '" + model + "' (supported: gpt2, llama)");

  const size_t n = v.tokens.size();
  auto bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
  auto eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
  const bool add_bos = f.opt_bool("tokenizer.ggml.add_bos_token").value_or(model == "llama") && bos;
  const bool add_eos = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false) && eos;
  if (add_bos || add_eos) {
    json single = json::array(), specials = json::object();
    auto special = [&](int64_t id) {
      single.push_back({{"SpecialToken", {{"id", v.tokens[size_t(id)]}, {"type_id", 0}}}});
      specials[v.tokens[size_t(id)]] = {
          {"id", v.tokens[size_t(id)]}, {"ids", {id}}, {"tokens", {v.tokens[size_t(id)]}}};
    };
    if (add_bos) special(*bos);
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) special(*eos);
    tj["post_processor"] = {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
  }

  Tokenizer t = from_json_string(tj.dump(), f.path().string() + " (tokenizer.ggml.*)");
  t.add_bos_token_ = add_bos;
  if (bos) {
    t.bos_id_ = int32_t(*bos);
    t.bos_token_ = v.tokens[size_t(*bos)];
  }
  if (eos) t.eos_token_ = v.tokens[size_t(*eos)];
  // llama.cpp ends generation on every end-of-generation token: eos, eot and eom.
  for (const char* key :
       {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (auto id = token_id(f, key, n); id && std::find(t.eos_ids_.begin(), t.eos_ids_.end(), *id) == t.eos_ids_.end())
      t.eos_ids_.push_back(int32_t(*id));
  if (auto pad = token_id(f, "tokenizer.ggml.padding_token_id", n)) t.pad_id_ = int32_t(*pad);
  t.chat_template_ = f.opt_string("tokenizer.chat_template").value_or("");
  return t;
}

}  // namespace lmtune

// ---- Writing ---------------------------------------------------------------------------------------------------
namespace lmtune {
namespace {

[[noreturn]] void refuse(const tok::Pipeline& p, const std::string& what) {
  throw ConfigError("GGUF export: " + p.name + ": " + what + " has no GGUF form (llama.cpp would tokenize "
                    "differently)");
}

std::string type_of(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }

// The regex of a Sequence [Split(Regex), ByteLevel] pre-tokenizer, or "".
std::string split_regex(const json& pre) {
  if (type_of(pre) != "Sequence") return "";
  const json& list = pre.value("pretokenizers", json::array());
  if (list.size() != 2 || type_of(list[0]) != "Split" || type_of(list[1]) != "ByteLevel") return "";
  const json& pattern = list[0].value("pattern", json());
  return pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()
             ? pattern["Regex"].get<std::string>()
             : "";
}

// tokenizer.ggml.pre of a byte-level tokenizer; the normalizer and ignore_merges must be what gpt2_pipeline
// rebuilds for that name.
std::string gpt2_pre_name(const tok::Pipeline& p) {
  const json& pre = p.pre_tokenizer_spec;
  const std::string regex = split_regex(pre);
  std::string name;
  if (type_of(pre) == "ByteLevel" && pre.value("use_regex", true)) name = "gpt-2";
  else if (regex == kLlama3Regex) name = "llama-bpe";
  else if (regex == kQwen2Regex) name = "qwen2";
  else refuse(p, "the pre-tokenizer " + pre.dump().substr(0, 300));
  const bool nfc = type_of(p.normalizer_spec) == "NFC";
  if (name == "qwen2" ? !nfc : !p.normalizer_spec.is_null())
    refuse(p, "the normalizer " + p.normalizer_spec.dump() + " with the " + name + " pre-tokenizer");
  if (p.model->ignore_merges() != (name == "llama-bpe"))
    refuse(p, std::string("ignore_merges ") + (p.model->ignore_merges() ? "true" : "false") + " with the " + name +
                  " pre-tokenizer");
  return name;
}

// Whether a SentencePiece-style tokenizer prepends ▁ (tokenizer.ggml.add_space_prefix). Its pre-tokenizer must be
// none, a Metaspace that does not split, or a split on " " (a no-op once the normalizer made spaces ▁).
bool spm_space_prefix(const tok::Pipeline& p) {
  const json& pre = p.pre_tokenizer_spec;
  if (type_of(pre) == "Metaspace" && !pre.value("split", true))
    return pre.value("prepend_scheme", std::string("always")) != "never";
  const bool space_split = type_of(pre) == "Split" && pre.value("pattern", json()) == json{{"String", " "}};
  if (!pre.is_null() && !space_split) refuse(p, "the pre-tokenizer " + pre.dump().substr(0, 300));
  return p.normalizer_spec.dump().find("\"Prepend\"") != std::string::npos;
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

// SentencePiece scores that make llama.cpp (and from_gguf) merge in the BPE model's order: the piece the k-th merge
// makes scores -k, single characters 0, anything else far below.
std::vector<float> spm_scores(const tok::Pipeline& p, const std::vector<std::string>& tokens,
                              const std::vector<int32_t>& types) {
  constexpr float kUnmade = -1e9f;
  std::vector<float> scores(tokens.size(), kUnmade);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == kNormal && !tokens[i].empty() &&
        tok::utf8_char_length(static_cast<unsigned char>(tokens[i][0])) == tokens[i].size())
      scores[i] = 0.0f;
  const auto merges = p.model->ranked_merges();
  for (size_t r = 0; r < merges.size(); ++r) {
    auto it = p.model->vocab().find(p.id_to_token[size_t(merges[r].first)] + p.id_to_token[size_t(merges[r].second)]);
    if (it != p.model->vocab().end() && scores[size_t(it->second)] == kUnmade)
      scores[size_t(it->second)] = -float(r + 1);
  }
  return scores;
}

// add_bos_token / add_eos_token as the post-processor behaves: what it puts around an encoded text.
void special_additions(const Tokenizer& t, GgufMetadata& m) {
  const std::vector<int32_t> plain = t.encode("a", false), with = t.encode("a", true);
  auto at = std::search(with.begin(), with.end(), plain.begin(), plain.end());
  if (at == with.end()) refuse(t.pipeline(), "a post-processor that rewrites the encoded text");
  const std::vector<int32_t> prefix(with.begin(), at), suffix(at + int64_t(plain.size()), with.end());
  const std::vector<int32_t> eos = t.eos_ids().empty() ? std::vector<int32_t>{} : std::vector{t.eos_ids()[0]};
  const std::vector<int32_t> bos = t.bos_id() ? std::vector{*t.bos_id()} : std::vector<int32_t>{};
  if (!prefix.empty() && prefix != bos) refuse(t.pipeline(), "a post-processor that prepends other than bos");
  if (!suffix.empty() && suffix != eos) refuse(t.pipeline(), "a post-processor that appends other than eos");
  m.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::of_bool(!prefix.empty()));
  m.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::of_bool(!suffix.empty()));
}

// bos, eos (the first end-of-generation id), eot and eom (the next two: llama.cpp ends generation on all three),
// padding and unknown ids.
void special_ids(const Tokenizer& t, GgufMetadata& m) {
  auto id = [&](const char* key, int32_t v) { m.emplace_back(key, GgufValue::of_u32(uint32_t(v))); };
  if (t.bos_id()) id("tokenizer.ggml.bos_token_id", *t.bos_id());
  const std::vector<int32_t> eos = t.eos_ids();
  const char* keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
  for (size_t i = 0; i < eos.size() && i < 3; ++i) id(keys[i], eos[i]);
  if (eos.size() > 3)
    spdlog::warn("GGUF export: {} end-of-generation tokens; GGUF names three (eos, eot, eom), '{}' and later ones "
                 "are left out (llama.cpp still recognises the usual ones by their text)",
                 eos.size(), t.token(eos[3]));
  if (t.pad_id()) id("tokenizer.ggml.padding_token_id", *t.pad_id());
  if (auto unk = t.pipeline().model->unk_id()) id("tokenizer.ggml.unknown_token_id", *unk);
}

}  // namespace

GgufMetadata gguf_tokenizer_metadata(const Tokenizer& t, int64_t vocab_size) {
  const tok::Pipeline& p = t.pipeline();
  if (t.vocab_size() > vocab_size)
    throw ConfigError("GGUF export: " + p.name + ": the tokenizer has " + std::to_string(t.vocab_size()) +
                      " tokens but the model only " + std::to_string(vocab_size) + " embedding rows");
  const bool spm = p.model->byte_fallback();
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(size_t(vocab_size), kNormal);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i >= p.id_to_token.size() || p.id_to_token[i].empty()) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = kUnused;
      continue;
    }
    tokens[i] = p.id_to_token[i];
    if (p.added[i]) types[i] = p.special[i] ? kControl : kUserDefined;
    else if (spm && is_byte_token(tokens[i])) types[i] = kByte;
  }
  if (auto unk = p.model->unk_id(); unk && spm) types[size_t(*unk)] = kUnknown;

  GgufMetadata m;
  m.emplace_back("tokenizer.ggml.model", GgufValue::of_string(spm ? "llama" : "gpt2"));
  m.emplace_back("tokenizer.ggml.pre", GgufValue::of_string(spm ? "default" : gpt2_pre_name(p)));
  m.emplace_back("tokenizer.ggml.tokens", GgufValue::of_strings(tokens));
  if (spm) m.emplace_back("tokenizer.ggml.scores", GgufValue::of_f32s(spm_scores(p, tokens, types)));
  m.emplace_back("tokenizer.ggml.token_type", GgufValue::of_i32s(types));
  if (spm) {
    m.emplace_back("tokenizer.ggml.add_space_prefix", GgufValue::of_bool(spm_space_prefix(p)));
  } else {
    std::vector<std::string> merges;
    for (const auto& [a, b] : p.model->ranked_merges())
      merges.push_back(p.id_to_token[size_t(a)] + " " + p.id_to_token[size_t(b)]);
    m.emplace_back("tokenizer.ggml.merges", GgufValue::of_strings(merges));
  }
  special_ids(t, m);
  special_additions(t, m);
  if (!t.chat_template().empty()) m.emplace_back("tokenizer.chat_template", GgufValue::of_string(t.chat_template()));
  return m;
}

}  // namespace lmtune
