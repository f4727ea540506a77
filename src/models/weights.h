// The one place that maps HuggingFace tensor names to decoder parameters, and the loading, saving and random
// initialisation built on it. Names are those of transformers' *ForCausalLM modules:
//   model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tie_word_embeddings),
//   model.layers.N.input_layernorm.weight, model.layers.N.post_attention_layernorm.weight,
//   model.layers.N.pre_feedforward_layernorm.weight, model.layers.N.post_feedforward_layernorm.weight (Gemma),
//   model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.N.self_attn.{q,k}_norm.weight,
//   model.layers.N.mlp.{gate,up,down}_proj.{weight,bias}
//   Gemma 4: model.embed_tokens_per_layer.weight, model.per_layer_model_projection.weight,
//   model.per_layer_projection_norm.weight, model.layers.N.{per_layer_input_gate, per_layer_projection,
//   post_per_layer_input_norm}.weight, model.layers.N.layer_scalar (no k/v projections or k_norm on layers that
//   share another's keys, no v_proj where the values are the keys)
//   qwen3_next: model.layers.N.linear_attn.{in_proj_qkvz, in_proj_ba, out_proj, norm, conv1d}.weight (Qwen3.5:
//   in_proj_qkv, in_proj_z, in_proj_b, in_proj_a instead of the first two),
//   model.layers.N.linear_attn.{dt_bias, A_log} on Gated DeltaNet layers, mlp.shared_expert.{gate,up,down}_proj
//   and mlp.shared_expert_gate beside the experts
//   model.layers.N.mlp.gate.weight, model.layers.N.mlp.experts.{gate_up_proj,down_proj} (mixture-of-experts
//   layers, as transformers 5 writes them; loading also takes the per-expert layout of earlier versions:
//   block_sparse_moe.{gate,experts.E.w1,w2,w3} (Mixtral), mlp.experts.E.{gate,up,down}_proj (Qwen3-MoE))
// Multimodal wrappers store the same names under "language_model.model." / "language_model.lm_head." (older
// transformers) or "model.language_model." (newer); loading detects the layout and saving writes the plain one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/quant.h"
#include "core/tensor.h"
#include "io/hf_config.h"
#include "models/decoder.h"

