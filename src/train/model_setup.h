// What a recipe trains: the device and dtypes it asks for, the decoder loaded from `model`, and the trainable
// tensors — fresh LoRA adapters, adapters continued from `lora.init_from`, or (finetune: full) every weight as an
// f32 master copy.
#pragma once
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "io/hf_config.h"
#include "models/decoder.h"
#include "tokenizer/tokenizer.h"
#include "train/optimizer.h"
#include "train/recipe.h"

namespace lmtune {

struct TrainableModel {
  std::unique_ptr<models::Decoder> decoder;
  std::vector<NamedParam> params;  // in a stable order (the checkpoint's)
  // The LoRA settings in effect (those of lora.init_from's adapter_config.json when continuing one).
  int lora_rank = 0;
  double lora_alpha = 0;
  bool lora_rslora = false;
  DType weight_dtype = DType::f32;  // frozen base weights
  int64_t unchecked_layers = 0;     // train.checkpoint_layers auto: the last layers that are not checkpointed
  int64_t trainable_count() const;
};

// "auto" | "cpu" | "vulkan" | "vulkan:N"; `override_spec` (the CLI's --device) wins when non-empty.
Device training_device(const Recipe& recipe, const std::string& override_spec = {});
// fp32 | fp16 | bf16 -> the compute dtype.
DType compute_dtype(const Recipe& recipe);
// The model directory has config.json, weights and tokenizer.json; throws FileError naming what is missing.
void check_model_files(const Recipe& recipe);
// Loads the model and makes its trainable tensors. Throws FileError for missing or bad model files.
TrainableModel build_trainable_model(const Recipe& recipe, Device device);
// What the recipe asks of the model and the device, checked before the weights load: the tokenizer's ids fit
// the embedding, data.max_seq_len is within max_position_embeddings (a warning for rope-scaled models) and the
// memory estimate within what `device` has. Throws ConfigError naming the keys and values.
void check_recipe_fits(const Recipe& recipe, const Tokenizer& tokenizer, Device device);
void check_max_seq_len(const Recipe& recipe, const ModelConfig& config);
// Sequences a micro-batch holds: train.batch_size, or twice that for a preference objective (batch_size pairs).
inline int64_t sequences_per_micro_batch(const Recipe& r) {
  return int64_t(r.train.batch_size) * (r.objective == Objective::sft ? 1 : 2);
}
// Weights, adapter (or full fine-tuning) state and activations at train.batch_size x data.max_seq_len.
uint64_t estimated_training_bytes(const Recipe& recipe, const ModelConfig& config);
// Throws ConfigError naming the estimate, `available` and the keys behind them when the estimate is larger;
// available 0 (the backend cannot tell) passes.
void check_training_memory(const Recipe& recipe, uint64_t estimate, uint64_t available, const std::string& device);
// The LoRA scale for a rank and alpha: alpha / r, or alpha / sqrt(r) with rsLoRA.
double lora_scale(int rank, double alpha, bool rslora);

}  // namespace lmtune
