// Recipe loading: YAML layering (base:), dotted overrides, and validation against the schema in bind_all().
#include "train/recipe.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace lmtune {

std::string to_string(Precision p) { return p == Precision::fp32 ? "fp32" : p == Precision::fp16 ? "fp16" : "bf16"; }
std::string to_string(Finetune f) { return f == Finetune::lora ? "lora" : "full"; }
std::string to_string(OptimizerName o) { return o == OptimizerName::adamw ? "adamw" : "sgd"; }
std::string to_string(Objective o) {
  return o == Objective::sft ? "sft" : o == Objective::dpo ? "dpo" : o == Objective::orpo ? "orpo" : "simpo";
}
std::string quantize_name(const std::optional<quant::Format>& f) {
  return f ? std::string(quant::info(*f).name) : "none";
}

namespace {

std::string number(double v) {
  std::ostringstream s;
  s << std::setprecision(10) << v;
  return s.str();
}

std::string where(const std::string& file, const YAML::Node& n) {
  if (n.Mark().is_null()) return file;
  return file + ":" + std::to_string(n.Mark().line + 1);
}

// Recursively overlays `top` onto `base` (maps merge key by key; anything else replaces).
YAML::Node overlay(const YAML::Node& base, const YAML::Node& top) {
  if (!base.IsMap() || !top.IsMap()) return YAML::Clone(top);
  YAML::Node out = YAML::Clone(base);
  for (const auto& kv : top) {
    if (!kv.first.IsScalar()) {  // a complex key: kept for reject_unknown to report
      out.force_insert(kv.first, kv.second);
      continue;
    }
    std::string key = kv.first.as<std::string>();
    out[key] = out[key] ? overlay(out[key], kv.second) : YAML::Clone(kv.second);
  }
  return out;
}

// YAML leaves a key written twice to the parser; a recipe that sets one key twice is a mistake.
void reject_duplicate_keys(const YAML::Node& node, const std::string& name, const std::string& prefix) {
  if (!node.IsMap()) return;
  std::set<std::string> seen;
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.as<std::string>() : "?";
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (!seen.insert(key).second) throw ConfigError(where(name, kv.first) + ": key '" + path + "' is set twice");
    reject_duplicate_keys(kv.second, name, path);
  }
}

YAML::Node load_yaml(const std::string& text, const std::string& name) {
  try {
    YAML::Node n = YAML::Load(text);
    if (n.IsNull()) return YAML::Node(YAML::NodeType::Map);
    if (!n.IsMap()) throw ConfigError(name + ": a recipe must be a YAML mapping of keys to values");
    reject_duplicate_keys(n, name, "");
    return n;
  } catch (const YAML::Exception& e) {
    throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
  }
}

YAML::Node load_with_bases(const std::filesystem::path& file, int depth) {
  if (depth > 8) throw ConfigError(file.string() + ": `base:` chain is too deep (a cycle?)");
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read recipe " + file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  YAML::Node node = load_yaml(ss.str(), file.string());
  if (node["base"]) {
    if (!node["base"].IsScalar()) throw ConfigError(where(file.string(), node["base"]) + ": key 'base' must be a path");
    std::filesystem::path base = file.parent_path() / node["base"].as<std::string>();
    node.remove("base");
    return overlay(load_with_bases(base, depth + 1), node);
  }
  return node;
}

void apply_override(YAML::Node& root, const std::string& item, const std::string& name) {
  auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override '" + item + "' must look like key.sub=value (for " + name + ")");
  std::string path = item.substr(0, eq), value = item.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value.empty() ? "''" : value);
  } catch (const YAML::Exception& e) {
    throw ConfigError("override '" + item + "': cannot parse the value: " + e.msg);
  }
  std::vector<std::string> keys;
  std::stringstream ss(path);
  for (std::string k; std::getline(ss, k, '.');) keys.push_back(k);
  // yaml-cpp nodes are handles: walk with copies of the handle, assigning through the map's operator[].
  std::function<void(YAML::Node, size_t)> set = [&](YAML::Node node, size_t i) {
    if (i + 1 == keys.size()) {
      node[keys[i]] = parsed;
      return;
    }
    if (!node[keys[i]] || !node[keys[i]].IsMap()) node[keys[i]] = YAML::Node(YAML::NodeType::Map);
    set(node[keys[i]], i + 1);
  };
  set(root, 0);
}

// Reads typed values out of the YAML tree and remembers which keys the schema knows.
class Binder {
 public:
  Binder(const YAML::Node& root, std::string file) : root_(root), file_(std::move(file)) {}

