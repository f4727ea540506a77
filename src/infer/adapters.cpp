// Adapter specifications and validated loading (see adapters.h).
#include "infer/adapters.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "models/adapters.h"

namespace lmtune::infer {

AdapterSpec parse_adapter_spec(const std::string& spec) {
  AdapterSpec out;
  out.dir = spec;
  size_t colon = spec.rfind(':');
  if (colon != std::string::npos && !std::filesystem::exists(spec)) {
    std::string num = spec.substr(colon + 1);
    char* end = nullptr;
    float v = std::strtof(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !std::isfinite(v))
      throw ConfigError("--adapter '" + spec + "': expected DIR or DIR:scale with a numeric scale");
    out.dir = spec.substr(0, colon);
    out.multiplier = v;
  }
  if (out.dir.empty()) throw ConfigError("--adapter '" + spec + "': empty directory");
  std::filesystem::path d = out.dir;
  out.name = (d.has_filename() ? d.filename() : d.parent_path().filename()).string();
  if (out.name.empty()) out.name = "adapter";
  return out;
}

void validate_adapter(const PeftAdapter& adapter, models::DecoderWeights& weights, const std::string& where) {
  std::set<std::string> kinds;
  for (const auto& nl : models::named_linears(weights)) kinds.insert(nl.kind);
  for (const auto& t : adapter.target_modules)
    if (t != "all-linear" && !kinds.count(t)) {
      std::string list;
      for (const auto& k : kinds) list += (list.empty() ? "" : ", ") + k;
      throw FileError(where + ": target module '" + t + "' is not a module of this model (" + list + ")");
    }
  std::map<std::string, const models::Linear*> by_module;
  for (const auto& nl : models::named_linears(weights)) by_module[nl.module] = nl.linear;
  for (const auto& [module, lw] : adapter.modules) {
    auto it = by_module.find(module);
    // LoRA on the experts (target_parameters): attach_peft checks those against the stacked weights.
    const bool experts = module.find(".mlp.experts") != std::string::npos;
    if (it == by_module.end() && !adapter.target_parameters.empty() && experts) continue;
    if (it == by_module.end())
      throw FileError(where + ": module '" + module + "' does not exist in the base model (" +
                      std::to_string(weights.layers.size()) + " layers)");
    const models::Linear& lin = *it->second;
    Shape a_want{adapter.rank, lin.in_features()}, b_want{lin.out_features(), adapter.rank};
    if (lw.a_shape != a_want || lw.b_shape != b_want)
      throw FileError(where + ": module '" + module + "' has lora_A " + to_string(lw.a_shape) + " and lora_B " +
                      to_string(lw.b_shape) + ", but the base model needs " + to_string(a_want) + " and " +
                      to_string(b_want));
  }
}

PeftAdapter load_adapter(models::Decoder& decoder, const AdapterSpec& spec) {
  PeftAdapter adapter = load_peft_adapter(spec.dir);
  validate_adapter(adapter, decoder.weights(), "adapter " + spec.dir.string());
  models::attach_peft(decoder.weights(), adapter, spec.name, spec.multiplier);
  return adapter;
}

}  // namespace lmtune::infer
