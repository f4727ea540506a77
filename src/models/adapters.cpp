// LoRA adapter placement and PEFT conversion.
#include "models/adapters.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"

namespace lmtune::models {
namespace {
const char* kKinds[] = {"q_proj",       "k_proj",     "v_proj",      "o_proj",    "gate_proj",
                        "up_proj",      "down_proj",  "in_proj_qkvz", "in_proj_ba", "in_proj_qkv",
                        "in_proj_z",    "in_proj_b",  "in_proj_a",   "out_proj",  "shared_expert_gate"};
const char* kExpertParams[] = {"gate_up_proj", "down_proj"};  // the experts module's declaration order

bool wants_experts(const std::vector<std::string>& targets) {
  return std::find(targets.begin(), targets.end(), "experts") != targets.end();
}

// The targeted expert parameters of a PEFT config, in declaration order: a target_parameters entry names one when
// it is the parameter's name or ends with "." and that name (PEFT's match).
std::vector<std::string> targeted_expert_params(const std::vector<std::string>& target_parameters) {
  std::vector<std::string> out;
  for (const char* p : kExpertParams) {
    const std::string suffix = std::string(".") + p;
    for (const std::string& t : target_parameters)
      if (t == p || (t.size() > suffix.size() && t.compare(t.size() - suffix.size(), suffix.size(), suffix) == 0)) {
        out.push_back(p);
        break;
      }
  }
  return out;
}

// PEFT's module path of `param`'s LoRA on an experts module, given the targeted parameters in declaration order
// (the first is wrapped innermost, so it sits below one "base_layer" per later one).
std::string peft_expert_module(const std::string& module, const std::string& param,
                               const std::vector<std::string>& targeted) {
  const size_t k = size_t(std::find(targeted.begin(), targeted.end(), param) - targeted.begin());
  std::string path = module;
  for (size_t i = k + 1; i < targeted.size(); ++i) path += ".base_layer";
  return path;
}

// B between lmtune's [E, out, R] and PEFT's [out, R E] (expert e's column j at j E + e); A is [E, R, in] in both
// orders of its elements.
std::vector<float> expert_b_to_peft(const std::vector<float>& b, int64_t E, int64_t out, int64_t R) {
  std::vector<float> p(b.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < R; ++j) p[size_t(o * R * E + j * E + e)] = b[size_t((e * out + o) * R + j)];
  return p;
}
std::vector<float> expert_b_from_peft(const std::vector<float>& p, int64_t E, int64_t out, int64_t R) {
  std::vector<float> b(p.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < R; ++j) b[size_t((e * out + o) * R + j)] = p[size_t(o * R * E + j * E + e)];
  return b;
}

// A fresh adapter on a stacked expert weight [E, out, in], initialised as PEFT's ParamWrapper does: its lora_A is
// an nn.Linear(in, R E), kaiming-uniform, i.e. U(-1/sqrt(in), 1/sqrt(in)); B zero.
ExpertAdapter fresh_expert_adapter(const Tensor& w, int64_t rank, float scale, uint64_t seed,
                                   const std::string& name) {
  const int64_t E = w.dim(0), out = w.dim(1), in = w.dim(2);
  const float bound = 1.0f / std::sqrt(float(in));
  ExpertAdapter a;
  a.name = name;
  a.A = Tensor::uniform({E, rank, in}, seed, -bound, bound, DType::f32, w.device()).set_requires_grad(true);
  a.B = Tensor::zeros({E, out, rank}, DType::f32, w.device()).set_requires_grad(true);
  a.scale = scale;
  return a;
}
}  // namespace

std::vector<NamedExperts> named_experts(DecoderWeights& w) {
  std::vector<NamedExperts> out;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    MoeWeights& m = w.layers[i].moe;
    if (!m.gate_up.defined()) continue;
    // Gemma 4's experts (a router with its own input scale) sit beside the MLP, as layers.N.experts.
    const std::string module =
        "model.layers." + std::to_string(i) + (m.router_scale.defined() ? ".experts" : ".mlp.experts");
    out.push_back({module, "gate_up_proj", &m.gate_up, &m.gate_up_adapters});
    out.push_back({module, "down_proj", &m.down, &m.down_adapters});
  }
  return out;
}

