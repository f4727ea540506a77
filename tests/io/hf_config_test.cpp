// Tests for io/hf_config with config.json files as published for Llama-3.2-1B, Llama-2-7b, Mistral-7B-v0.1,
// Qwen2.5-0.5B, Qwen3-0.6B, gemma-2-2b, gemma-3-1b-it and gemma-3-4b-it (old rope_scaling form), plus the
// newer transformers rope_parameters form, and rope_inv_freq against an independent double-precision formula.
#include "io/hf_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/io_test_util.h"

namespace lmtune {
namespace {

using testing::TempDir;

const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kLlama2_7B = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
  "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kGemma2_2B = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
  "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000})";

const char* kGemma3_1B = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

// gemma-3-4b-it: the multimodal wrapper; text_config omits keys that keep Gemma3TextConfig defaults.
const char* kGemma3_4B = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
  "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                  "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                  "sliding_window": 1024},
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                    "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}})";

// Independent reference for llama3 scaling, in double precision, written from the published algorithm.
double llama3_expected(double theta, int dim, int i, double factor, double low, double high, double old_len) {
  double f = 1.0 / std::pow(theta, double(2 * i) / dim);
  double wavelen = 2 * std::numbers::pi / f;
  if (wavelen < old_len / high) return f;
  if (wavelen > old_len / low) return f / factor;
  double smooth = (old_len / wavelen - low) / (high - low);
  return (1 - smooth) * f / factor + smooth * f;
}

TEST(HfConfig, Llama32_1B) {
  ModelConfig c = parse_model_config(kLlama32_1B);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, Activation::silu);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_FLOAT_EQ(c.attn_scale, 0.125f);
  EXPECT_EQ(c.rope.type, RopeType::llama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_pos, 8192);
  EXPECT_FALSE(c.rope_local);
  ASSERT_EQ(c.layers.size(), 16u);
  for (const auto& l : c.layers) {
    EXPECT_EQ(l.attention, AttentionKind::full);
    EXPECT_EQ(l.rope, c.rope);
  }
  EXPECT_EQ(c.embed_scale, 1.0f);
  EXPECT_EQ(c.norm_style, NormStyle::weight);
  EXPECT_FALSE(c.qk_norm || c.sandwich_norms);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.attn_logit_softcapping, 0);
  EXPECT_EQ(c.final_logit_softcapping, 0);
}

TEST(HfConfig, Llama3InvFreqMatchesIndependentFormula) {
  ModelConfig c = parse_model_config(kLlama32_1B);
  std::vector<float> inv = rope_inv_freq(c.rope, int(c.rotary_dim));
  ASSERT_EQ(inv.size(), 32u);
  int low = 0, medium = 0, high = 0;
  for (int i = 0; i < 32; ++i) {
    double expected = llama3_expected(500000.0, 64, i, 32.0, 1.0, 4.0, 8192.0);
    EXPECT_NEAR(inv[size_t(i)], expected, 2e-6 * expected) << "i=" << i;
    double wavelen = 2 * std::numbers::pi * std::pow(500000.0, 2.0 * i / 64);
    (wavelen < 2048 ? high : wavelen > 8192 ? low : medium)++;
  }
  EXPECT_GT(low, 0);  // the test covers all three regimes
  EXPECT_GT(medium, 0);
  EXPECT_GT(high, 0);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  // Lowest frequency: 500000^(-62/64) / 32.
  EXPECT_NEAR(inv[31], std::pow(500000.0, -62.0 / 64) / 32, 1e-6 * inv[31]);
}