  template <class T>
  void bind(const std::string& path, T& out, std::initializer_list<const char*> choices = {}) {
    known_.insert(path);
    YAML::Node n = lookup(path);
    if (!n || n.IsNull()) return;
    try {
      out = read<T>(n, path);
    } catch (const YAML::Exception&) {
      throw ConfigError(where(file_, n) + ": key '" + path + "': expected " + type_name<T>());
    }
    if constexpr (std::is_same_v<T, std::string>) {
      if (choices.size()) {
        bool ok = false;
        std::string list;
        for (const char* c : choices) {
          ok = ok || out == c;
          list += (list.empty() ? "" : ", ") + std::string(c);
        }
        if (!ok) throw ConfigError(where(file_, n) + ": key '" + path + "': '" + out + "' is not one of " + list);
      }
    }
  }

  // A string key with a fixed set of values, each an enumerator of E.
  template <class E>
  void bind(const std::string& path, E& out, std::initializer_list<E> values) {
    std::string text = to_string(out);
    bind(path, text);
    std::string list;
    for (E v : values) {
      if (to_string(v) == text) {
        out = v;
        return;
      }
      list += (list.empty() ? "" : ", ") + to_string(v);
    }
    throw ConfigError(where(file_, lookup(path)) + ": key '" + path + "': '" + text + "' is not one of " + list);
  }

  // An error at the key's line: "<file>:<line>: key '<path>': <what>".
  [[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw ConfigError(where(file_, lookup(path)) + ": key '" + path + "': " + what);
  }

  // NaN and infinities fail too: a recipe value is a finite number.
  void require_positive(const std::string& path, double v, bool allow_zero = false) {
    if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0))
      throw ConfigError(where(file_, lookup(path)) + ": key '" + path + "' must be " +
                        (allow_zero ? "a finite number >= 0" : "a finite number > 0"));
  }
  // lo <= v < hi (v <= hi with `closed`).
  void require_range(const std::string& path, double v, double lo, double hi, bool closed) {
    if (!std::isfinite(v) || v < lo || v > hi || (!closed && v == hi))
      throw ConfigError(where(file_, lookup(path)) + ": key '" + path + "' must be in [" + number(lo) + ", " +
                        number(hi) + (closed ? "]" : ")"));
  }

  // Every key in the tree must be known (or under a known key).
  void reject_unknown(const YAML::Node& node, const std::string& prefix) {
    for (const auto& kv : node) {
      if (!kv.first.IsScalar())  // YAML's complex keys ("? [a, b]: 1", "? : x")
        throw ConfigError(where(file_, kv.first) + ": a key" + (prefix.empty() ? "" : " under '" + prefix + "'") +
                          " must be a plain name, not " + (kv.first.IsNull() ? "empty" : "a list or mapping"));
      std::string key = prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>();
      if (known_.count(key)) continue;
      bool is_section = false;
      for (const auto& k : known_) is_section = is_section || k.rfind(key + ".", 0) == 0;
      if (is_section && kv.second.IsMap()) {
        reject_unknown(kv.second, key);
        continue;
      }
      std::string siblings;
      for (const auto& k : known_) {
        auto dot = k.rfind('.');
        std::string parent = dot == std::string::npos ? "" : k.substr(0, dot);
        if (parent == prefix) siblings += (siblings.empty() ? "" : ", ") + k.substr(dot == std::string::npos ? 0 : dot + 1);
      }
      throw ConfigError(where(file_, kv.first) + ": unknown key '" + key + "'" +
                        (is_section ? " (expected a mapping)" : "") + "; known keys" +
                        (prefix.empty() ? "" : " under '" + prefix + "'") + ": " + siblings);
    }
  }

 private:
  YAML::Node lookup(const std::string& path) const {
    YAML::Node n = YAML::Clone(root_);
    std::stringstream ss(path);
    for (std::string k; std::getline(ss, k, '.');) {
      if (!n.IsMap() || !n[k]) return YAML::Node();
      n = n[k];
    }
    return n;
  }
  template <class T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else if constexpr (std::is_same_v<T, std::string>) return "a string";
    else return "a list of strings";
  }
  template <class T>
  T read(const YAML::Node& n, const std::string&) const {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!n.IsScalar()) throw YAML::BadConversion(n.Mark());
      return n.as<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      if (n.IsScalar()) return {n.as<std::string>()};
      if (!n.IsSequence()) throw YAML::BadConversion(n.Mark());
      std::vector<std::string> v;
      for (const auto& e : n) {
        if (!e.IsScalar()) throw YAML::BadConversion(e.Mark());
        v.push_back(e.as<std::string>());
      }
      return v;
    } else {
      if (!n.IsScalar()) throw YAML::BadConversion(n.Mark());
      return n.as<T>();
    }
  }

  YAML::Node root_;
  std::string file_;
  std::set<std::string> known_;
};

