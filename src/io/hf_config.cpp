// config.json parsing. Defaults per model_type mirror the transformers config classes (LlamaConfig,
// MistralConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig, Gemma2Config, Gemma3TextConfig,
// Gemma4TextConfig), so a
// config that omits a key means what it means to transformers (gemma-3 multimodal configs rely on this for their
// text_config).
#include "io/hf_config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/gguf_model.h"
#include "io/json_util.h"

namespace lmtune {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// gemma4_pattern: every 6th layer global and the last one global whatever layer_types says (transformers forces it).
enum class WindowRule { none, all_layers, qwen_upper_layers, gemma2_even_layers, gemma3_pattern, gemma4_pattern };

struct ModelDefaults {
  const char* model_type;
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: same as num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rms_norm_eps;
  const char* hidden_act;
  bool tie_word_embeddings;
  double rope_theta;
  int64_t sliding_window;  // 0: null
  WindowRule window_rule;
  bool gemma;               // (1 + w) norms, sqrt(hidden) embedding scale, sandwich norms, hidden_activation
  bool qk_norm;
  bool qkv_bias_always;     // Qwen2 hard-codes bias=True on q/k/v and False on o
  bool has_attention_bias;  // the attention_bias key exists (else no attention biases unless qkv_bias_always)
  bool has_mlp_bias;
  double query_pre_attn_scalar;  // 0: none
  double attn_logit_softcapping, final_logit_softcapping;  // 0: null
  bool local_rope;          // sliding layers use rope_local_base_freq
};

// Values from the transformers config classes' __init__ defaults.
const ModelDefaults kModels[] = {
    {"llama", 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, "silu", false, 10000.0, 0, WindowRule::none,
     false, false, false, true, true, 0, 0, 0, false},
    {"mistral", 32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 1e-6, "silu", false, 10000.0, 4096,
     WindowRule::all_layers, false, false, false, false, false, 0, 0, 0, false},
    {"mixtral", 32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 1e-5, "silu", false, 1e6, 0,
     WindowRule::all_layers, false, false, false, false, false, 0, 0, 0, false},
    {"qwen2", 151936, 4096, 22016, 32, 32, 32, 0, 32768, 1e-6, "silu", false, 10000.0, 4096,
     WindowRule::qwen_upper_layers, false, false, true, false, false, 0, 0, 0, false},
    {"qwen3", 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, "silu", false, 10000.0, 4096,
     WindowRule::qwen_upper_layers, false, true, false, true, false, 0, 0, 0, false},
    {"qwen3_moe", 151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, "silu", false, 10000.0, 4096,
     WindowRule::qwen_upper_layers, false, true, false, true, false, 0, 0, 0, false},
    {"qwen3_next", 151936, 2048, 5632, 48, 16, 2, 256, 32768, 1e-6, "silu", false, 10000.0, 0, WindowRule::none,
     false, true, false, true, false, 0, 0, 0, false},
    {"qwen3_5_text", 248320, 4096, 12288, 32, 16, 4, 256, 32768, 1e-6, "silu", false, 10000.0, 0, WindowRule::none,
     false, true, false, true, false, 0, 0, 0, false},
    {"qwen3_5_moe_text", 248320, 2048, 5632, 40, 16, 2, 256, 32768, 1e-6, "silu", false, 10000.0, 0,
     WindowRule::none, false, true, false, true, false, 0, 0, 0, false},
    {"gemma2", 256000, 2304, 9216, 26, 8, 4, 256, 8192, 1e-6, "gelu_pytorch_tanh", true, 10000.0, 4096,
     WindowRule::gemma2_even_layers, true, false, false, true, false, 256, 50.0, 30.0, false},
    {"gemma3_text", 262208, 2304, 9216, 26, 8, 4, 256, 131072, 1e-6, "gelu_pytorch_tanh", true, 1e6, 4096,
     WindowRule::gemma3_pattern, true, true, false, true, false, 256, 0, 0, true},
    {"gemma4_text", 262144, 2304, 9216, 30, 8, 4, 256, 131072, 1e-6, "gelu_pytorch_tanh", true, 10000.0, 512,
     WindowRule::gemma4_pattern, true, true, false, true, false, 0, 0, 0, false},
};

// Read access to one JSON object with errors naming "<file>: key '<prefix><key>'". A key that is absent or
// null counts as not given, as in transformers.
class Scope {
 public:
  Scope(const json* obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  const json* get(const char* key) const {
    if (!obj_) return nullptr;
    auto it = obj_->find(key);
    return it == obj_->end() || it->is_null() ? nullptr : &*it;
  }
  bool contains(const char* key) const { return obj_ && obj_->contains(key); }  // null counts
  bool has(const char* key) const { return get(key) != nullptr; }

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ConfigError(where_ + ": key '" + prefix_ + key + "': " + problem);
  }

