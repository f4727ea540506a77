// LoRA adapter placement and PEFT conversion.
#include "models/adapters.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace lmtune::models {
namespace {
const char* kKinds[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

std::vector<NamedLinear> named_linears(DecoderWeights& w) {
  std::vector<NamedLinear> out;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    out.push_back({p + "self_attn.q_proj", "q_proj", &l.attn.q});
    out.push_back({p + "self_attn.k_proj", "k_proj", &l.attn.k});
    out.push_back({p + "self_attn.v_proj", "v_proj", &l.attn.v});
    out.push_back({p + "self_attn.o_proj", "o_proj", &l.attn.o});
    if (!l.mlp.gate.weight.defined() && !l.mlp.gate.qweight.defined()) continue;  // experts instead of an MLP
    out.push_back({p + "mlp.gate_proj", "gate_proj", &l.mlp.gate});
    out.push_back({p + "mlp.up_proj", "up_proj", &l.mlp.up});
    out.push_back({p + "mlp.down_proj", "down_proj", &l.mlp.down});
  }
  return out;
}

std::vector<NamedLinear> select_targets(DecoderWeights& w, const std::vector<std::string>& targets) {
  std::set<std::string> wanted;
  for (const auto& t : targets) {
    if (t == "all-linear") {
      wanted.insert(std::begin(kKinds), std::end(kKinds));
      continue;
    }
    if (std::find(std::begin(kKinds), std::end(kKinds), t) == std::end(kKinds)) {
      std::string list = "all-linear";
      for (const char* k : kKinds) list += std::string(", ") + k;
      throw ConfigError("lora.targets: unknown module '" + t + "' (expected " + list + ")");
    }
    wanted.insert(t);
  }
  if (wanted.empty()) throw ConfigError("lora.targets: no target modules given");
  std::vector<NamedLinear> out;
  for (auto& nl : named_linears(w))
    if (wanted.count(nl.kind)) out.push_back(nl);
  return out;
}

std::vector<Tensor> add_lora(DecoderWeights& w, const std::vector<std::string>& targets, int rank, float scale,
                             uint64_t seed, const std::string& name) {
  std::vector<Tensor> params;
  uint64_t i = 0;
  for (auto& nl : select_targets(w, targets)) {
    LoraAdapter& a = nl.linear->add_adapter(rank, scale, seed * 1000003ull + i++, name);
    params.push_back(a.A);
    params.push_back(a.B);
  }
  return params;
}

void attach_peft(DecoderWeights& w, const PeftAdapter& adapter, const std::string& name, float multiplier,
                 bool trainable) {
  std::map<std::string, Linear*> by_module;
  for (auto& nl : named_linears(w)) by_module[nl.module] = nl.linear;
  for (const auto& [module, lw] : adapter.modules) {
    auto it = by_module.find(module);
    if (it == by_module.end())
      throw FileError("adapter '" + name + "': module '" + module + "' does not exist in the base model");
    Linear& lin = *it->second;
    Shape a_want{adapter.rank, lin.in_features()}, b_want{lin.out_features(), adapter.rank};
    if (lw.a_shape != a_want || lw.b_shape != b_want)
      throw FileError("adapter '" + name + "': module '" + module + "' has lora_A " + to_string(lw.a_shape) +
                      " and lora_B " + to_string(lw.b_shape) + ", but the base model needs " + to_string(a_want) +
                      " and " + to_string(b_want));
    Device dev = lin.device();
    LoraAdapter a;
    a.name = name;
    a.A = Tensor::from_floats(lw.a, lw.a_shape, DType::f32, dev);
    a.B = Tensor::from_floats(lw.b, lw.b_shape, DType::f32, dev);
    if (trainable) {
      a.A.set_requires_grad(true);
      a.B.set_requires_grad(true);
    }
    a.scale = float(adapter.scale() * multiplier);
    a.dropout = float(adapter.dropout);
    lin.adapters.push_back(std::move(a));
  }
}

PeftAdapter extract_peft(DecoderWeights& w, const std::string& name, int rank, double alpha, bool rslora,
                         double dropout, const std::string& base_model) {
  PeftAdapter p;
  p.rank = rank;
  p.alpha = alpha;
  p.rslora = rslora;
  p.dropout = dropout;
  p.base_model = base_model;
  std::set<std::string> kinds;
  for (auto& nl : named_linears(w))
    for (const LoraAdapter& a : nl.linear->adapters) {
      if (a.name != name) continue;
      LoraWeights lw;
      lw.a = a.A.to_floats();
      lw.b = a.B.to_floats();
      lw.a_shape = a.A.shape();
      lw.b_shape = a.B.shape();
      p.modules[nl.module] = std::move(lw);
      kinds.insert(nl.kind);
    }
  if (p.modules.empty()) throw ConfigError("no adapter named '" + name + "' is attached");
  p.target_modules.assign(kinds.begin(), kinds.end());
  return p;
}

void remove_adapter(DecoderWeights& w, const std::string& name) {
  for (auto& nl : named_linears(w)) {
    auto& v = nl.linear->adapters;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const LoraAdapter& a) { return a.name == name; }), v.end());
  }
}

}  // namespace lmtune::models