Recipe bind_all(const YAML::Node& root, const std::string& name) {
  Recipe r;
  Binder b(root, name);
  b.bind("model", r.model);
  b.bind("device", r.device);
  b.bind("precision", r.precision, {Precision::fp32, Precision::fp16, Precision::bf16});
  b.bind("finetune", r.finetune, {Finetune::lora, Finetune::full});
  b.bind("objective", r.objective, {Objective::sft, Objective::dpo, Objective::orpo, Objective::simpo});
  b.bind("preference.beta", r.preference.beta);
  b.bind("preference.label_smoothing", r.preference.label_smoothing);
  b.bind("preference.gamma", r.preference.gamma);
  std::string quantize = "none";
  b.bind("quantize", quantize, {"none", "nf4", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"});
  if (quantize != "none") r.quantize = quant::parse_format(quantize);
  b.bind("data.train", r.data.train);
  b.bind("data.valid", r.data.valid);
  b.bind("data.valid_split", r.data.valid_split);
  b.bind("data.format", r.data.format, {"auto", "text", "completion", "chat"});
  b.bind("data.max_seq_len", r.data.max_seq_len);
  b.bind("data.packing", r.data.packing);
  b.bind("data.overlong", r.data.overlong, {"truncate", "drop", "error"});
  b.bind("lora.rank", r.lora.rank);
  b.bind("lora.alpha", r.lora.alpha);
  b.bind("lora.dropout", r.lora.dropout);
  b.bind("lora.targets", r.lora.targets);
  b.bind("lora.rslora", r.lora.rslora);
  b.bind("lora.init_from", r.lora.init_from);
  b.bind("optimizer.name", r.optimizer.name, {OptimizerName::adamw, OptimizerName::sgd});
  b.bind("optimizer.lr", r.optimizer.lr);
  std::vector<std::string> betas;
  b.bind("optimizer.betas", betas);
  b.bind("optimizer.eps", r.optimizer.eps);
  b.bind("optimizer.weight_decay", r.optimizer.weight_decay);
  b.bind("optimizer.momentum", r.optimizer.momentum);
  b.bind("schedule.name", r.schedule.name, {"constant", "linear", "cosine"});
  b.bind("schedule.warmup_steps", r.schedule.warmup_steps);
  b.bind("schedule.min_lr_ratio", r.schedule.min_lr_ratio);
  b.bind("train.batch_size", r.train.batch_size);
  b.bind("train.grad_accum", r.train.grad_accum);
  b.bind("train.steps", r.train.steps);
  b.bind("train.grad_clip", r.train.grad_clip);
  b.bind("train.grad_checkpointing", r.train.grad_checkpointing);
  b.bind("train.checkpoint_layers", r.train.checkpoint_layers, {"auto", "all"});
  b.bind("train.transposed_weights", r.train.transposed_weights, {"auto", "on", "off"});
  b.bind("train.seed", r.train.seed);
  b.bind("train.max_skipped_steps", r.train.max_skipped_steps);
  double aux_coef = std::nan("");
  b.bind("train.router_aux_loss_coef", aux_coef);
  if (!std::isnan(aux_coef)) {
    if (!(aux_coef >= 0 && std::isfinite(aux_coef)))
      throw ConfigError(name + ": key 'train.router_aux_loss_coef' must be a non-negative number");
    r.train.router_aux_loss_coef = aux_coef;
  }
  b.bind("eval.every", r.eval.every);
  b.bind("eval.batches", r.eval.batches);
  b.bind("save.every", r.save.every);
  b.bind("save.dir", r.save.dir);
  b.bind("resume", r.resume);
  b.reject_unknown(root, "");

  if (!betas.empty()) {
    if (betas.size() != 2) throw ConfigError(name + ": key 'optimizer.betas' must be a list of two numbers");
    try {
      r.optimizer.beta1 = std::stod(betas[0]);
      r.optimizer.beta2 = std::stod(betas[1]);
    } catch (const std::exception&) {
      throw ConfigError(name + ": key 'optimizer.betas' must be a list of two numbers");
    }
  }
  if (r.model.empty()) throw ConfigError(name + ": key 'model' is required (a HuggingFace model directory)");
  if (r.data.train.empty()) throw ConfigError(name + ": key 'data.train' is required (a JSONL file)");
  if (r.quantize && r.finetune == Finetune::full)
    b.fail("quantize", "a quantized base is frozen: quantize needs finetune: lora (it is full)");
  // The DPO reference is the base with the adapter switched off; full fine-tuning has no such model.
  if (r.objective == Objective::dpo && r.finetune == Finetune::full)
    b.fail("objective", "dpo needs finetune: lora (its reference model is the base without the adapter); "
                        "use orpo or simpo for full fine-tuning");
  b.require_positive("data.max_seq_len", r.data.max_seq_len);
  b.require_positive("preference.beta", r.preference.beta);
  b.require_range("preference.label_smoothing", r.preference.label_smoothing, 0, 0.5, false);
  if (!std::isfinite(r.preference.gamma)) b.fail("preference.gamma", "must be a finite number");
  b.require_positive("lora.rank", r.lora.rank);
  b.require_positive("lora.alpha", r.lora.alpha);
  b.require_positive("optimizer.lr", r.optimizer.lr);
  b.require_positive("optimizer.eps", r.optimizer.eps);
  b.require_positive("optimizer.weight_decay", r.optimizer.weight_decay, true);
  b.require_positive("train.batch_size", r.train.batch_size);
  b.require_positive("train.grad_accum", r.train.grad_accum);
  b.require_positive("train.steps", r.train.steps);
  b.require_positive("train.grad_clip", r.train.grad_clip, true);
  b.require_positive("train.max_skipped_steps", r.train.max_skipped_steps);
  b.require_positive("schedule.warmup_steps", r.schedule.warmup_steps, true);
  b.require_positive("eval.every", r.eval.every, true);
  b.require_positive("eval.batches", r.eval.batches, true);
  b.require_positive("save.every", r.save.every, true);
  // Sizes beyond any device are refused here; what fits the device is checked against its memory before a run.
  b.require_range("lora.rank", r.lora.rank, 1, 65536, true);
  b.require_range("train.batch_size", r.train.batch_size, 1, 65536, true);
  b.require_range("train.grad_accum", r.train.grad_accum, 1, 65536, true);
  b.require_range("data.max_seq_len", r.data.max_seq_len, 2, 1 << 24, true);
  const double tokens = double(r.train.batch_size) * r.data.max_seq_len;
  if (tokens > double(kMaxMicroBatchTokens) || tokens * r.train.grad_accum > double(kMaxStepTokens))
    throw ConfigError(name + ": train.batch_size " + std::to_string(r.train.batch_size) + " x data.max_seq_len " +
                      std::to_string(r.data.max_seq_len) + " x train.grad_accum " +
                      std::to_string(r.train.grad_accum) + " is beyond " + std::to_string(kMaxMicroBatchTokens) +
                      " tokens per micro-batch or " + std::to_string(kMaxStepTokens) + " per step");
  b.require_range("lora.dropout", r.lora.dropout, 0, 1, false);
  b.require_range("data.valid_split", r.data.valid_split, 0, 1, false);
  b.require_range("optimizer.momentum", r.optimizer.momentum, 0, 1, false);
  b.require_range("schedule.min_lr_ratio", r.schedule.min_lr_ratio, 0, 1, true);
  if (r.optimizer.beta1 < 0 || r.optimizer.beta1 >= 1 || r.optimizer.beta2 < 0 || r.optimizer.beta2 >= 1)
    throw ConfigError(name + ": key 'optimizer.betas' must be in [0, 1)");
  if (r.device != "auto" && r.device != "cpu" && r.device != "vulkan" && r.device.rfind("vulkan:", 0) != 0)
    throw ConfigError(name + ": key 'device': '" + r.device + "' is not one of auto, cpu, vulkan, vulkan:N");
  YAML::Emitter emitter;
  emitter << root;
  r.resolved_yaml = emitter.c_str();
  return r;
}

}  // namespace

Recipe parse_recipe(const std::string& yaml_text, const std::string& name, const std::vector<std::string>& overrides) {
  YAML::Node root = load_yaml(yaml_text, name);
  if (root["base"]) throw ConfigError(name + ": key 'base' is only supported in recipe files");
  for (const auto& o : overrides) apply_override(root, o, name);
  return bind_all(root, name);
}

Recipe load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  YAML::Node root = load_with_bases(file, 0);
  for (const auto& o : overrides) apply_override(root, o, file.string());
  Recipe r = bind_all(root, file.string());
  r.source = file;
  // Relative data/model paths stay relative to the working directory, as users type them on the command line.
  return r;
}

}  // namespace lmtune