  std::optional<int64_t> opt_int(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) fail(key, "integer out of range");
      return v->get<int64_t>();
    }
    // Some tools write integral values as floats (4096.0).
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return int64_t(d);
    }
    fail(key, "expected an integer, got " + v->dump());
  }
  // A config is untrusted input: sizes beyond any real model (`max`) are refused before anything is allocated.
  int64_t positive_int(const char* key, int64_t fallback, int64_t max) const {
    int64_t v = opt_int(key).value_or(fallback);
    if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
    if (v > max) fail(key, std::to_string(v) + " is beyond the largest supported value " + std::to_string(max));
    return v;
  }
  std::optional<double> opt_num(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(key, "expected a number, got " + json_type_name(*v));
    return v->get<double>();
  }
  std::optional<bool> opt_bool(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + json_type_name(*v));
    return v->get<bool>();
  }
  std::optional<std::string> opt_str(const char* key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, "expected a string, got " + json_type_name(*v));
    return v->get<std::string>();
  }
  // A list of numbers (longrope's factors), empty when absent/null.
  std::vector<double> num_list(const char* key) const {
    const json* v = get(key);
    if (!v) return {};
    std::vector<double> out;
    if (v->is_array())
      for (const json& x : *v) {
        if (!x.is_number()) break;
        out.push_back(x.get<double>());
      }
    if (!v->is_array() || out.size() != v->size()) fail(key, "expected a list of numbers, got " + v->dump());
    return out;
  }
  // A nested object, or an empty scope when absent/null.
  Scope sub(const char* key) const {
    const json* v = get(key);
    if (v && !v->is_object()) fail(key, "expected an object, got " + json_type_name(*v));
    return Scope(v, where_, prefix_ + key + ".");
  }
  // Token ids: an integer or a list of integers.
  std::vector<int64_t> int_list(const char* key) const {
    const json* v = get(key);
    if (!v) return {};
    std::vector<int64_t> out;
    auto one = [&](const json& x) {
      if (!x.is_number_integer()) fail(key, "expected an integer or a list of integers, got " + v->dump());
      out.push_back(x.get<int64_t>());
    };
    if (v->is_array())
      for (const json& x : *v) one(x);
    else
      one(*v);
    return out;
  }
  const std::string& where() const { return where_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json* obj_;
  std::string where_;
  std::string prefix_;
};

Activation parse_activation(const Scope& s, const char* key, const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_fast") return Activation::gelu_tanh;
  if (name == "gelu") return Activation::gelu_erf;
  s.fail(key, "unsupported activation '" + name + "' (supported: silu, gelu_pytorch_tanh, gelu_new, gelu)");
}

// What a rope dict is read against: the model's settings outside it.
struct RopeContext {
  double theta;                  // rope_theta outside the dict
  int64_t max_position_embeddings;
  int64_t rotary_dim;
  // The scope holding the dict (null for per-layer-type dicts): its original_max_position_embeddings (Phi-3
  // style) overrides the dict's for yarn and longrope in transformers when one dict serves all layers.
  const Scope* outer;
};

// transformers' get_mscale of yarn.
double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// yarn and longrope: original_max_position_embeddings as transformers' standardize_rope_params settles it.
int64_t original_max_pos(const Scope& d, const RopeContext& ctx) {
  const char* key = "original_max_position_embeddings";
  const Scope& from = ctx.outer && ctx.outer->has(key) ? *ctx.outer : d;
  int64_t omp = from.opt_int(key).value_or(ctx.max_position_embeddings);
  if (omp <= 0) from.fail(key, "must be positive");
  return omp;
}

double positive(const Scope& d, const char* key, double v) {
  if (!std::isfinite(v) || !(v > 0)) d.fail(key, "must be positive, got " + std::to_string(v));
  return v;
}

void parse_yarn(const Scope& d, const RopeContext& ctx, RopeConfig& r) {
  r.original_max_pos = original_max_pos(d, ctx);
  // transformers indexes factor (a missing key is an error) but takes null as max_position_embeddings / original.
  if (!d.contains("factor")) d.fail("factor", "missing (required for rope type 'yarn')");
  r.factor = positive(d, "factor", d.opt_num("factor").value_or(double(ctx.max_position_embeddings) /
                                                                  double(r.original_max_pos)));
  if (auto af = d.opt_num("attention_factor")) {
    r.attention_factor = positive(d, "attention_factor", *af);
  } else {
    double mscale = d.opt_num("mscale").value_or(0), mscale_all_dim = d.opt_num("mscale_all_dim").value_or(0);
    r.attention_factor = mscale != 0 && mscale_all_dim != 0
                             ? yarn_mscale(r.factor, mscale) / yarn_mscale(r.factor, mscale_all_dim)
                             : yarn_mscale(r.factor, 1.0);
    positive(d, "mscale", r.attention_factor);
  }
  // `beta_fast or 32`: zero or null take the paper's defaults too.
  double fast = d.opt_num("beta_fast").value_or(0), slow = d.opt_num("beta_slow").value_or(0);
  r.beta_fast = positive(d, "beta_fast", fast != 0 ? fast : 32.0);
  r.beta_slow = positive(d, "beta_slow", slow != 0 ? slow : 1.0);
  r.truncate = d.opt_bool("truncate").value_or(true);
}