namespace lmtune::models {

// How a parameter is initialised by init_weights.
enum class ParamInit { normal, zeros, ones, norm };  // norm: 1, or 0 for (1 + w) norms

struct ParamRef {
  std::string name;  // HF name in the plain layout
  Shape shape;       // what the config implies
  Tensor* slot;      // where it lives in DecoderWeights
  ParamInit init;
  Linear* linear = nullptr;  // the layer, for a linear weight (QLoRA quantizes it at load; a quantized GGUF
                             // weight goes to linear->qweight as it is)
  bool trainable = true;     // false for buffers (Gemma 4's layer_scalar): full fine-tuning leaves them
  // Gemma 4's per-layer-input table (262144 x L P: 4.4 GiB for E2B) is looked up row by row: where it is larger
  // than the device's kernels can address (Backend::max_tensor_bytes), it is loaded into host memory, and its
  // rows also onto the device in blocks that are not (row_blocks; Decoder::per_layer_inputs gathers from them).
  bool host_if_too_large = false;
};

// Every stored parameter of the model described by `config`, in a stable order (embedding, layers, final norm,
// lm_head). Resizes weights.layers to the config's layer count. The tied lm_head is not listed.
std::vector<ParamRef> parameter_map(const ModelConfig& config, DecoderWeights& weights);

// The rows of a [V, N] table on `device` in consecutive blocks of at most max_bytes each.
std::vector<Tensor> row_blocks(const Tensor& table, Device device, size_t max_bytes);

// The GGUF tensor name llama.cpp's convert_hf_to_gguf.py gives a parameter (plain HF name): token_embd.weight,
// output_norm.weight, output.weight, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm,
// ffn_norm, ffn_gate, ffn_up, ffn_down, post_attention_norm, post_ffw_norm}.{weight,bias}. The pre-MLP norm is
// ffn_norm in both layouts (Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm).
std::string gguf_tensor_name(const std::string& hf_name, const ModelConfig& config);

// The rows convert_hf_to_gguf.py reorders: for the llama architecture (LlamaModel.permute) each head's q and k rows
// (weight and bias) have their two rotary halves interleaved, GGUF row h·D + 2k + j holding HF row h·D + j·D/2 + k.
// Returns, for each GGUF row, the HF row it holds; empty when `hf_name` is not reordered in `gguf_arch`.
std::vector<int64_t> gguf_row_order(const std::string& hf_name, const ModelConfig& config,
                                    const std::string& gguf_arch);

// Total parameters (the tied lm_head counted once; buffers such as Gemma 4's layer_scalar not counted).
int64_t parameter_count(const ModelConfig& config);
// Parameters one token uses: the total less the experts a mixture-of-experts layer does not route it to.
int64_t active_parameter_count(const ModelConfig& config);

// Loads the weights of `config` from a checkpoint (a model directory with model.safetensors or a sharded
// model.safetensors.index.json, a .safetensors file, or a GGUF model: see load_gguf_weights) onto `device`,
// converted to `dtype`. Missing tensors,
// shapes that disagree with the config, dtypes other than F32/F16/BF16 and NaN or infinite values throw FileError
// naming the tensor and the file.
// Tensors that the decoder does not use are ignored (a warning lists them, except vision-tower ones).
// quantize: the projections of the decoder layers (q/k/v/o, gate/up/down) are quantized to this format as they are
// read (Linear::qweight; rows on all host threads, one tensor at a time, never the whole model dense in host
// memory); embeddings, norms, biases and lm_head stay in `dtype`, as bitsandbytes' QLoRA keeps them. A projection
// whose input size is not a multiple of the format's block throws ConfigError naming the tensor; so does quantize
// with a GGUF model (its tensors keep their own types).
DecoderWeights load_weights(const ModelConfig& config, const std::filesystem::path& checkpoint, DType dtype,
                            Device device, std::optional<quant::Format> quantize = std::nullopt);

// The weights of a GGUF model (gguf_weights.cpp), undoing what convert_hf_to_gguf.py changes: the q/k row
// permutation of the llama architecture and the +1 on Gemma's norms. F32/F16/BF16 tensors are converted to `dtype`;
// a linear weight in a block format quant.h knows (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) goes to Linear::qweight as is,
// while embeddings, norms and the output head in such a format are dequantized to `dtype`. Other ggml types, shapes
// that disagree with the config and non-finite values throw FileError naming the file and tensor.
DecoderWeights load_gguf_weights(const ModelConfig& config, const std::filesystem::path& file, DType dtype,
                                 Device device);

// config.json + weights from a model directory (or a GGUF model). weight_dtype: the dtype weights are stored in on
// the device; quantize: see load_weights (safetensors checkpoints only).
Decoder load_decoder(const std::filesystem::path& model_dir, DType weight_dtype, DType compute_dtype, Device device,
                     std::optional<quant::Format> quantize = std::nullopt);

// Writes the weights in the plain HF layout into `dir`: model.safetensors, or model-0000i-of-0000n.safetensors
// shards + model.safetensors.index.json when they exceed max_shard_bytes. Adapters are not included (see
// Linear::merged_weight for merged export). Files are written atomically.
void save_weights(const ModelConfig& config, const DecoderWeights& weights, const std::filesystem::path& dir,
                  DType dtype, uint64_t max_shard_bytes = 5ull << 30);

// Random initialisation as transformers' _init_weights: linear weights and embeddings ~ N(0, std), biases 0,
// norms 1 (0 for Gemma's (1 + w) norms). Deterministic for a seed on every device.
DecoderWeights init_weights(const ModelConfig& config, uint64_t seed, double std, DType dtype, Device device);

// save_weights(init_weights(config, seed, std, ...)) without holding the model: each tensor is drawn on all CPU
// threads as its file is written (one tensor in memory at a time).
void save_random_weights(const ModelConfig& config, uint64_t seed, double std, const std::filesystem::path& dir,
                         DType dtype, uint64_t max_shard_bytes = 5ull << 30);

}  // namespace lmtune::models