TEST(HfConfig, DefaultAndLinearInvFreq) {
  RopeConfig r;
  r.theta = 10000.0;
  std::vector<float> inv = rope_inv_freq(r, 128);
  ASSERT_EQ(inv.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    double expected = 1.0 / std::pow(10000.0, 2.0 * i / 128);
    EXPECT_NEAR(inv[size_t(i)], expected, 1e-6 * expected) << i;
  }
  r.type = RopeType::linear;
  r.factor = 8.0;
  std::vector<float> lin = rope_inv_freq(r, 128);
  for (size_t i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(lin[i], inv[i] / 8.0f);
  EXPECT_THROW(rope_inv_freq(r, 7), ConfigError);
  EXPECT_THROW(rope_inv_freq(r, 0), ConfigError);
}

TEST(HfConfig, Llama2_7B) {
  ModelConfig c = parse_model_config(kLlama2_7B);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.head_dim, 128);  // derived: 4096 / 32
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.type, RopeType::standard);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);  // default
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(HfConfig, Mistral7B_SlidingOnAllLayers) {
  ModelConfig c = parse_model_config(kMistral7B);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 4096);
  for (const auto& l : c.layers) {
    EXPECT_EQ(l.attention, AttentionKind::sliding);
    EXPECT_EQ(l.sliding_window, 4096);
  }
  EXPECT_FALSE(c.qkv_bias || c.o_bias);
  // Mistral v0.2+ sets the window to null: all layers full.
  std::string v02 = kMistral7B;
  v02.replace(v02.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  ModelConfig c2 = parse_model_config(v02);
  EXPECT_FALSE(c2.sliding_window);
  EXPECT_EQ(c2.layers[0].attention, AttentionKind::full);
}

TEST(HfConfig, Qwen25_05B) {
  ModelConfig c = parse_model_config(kQwen25_05B);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_TRUE(c.qkv_bias);   // Qwen2 always has q/k/v biases...
  EXPECT_FALSE(c.o_bias);    // ...and never an o_proj bias
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.use_sliding_window);
  EXPECT_FALSE(c.sliding_window);  // ignored while use_sliding_window is false
  EXPECT_EQ(c.max_window_layers, 24);
  for (const auto& l : c.layers) EXPECT_EQ(l.attention, AttentionKind::full);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_FALSE(c.qk_norm);
  // With the window enabled, layers from max_window_layers on slide.
  std::string on = kQwen25_05B;
  on.replace(on.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  on.replace(on.find("\"max_window_layers\": 24"), 23, "\"max_window_layers\": 20");
  ModelConfig c2 = parse_model_config(on);
  EXPECT_EQ(c2.layers[19].attention, AttentionKind::full);
  EXPECT_EQ(c2.layers[20].attention, AttentionKind::sliding);
  EXPECT_EQ(c2.layers[20].sliding_window, 32768);
  EXPECT_EQ(c2.layer_types[23], "sliding_attention");
}

TEST(HfConfig, Qwen3_06B) {
  ModelConfig c = parse_model_config(kQwen3_06B);
  EXPECT_EQ(c.head_dim, 128);  // explicit, independent of 1024 / 16 = 64
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(128.0f));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.norm_style, NormStyle::weight);
  EXPECT_FALSE(c.qkv_bias || c.o_bias);
  EXPECT_FALSE(c.sliding_window);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(c.layers.size(), 28u);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
}

std::string config_error(const std::string& text);

