// HuggingFace config.json / generation_config.json parsing into ModelConfig: sizes, per-layer attention kind
// and rotary embedding, and the architecture's structural choices (norm style, biases, q/k norms, embedding
// scale, soft-capping) as plain fields, so model code never branches on model_type strings.
// Missing keys take the defaults of the transformers config class of that model_type. Wrong keys or values
// throw ConfigError("<file>: key '<path>': <problem>"); unreadable or malformed JSON throws FileError.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lmtune {

// Rotary embedding frequency schemes (transformers' rope_type). `standard` is transformers' "default".
enum class RopeType { standard, linear, llama3, dynamic, yarn, longrope, proportional };
// "default", "linear", "llama3", "dynamic", "yarn", "longrope", "proportional"
std::string_view rope_type_name(RopeType t);

struct RopeConfig {
  double theta = 10000.0;         // rope_theta (base)
  RopeType type = RopeType::standard;
  double factor = 1.0;            // linear, llama3, dynamic, yarn (longrope: only through attention_factor)
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3, yarn, longrope: original_max_position_embeddings; dynamic: max_position_embeddings (the length past
  // which the base grows; transformers' dynamic NTK reads that, not the original length).
  int64_t original_max_pos = 0;
  // yarn, longrope: cos and sin are multiplied by this (transformers' attention_scaling), resolved from the
  // config as transformers does (attention_factor, else from factor / mscale / mscale_all_dim); 1 otherwise.
  double attention_factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn: the ramp between extrapolated and interpolated frequencies
  bool truncate = true;                      // yarn: round the ramp's ends to whole dimensions
  std::vector<double> short_factor, long_factor;  // longrope: one per frequency (rotary_dim / 2)
  // proportional (Gemma 4's full layers): the first floor(fraction · D / 2) pairs of the whole head rotate with
  // base^(-2i / D), the others get frequency 0 (pass through); D is the rotary dimension given to rope_inv_freq.
  double rotated_fraction = 1.0;
  // llama.cpp's rope_freqs.weight (GGUF models only): frequency i is divided by freq_factors[i]; empty = none.
  std::vector<float> freq_factors;
  bool operator==(const RopeConfig&) const = default;
};

// Whether a forward call's frequencies depend on its longest sequence (dynamic, longrope): transformers
// recomputes them from seq_len = the largest position in the call + 1.
bool rope_depends_on_length(const RopeConfig& rope);

// Inverse frequencies [rotary_dim / 2] for positions, in f32 as transformers computes them
// (_compute_default_rope_parameters, _compute_linear_scaling_rope_parameters as inv_freq / factor,
// _compute_llama3_parameters, _compute_dynamic_ntk_parameters, _compute_yarn_parameters,
// _compute_longrope_parameters, _compute_proportional_rope_parameters), then divided by rope.freq_factors
// where given. `seq_len` is the forward call's
// largest position + 1: dynamic grows its base once seq_len passes original_max_pos, longrope takes long_factor
// then (short_factor otherwise); the other types ignore it. Throws ConfigError if rotary_dim is not positive and
// even, or freq_factors / short_factor / long_factor have another length than rotary_dim / 2.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int rotary_dim, int64_t seq_len = 0);

enum class Activation { silu, gelu_tanh, gelu_erf };  // silu | gelu_pytorch_tanh, gelu_new | gelu
std::string_view activation_name(Activation a);

enum class AttentionKind { full, sliding };

struct LayerConfig {
  AttentionKind attention = AttentionKind::full;
  bool moe = false;            // the MLP is a mixture of experts (ModelConfig::num_experts), else dense
  int64_t sliding_window = 0;  // > 0 on sliding layers: key j is visible from query i iff i - j < window
  RopeConfig rope;             // gemma3 sliding layers use rope_local_base_freq
  // Attention shape: ModelConfig's head_dim, num_key_value_heads and rotary_dim, except where a layer type
  // overrides them (Gemma 4's full layers: global_head_dim, num_global_key_value_heads).
  int64_t head_dim = 0, kv_heads = 0, rotary_dim = 0;
  int64_t intermediate_size = 0;  // the dense MLP's (Gemma 4's double-wide MLP: twice ModelConfig's)
  // Gemma 4: the layer attends to the keys and values of layer kv_source (the last earlier layer of its type
  // that computes its own) and has no k/v projections; -1: its own.
  int kv_source = -1;
  bool k_eq_v = false;  // Gemma 4's attention_k_eq_v on full layers: the values are the key projection (no v_proj)
  // Qwen3-Next's linear_attention layers: a Gated DeltaNet (models/gated_deltanet.h) mixes the tokens instead of
  // attention (no q/k/v/o projections, no KV cache; a recurrent state instead).
  bool linear_attention = false;
};

// The Gated DeltaNet layers' shapes (Qwen3NextConfig's linear_* keys): key heads of key_head_dim, value heads of
// value_head_dim (a multiple of the key heads; each key head serves value_heads / key_heads of them), and the
// kernel size of the short causal convolution over their queries, keys and values.
struct LinearAttentionConfig {
  int64_t conv_kernel = 0, key_head_dim = 0, value_head_dim = 0, key_heads = 0, value_heads = 0;
  // Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; else (Qwen3-Next) in_proj_qkvz and in_proj_ba, grouped
  // per key head.
  bool split_projections = false;
  int64_t conv_channels() const { return 2 * key_heads * key_head_dim + value_heads * value_head_dim; }
};

// How RMSNorm applies its weight: x̂ * w, or x̂ * (1 + w) (Gemma; weights are stored as offsets from 1).
enum class NormStyle { weight, one_plus_weight };

struct ModelConfig {
  std::string model_type;    // as written in config.json ("gemma3", "qwen3_5_moe" for the multimodal wrappers)
  std::string architecture;  // architectures[0], or empty
  std::string torch_dtype;   // "torch_dtype" or "dtype", or empty

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // explicit, or hidden_size / num_attention_heads
  int64_t rotary_dim = 0;           // head_dim * partial_rotary_factor
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  Activation hidden_act = Activation::silu;
  bool tie_word_embeddings = false;