std::vector<NamedLinear> named_linears(DecoderWeights& w) {
  std::vector<NamedLinear> out;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    auto add = [&](const std::string& module, const char* kind, Linear& lin) {
      if (lin.present()) out.push_back({p + module, kind, &lin});
    };
    add("self_attn.q_proj", "q_proj", l.attn.q);  // none on a Gated DeltaNet layer
    add("self_attn.k_proj", "k_proj", l.attn.k);  // Gemma 4: shared layers
    add("self_attn.v_proj", "v_proj", l.attn.v);  // and k_eq_v have none
    add("self_attn.o_proj", "o_proj", l.attn.o);
    add("linear_attn.in_proj_qkvz", "in_proj_qkvz", l.delta.in_qkvz);
    add("linear_attn.in_proj_ba", "in_proj_ba", l.delta.in_ba);
    add("linear_attn.in_proj_qkv", "in_proj_qkv", l.delta.in_qkv);  // Qwen3.5
    add("linear_attn.in_proj_z", "in_proj_z", l.delta.in_z);
    add("linear_attn.in_proj_b", "in_proj_b", l.delta.in_b);
    add("linear_attn.in_proj_a", "in_proj_a", l.delta.in_a);
    add("linear_attn.out_proj", "out_proj", l.delta.out);
    add("mlp.gate_proj", "gate_proj", l.mlp.gate);  // expert layers have no dense MLP
    add("mlp.up_proj", "up_proj", l.mlp.up);
    add("mlp.down_proj", "down_proj", l.mlp.down);
    add("mlp.shared_expert.gate_proj", "gate_proj", l.moe.shared.gate);  // qwen3_next's shared expert
    add("mlp.shared_expert.up_proj", "up_proj", l.moe.shared.up);
    add("mlp.shared_expert.down_proj", "down_proj", l.moe.shared.down);
    add("mlp.shared_expert_gate", "shared_expert_gate", l.moe.shared_gate);
  }
  return out;
}

std::vector<NamedLinear> select_targets(DecoderWeights& w, const std::vector<std::string>& targets) {
  std::set<std::string> wanted;
  for (const auto& t : targets) {
    if (t == "experts") continue;  // add_lora's, not a linear
    if (t == "all-linear") {
      wanted.insert(std::begin(kKinds), std::end(kKinds));
      continue;
    }
    if (std::find(std::begin(kKinds), std::end(kKinds), t) == std::end(kKinds)) {
      std::string list = "all-linear";
      for (const char* k : kKinds) list += std::string(", ") + k;
      list += ", experts";
      throw ConfigError("lora.targets: unknown module '" + t + "' (expected " + list + ")");
    }
    wanted.insert(t);
  }
  if (wanted.empty() && !wants_experts(targets)) throw ConfigError("lora.targets: no target modules given");
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
  if (!wants_experts(targets)) return params;
  const std::vector<NamedExperts> experts = named_experts(w);
  if (experts.empty())
    throw ConfigError("lora.targets: 'experts' given, but the model has no mixture-of-experts layer");
  for (const NamedExperts& ne : experts) {
    ne.adapters->push_back(fresh_expert_adapter(*ne.weight, rank, scale, seed * 1000003ull + i++, name));
    params.push_back(ne.adapters->back().A);
    params.push_back(ne.adapters->back().B);
  }
  return params;
}

namespace {

void attach_expert_peft(const NamedExperts& ne, const LoraWeights& lw, const PeftAdapter& adapter,
                        const std::string& name, const std::string& module, float multiplier, bool trainable) {
  const Tensor& weight = *ne.weight;
  const int64_t E = weight.dim(0), out = weight.dim(1), in = weight.dim(2), R = adapter.rank;
  const Shape a_want{R * E, in}, b_want{out, R * E};
  if (lw.a_shape != a_want || lw.b_shape != b_want)
    throw FileError("adapter '" + name + "': module '" + module + "' (LoRA on " + ne.module + "." + ne.param +
                    ", " + std::to_string(E) + " experts) has lora_A " + to_string(lw.a_shape) + " and lora_B " +
                    to_string(lw.b_shape) + ", but the base model needs " + to_string(a_want) + " and " +
                    to_string(b_want));
  const Device dev = weight.device();
  ExpertAdapter a;
  a.name = name;
  a.A = Tensor::from_floats(lw.a, {E, R, in}, DType::f32, dev);
  a.B = Tensor::from_floats(expert_b_from_peft(lw.b, E, out, R), {E, out, R}, DType::f32, dev);
  if (trainable) {
    a.A.set_requires_grad(true);
    a.B.set_requires_grad(true);
  }
  a.scale = float(adapter.scale() * multiplier);
  ne.adapters->push_back(std::move(a));
}

}  // namespace

