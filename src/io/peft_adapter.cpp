// PEFT adapter reading and writing.
#include "io/peft_adapter.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"
#include "io/safetensors.h"

namespace lmtune {
namespace {

using json = nlohmann::json;
const char* kPrefix = "base_model.model.";

// "base_model.model.<module>.lora_A.weight" -> (<module>, 'A'); PEFT files may also carry an adapter name
// ("lora_A.default.weight").
bool split_key(const std::string& key, std::string& module, char& which) {
  std::string k = key;
  if (k.rfind(kPrefix, 0) == 0) k = k.substr(std::string(kPrefix).size());
  for (const char* tag : {".lora_A.", ".lora_B."}) {
    auto at = k.find(tag);
    if (at == std::string::npos) continue;
    std::string rest = k.substr(at + std::string(tag).size());
    if (rest != "weight" && rest != "default.weight") return false;
    module = k.substr(0, at);
    which = tag[6];
    return true;
  }
  return false;
}

}  // namespace

double PeftAdapter::scale() const { return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank); }

PeftAdapter load_peft_adapter(const std::filesystem::path& dir) {
  auto config_file = dir / "adapter_config.json";
  auto weights_file = dir / "adapter_model.safetensors";
  if (!std::filesystem::exists(config_file))
    throw FileError(config_file.string() + ": not found (a PEFT adapter directory holds adapter_config.json and "
                                           "adapter_model.safetensors)");
  json cfg = parse_json_strict(read_file_text(config_file), config_file.string());
  std::string where = config_file.string();
  auto get = [&](const char* key) -> const json& {
    if (!cfg.contains(key)) throw FileError(where + ": missing key '" + key + "'");
    return cfg[key];
  };
  PeftAdapter a;
  if (cfg.value("peft_type", "LORA") != "LORA")
    throw FileError(where + ": peft_type '" + cfg.value("peft_type", "") + "' is not supported (only LORA)");
  // An adapter is untrusted input: a scale of 0, a negative or an absurd one, or NaN weights would be applied
  // silently by generate, eval and export.
  if (!get("r").is_number_integer() || get("r").get<int64_t>() <= 0 || get("r").get<int64_t>() > 65536)
    throw FileError(where + ": key 'r' must be an integer in [1, 65536]");
  a.rank = get("r").get<int>();
  if (!get("lora_alpha").is_number()) throw FileError(where + ": key 'lora_alpha' must be a number");
  a.alpha = get("lora_alpha").get<double>();
  if (!(a.alpha > 0 && a.alpha <= 1e5))
    throw FileError(where + ": key 'lora_alpha' must be in (0, 100000], got " + get("lora_alpha").dump());
  if (cfg.contains("lora_dropout") && !cfg["lora_dropout"].is_number())
    throw FileError(where + ": key 'lora_dropout' must be a number");
  a.dropout = cfg.value("lora_dropout", 0.0);
  if (!(a.dropout >= 0 && a.dropout < 1)) throw FileError(where + ": key 'lora_dropout' must be in [0, 1)");
  a.rslora = cfg.value("use_rslora", false);
  a.base_model = cfg.contains("base_model_name_or_path") && cfg["base_model_name_or_path"].is_string()
                     ? cfg["base_model_name_or_path"].get<std::string>()
                     : "";
  if (cfg.value("use_dora", false)) throw FileError(where + ": DoRA adapters are not supported");
  if (cfg.contains("bias") && cfg["bias"].is_string() && cfg["bias"] != "none")
    throw FileError(where + ": bias '" + cfg["bias"].get<std::string>() + "' is not supported (only 'none')");
  if (cfg.value("fan_in_fan_out", false)) throw FileError(where + ": fan_in_fan_out adapters are not supported");
  if (cfg.contains("rank_pattern") && cfg["rank_pattern"].is_object() && !cfg["rank_pattern"].empty())
    throw FileError(where + ": per-module rank_pattern is not supported");
  if (cfg.contains("target_modules")) {
    const json& t = cfg["target_modules"];
    if (t.is_string()) a.target_modules = {t.get<std::string>()};
    else if (t.is_array())
      for (const auto& e : t) a.target_modules.push_back(e.get<std::string>());
  }
  if (cfg.contains("target_parameters") && !cfg["target_parameters"].is_null()) {
    const json& t = cfg["target_parameters"];
    if (!t.is_array()) throw FileError(where + ": key 'target_parameters' must be a list of parameter names");
    for (const auto& e : t) {
      if (!e.is_string()) throw FileError(where + ": key 'target_parameters' must be a list of parameter names");
      a.target_parameters.push_back(e.get<std::string>());
    }
  }
  SafetensorsFile st(weights_file);
  for (const auto& t : st.tensors()) {
    std::string module;
    char which = 0;
    if (!split_key(t.name, module, which))
      throw FileError(weights_file.string() + ": tensor '" + t.name + "' is not a LoRA A/B weight");
    if (t.shape.size() != 2)
      throw FileError(weights_file.string() + ": tensor '" + t.name + "' has shape " + to_string(t.shape) + ", expected 2-D");
    LoraWeights& w = a.modules[module];
    // A wrapped parameter (target_parameters) stacks one rank-r factor per expert.
    const int64_t r = which == 'A' ? t.shape[0] : t.shape[1];
    const bool stacked = !a.target_parameters.empty() && r > a.rank && r % a.rank == 0;
    if (r != a.rank && !stacked)
      throw FileError(weights_file.string() + ": tensor '" + t.name + "' has rank " + std::to_string(r) +
                      " but adapter_config.json says r = " + std::to_string(a.rank));
    std::vector<float>& values = which == 'A' ? w.a : w.b;
    values = t.to_f32();
    for (size_t i = 0; i < values.size(); ++i)
      if (!std::isfinite(values[i]))
        throw FileError(weights_file.string() + ": tensor '" + t.name + "' holds a non-finite value (" +
                        std::to_string(values[i]) + " at element " + std::to_string(i) + ")");
    (which == 'A' ? w.a_shape : w.b_shape) = t.shape;
  }
  for (const auto& [module, w] : a.modules)
    if (w.a.empty() || w.b.empty())
      throw FileError(weights_file.string() + ": module '" + module + "' has lora_" + (w.a.empty() ? "A" : "B") +
                      " missing");
  if (a.modules.empty()) throw FileError(weights_file.string() + ": no LoRA weights");
  return a;
}