void parse_longrope(const Scope& d, const RopeContext& ctx, RopeConfig& r) {
  r.original_max_pos = original_max_pos(d, ctx);
  const size_t n = size_t(ctx.rotary_dim / 2);
  for (const char* key : {"short_factor", "long_factor"}) {
    std::vector<double> f = d.num_list(key);
    if (f.empty() && !d.has(key)) d.fail(key, "missing (required for rope type 'longrope')");
    if (f.size() != n)
      d.fail(key, "has " + std::to_string(f.size()) + " entries; expected " + std::to_string(n) +
                      " (rotary dimension / 2)");
    for (double v : f) positive(d, key, v);
    (std::string_view(key) == "short_factor" ? r.short_factor : r.long_factor) = std::move(f);
  }
  // factor only sets the default attention factor (Phi-3 leaves it out: max_position_embeddings / original).
  double factor = d.opt_num("factor").value_or(double(ctx.max_position_embeddings) / double(r.original_max_pos));
  if (auto af = d.opt_num("attention_factor")) {
    r.attention_factor = positive(d, "attention_factor", *af);
  } else if (factor > 1) {
    r.attention_factor = std::sqrt(1 + std::log(factor) / std::log(double(r.original_max_pos)));
  }
}

// One rope dict: rope_scaling (old form, theta given separately) or a rope_parameters entry.
RopeConfig parse_rope(const Scope& d, const RopeContext& ctx) {
  RopeConfig r;
  r.theta = d.opt_num("rope_theta").value_or(ctx.theta);
  if (!(r.theta > 0)) d.fail("rope_theta", "must be positive");
  // transformers reads rope_type, falling back to the legacy key "type".
  const char* type_key = d.has("rope_type") ? "rope_type" : "type";
  std::string type = d.opt_str(type_key).value_or("default");
  auto factor = [&](const char* key) {
    auto v = d.opt_num(key);
    if (!v) d.fail(key, "missing (required for rope type '" + type + "')");
    if (!(*v > 0)) d.fail(key, "must be positive");
    return *v;
  };
  if (type == "default") {
    r.type = RopeType::standard;
  } else if (type == "linear") {
    r.type = RopeType::linear;
    r.factor = factor("factor");
  } else if (type == "llama3") {
    r.type = RopeType::llama3;
    r.factor = factor("factor");
    r.low_freq_factor = factor("low_freq_factor");
    r.high_freq_factor = factor("high_freq_factor");
    if (!(r.high_freq_factor > r.low_freq_factor)) d.fail("high_freq_factor", "must be greater than low_freq_factor");
    auto omp = d.opt_int("original_max_position_embeddings");
    if (!omp) d.fail("original_max_position_embeddings", "missing (required for rope type 'llama3')");
    if (*omp <= 0) d.fail("original_max_position_embeddings", "must be positive");
    r.original_max_pos = *omp;
  } else if (type == "dynamic") {
    r.type = RopeType::dynamic;
    r.factor = factor("factor");
    r.original_max_pos = ctx.max_position_embeddings;
  } else if (type == "yarn") {
    r.type = RopeType::yarn;
    parse_yarn(d, ctx, r);
  } else if (type == "longrope") {
    r.type = RopeType::longrope;
    parse_longrope(d, ctx, r);
  } else if (type == "proportional") {
    r.type = RopeType::proportional;
    r.factor = positive(d, "factor", d.opt_num("factor").value_or(1.0));
    r.rotated_fraction = d.opt_num("partial_rotary_factor").value_or(1.0);
    if (!(r.rotated_fraction > 0 && r.rotated_fraction <= 1)) d.fail("partial_rotary_factor", "must be in (0, 1]");
  } else {
    d.fail(type_key, "unsupported rope type '" + type +
                         "' (supported: default, linear, llama3, dynamic, yarn, longrope, proportional)");
  }
  return r;
}