// Qwen3-30B-A3B's config.json (the keys that matter here): every layer sparse, 8 of 128 experts of 768.
TEST(HfConfig, Qwen3MoeExpertsAndDenseLayers) {
  const std::string base = R"({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "vocab_size": 151936})";
  ModelConfig c = parse_model_config(base);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.output_router_logits);
  EXPECT_DOUBLE_EQ(c.router_aux_loss_coef, 0.001);
  for (const LayerConfig& l : c.layers) EXPECT_TRUE(l.moe);
  // Dense layers: listed, or off the sparse step; Qwen3MoeConfig's defaults otherwise.
  const std::string sparse = R"("decoder_sparse_step": 1, "mlp_only_layers": [])";
  std::string dense = base;
  dense.replace(dense.find(sparse), sparse.size(), R"("decoder_sparse_step": 2, "mlp_only_layers": [3])");
  c = parse_model_config(dense);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.layers[size_t(i)].moe, i == 1 || i == 5) << i;
  c = parse_model_config(R"({"model_type": "qwen3_moe"})");
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.head_dim, 2048 / 32);
  // transformers 5 saves the count as num_local_experts (Qwen3MoeConfig's attribute map); two counts must agree.
  c = parse_model_config(R"({"model_type": "qwen3_moe", "num_local_experts": 16, "num_experts_per_tok": 4})");
  EXPECT_EQ(c.num_experts, 16);
  c = parse_model_config(R"({"model_type": "qwen3_moe", "num_local_experts": 16, "num_experts": 16})");
  EXPECT_EQ(c.num_experts, 16);
  const std::string msg = config_error(R"({"model_type": "qwen3_moe", "num_local_experts": 16, "num_experts": 8})");
  EXPECT_NE(msg.find("key 'num_local_experts': gives 16 experts, but num_experts gives 8"), std::string::npos) << msg;
}

TEST(HfConfig, MixtralAlwaysRenormalizesAndRefusesJitter) {
  ModelConfig c = parse_model_config(R"({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
    "norm_topk_prob": false, "output_router_logits": true, "router_aux_loss_coef": 0.02})");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.output_router_logits);
  EXPECT_FALSE(c.sliding_window);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.num_key_value_heads, 8);
  for (const LayerConfig& l : c.layers) EXPECT_TRUE(l.moe);
  std::string msg = config_error(R"({"model_type": "mixtral", "router_jitter_noise": 0.1})");
  EXPECT_NE(msg.find("key 'router_jitter_noise': router jitter noise is not supported"), std::string::npos) << msg;
  msg = config_error(R"({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 6})");
  EXPECT_NE(msg.find("key 'num_experts_per_tok': 6 is more than the 4 experts of num_local_experts"),
            std::string::npos) << msg;
  msg = config_error(R"({"model_type": "qwen3_moe", "num_experts": 0})");
  EXPECT_NE(msg.find("key 'num_experts': must be positive"), std::string::npos) << msg;
}

TEST(HfConfig, Gemma2_2B) {
  ModelConfig c = parse_model_config(kGemma2_2B);
  EXPECT_EQ(c.hidden_act, Activation::gelu_tanh);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma default, key absent
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(2304.0f));
  EXPECT_EQ(c.norm_style, NormStyle::one_plus_weight);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_FALSE(c.qk_norm);
  ASSERT_EQ(c.layers.size(), 26u);
  for (size_t i = 0; i < 26; ++i) {  // transformers: layer_idx % 2 == 0 -> sliding
    EXPECT_EQ(c.layers[i].attention, i % 2 == 0 ? AttentionKind::sliding : AttentionKind::full) << i;
    EXPECT_EQ(c.layers[i].rope, c.rope);
  }
  EXPECT_EQ(c.layers[0].sliding_window, 4096);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(c.pad_token_id, 0);
}

TEST(HfConfig, Gemma3_1B) {
  ModelConfig c = parse_model_config(kGemma3_1B);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.attn_logit_softcapping, 0);  // explicit null turns the Gemma2-style caps off
  EXPECT_EQ(c.final_logit_softcapping, 0);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_EQ(c.norm_style, NormStyle::one_plus_weight);
  EXPECT_FLOAT_EQ(c.embed_scale, std::sqrt(1152.0f));
  EXPECT_EQ(c.sliding_window_pattern, 6);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  ASSERT_TRUE(c.rope_local);
  EXPECT_DOUBLE_EQ(c.rope_local->theta, 10000.0);
  for (size_t i = 0; i < 26; ++i) {
    bool global = (i + 1) % 6 == 0;  // layers 5, 11, 17, 23
    EXPECT_EQ(c.layers[i].attention, global ? AttentionKind::full : AttentionKind::sliding) << i;
    EXPECT_DOUBLE_EQ(c.layers[i].rope.theta, global ? 1e6 : 1e4) << i;
    if (!global) {
      EXPECT_EQ(c.layers[i].sliding_window, 512);
    }
  }
  EXPECT_EQ(c.layer_types[5], "full_attention");
}

