// The one place that maps HuggingFace tensor names to decoder parameters, and the loading, saving and random
// initialisation built on it. Names are those of transformers' *ForCausalLM modules:
//   model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when tie_word_embeddings),
//   model.layers.N.input_layernorm.weight, model.layers.N.post_attention_layernorm.weight,
//   model.layers.N.pre_feedforward_layernorm.weight, model.layers.N.post_feedforward_layernorm.weight (Gemma),
//   model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.N.self_attn.{q,k}_norm.weight,
//   model.layers.N.mlp.{gate,up,down}_proj.{weight,bias}
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
enum class ParamInit { normal, zeros, norm };  // norm: 1, or 0 for (1 + w) norms

struct ParamRef {
  std::string name;  // HF name in the plain layout
  Shape shape;       // what the config implies
  Tensor* slot;      // where it lives in DecoderWeights
  ParamInit init;
  Linear* linear = nullptr;  // for the weight of a decoder layer's projection (q/k/v/o, gate/up/down): its layer
};

// Every stored parameter of the model described by `config`, in a stable order (embedding, layers, final norm,
// lm_head). Resizes weights.layers to the config's layer count. The tied lm_head is not listed.
std::vector<ParamRef> parameter_map(const ModelConfig& config, DecoderWeights& weights);

// Total parameters (the tied lm_head counted once).
int64_t parameter_count(const ModelConfig& config);

// Loads the weights of `config` from a checkpoint (a model directory with model.safetensors or a sharded
// model.safetensors.index.json, or a .safetensors file) onto `device`, converted to `dtype`. Missing tensors,
// shapes that disagree with the config, dtypes other than F32/F16/BF16 and NaN or infinite values throw FileError
// naming the tensor and the file.
// Tensors that the decoder does not use are ignored (a warning lists them, except vision-tower ones).
// quantize: the projections of the decoder layers (q/k/v/o, gate/up/down) are quantized to this format as they are
// read (Linear::qweight; rows on all host threads, one tensor at a time, never the whole model dense in host
// memory); embeddings, norms, biases and lm_head stay in `dtype`, as bitsandbytes' QLoRA keeps them. A projection
// whose input size is not a multiple of the format's block throws ConfigError naming the tensor.
DecoderWeights load_weights(const ModelConfig& config, const std::filesystem::path& checkpoint, DType dtype,
                            Device device, std::optional<quant::Format> quantize = std::nullopt);

// config.json + weights from a model directory. weight_dtype: the dtype weights are stored in on the device;
// quantize: see load_weights.
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
