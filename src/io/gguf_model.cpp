// GGUF metadata <-> ModelConfig (see gguf_model.h). Reading builds the config.json that describes the same model
// and hands it to parse_model_config, so defaults, derived per-layer settings and validation are those of HF models;
// the GGUF keys are checked first so that errors name them.
#include "io/gguf_model.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include <cstring>

#include "core/error.h"

namespace lmtune {
using nlohmann::json;

namespace {

struct Arch {
  const char* gguf;
  const char* model_type;
  int64_t big_layers;  // llama.cpp scales Gemma's attention by (hidden / heads)^-0.5 for the 27B (this many layers)
};
constexpr Arch kArchs[] = {
    {"llama", "llama", 0},    {"qwen2", "qwen2", 0},         {"qwen3", "qwen3", 0},
    {"gemma2", "gemma2", 46}, {"gemma3", "gemma3_text", 62},
};

const Arch& find_arch(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  for (const Arch& a : kArchs)
    if (arch == a.gguf) return a;
  f.fail_key("general.architecture", "unsupported architecture '" + arch +
                                         "' (supported: llama, mistral as llama, qwen2, qwen3, gemma2, gemma3)");
}

int64_t positive(const GgufFile& f, const std::string& key, int64_t max) {
  int64_t v = f.get_int(key);
  if (v <= 0 || v > max) f.fail_key(key, std::to_string(v) + " is outside [1, " + std::to_string(max) + "]");
  return v;
}

std::string torch_dtype_of(const GgufTensor& embedding) {
  switch (embedding.type) {
    case GgmlType::F32: return "float32";
    case GgmlType::F16: return "float16";
    default: return "bfloat16";  // BF16, and quantized embeddings (dequantized to the model's 16-bit dtype)
  }
}

// Rope settings: rope.freq_base, rope.dimension_count (partial rotary), rope.scaling.{type,factor}.
void read_rope(const GgufFile& f, const std::string& a, int64_t head_dim, json& j) {
  if (auto base = f.opt_float(a + "rope.freq_base")) {
    if (!(*base > 0)) f.fail_key(a + "rope.freq_base", "must be positive");
    j["rope_theta"] = *base;
  }
  if (auto dims = f.opt_int(a + "rope.dimension_count")) {
    if (*dims <= 0 || *dims > head_dim || *dims % 2 != 0)
      f.fail_key(a + "rope.dimension_count",
                 std::to_string(*dims) + " must be even and in [2, head_dim " + std::to_string(head_dim) + "]");
    if (*dims != head_dim) j["partial_rotary_factor"] = double(*dims) / double(head_dim);
  }
  const std::string type = f.opt_string(a + "rope.scaling.type").value_or("none");
  if (type == "linear") {
    double factor = f.get_float(a + "rope.scaling.factor");
    if (!(factor > 0)) f.fail_key(a + "rope.scaling.factor", "must be positive");
    if (factor != 1.0) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  } else if (type != "none") {
    f.fail_key(a + "rope.scaling.type", "unsupported rope scaling '" + type + "' (supported: none, linear)");
  }
}

// rope_freqs.weight: llama.cpp divides each rotary frequency by its entry (how llama3 rope scaling is stored).
std::vector<float> rope_freq_factors(const GgufFile& f, int64_t rotary_dim) {
  const GgufTensor* t = f.find_tensor("rope_freqs.weight");
  if (!t) return {};
  if (t->type != GgmlType::F32 || t->dims.size() != 1 || t->dims[0] != rotary_dim / 2)
    throw FileError(f.path().string() + ": tensor 'rope_freqs.weight' must be F32 of " +
                    std::to_string(rotary_dim / 2) + " elements (rotary dimension / 2)");
  std::vector<float> v(size_t(t->dims[0]));
  std::memcpy(v.data(), t->data.data(), v.size() * 4);
  for (float x : v)
    if (!(x > 0) || !std::isfinite(x))
      throw FileError(f.path().string() + ": tensor 'rope_freqs.weight' holds a factor that is not positive");
  return v;
}

}  // namespace

std::string gguf_model_type(const GgufFile& file) { return find_arch(file).model_type; }

ModelConfig gguf_model_config(const GgufFile& f) {
  const Arch& arch = find_arch(f);
  const std::string a = std::string(arch.gguf) + ".";
  const std::string type = arch.model_type;
  json j;
  j["model_type"] = type;
  const int64_t hidden = positive(f, a + "embedding_length", int64_t(1) << 16);
  const int64_t heads = positive(f, a + "attention.head_count", 1024);
  const int64_t layers = positive(f, a + "block_count", 1024);
  // llama.cpp writes Mixtral as "llama" with experts (ffn_gate_exps); lmtune reads those from safetensors only.
  if (f.opt_int(a + "expert_count").value_or(0) > 0)
    f.fail_key(a + "expert_count",
               "mixture-of-experts GGUF models are not supported (use the safetensors checkpoint)");
  j["hidden_size"] = hidden;
  j["intermediate_size"] = positive(f, a + "feed_forward_length", int64_t(1) << 20);
  j["num_hidden_layers"] = layers;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] =
      f.contains(a + "attention.head_count_kv") ? positive(f, a + "attention.head_count_kv", 1024) : heads;
  int64_t head_dim = hidden / heads;
  if (f.contains(a + "attention.key_length")) {
    head_dim = positive(f, a + "attention.key_length", 1024);
    j["head_dim"] = head_dim;
  }
  if (auto v = f.opt_int(a + "attention.value_length"); v && *v != head_dim)
    f.fail_key(a + "attention.value_length",
               std::to_string(*v) + " differs from the key length " + std::to_string(head_dim) + " (unsupported)");
  j["max_position_embeddings"] = positive(f, a + "context_length", int64_t(1) << 26);
  if (auto eps = f.opt_float(a + "attention.layer_norm_rms_epsilon")) j["rms_norm_eps"] = *eps;
  read_rope(f, a, head_dim, j);