const ModelDefaults& find_model(const Scope& top, const std::string& model_type) {
  const std::string wanted = text_model_type(model_type);
  for (const ModelDefaults& m : kModels)
    if (wanted == m.model_type) return m;
  std::string list;
  for (const std::string& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
  top.fail("model_type", "unsupported model type '" + model_type + "' (supported: " + list + ")");
}

// Mixture-of-experts keys (MixtralConfig, Qwen3MoeConfig defaults). Mixtral's every layer is sparse, with experts
// of intermediate_size and the top-k probabilities always renormalized; Qwen3-MoE's layer i is sparse unless it is
// listed in mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step.
// Qwen3-Next adds a shared expert (and 0 experts means dense layers); Qwen3.5-MoE's every layer is sparse, its
// top-k always renormalized.
void parse_moe(const Scope& s, ModelConfig& c, const std::string& type) {
  const bool mixtral = type == "mixtral", next = type == "qwen3_next", q35 = type == "qwen3_5_moe_text";
  // transformers 5 saves Qwen3-MoE's count as num_local_experts (its attribute map): either key, not two counts.
  const char* experts_key = mixtral ? "num_local_experts" : "num_experts";
  const char* alias = mixtral ? "num_experts" : "num_local_experts";
  if (!s.has(experts_key) && s.has(alias)) {
    experts_key = alias;
  } else if (s.has(experts_key) && s.has(alias) && s.opt_int(experts_key) != s.opt_int(alias)) {
    s.fail(alias, "gives " + std::to_string(s.opt_int(alias).value_or(0)) + " experts, but " + experts_key +
                      " gives " + std::to_string(s.opt_int(experts_key).value_or(0)));
  }
  if (next && s.opt_int(experts_key).value_or(512) == 0) return;  // Qwen3NextConfig: 0 experts = dense layers
  c.num_experts = s.positive_int(experts_key, mixtral ? 8 : next ? 512 : q35 ? 256 : 128, 4096);
  c.experts_per_token = s.positive_int("num_experts_per_tok", mixtral ? 2 : next ? 10 : 8, 4096);
  if (c.experts_per_token > c.num_experts)
    s.fail("num_experts_per_tok", std::to_string(c.experts_per_token) + " is more than the " +
                                      std::to_string(c.num_experts) + " experts of " + experts_key);
  c.moe_intermediate_size = mixtral ? c.intermediate_size
                                    : s.positive_int("moe_intermediate_size", next || q35 ? 512 : 768, 1 << 20);
  c.norm_topk_prob = mixtral || q35 || s.opt_bool("norm_topk_prob").value_or(next);
  if (next || q35)
    c.shared_expert_intermediate_size = s.positive_int("shared_expert_intermediate_size", 512, 1 << 20);
  if (q35) {
    for (LayerConfig& l : c.layers) l.moe = true;
    return;
  }
  c.router_aux_loss_coef = s.opt_num("router_aux_loss_coef").value_or(0.001);
  if (!(c.router_aux_loss_coef >= 0)) s.fail("router_aux_loss_coef", "must be non-negative");
  c.output_router_logits = s.opt_bool("output_router_logits").value_or(false);
  if (mixtral && s.opt_num("router_jitter_noise").value_or(0.0) != 0.0)
    s.fail("router_jitter_noise", "router jitter noise is not supported (set it to 0)");
  std::vector<int64_t> dense_layers = s.int_list("mlp_only_layers");
  const int64_t step = mixtral ? 1 : s.positive_int("decoder_sparse_step", 1, 1024);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layers[size_t(i)].moe = (i + 1) % step == 0 &&
                              std::find(dense_layers.begin(), dense_layers.end(), i) == dense_layers.end();
}

// A per_layer_config entry (what transformers 5 writes for Gemma 4): the layer's head_dim / num_key_value_heads.
void per_layer_override(const Scope& s, const std::string& key, const json& v, LayerConfig& l) {
  if (!v.is_object()) s.fail("per_layer_config." + key, "expected an object, got " + json_type_name(v));
  const Scope o(&v, s.where(), s.prefix() + "per_layer_config." + key + ".");
  for (const auto& [name, value] : v.items())
    if (name != "head_dim" && name != "num_key_value_heads")
      o.fail(name, "unsupported per-layer setting (supported: head_dim, num_key_value_heads)");
  l.head_dim = o.positive_int("head_dim", l.head_dim, 1024);
  l.kv_heads = o.positive_int("num_key_value_heads", l.kv_heads, 1024);
}

// Gemma4TextConfig and Gemma4TextModel: plain-weight norms, unscaled attention scores (the q/k norms set the
// scale), value norms, per-layer head sizes, shared key/value layers, the double-wide MLP, per-layer inputs and
// the layer scalars.
void parse_gemma4(const Scope& s, ModelConfig& c) {
  const int64_t L = c.num_hidden_layers;
  c.norm_style = NormStyle::weight;
  c.attn_scale = 1.0f;
  c.v_norm = true;
  c.layer_scalar = true;
  if (s.opt_bool("enable_moe_block").value_or(false)) {
    c.experts_beside_mlp = true;
    for (const char* key : {"num_experts", "top_k_experts", "moe_intermediate_size"})
      if (!s.has(key)) s.fail(key, "missing (required with enable_moe_block)");
    c.num_experts = s.positive_int("num_experts", 0, 4096);
    c.experts_per_token = s.positive_int("top_k_experts", 0, 4096);
    if (c.experts_per_token > c.num_experts)
      s.fail("top_k_experts", std::to_string(c.experts_per_token) + " is more than the " +
                                  std::to_string(c.num_experts) + " experts of num_experts");
    c.moe_intermediate_size = s.positive_int("moe_intermediate_size", 0, int64_t(1) << 20);
    c.norm_topk_prob = true;
    for (LayerConfig& l : c.layers) l.moe = true;  // Gemma4ForCausalLM adds no load-balancing loss
  }
  if (auto b = s.opt_str("use_bidirectional_attention"); b && *b == "all")
    s.fail("use_bidirectional_attention", "bidirectional attention over text is not supported (\"vision\" is)");
  c.attn_logit_softcapping = 0;  // Gemma 4 has none (a stray key is ignored, as transformers does)
  const bool k_eq_v = s.opt_bool("attention_k_eq_v").value_or(false);
  // Full layers' heads: global_head_dim (default 512) and, with attention_k_eq_v, num_global_key_value_heads;
  // or per_layer_config, the form transformers writes back.
  if (const json* per = s.get("per_layer_config")) {
    if (!per->is_object()) s.fail("per_layer_config", "expected an object, got " + json_type_name(*per));
    for (const auto& [key, v] : per->items()) {
      size_t used = 0;
      int64_t i = -1;
      try {
        i = std::stoll(key, &used);
      } catch (const std::exception&) {
      }
      if (used != key.size() || i < 0 || i >= L)
        s.fail("per_layer_config", "key '" + key + "' is not a layer index below " + std::to_string(L));
      per_layer_override(s, key, v, c.layers[size_t(i)]);
    }
  } else {
    const int64_t global_dim = s.positive_int("global_head_dim", 512, 1024);
    const int64_t global_kv = k_eq_v ? s.positive_int("num_global_key_value_heads", c.num_key_value_heads, 1024)
                                     : c.num_key_value_heads;
    for (LayerConfig& l : c.layers)
      if (l.attention == AttentionKind::full) {
        l.head_dim = global_dim;
        l.kv_heads = global_kv;
      }
  }
  for (int64_t i = 0; i < L; ++i) {
    LayerConfig& l = c.layers[size_t(i)];
    if (l.head_dim % 2 != 0) s.fail("head_dim", "layer " + std::to_string(i) + "'s head size must be even");
    if (c.num_attention_heads % l.kv_heads != 0)
      s.fail("num_key_value_heads", "layer " + std::to_string(i) + ": " + std::to_string(l.kv_heads) +
                                        " does not divide num_attention_heads");
    l.rotary_dim = l.head_dim;
    l.k_eq_v = k_eq_v && l.attention == AttentionKind::full;
  }
  // The last num_kv_shared_layers layers reuse the keys and values of the last earlier layer of their type.
  const int64_t shared = s.opt_int("num_kv_shared_layers").value_or(0);
  if (shared < 0 || shared >= L)
    s.fail("num_kv_shared_layers", "must be at least 0 and below num_hidden_layers (" + std::to_string(L) + ")");
  const int64_t first_shared = L - shared;
  const bool double_wide = s.opt_bool("use_double_wide_mlp").value_or(false);
  for (int64_t i = first_shared; i < L; ++i) {
    LayerConfig& l = c.layers[size_t(i)];
    int64_t j = first_shared - 1;
    while (j >= 0 && c.layer_types[size_t(j)] != c.layer_types[size_t(i)]) --j;
    if (j < 0)
      s.fail("num_kv_shared_layers", "layer " + std::to_string(i) + " (" + c.layer_types[size_t(i)] +
                                         ") shares keys and values, but no earlier layer of its type computes them");
    const LayerConfig& src = c.layers[size_t(j)];
    if (src.head_dim != l.head_dim || src.kv_heads != l.kv_heads)
      s.fail("num_kv_shared_layers", "layer " + std::to_string(i) + " shares the keys of layer " + std::to_string(j) +
                                         ", whose heads differ in size");
    l.kv_source = int(j);
    if (double_wide) l.intermediate_size = 2 * c.intermediate_size;
  }
  c.per_layer_input_size = s.opt_int("hidden_size_per_layer_input").value_or(256);
  if (c.per_layer_input_size < 0 || c.per_layer_input_size > 65536)
    s.fail("hidden_size_per_layer_input", "must be between 0 and 65536");
  if (c.per_layer_input_size > 0)
    c.per_layer_vocab_size = s.positive_int("vocab_size_per_layer_input", 262144, int64_t(1) << 24);
  if (c.per_layer_input_size > 0 && c.per_layer_vocab_size < c.vocab_size)
    s.fail("vocab_size_per_layer_input", std::to_string(c.per_layer_vocab_size) + " is below vocab_size " +
                                             std::to_string(c.vocab_size) +
                                             ": some tokens would have no per-layer input");
}

// Qwen3NextConfig and Qwen3.5's text configs: Gated DeltaNet layers where layer_types says linear_attention (by
// default all but every full_attention_interval-th), gated attention with (1 + w) norms elsewhere, and the
// experts' shared expert. Qwen3.5 projects q, k, v, z, b and a separately (in_proj_qkv, _z, _b, _a).
void parse_qwen3_next(const Scope& s, ModelConfig& c, const std::string& type) {
  c.norm_style = NormStyle::one_plus_weight;
  c.gated_attention = true;
  LinearAttentionConfig& la = c.linear_attention;
  la.conv_kernel = s.positive_int("linear_conv_kernel_dim", 4, 64);
  la.key_head_dim = s.positive_int("linear_key_head_dim", 128, 1024);
  la.value_head_dim = s.positive_int("linear_value_head_dim", 128, 1024);
  la.key_heads = s.positive_int("linear_num_key_heads", 16, 1024);
  la.value_heads = s.positive_int("linear_num_value_heads", 32, 1024);
  if (la.value_heads % la.key_heads != 0)
    s.fail("linear_num_value_heads", std::to_string(la.value_heads) + " is not a multiple of linear_num_key_heads " +
                                         std::to_string(la.key_heads));
  la.split_projections = type != "qwen3_next";
  for (size_t i = 0; i < c.layers.size(); ++i) c.layers[i].linear_attention = c.layer_types[i] == "linear_attention";
  if (type != "qwen3_5_text") parse_moe(s, c, type);
}

}  // namespace

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::gelu_tanh: return "gelu_pytorch_tanh";
    case Activation::gelu_erf: return "gelu";
  }
  return "?";
}