TEST(HfConfig, Gemma3_4B_TextConfigAndDefaults) {
  ModelConfig c = parse_model_config(kGemma3_4B);
  EXPECT_EQ(c.model_type, "gemma3");
  EXPECT_EQ(c.architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.num_hidden_layers, 34);
  EXPECT_EQ(c.vocab_size, 262208);         // Gemma3TextConfig default
  EXPECT_EQ(c.num_attention_heads, 8);     // default
  EXPECT_EQ(c.num_key_value_heads, 4);     // default
  EXPECT_EQ(c.head_dim, 256);              // default
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));  // from the top level
  EXPECT_EQ(c.rope.type, RopeType::linear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.layers[5].rope, c.rope);                    // global layers: scaled rope
  EXPECT_EQ(c.layers[0].rope.type, RopeType::standard);   // local layers: unscaled 10k
  EXPECT_DOUBLE_EQ(c.layers[0].rope.theta, 1e4);
  EXPECT_EQ(c.layers[0].sliding_window, 1024);
}

TEST(HfConfig, RopeParametersNewForm) {
  // transformers >= 4.57 / 5 writes rope_parameters instead of rope_theta + rope_scaling.
  std::string llama = kLlama32_1B;
  llama.replace(llama.find("\"rope_scaling\":"), 15, "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
                "\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                "\"original_max_position_embeddings\": 8192}, \"_old_rope_scaling\":");
  llama.replace(llama.find("\"rope_theta\": 500000.0,"), 24, "");  // theta only inside rope_parameters
  ModelConfig a = parse_model_config(llama);
  ModelConfig b = parse_model_config(kLlama32_1B);
  EXPECT_EQ(a.rope, b.rope);

  const char* gemma3_new = R"({"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 12,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
    "layer_types": ["sliding_attention","sliding_attention","sliding_attention","sliding_attention","sliding_attention","full_attention",
                    "sliding_attention","sliding_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})";
  ModelConfig g = parse_model_config(gemma3_new);
  EXPECT_EQ(g.layers[5].attention, AttentionKind::full);
  EXPECT_EQ(g.layers[5].rope.type, RopeType::linear);
  EXPECT_DOUBLE_EQ(g.layers[5].rope.theta, 1e6);
  EXPECT_EQ(g.layers[4].rope.type, RopeType::standard);
  EXPECT_DOUBLE_EQ(g.layers[4].rope.theta, 1e4);
  EXPECT_EQ(g.layers[4].sliding_window, 512);

  // Explicit layer_types override the derived pattern (here for gemma2).
  std::string g2 = kGemma2_2B;
  g2.replace(g2.find("\"num_hidden_layers\": 26"), 23, "\"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\", \"sliding_attention\"]");
  ModelConfig c2 = parse_model_config(g2);
  EXPECT_EQ(c2.layers[0].attention, AttentionKind::full);
  EXPECT_EQ(c2.layers[1].attention, AttentionKind::sliding);
}

TEST(HfConfig, LegacyRopeTypeKey) {
  std::string cfg = kLlama2_7B;
  cfg.replace(cfg.find("\"rope_scaling\": null"), 20, "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}");
  ModelConfig c = parse_model_config(cfg);
  EXPECT_EQ(c.rope.type, RopeType::linear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
}

std::string config_error(const std::string& text) {
  try {
    parse_model_config(text);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ConfigError, nothing thrown";
  return "";
}

TEST(HfConfig, ErrorsNameTheKey) {
  auto with = [](const std::string& base, const std::string& from, const std::string& to) {
    std::string s = base;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  std::string msg = config_error(with(kLlama2_7B, "\"model_type\": \"llama\"", "\"model_type\": \"phi3\""));
  EXPECT_NE(msg.find("config.json: key 'model_type': unsupported model type 'phi3' (supported: llama, mistral, "
                     "mixtral, qwen2, qwen3, qwen3_moe, qwen3_next, qwen3_5_text, qwen3_5, "
                     "qwen3_5_moe_text, qwen3_5_moe, gemma2, gemma3_text, gemma3, gemma4_text, gemma4)"),
            std::string::npos) << msg;
  msg = config_error(R"({"hidden_size": 8})");
  EXPECT_NE(msg.find("key 'model_type': missing"), std::string::npos) << msg;
  msg = config_error(with(kLlama32_1B, "\"factor\": 32.0", "\"factor\": \"big\""));
  EXPECT_NE(msg.find("config.json: key 'rope_scaling.factor': expected a number"), std::string::npos) << msg;
  msg = config_error(with(kLlama32_1B, "\"rope_type\": \"llama3\"", "\"rope_type\": \"su\""));
  EXPECT_NE(msg.find("key 'rope_scaling.rope_type': unsupported rope type 'su' (supported: default, linear, llama3, "
                     "dynamic, yarn, longrope, proportional)"), std::string::npos) << msg;
  msg = config_error(with(kLlama32_1B, "\"original_max_position_embeddings\": 8192,", ""));
  EXPECT_NE(msg.find("key 'rope_scaling.original_max_position_embeddings': missing"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"ntk\"}"));
  EXPECT_NE(msg.find("key 'rope_scaling.type': unsupported rope type 'ntk'"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"hidden_size\": 4096", "\"hidden_size\": 4096.5"));
  EXPECT_NE(msg.find("key 'hidden_size': expected an integer, got 4096.5"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"num_key_value_heads\": 32", "\"num_key_value_heads\": 5"));
  EXPECT_NE(msg.find("key 'num_key_value_heads': 5 does not divide num_attention_heads 32"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu2\""));
  EXPECT_NE(msg.find("key 'hidden_act': unsupported activation 'relu2'"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"num_hidden_layers\": 32", "\"num_hidden_layers\": -1"));
  EXPECT_NE(msg.find("key 'num_hidden_layers': must be positive"), std::string::npos) << msg;
  // Sizes no real model has are refused before anything is allocated for them.
  msg = config_error(with(kLlama2_7B, "\"num_hidden_layers\": 32", "\"num_hidden_layers\": 1e9"));
  EXPECT_NE(msg.find("key 'num_hidden_layers': 1000000000 is beyond the largest supported value 1024"),
            std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"hidden_size\": 4096", "\"hidden_size\": 1e12"));
  EXPECT_NE(msg.find("key 'hidden_size': 1000000000000 is beyond"), std::string::npos) << msg;
  msg = config_error(with(kGemma3_4B, "\"sliding_window\": 1024", "\"sliding_window\": \"x\""));
  EXPECT_NE(msg.find("key 'text_config.sliding_window': expected an integer"), std::string::npos) << msg;
  msg = config_error(with(kGemma2_2B, "\"num_hidden_layers\": 26", "\"num_hidden_layers\": 26, \"layer_types\": [\"full_attention\"]"));
  EXPECT_NE(msg.find("key 'layer_types': expected a list of 26 strings"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": \"no\""));
  EXPECT_NE(msg.find("key 'tie_word_embeddings': expected true or false"), std::string::npos) << msg;
  msg = config_error(with(kLlama2_7B, "\"eos_token_id\": 2", "\"eos_token_id\": [2, \"x\"]"));
  EXPECT_NE(msg.find("key 'eos_token_id': expected an integer or a list of integers"), std::string::npos) << msg;
  // Llama 2 has vocab_size 32000; ids past 2^32 must not wrap into it.
  for (const char* eos : {"32000", "[2, 4294967298]", "-1", "18446744073709551615"}) {
    msg = config_error(with(kLlama2_7B, "\"eos_token_id\": 2", std::string("\"eos_token_id\": ") + eos));
    EXPECT_NE(msg.find("key 'eos_token_id': "), std::string::npos) << msg;
    EXPECT_NE(msg.find("is outside the vocabulary [0, 32000)"), std::string::npos) << msg;
  }
  msg = config_error(with(kGemma3_4B, "\"eos_token_id\": [1, 106]", "\"eos_token_id\": [1, 262208]"));
  EXPECT_NE(msg.find("key 'eos_token_id': 262208 is outside the vocabulary [0, 262208)"), std::string::npos) << msg;
  msg = config_error("[1, 2]");
  EXPECT_NE(msg.find("config.json: expected a JSON object"), std::string::npos) << msg;
  // Syntax errors are file errors.
  EXPECT_THROW(parse_model_config("{\"model_type\": "), FileError);
}

// Gemma 4 (the text decoder of google/gemma-4-E2B, as transformers' convert_gemma4_weights.py configures it):
// four sliding layers to one full one with heads of 512 and proportional rope, the last 20 layers sharing layers
// 13 and 14's keys and values with double-wide MLPs, per-layer inputs; unscaled scores and plain-weight norms.
TEST(HfConfig, Gemma4_E2B) {
  std::string types;
  for (int i = 0; i < 35; ++i)
    types += std::string(i ? ", " : "") + ((i + 1) % 5 ? "\"sliding_attention\"" : "\"full_attention\"");
  ModelConfig c = parse_model_config(R"({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": {"model_type": "gemma4_text", "hidden_size": 1536, "hidden_size_per_layer_input": 256,
      "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1,
      "num_global_key_value_heads": null, "attention_k_eq_v": false, "num_kv_shared_layers": 20,
      "use_double_wide_mlp": true, "final_logit_softcapping": 30.0, "global_head_dim": 512,
      "layer_types": [)" + types + R"(]}, "eos_token_id": [1, 106]})");
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.attn_scale, 1.0f);
  EXPECT_EQ(c.norm_style, NormStyle::weight);
  EXPECT_TRUE(c.qk_norm && c.v_norm && c.sandwich_norms && c.layer_scalar && c.tie_word_embeddings);
  EXPECT_EQ(c.per_layer_input_size, 256);
  EXPECT_EQ(c.per_layer_vocab_size, 262144);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  for (int i = 0; i < 35; ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const bool full = (i + 1) % 5 == 0;
    EXPECT_EQ(l.attention, full ? AttentionKind::full : AttentionKind::sliding) << i;
    EXPECT_EQ(l.sliding_window, full ? 0 : 512) << i;
    EXPECT_EQ(l.head_dim, full ? 512 : 256) << i;
    EXPECT_EQ(l.rotary_dim, l.head_dim) << i;
    EXPECT_EQ(l.kv_heads, 1) << i;
    EXPECT_FALSE(l.k_eq_v) << i;
    EXPECT_EQ(l.kv_source, i < 15 ? -1 : full ? 14 : 13) << i;
    EXPECT_EQ(l.intermediate_size, i < 15 ? 6144 : 12288) << i;
    EXPECT_EQ(l.rope.type, full ? RopeType::proportional : RopeType::standard) << i;
    EXPECT_EQ(l.rope.theta, full ? 1e6 : 1e4) << i;
  }
  // Proportional rope: a quarter of the 256 pairs of a 512 head rotate at base^(-2i / 512), the rest not at all.
  std::vector<float> f = rope_inv_freq(c.layers[4].rope, 512);
  ASSERT_EQ(f.size(), 256u);
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_FLOAT_EQ(f[i], i < 64 ? float(std::pow(1e6, -double(2 * i) / 512.0)) : 0.0f) << i;
}

// Qwen/Qwen3-Next-80B-A3B's config.json: every 4th layer gated attention (full_attention_interval), the others
// Gated DeltaNet; a quarter of the heads rotated; experts with a shared expert; (1 + w) norms.
TEST(HfConfig, Qwen3Next80B) {
  ModelConfig c = parse_model_config(R"({
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": true,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": false, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  EXPECT_EQ(c.norm_style, NormStyle::one_plus_weight);
  EXPECT_TRUE(c.gated_attention);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.rope.theta, 1e7);
  for (int64_t i = 0; i < 48; ++i) {
    EXPECT_EQ(c.layers[size_t(i)].linear_attention, (i + 1) % 4 != 0) << i;
    EXPECT_TRUE(c.layers[size_t(i)].moe) << i;
  }
  EXPECT_EQ(c.linear_attention.conv_channels(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(c.num_experts, 512);
  EXPECT_EQ(c.experts_per_token, 10);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  // transformers 5's form: partial_rotary_factor inside rope_parameters, layer_types written out; refusals.
  const std::string base = R"({"model_type": "qwen3_next", "num_hidden_layers": 2, "num_experts": 0, )";
  ModelConfig d = parse_model_config(base + R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
      "partial_rotary_factor": 0.5}, "layer_types": ["linear_attention", "full_attention"]})");
  EXPECT_EQ(d.rotary_dim, 128);
  EXPECT_EQ(d.num_experts, 0);
  EXPECT_TRUE(d.layers[0].linear_attention);
  EXPECT_FALSE(d.layers[1].linear_attention);
  for (const auto& [extra, want] : std::vector<std::pair<std::string, std::string>>{
           {R"("linear_num_key_heads": 3})", "key 'linear_num_value_heads': 32 is not a multiple of"},
           {R"("layer_types": ["sliding_attention", "full_attention"]})",
            "key 'layer_types': entries must be \"full_attention\" or \"linear_attention\""}}) {
    const std::string msg = config_error(base + extra);
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

// Qwen3.5-MoE's multimodal wrapper: the text decoder's settings under text_config, Qwen3_5MoeTextConfig's
// defaults (35B-A3B), separate DeltaNet projections, every layer sparse and always renormalized.
TEST(HfConfig, Qwen35MoeWrapperDefaults) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3_5_moe", "architectures":
      ["Qwen3_5MoeForConditionalGeneration"], "text_config": {"model_type": "qwen3_5_moe_text",
      "norm_topk_prob": false, "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
      "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}},
      "vision_config": {"depth": 27}})");
  EXPECT_EQ(c.num_hidden_layers, 40);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_TRUE(c.linear_attention.split_projections);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_TRUE(c.norm_topk_prob);  // Qwen3VLMoeTextTopKRouter always renormalizes
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.rotary_dim, 64);
  for (int64_t i = 0; i < 40; ++i) {
    EXPECT_TRUE(c.layers[size_t(i)].moe) << i;
    EXPECT_EQ(c.layers[size_t(i)].linear_attention, (i + 1) % 4 != 0) << i;
  }
  ModelConfig dense = parse_model_config(R"({"model_type": "qwen3_5_text"})");
  EXPECT_EQ(dense.num_experts, 0);
  EXPECT_EQ(dense.intermediate_size, 12288);
  EXPECT_TRUE(dense.linear_attention.split_projections);
}