  const GgufTensor& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2) throw FileError(f.path().string() + ": tensor 'token_embd.weight' must have 2 dims");
  j["vocab_size"] = embd.dims[1];
  j["torch_dtype"] = torch_dtype_of(embd);
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (type == "llama") {
    j["attention_bias"] = f.find_tensor("blk.0.attn_q.bias") != nullptr;
    j["mlp_bias"] = f.find_tensor("blk.0.ffn_up.bias") != nullptr;
  }
  if (type == "gemma2" || type == "gemma3_text") {
    if (auto w = f.opt_int(a + "attention.sliding_window")) j["sliding_window"] = *w;
    // llama.cpp: 1/sqrt(hidden / heads) for the 27B models, 1/sqrt(head_dim) otherwise.
    j["query_pre_attn_scalar"] = layers == arch.big_layers ? hidden / heads : head_dim;
    j["attn_logit_softcapping"] = f.opt_float(a + "attn_logit_softcapping").value_or(0.0);
    j["final_logit_softcapping"] = f.opt_float(a + "final_logit_softcapping").value_or(0.0);
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"})
      if (j[k] == 0.0) j[k] = nullptr;
  }
  if (type == "gemma3_text") {
    // llama.cpp fixes every 6th layer global and the local layers' rope base at 10000.
    j["sliding_window_pattern"] = f.opt_int(a + "attention.sliding_window_pattern").value_or(6);
    j["rope_local_base_freq"] = f.opt_float(a + "rope.freq_base_swa").value_or(10000.0);
  }
  const std::string t = "tokenizer.ggml.";
  if (auto eos = f.opt_int(t + "eos_token_id")) j["eos_token_id"] = *eos;
  if (auto bos = f.opt_int(t + "bos_token_id")) j["bos_token_id"] = *bos;
  if (auto pad = f.opt_int(t + "padding_token_id")) j["pad_token_id"] = *pad;

  ModelConfig c;
  try {
    c = parse_model_config(j.dump(), f.path().string());
  } catch (const ConfigError& e) { throw FileError(std::string(e.what()) + " (derived from the GGUF metadata)"); }
  if (std::vector<float> factors = rope_freq_factors(f, c.rotary_dim); !factors.empty()) {
    const RopeConfig global = c.rope;
    c.rope.freq_factors = factors;
    for (LayerConfig& l : c.layers)
      if (l.rope == global) l.rope = c.rope;
  }
  return c;
}

std::string gguf_arch_name(const ModelConfig& c) {
  if (c.model_type == "llama" || c.model_type == "mistral") return "llama";
  if (c.model_type == "gemma3_text" || c.model_type == "gemma3") return "gemma3";
  if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "gemma2") return c.model_type;
  throw ConfigError("GGUF export: unsupported model type '" + c.model_type + "'" +
                    (c.num_experts > 0 ? " (mixtures of experts export to safetensors only)" : ""));
}

