// Random model initialisation in HF layout (see init_model.h).
#include "models/init_model.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "models/hf_config_writer.h"
#include "models/weights.h"

namespace lmtune::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json yaml_to_json(const YAML::Node& n, const std::string& where) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& item : n) a.push_back(yaml_to_json(item, where));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = yaml_to_json(kv.second, where);
      return o;
    }
    case YAML::NodeType::Scalar: break;
  }
  const std::string s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  if (s == "null" || s == "~" || s.empty()) return nullptr;
  char* end = nullptr;
  errno = 0;
  long long i = std::strtoll(s.c_str(), &end, 10);
  if (end && *end == '\0' && errno == 0) return int64_t(i);
  errno = 0;
  double d = std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && errno == 0) return d;
  return s;
}

DType dtype_from_torch(const std::string& name, const std::string& where) {
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float16" || name == "half") return DType::f16;
  throw ConfigError(where + ": key 'torch_dtype': unsupported value '" + name + "' (float32, bfloat16, float16)");
}

std::string torch_name(DType d) {
  switch (d) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

json read_json_file(const fs::path& p) { return parse_json_strict(read_file_text(p), p.string()); }

// A special token given in tokenizer_config.json (a string or {"content": ...}) -> its id, if it can be found.
std::optional<int64_t> special_token_id(const fs::path& dir, const char* key) {
  if (!fs::exists(dir / "tokenizer_config.json") || !fs::exists(dir / "tokenizer.json")) return std::nullopt;
  json cfg = read_json_file(dir / "tokenizer_config.json");
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  std::string content = it->is_string() ? it->get<std::string>()
                        : it->is_object() && it->contains("content") ? (*it)["content"].get<std::string>()
                                                                     : "";
  if (content.empty()) return std::nullopt;
  json tok = read_json_file(dir / "tokenizer.json");
  if (tok.contains("added_tokens"))
    for (const json& t : tok["added_tokens"])
      if (t.value("content", "") == content) return t["id"].get<int64_t>();
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object() &&
      tok["model"]["vocab"].contains(content))
    return tok["model"]["vocab"][content].get<int64_t>();
  return std::nullopt;
}

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  static const char* names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                                "chat_template.jinja", "chat_template.json"};
  int copied = 0;
  for (const char* n : names) {
    if (!fs::exists(from / n)) continue;
    write_file_atomic(to / n, read_file_bytes(from / n));
    ++copied;
  }
  if (copied == 0) throw FileError(from.string() + ": no tokenizer files (tokenizer.json, vocab.json, ...) found");
}

}  // namespace

json yaml_file_to_json(const fs::path& path) {
  std::string text = read_file_text(path);
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) throw ConfigError(path.string() + ": expected a mapping of config.json keys");
    return yaml_to_json(root, path.string());
  } catch (const YAML::Exception& e) {
    throw ConfigError(path.string() + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

int64_t tokenizer_vocab_size(const fs::path& dir) {
  int64_t max_id = -1;
  auto see = [&](const json& id) {
    if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
  };
  if (fs::exists(dir / "tokenizer.json")) {
    json tok = read_json_file(dir / "tokenizer.json");
    if (tok.contains("model") && tok["model"].contains("vocab")) {
      const json& v = tok["model"]["vocab"];
      if (v.is_object())
        for (const auto& [piece, id] : v.items()) see(id);
      else if (v.is_array())  // Unigram: [[piece, score], ...], ids are positions
        max_id = std::max(max_id, int64_t(v.size()) - 1);
    }
    if (tok.contains("added_tokens"))
      for (const json& t : tok["added_tokens"]) see(t.value("id", json()));
  } else if (fs::exists(dir / "vocab.json")) {
    // Named locals: a range-for over a temporary's items() would outlive the temporary.
    const json vocab = read_json_file(dir / "vocab.json");
    for (const auto& [piece, id] : vocab.items()) see(id);
    if (fs::exists(dir / "added_tokens.json")) {
      const json added = read_json_file(dir / "added_tokens.json");
      for (const auto& [piece, id] : added.items()) see(id);
    }
  } else {
    throw FileError(dir.string() + ": no tokenizer.json or vocab.json");
  }
  if (max_id < 0) throw FileError(dir.string() + ": the tokenizer has an empty vocabulary");
  return max_id + 1;
}

InitResult init_model_dir(const InitOptions& o) {
  const std::string where = o.preset.string();
  json preset = yaml_file_to_json(o.preset);
  if (!o.arch.empty()) {
    if (preset.contains("model_type") && preset["model_type"] != o.arch)
      throw ConfigError(where + ": key 'model_type': the preset says " + preset["model_type"].dump() +
                        " but --arch is '" + o.arch + "'");
    preset["model_type"] = o.arch;
  }
  if (!preset.contains("model_type"))
    throw ConfigError(where + ": key 'model_type': missing (give it in the preset or with --arch)");
  if (!preset.contains("architectures"))
    preset["architectures"] = {causal_lm_class(preset["model_type"].get<std::string>())};
  const bool has_tokenizer = !o.tokenizer_dir.empty();
  if (!preset.contains("vocab_size") || preset["vocab_size"].is_null()) {
    if (!has_tokenizer)
      throw ConfigError(where + ": key 'vocab_size': missing (give it in the preset or pass --tokenizer)");
    preset["vocab_size"] = tokenizer_vocab_size(o.tokenizer_dir);
  }
  if (has_tokenizer) {
    for (auto [key, tok_key] : {std::pair{"bos_token_id", "bos_token"}, std::pair{"eos_token_id", "eos_token"},
                                std::pair{"pad_token_id", "pad_token"}})
      if (!preset.contains(key))
        if (auto id = special_token_id(o.tokenizer_dir, tok_key)) {
          // A tokenizer bigger than the preset's vocabulary: ids past it would break the model (and HF's loaders).
          if (int64_t(*id) >= preset["vocab_size"].get<int64_t>())
            spdlog::warn("{}: the tokenizer's {} ({}) is past the model's vocabulary ({}); {} left unset", where,
                         tok_key, *id, preset["vocab_size"].get<int64_t>(), key);
          else
            preset[key] = *id;
        }
  }
  DType dtype = o.dtype ? *o.dtype
                        : preset.contains("torch_dtype") && preset["torch_dtype"].is_string()
                              ? dtype_from_torch(preset["torch_dtype"].get<std::string>(), where)
                              : DType::f32;
  preset["torch_dtype"] = torch_name(dtype);
  const double std = preset.value("initializer_range", 0.02);
  if (!preset.contains("initializer_range")) preset["initializer_range"] = std;

  ModelConfig config = parse_model_config(preset.dump(), where);
  if (fs::exists(o.out / "config.json") && !o.overwrite)
    throw FileError(o.out.string() + ": already holds a model (config.json); choose another --out");
  fs::create_directories(o.out);

  json config_json = hf_config_json(config, preset);
  write_file_atomic(o.out / "config.json", config_json.dump(2) + "\n");
  write_file_atomic(o.out / "generation_config.json", hf_generation_config_json(config).dump(2) + "\n");
  save_random_weights(config, o.seed, std, o.out, dtype);
  if (has_tokenizer) copy_tokenizer_files(o.tokenizer_dir, o.out);
  return {config, parameter_count(config), dtype};
}

}  // namespace lmtune::models