std::string text_model_type(const std::string& model_type) {
  const bool wrapper = model_type == "gemma3" || model_type == "gemma4" || model_type == "qwen3_5" ||
                       model_type == "qwen3_5_moe";
  return wrapper ? model_type + "_text" : model_type;
}

bool has_gated_deltanet(std::string_view type) {
  return type == "qwen3_next" || type == "qwen3_5_text" || type == "qwen3_5_moe_text";
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"llama", "mistral",     "mixtral", "qwen2", "qwen3",
                                                 "qwen3_moe", "qwen3_next", "qwen3_5_text", "qwen3_5",
                                                 "qwen3_5_moe_text", "qwen3_5_moe", "gemma2", "gemma3_text",
                                                 "gemma3", "gemma4_text", "gemma4"};
  return types;
}

ModelConfig parse_model_config(std::string_view json_text, const std::string& where) {
  json root = parse_json_strict(json_text, where);
  if (!root.is_object()) throw ConfigError(where + ": expected a JSON object");
  Scope top(&root, where, "");
  ModelConfig c;
  auto model_type = top.opt_str("model_type");
  if (!model_type) top.fail("model_type", "missing");
  c.model_type = *model_type;
  const ModelDefaults& d = find_model(top, c.model_type);
  // The multimodal gemma3 / gemma4 configs keep the language model's settings under text_config.
  const bool wrapper = c.model_type != d.model_type;
  Scope s = wrapper ? top.sub("text_config") : top;
  const bool gemma4 = std::string_view(d.model_type) == "gemma4_text";

  if (const json* arch = top.get("architectures"); arch && arch->is_array() && !arch->empty() &&
                                                    (*arch)[0].is_string())
    c.architecture = (*arch)[0].get<std::string>();
  c.torch_dtype = s.opt_str("torch_dtype").value_or(top.opt_str("torch_dtype").value_or(
      s.opt_str("dtype").value_or(top.opt_str("dtype").value_or(""))));

  c.vocab_size = s.positive_int("vocab_size", d.vocab_size, int64_t(1) << 24);
  c.hidden_size = s.positive_int("hidden_size", d.hidden_size, int64_t(1) << 16);
  c.intermediate_size = s.positive_int("intermediate_size", d.intermediate_size, int64_t(1) << 20);
  c.num_hidden_layers = s.positive_int("num_hidden_layers", d.num_hidden_layers, 1024);
  c.num_attention_heads = s.positive_int("num_attention_heads", d.num_attention_heads, 1024);
  c.num_key_value_heads =
      s.positive_int("num_key_value_heads", d.num_key_value_heads ? d.num_key_value_heads : c.num_attention_heads,
                     1024);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    s.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads " +
                                      std::to_string(c.num_attention_heads));
  if (s.has("head_dim") || d.head_dim) {
    c.head_dim = s.positive_int("head_dim", d.head_dim, 1024);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      s.fail("num_attention_heads", "hidden_size " + std::to_string(c.hidden_size) + " is not divisible by " +
                                        std::to_string(c.num_attention_heads) + " heads and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // transformers 5 keeps partial_rotary_factor in rope_parameters (Gemma 4's there means its proportional rope's).
  const bool next = has_gated_deltanet(d.model_type);
  std::optional<double> partial_in_rope;
  if (!gemma4 && s.has("rope_parameters"))
    partial_in_rope = s.sub("rope_parameters").opt_num("partial_rotary_factor");
  double partial = s.opt_num("partial_rotary_factor").value_or(partial_in_rope.value_or(next ? 0.25 : 1.0));
  c.rotary_dim = int64_t(double(c.head_dim) * partial);
  if (!(partial > 0 && partial <= 1) || c.rotary_dim <= 0 || c.rotary_dim % 2 != 0)
    s.fail("partial_rotary_factor", "gives rotary dimension " + std::to_string(c.rotary_dim) +
                                        "; it must be positive, even and at most head_dim");
  c.max_position_embeddings = s.positive_int("max_position_embeddings", d.max_position_embeddings, int64_t(1) << 26);
  c.rms_norm_eps = s.opt_num("rms_norm_eps").value_or(d.rms_norm_eps);
  if (!(c.rms_norm_eps >= 0)) s.fail("rms_norm_eps", "must be non-negative");

  // Gemma's modules read hidden_activation; hidden_act is its legacy alias.
  const char* act_key = d.gemma && s.has("hidden_activation") ? "hidden_activation" : "hidden_act";
  c.hidden_act = parse_activation(s, act_key, s.opt_str(act_key).value_or(d.hidden_act));

  c.tie_word_embeddings =
      s.opt_bool("tie_word_embeddings").value_or(top.opt_bool("tie_word_embeddings").value_or(d.tie_word_embeddings));

  bool attention_bias = d.has_attention_bias ? s.opt_bool("attention_bias").value_or(false) : false;
  c.qkv_bias = d.qkv_bias_always || attention_bias;
  c.o_bias = attention_bias;
  c.mlp_bias = d.has_mlp_bias ? s.opt_bool("mlp_bias").value_or(false) : false;

  if (d.query_pre_attn_scalar > 0) {
    c.query_pre_attn_scalar = s.opt_num("query_pre_attn_scalar").value_or(d.query_pre_attn_scalar);
    if (!(c.query_pre_attn_scalar > 0)) s.fail("query_pre_attn_scalar", "must be positive");
    c.attn_scale = float(1.0 / std::sqrt(c.query_pre_attn_scalar));
  } else {
    c.attn_scale = float(1.0 / std::sqrt(double(c.head_dim)));
  }
  // Soft-capping: an absent key takes the class default, an explicit null turns it off.
  auto softcap = [&](const char* key, double fallback) {
    double v = s.contains(key) ? s.opt_num(key).value_or(0.0) : fallback;
    if (v < 0) s.fail(key, "must be positive or null");
    return v;
  };
  c.attn_logit_softcapping = softcap("attn_logit_softcapping", d.attn_logit_softcapping);
  c.final_logit_softcapping = softcap("final_logit_softcapping", d.final_logit_softcapping);

  // ---- sliding windows and layer types ----
  if (d.window_rule != WindowRule::none) {
    if (s.contains("sliding_window")) c.sliding_window = s.opt_int("sliding_window");
    else if (d.sliding_window) c.sliding_window = d.sliding_window;
    if (c.sliding_window && *c.sliding_window <= 0) s.fail("sliding_window", "must be positive or null");
  }
  if (d.window_rule == WindowRule::qwen_upper_layers) {
    c.use_sliding_window = s.opt_bool("use_sliding_window").value_or(false);
    c.max_window_layers = s.opt_int("max_window_layers").value_or(28);
    if (!c.use_sliding_window) c.sliding_window.reset();  // transformers ignores the window unless enabled
  }
  if (d.window_rule == WindowRule::gemma3_pattern) {
    c.sliding_window_pattern = s.positive_int("sliding_window_pattern", 6, 1024);
  }
  const int64_t n_layers = c.num_hidden_layers;
  if (const json* lt = s.get("layer_types")) {
    if (!lt->is_array() || int64_t(lt->size()) != n_layers)
      s.fail("layer_types", "expected a list of " + std::to_string(n_layers) + " strings (one per layer)");
    for (const json& t : *lt) {
      const char* second = next ? "linear_attention" : "sliding_attention";
      if (!t.is_string() || (t != "full_attention" && t != second))
        s.fail("layer_types", std::string("entries must be \"full_attention\"") +
                                  (next ? " or \"linear_attention\"" : " or \"sliding_attention\"") + ", got " +
                                  t.dump());
      c.layer_types.push_back(t.get<std::string>());
    }
  } else if (next) {
    const int64_t interval = s.positive_int("full_attention_interval", 4, 1024);
    for (int64_t i = 0; i < n_layers; ++i)
      c.layer_types.push_back((i + 1) % interval ? "linear_attention" : "full_attention");
  } else {
    for (int64_t i = 0; i < n_layers; ++i) {
      bool sliding = false;
      switch (d.window_rule) {
        case WindowRule::none: break;
        case WindowRule::all_layers: sliding = c.sliding_window.has_value(); break;
        case WindowRule::qwen_upper_layers: sliding = c.sliding_window.has_value() && i >= c.max_window_layers; break;
        case WindowRule::gemma2_even_layers: sliding = i % 2 == 0; break;
        case WindowRule::gemma3_pattern: sliding = (i + 1) % c.sliding_window_pattern != 0; break;
        case WindowRule::gemma4_pattern: sliding = (i + 1) % 6 != 0; break;
      }
      c.layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
    }
  }
  if (d.window_rule == WindowRule::gemma4_pattern) c.layer_types.back() = "full_attention";

  // ---- rotary embedding ----
  if (gemma4) c.rotary_dim = c.head_dim;  // each layer's rope covers its whole head (proportional pads with zeros)
  RopeContext rope_ctx{s.opt_num("rope_theta").value_or(d.rope_theta), c.max_position_embeddings, c.rotary_dim, &s};
  if (s.has("rope_parameters")) {
    Scope rp = s.sub("rope_parameters");
    if (rp.has("full_attention") || rp.has("sliding_attention")) {
      RopeContext per_type = rope_ctx;
      per_type.outer = nullptr;  // transformers only fills in max_position_embeddings here
      c.rope = parse_rope(rp.sub("full_attention"), per_type);
      if (rp.has("sliding_attention")) c.rope_local = parse_rope(rp.sub("sliding_attention"), per_type);
    } else {
      c.rope = parse_rope(rp, rope_ctx);
    }
  } else if (gemma4) {
    // Gemma4TextConfig's defaults: proportional rope over a quarter of the full layers' heads, base 1e6.
    c.rope.type = RopeType::proportional;
    c.rope.theta = 1e6;
    c.rope.rotated_fraction = 0.25;
    c.rope_local = RopeConfig{};
  } else {
    c.rope = parse_rope(s.sub("rope_scaling"), rope_ctx);
  }
  if (d.local_rope && !c.rope_local) {
    RopeConfig local;
    local.theta = s.opt_num("rope_local_base_freq").value_or(10000.0);
    if (!(local.theta > 0)) s.fail("rope_local_base_freq", "must be positive");
    c.rope_local = local;
  }

  c.layers.resize(size_t(n_layers));
  for (int64_t i = 0; i < n_layers; ++i) {
    LayerConfig& l = c.layers[size_t(i)];
    if (c.layer_types[size_t(i)] == "sliding_attention") {
      if (!c.sliding_window)
        s.fail("sliding_window", "layer " + std::to_string(i) + " is sliding_attention but no window is set");
      l.attention = AttentionKind::sliding;
      l.sliding_window = *c.sliding_window;
      l.rope = c.rope_local.value_or(c.rope);
    } else {
      l.rope = c.rope;
    }
    l.head_dim = c.head_dim;
    l.kv_heads = c.num_key_value_heads;
    l.rotary_dim = c.rotary_dim;
    l.intermediate_size = c.intermediate_size;
  }

  // ---- structure ----
  c.embed_scale = d.gemma ? float(std::sqrt(double(c.hidden_size))) : 1.0f;
  c.norm_style = d.gemma ? NormStyle::one_plus_weight : NormStyle::weight;
  c.qk_norm = d.qk_norm;
  c.sandwich_norms = d.gemma;
  if (c.model_type == "mixtral" || c.model_type == "qwen3_moe") parse_moe(s, c, c.model_type);
  if (gemma4) parse_gemma4(s, c);
  if (next) parse_qwen3_next(s, c, d.model_type);

  // Token ids may sit in text_config or at the top level (gemma3, gemma4).
  const Scope& eos_scope = s.has("eos_token_id") ? s : top;
  c.eos_token_ids = eos_scope.int_list("eos_token_id");
  // Generation stops on these ids: one outside the vocabulary would never be produced.
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      eos_scope.fail("eos_token_id", std::to_string(id) + " is outside the vocabulary [0, " +
                                         std::to_string(c.vocab_size) + ") of vocab_size");
  c.bos_token_id = s.has("bos_token_id") ? s.opt_int("bos_token_id") : top.opt_int("bos_token_id");
  c.pad_token_id = s.has("pad_token_id") ? s.opt_int("pad_token_id") : top.opt_int("pad_token_id");
  return c;
}

namespace {
fs::path file_in(const fs::path& path, const char* name) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? path / name : path;
}
}  // namespace

ModelConfig load_model_config(const fs::path& path) {
  if (auto gguf = find_gguf_model(path)) return gguf_model_config(GgufFile(*gguf));
  fs::path file = file_in(path, "config.json");
  return parse_model_config(read_file_text(file), file.string());
}

GenerationConfig parse_generation_config(std::string_view json_text, const std::string& where) {
  json root = parse_json_strict(json_text, where);
  if (!root.is_object()) throw ConfigError(where + ": expected a JSON object");
  Scope s(&root, where, "");
  GenerationConfig g;
  g.eos_token_ids = s.int_list("eos_token_id");
  g.bos_token_id = s.opt_int("bos_token_id");
  g.pad_token_id = s.opt_int("pad_token_id");
  return g;
}

GenerationConfig load_generation_config(const fs::path& path) {
  fs::path file = file_in(path, "generation_config.json");
  return parse_generation_config(read_file_text(file), file.string());
}

}  // namespace lmtune