void save_peft_adapter(const PeftAdapter& a, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  std::vector<std::string> names;
  names.reserve(a.modules.size() * 2);
  for (const auto& [module, w] : a.modules) {
    names.push_back(kPrefix + module + ".lora_A.weight");
    tensors.push_back({names.back(), StDType::F32, w.a_shape,
                       std::span(reinterpret_cast<const std::byte*>(w.a.data()), w.a.size() * 4)});
    names.push_back(kPrefix + module + ".lora_B.weight");
    tensors.push_back({names.back(), StDType::F32, w.b_shape,
                       std::span(reinterpret_cast<const std::byte*>(w.b.data()), w.b.size() * 4)});
  }
  std::set<std::string> targets(a.target_modules.begin(), a.target_modules.end());
  json cfg = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", a.base_model},
      {"r", a.rank},
      {"lora_alpha", a.alpha},
      {"lora_dropout", a.dropout},
      {"use_rslora", a.rslora},
      // PEFT takes no empty target_modules beside target_parameters: null there.
      {"target_modules", targets.empty() && !a.target_parameters.empty()
                             ? json(nullptr)
                             : json(std::vector<std::string>(targets.begin(), targets.end()))},
      {"target_parameters", a.target_parameters.empty() ? json(nullptr) : json(a.target_parameters)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"use_dora", false},
      {"revision", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
  };
  write_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomic(dir / "adapter_config.json", cfg.dump(2) + "\n");
}

}  // namespace lmtune