// The Gemma4TextConfig defaults (every 6th layer and the last one full, heads of 512 there, per-layer inputs of 256,
// window 512), the per_layer_config form transformers writes back, and what Gemma 4 cannot be.
TEST(HfConfig, Gemma4DefaultsWrittenFormAndRefusals) {
  ModelConfig d = parse_model_config(R"({"model_type": "gemma4_text", "num_hidden_layers": 8})");
  EXPECT_EQ(d.layer_types, (std::vector<std::string>{"sliding_attention", "sliding_attention", "sliding_attention",
                                                      "sliding_attention", "sliding_attention", "full_attention",
                                                      "sliding_attention", "full_attention"}));
  EXPECT_EQ(d.layers[5].head_dim, 512);
  EXPECT_EQ(d.layers[5].kv_heads, 4);  // num_global_key_value_heads only with attention_k_eq_v
  EXPECT_EQ(d.layers[5].rope.rotated_fraction, 0.25);
  EXPECT_EQ(d.per_layer_input_size, 256);
  EXPECT_EQ(*d.sliding_window, 512);
  // The fixture's config as transformers 5.17 saves it (per_layer_config) and as written for it (global_head_dim,
  // num_global_key_value_heads): the same model.
  const std::filesystem::path src(LMTUNE_SOURCE_DIR);
  ModelConfig saved = load_model_config(src / "tests/io/fixtures/gemma4_text_transformers_config.json");
  ModelConfig given = load_model_config(src / "tests/models/fixtures/gemma4_text");
  ASSERT_EQ(saved.layers.size(), given.layers.size());
  for (size_t i = 0; i < saved.layers.size(); ++i) {
    EXPECT_EQ(saved.layers[i].head_dim, given.layers[i].head_dim) << i;
    EXPECT_EQ(saved.layers[i].kv_heads, given.layers[i].kv_heads) << i;
    EXPECT_EQ(saved.layers[i].kv_source, given.layers[i].kv_source) << i;
    EXPECT_EQ(saved.layers[i].k_eq_v, given.layers[i].k_eq_v) << i;
    EXPECT_EQ(saved.layers[i].intermediate_size, given.layers[i].intermediate_size) << i;
    EXPECT_TRUE(saved.layers[i].rope == given.layers[i].rope) << i;
  }
  EXPECT_EQ(saved.layers[1].head_dim, 32);
  EXPECT_EQ(saved.layers[1].kv_heads, 1);
  const std::string base = R"({"model_type": "gemma4_text", "num_hidden_layers": 6, )";
  for (const auto& [extra, want] : std::vector<std::pair<std::string, std::string>>{
           {R"("enable_moe_block": true})", "key 'num_experts': missing (required with enable_moe_block)"},
           {R"("enable_moe_block": true, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8})",
            "key 'top_k_experts': 5 is more than the 4 experts"},
           {R"("use_bidirectional_attention": "all"})", "key 'use_bidirectional_attention': bidirectional"},
           {R"("num_kv_shared_layers": 6})", "key 'num_kv_shared_layers': must be at least 0 and below"},
           {R"("num_kv_shared_layers": 5})", "layer 5 (full_attention) shares keys and values, but no earlier"},
           {R"("per_layer_config": {"7": {"head_dim": 64}}})", "key 'per_layer_config': key '7' is not a layer"},
           {R"("per_layer_config": {"1": {"rope_theta": 5.0}}})", "key 'per_layer_config.1.rope_theta': unsupported"},
           {R"("vocab_size_per_layer_input": 1000})", "key 'vocab_size_per_layer_input': 1000 is below vocab_size"},
           {R"("global_head_dim": 33})", "key 'head_dim': layer 5's head size must be even"}}) {
    const std::string msg = config_error(base + extra);
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

TEST(HfConfig, LoadFromDirectoryAndGenerationConfig) {
  TempDir dir;
  write_file_atomic(dir / "config.json", std::string_view(kQwen3_06B));
  write_file_atomic(dir / "generation_config.json",
                    std::string_view(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                                         "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95})"));
  ModelConfig c = load_model_config(dir.path());
  EXPECT_EQ(c.model_type, "qwen3");
  GenerationConfig g = load_generation_config(dir.path());
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(g.bos_token_id, 151643);
  EXPECT_EQ(g.pad_token_id, 151643);
  GenerationConfig single = parse_generation_config(R"({"eos_token_id": 2, "bos_token_id": null})");
  EXPECT_EQ(single.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(single.bos_token_id);
  try {
    parse_generation_config(R"({"eos_token_id": "</s>"})");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: key 'eos_token_id'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model_config(dir / "missing.json"), FileError);
}

}  // namespace
}  // namespace lmtune
