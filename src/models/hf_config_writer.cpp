// config.json / generation_config.json writing (see hf_config_writer.h).
#include "models/hf_config_writer.h"

#include "core/error.h"

namespace lmtune::models {
using nlohmann::json;

std::string causal_lm_class(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "mixtral") return "MixtralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "qwen3_moe") return "Qwen3MoeForCausalLM";
  if (model_type == "qwen3_next") return "Qwen3NextForCausalLM";
  if (model_type == "qwen3_5_text" || model_type == "qwen3_5") return "Qwen3_5ForCausalLM";
  if (model_type == "qwen3_5_moe_text" || model_type == "qwen3_5_moe") return "Qwen3_5MoeForCausalLM";
  if (model_type == "gemma2") return "Gemma2ForCausalLM";
  if (model_type == "gemma3_text" || model_type == "gemma3") return "Gemma3ForCausalLM";
  if (model_type == "gemma4_text" || model_type == "gemma4") return "Gemma4ForCausalLM";
  throw ConfigError("unsupported model type '" + model_type + "'");
}

namespace {

json rope_scaling(const RopeConfig& r) {
  if (!r.freq_factors.empty())
    throw ConfigError("config.json: a GGUF model's rope frequency factors (rope_freqs.weight) have no config.json form");
  switch (r.type) {
    case RopeType::standard: return nullptr;
    case RopeType::linear: return {{"rope_type", "linear"}, {"factor", r.factor}};
    case RopeType::llama3:
      return {{"rope_type", "llama3"},
              {"factor", r.factor},
              {"low_freq_factor", r.low_freq_factor},
              {"high_freq_factor", r.high_freq_factor},
              {"original_max_position_embeddings", r.original_max_pos}};
    // dynamic reads max_position_embeddings (written beside it); the attention factors are written resolved.
    case RopeType::dynamic: return {{"rope_type", "dynamic"}, {"factor", r.factor}};
    case RopeType::yarn:
      return {{"rope_type", "yarn"},
              {"factor", r.factor},
              {"original_max_position_embeddings", r.original_max_pos},
              {"attention_factor", r.attention_factor},
              {"beta_fast", r.beta_fast},
              {"beta_slow", r.beta_slow},
              {"truncate", r.truncate}};
    case RopeType::longrope:
      return {{"rope_type", "longrope"},
              {"short_factor", r.short_factor},
              {"long_factor", r.long_factor},
              {"original_max_position_embeddings", r.original_max_pos},
              {"attention_factor", r.attention_factor}};
    case RopeType::proportional:
      return {{"rope_type", "proportional"}, {"factor", r.factor}, {"partial_rotary_factor", r.rotated_fraction}};
  }
  return nullptr;
}

// Gemma4TextConfig's own keys: per-layer-type rope dicts, the full layers' head sizes, shared keys and values,
// per-layer inputs. Replaces the keys it does not have.
void write_gemma4(const ModelConfig& c, json& j) {
  for (const char* key : {"rope_theta", "rope_scaling", "partial_rotary_factor", "hidden_act"}) j.erase(key);
  auto rope = [](const RopeConfig& r) {
    json d = r.type == RopeType::standard ? json{{"rope_type", "default"}} : rope_scaling(r);
    d["rope_theta"] = r.theta;
    return d;
  };
  j["rope_parameters"] = {{"full_attention", rope(c.rope)},
                          {"sliding_attention", rope(c.rope_local.value_or(c.rope))}};
  j["attention_bias"] = c.qkv_bias;
  j["final_logit_softcapping"] = c.final_logit_softcapping > 0 ? json(c.final_logit_softcapping) : json(nullptr);
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  j["layer_types"] = c.layer_types;
  int64_t shared = 0;
  bool k_eq_v = false, double_wide = false;
  for (const LayerConfig& l : c.layers) {
    shared += l.kv_source >= 0;
    k_eq_v = k_eq_v || l.k_eq_v;
    double_wide = double_wide || l.intermediate_size != c.intermediate_size;
    if (l.attention == AttentionKind::full) {
      j["global_head_dim"] = l.head_dim;
      j["num_global_key_value_heads"] = l.kv_heads;
    }
  }
  j["attention_k_eq_v"] = k_eq_v;
  j["num_kv_shared_layers"] = shared;
  j["use_double_wide_mlp"] = double_wide;
  j["hidden_size_per_layer_input"] = c.per_layer_input_size;
  if (c.per_layer_input_size > 0) j["vocab_size_per_layer_input"] = c.per_layer_vocab_size;
}

json optional_id(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

json eos(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

json hf_config_json(const ModelConfig& c, const json& extra) {
  const std::string type = text_model_type(c.model_type);
  const bool delta_net = has_gated_deltanet(type);
  const bool gemma = type == "gemma2" || type == "gemma3_text" || type == "gemma4_text";
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen3_moe";
  json j = json::object();
  j["architectures"] = {causal_lm_class(type)};
  j["model_type"] = type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  if (type != "qwen3_5_moe_text") j["intermediate_size"] = c.intermediate_size;  // Qwen3.5-MoE's config has none
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = activation_name(c.hidden_act);
  if (gemma) j["hidden_activation"] = activation_name(c.hidden_act);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["rope_theta"] = c.rope.theta;
  j["rope_scaling"] = rope_scaling(c.rope);
  if (c.rotary_dim != c.head_dim) j["partial_rotary_factor"] = double(c.rotary_dim) / double(c.head_dim);
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["bos_token_id"] = optional_id(c.bos_token_id);
  j["eos_token_id"] = eos(c.eos_token_ids);
  j["pad_token_id"] = optional_id(c.pad_token_id);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;

  if (type == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  } else if (type == "mistral" || type == "mixtral") {
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  } else if (qwen) {
    if (type != "qwen2") j["attention_bias"] = c.qkv_bias;
    j["use_sliding_window"] = c.use_sliding_window;
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
    j["max_window_layers"] = c.max_window_layers;
    j["layer_types"] = c.layer_types;
  } else if (delta_net) {
    const LinearAttentionConfig& la = c.linear_attention;
    j["attention_bias"] = c.qkv_bias;
    j["layer_types"] = c.layer_types;
    j["linear_conv_kernel_dim"] = la.conv_kernel;
    j["linear_key_head_dim"] = la.key_head_dim;
    j["linear_value_head_dim"] = la.value_head_dim;
    j["linear_num_key_heads"] = la.key_heads;
    j["linear_num_value_heads"] = la.value_heads;
    if (c.num_experts == 0 && type == "qwen3_next") j["num_experts"] = 0;
  } else if (type == "gemma4_text") {
    write_gemma4(c, j);
  } else if (gemma) {
    j["attention_bias"] = c.qkv_bias;
    const double qs = c.query_pre_attn_scalar;
    j["query_pre_attn_scalar"] = qs == double(int64_t(qs)) ? json(int64_t(qs)) : json(qs);  // usually an int
    j["attn_logit_softcapping"] = c.attn_logit_softcapping > 0 ? json(c.attn_logit_softcapping) : json(nullptr);
    j["final_logit_softcapping"] = c.final_logit_softcapping > 0 ? json(c.final_logit_softcapping) : json(nullptr);
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
    if (type == "gemma3_text") {
      j["sliding_window_pattern"] = c.sliding_window_pattern;
      j["rope_local_base_freq"] = c.rope_local ? c.rope_local->theta : 10000.0;
      j["layer_types"] = c.layer_types;
    }
  }
  if (c.experts_beside_mlp) {  // Gemma 4's MoE block
    j["enable_moe_block"] = true;
    j["num_experts"] = c.num_experts;
    j["top_k_experts"] = c.experts_per_token;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
  } else if (c.num_experts > 0) {
    j[type == "mixtral" ? "num_local_experts" : "num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = c.output_router_logits;
    if (delta_net) j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    if (type == "qwen3_5_moe_text") j["moe_intermediate_size"] = c.moe_intermediate_size;  // every layer sparse
    if (type == "qwen3_moe" || type == "qwen3_next") {
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      json dense = json::array();
      for (size_t i = 0; i < c.layers.size(); ++i)
        if (!c.layers[i].moe) dense.push_back(int64_t(i));
      j["mlp_only_layers"] = dense;
    }
  }
  for (const auto& [key, value] : extra.items())
    if (!j.contains(key) && key != "text_config" && key != "rope_parameters" && key != "per_layer_config")
      j[key] = value;
  return j;
}

json hf_generation_config_json(const ModelConfig& c) {
  json j = json::object();
  j["_from_model_config"] = true;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (!c.eos_token_ids.empty()) j["eos_token_id"] = eos(c.eos_token_ids);
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j;
}

}  // namespace lmtune::models