void attach_peft(DecoderWeights& w, const PeftAdapter& adapter, const std::string& name, float multiplier,
                 bool trainable) {
  std::map<std::string, Linear*> by_module;
  for (auto& nl : named_linears(w)) by_module[nl.module] = nl.linear;
  const std::vector<std::string> targeted = targeted_expert_params(adapter.target_parameters);
  std::map<std::string, NamedExperts> experts_by_module;
  for (const NamedExperts& ne : named_experts(w))
    if (std::find(targeted.begin(), targeted.end(), ne.param) != targeted.end())
      experts_by_module.emplace(peft_expert_module(ne.module, ne.param, targeted), ne);
  for (const auto& [module, lw] : adapter.modules) {
    if (auto ex = experts_by_module.find(module); ex != experts_by_module.end()) {
      attach_expert_peft(ex->second, lw, adapter, name, module, multiplier, trainable);
      continue;
    }
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
  std::set<std::string> params;
  for (const NamedExperts& ne : named_experts(w))
    for (const ExpertAdapter& a : *ne.adapters)
      if (a.name == name) params.insert(ne.param);
  std::vector<std::string> targeted;
  for (const char* q : kExpertParams)
    if (params.count(q)) targeted.push_back(q);
  for (const NamedExperts& ne : named_experts(w))
    for (const ExpertAdapter& a : *ne.adapters) {
      if (a.name != name) continue;
      const int64_t E = a.B.dim(0), out = a.B.dim(1), R = a.B.dim(2);
      LoraWeights lw;
      lw.a = a.A.to_floats();
      lw.b = expert_b_to_peft(a.B.to_floats(), E, out, R);
      lw.a_shape = {E * R, a.A.dim(2)};
      lw.b_shape = {out, R * E};
      p.modules[peft_expert_module(ne.module, ne.param, targeted)] = std::move(lw);
    }
  // The experts' path within a layer: mlp.experts, or experts (Gemma 4).
  std::string experts = "mlp.experts";
  for (const NamedExperts& ne : named_experts(w)) {
    experts = ne.module.substr(ne.module.find('.', std::string("model.layers.").size()) + 1);
    break;
  }
  for (const std::string& q : targeted) p.target_parameters.push_back(experts + "." + q);
  if (p.modules.empty()) throw ConfigError("no adapter named '" + name + "' is attached");
  p.target_modules.assign(kinds.begin(), kinds.end());
  return p;
}

std::vector<std::string> modules_peft_skips(const std::string& model_type, const PeftAdapter& adapter) {
  std::vector<std::string> out;
  if (model_type != "mixtral" && model_type != "qwen3_moe" && model_type != "qwen3_next") return out;
  for (const auto& [module, lw] : adapter.modules) {
    const std::string kind = module.substr(module.rfind('.') + 1);
    if (kind == "gate_proj" || kind == "up_proj" || kind == "down_proj") out.push_back(module);
  }
  return out;
}

void warn_unless_peft_reads(const std::string& model_type, const PeftAdapter& adapter) {
  const std::vector<std::string> skipped = modules_peft_skips(model_type, adapter);
  if (skipped.empty()) return;
  std::string some;
  for (size_t i = 0; i < std::min<size_t>(skipped.size(), 3); ++i) some += (i ? ", " : "") + skipped[i];
  spdlog::warn("PEFT adapter: {} adapted MLP module(s) ({}{}) will not load into peft 0.21 with transformers 5: on "
               "{} models peft reads gate_proj / up_proj / down_proj as the experts' fused weights (lmtune and the "
               "merged export are not affected)",
               skipped.size(), some, skipped.size() > 3 ? ", ..." : "", model_type);
}

void remove_adapter(DecoderWeights& w, const std::string& name) {
  for (auto& nl : named_linears(w)) {
    auto& v = nl.linear->adapters;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const LoraAdapter& a) { return a.name == name; }), v.end());
  }
  for (const NamedExperts& ne : named_experts(w)) {
    auto& v = *ne.adapters;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const ExpertAdapter& a) { return a.name == name; }), v.end());
  }
}

}  // namespace lmtune::models