  // Biases: qkv_bias on q/k/v projections (Qwen2 always; others attention_bias), o_bias on o_proj
  // (attention_bias, never Qwen2), mlp_bias on gate/up/down (Llama's mlp_bias).
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;

  // Attention scores are (q · k) * attn_scale: query_pre_attn_scalar^-0.5 (Gemma) or head_dim^-0.5.
  double query_pre_attn_scalar = 0;  // 0 when the model has none
  float attn_scale = 0;
  double attn_logit_softcapping = 0;   // 0 = off
  double final_logit_softcapping = 0;  // 0 = off

  // Sliding-window settings as read (see `layers` for the per-layer result).
  std::optional<int64_t> sliding_window;
  bool use_sliding_window = false;  // qwen2/qwen3
  int64_t max_window_layers = 0;    // qwen2/qwen3: layers >= this use the window when enabled
  int64_t sliding_window_pattern = 0;  // gemma3: every Nth layer (1-based) is global

  RopeConfig rope;                       // full-attention layers
  std::optional<RopeConfig> rope_local;  // sliding layers, when they differ (gemma3)
  std::vector<std::string> layer_types;  // "full_attention" / "sliding_attention", given or derived
  std::vector<LayerConfig> layers;       // one per hidden layer

  // Structure of the decoder layer.
  float embed_scale = 1.0f;  // embeddings are multiplied by this (Gemma: sqrt(hidden_size), rounded to the
                             // activation dtype by transformers)
  NormStyle norm_style = NormStyle::weight;
  bool qk_norm = false;        // RMSNorm over head_dim on q and k before rope (qwen3, gemma3)
  bool sandwich_norms = false; // gemma2/3/4: post_attention_layernorm normalizes the attention output and
                               // pre_/post_feedforward_layernorm wrap the MLP; otherwise
                               // post_attention_layernorm is the pre-MLP norm (Llama naming)
  bool v_norm = false;         // gemma4: RMSNorm without a weight over each value head
  bool layer_scalar = false;   // gemma4: each layer's output is multiplied by its layer_scalar [1]
  // gemma4's per-layer inputs (PLE): each layer i adds ple_proj(act(ple_gate(x)) · p_i), normed, where p_i is
  // a slice of a per-token embedding of per_layer_input_size · layers values (vocabulary per_layer_vocab_size)
  // mixed with a projection of the embedded tokens. 0: none.
  int64_t per_layer_input_size = 0;
  int64_t per_layer_vocab_size = 0;
  // qwen3_next: q_proj yields, per head, the queries and as many gate values; attention's output is multiplied by
  // sigmoid(gate) before o_proj.
  bool gated_attention = false;
  LinearAttentionConfig linear_attention;  // qwen3_next's Gated DeltaNet layers (LayerConfig::linear_attention)

  // Mixture of experts (mixtral, qwen3_moe): on layers with LayerConfig::moe a router picks, per token, the
  // experts_per_token most probable of num_experts SwiGLU experts (each of moe_intermediate_size) and sums their
  // outputs weighted by those probabilities; the other layers keep the dense MLP of intermediate_size.
  int64_t num_experts = 0;            // num_local_experts (mixtral), num_experts (qwen3_moe); 0: dense model
  int64_t experts_per_token = 0;      // num_experts_per_tok
  int64_t moe_intermediate_size = 0;  // mixtral: intermediate_size
  bool norm_topk_prob = false;        // the chosen probabilities renormalized to sum to 1 (mixtral always)
  double router_aux_loss_coef = 0;    // weight of the load-balancing loss
  bool output_router_logits = false;  // transformers adds that loss to the training loss only when set
  // Gemma 4's MoE block (enable_moe_block): every layer runs its experts beside the dense MLP, on the residual
  // stream normed by pre_feedforward_layernorm_2; the router normalizes its input without a weight, scales it by
  // router.scale · C^-1/2, and multiplies each chosen expert's renormalized probability by its per_expert_scale.
  bool experts_beside_mlp = false;
  // qwen3_next: a SwiGLU shared expert of this size runs beside the routed ones on every expert layer, its output
  // multiplied by sigmoid(shared_expert_gate(h)). 0: none.
  int64_t shared_expert_intermediate_size = 0;

  std::vector<int64_t> eos_token_ids;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
};

// model_type values parse_model_config accepts.
const std::vector<std::string>& supported_model_types();
// The model_type whose settings sit in a config's text_config ("gemma3" -> "gemma3_text"; the multimodal wrappers
// gemma3, gemma4, qwen3_5, qwen3_5_moe), or model_type itself.
std::string text_model_type(const std::string& model_type);
// Whether a text model_type's layers include Gated DeltaNet ones (qwen3_next, qwen3_5_text, qwen3_5_moe_text).
bool has_gated_deltanet(std::string_view text_model_type);

// `where` names the file in messages.
ModelConfig parse_model_config(std::string_view json_text, const std::string& where = "config.json");
// `path` is a config.json file or a directory containing one, or a GGUF model (a .gguf file or a directory holding
// one; see find_gguf_model and gguf_model_config).
ModelConfig load_model_config(const std::filesystem::path& path);

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // eos_token_id: an integer or a list
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
};
GenerationConfig parse_generation_config(std::string_view json_text,
                                         const std::string& where = "generation_config.json");
// `path` is a generation_config.json file or a directory containing one.
GenerationConfig load_generation_config(const std::filesystem::path& path);

}  // namespace lmtune