namespace {
// Settings llama.cpp cannot be told (it derives them): a config that differs would run as another model there.
void check_expressible(const ModelConfig& c, const std::string& arch) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("GGUF export: " + what + " cannot be expressed in GGUF (llama.cpp derives it)");
  };
  if (arch == "gemma2" || arch == "gemma3") {
    const int64_t big = arch == "gemma2" ? 46 : 62;
    const double expected =
        c.num_hidden_layers == big ? double(c.hidden_size / c.num_attention_heads) : double(c.head_dim);
    if (c.query_pre_attn_scalar != expected)
      fail("query_pre_attn_scalar " + std::to_string(c.query_pre_attn_scalar) + " (llama.cpp uses " +
           std::to_string(expected) + ")");
  }
  if (arch == "gemma3" && c.sliding_window_pattern != 6) fail("sliding_window_pattern other than 6");
  if (arch == "gemma3" && c.rope_local && c.rope_local->theta != 10000.0)
    fail("rope_local_base_freq other than 10000");
  if ((arch == "qwen2" || arch == "qwen3") && c.use_sliding_window) fail("use_sliding_window");
  if (c.rope.type == RopeType::llama3 && arch != "llama") fail("llama3 rope scaling outside the llama architecture");
  for (const LayerConfig& l : c.layers)
    if (l.rope.type == RopeType::dynamic || l.rope.type == RopeType::yarn || l.rope.type == RopeType::longrope)
      throw ConfigError("GGUF export: " + std::string(rope_type_name(l.rope.type)) +
                        " rope scaling is not written to GGUF yet");
}
}  // namespace

GgufMetadata gguf_config_metadata(const ModelConfig& c, const std::string& name, int file_type) {
  const std::string arch = gguf_arch_name(c);
  check_expressible(c, arch);
  const std::string a = arch + ".";
  auto u32 = [](int64_t v) { return GgufValue::of_u32(uint32_t(v)); };
  GgufMetadata m;
  m.emplace_back("general.architecture", GgufValue::of_string(arch));
  m.emplace_back("general.type", GgufValue::of_string("model"));
  m.emplace_back("general.name", GgufValue::of_string(name));
  m.emplace_back(a + "block_count", u32(c.num_hidden_layers));
  m.emplace_back(a + "context_length", u32(c.max_position_embeddings));
  m.emplace_back(a + "embedding_length", u32(c.hidden_size));
  m.emplace_back(a + "feed_forward_length", u32(c.intermediate_size));
  m.emplace_back(a + "attention.head_count", u32(c.num_attention_heads));
  m.emplace_back(a + "attention.head_count_kv", u32(c.num_key_value_heads));
  m.emplace_back(a + "rope.freq_base", GgufValue::of_f32(float(c.rope.theta)));
  m.emplace_back(a + "attention.layer_norm_rms_epsilon", GgufValue::of_f32(float(c.rms_norm_eps)));
  m.emplace_back(a + "attention.key_length", u32(c.head_dim));
  m.emplace_back(a + "attention.value_length", u32(c.head_dim));
  m.emplace_back("general.file_type", u32(file_type));
  if (arch == "llama") m.emplace_back(a + "vocab_size", u32(c.vocab_size));
  if (c.rotary_dim != c.head_dim || arch == "llama") m.emplace_back(a + "rope.dimension_count", u32(c.rotary_dim));
  if (c.rope.type == RopeType::linear) {
    m.emplace_back(a + "rope.scaling.type", GgufValue::of_string("linear"));
    m.emplace_back(a + "rope.scaling.factor", GgufValue::of_f32(float(c.rope.factor)));
  }
  if (arch == "gemma2") {
    m.emplace_back(a + "attn_logit_softcapping", GgufValue::of_f32(float(c.attn_logit_softcapping)));
    m.emplace_back(a + "final_logit_softcapping", GgufValue::of_f32(float(c.final_logit_softcapping)));
  }
  if ((arch == "gemma2" || arch == "gemma3") && c.sliding_window)
    m.emplace_back(a + "attention.sliding_window", u32(*c.sliding_window));
  return m;
}

}  // namespace lmtune
