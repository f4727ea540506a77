// A memory estimate for LoRA training of a decoder (shown by `lmtune info MODEL_DIR`). The formula is in
// docs/models.md; it is an estimate of what the decoder keeps alive, not a measurement.
#pragma once
#include <cstdint>
#include <optional>

#include "core/dtype.h"
#include "core/quant.h"
#include "io/hf_config.h"

namespace lmtune::models {

struct TrainingMemoryOptions {
  int64_t batch = 1;
  int64_t seq = 2048;
  int64_t rank = 16;                  // LoRA rank on all seven projections of every layer
  bool expert_lora = false;           // and on every expert of the mixture-of-experts layers (lora.targets: experts)
  DType weight_dtype = DType::bf16;   // frozen base weights
  std::optional<quant::Format> quantize;  // the decoder layers' projections in this format (QLoRA), else dense
  DType compute_dtype = DType::bf16;  // activations
};

struct TrainingMemoryEstimate {
  uint64_t weights = 0;          // frozen base weights (quantized projections at their blocks' bytes)
  uint64_t lora_params = 0;      // A and B, f32
  uint64_t lora_grads = 0;       // f32
  uint64_t optimizer = 0;        // AdamW first and second moments, f32
  uint64_t activations = 0;      // saved for backward, no checkpointing
  uint64_t activations_checkpointed = 0;  // layer inputs + one layer recomputed
  uint64_t logits = 0;           // the fused loss's vocabulary chunk: f32 logits, gradient, one temporary
                                 // (part of both activation figures)

  // The least a transformers + PEFT step at the same batch holds (their own memory is more): the weights, the same
  // adapter state, the layer inputs it checkpoints and the one layer it recomputes at a time in backward (else
  // activations at least as large as ours), the [N, V] logits in the compute dtype that the model returns and
  // keeps through backward, and the f32 copy with its gradient that transformers' loss materialises. What only
  // saves time (train.checkpoint_layers auto, train.transposed_weights) is kept within this floor, so lmtune never
  // takes more memory than the PyTorch step it replaces.
  uint64_t reference_floor = 0;          // with checkpointing
  uint64_t reference_floor_unchecked = 0;  // without
  int64_t lora_param_count = 0;
  int64_t layers = 0;
  uint64_t layer_activations = 0;  // what one layer saves for backward without checkpointing
  uint64_t layer_input = 0;        // what a checkpointed layer keeps: its input

  uint64_t fixed() const { return weights + lora_params + lora_grads + optimizer; }
  uint64_t total(bool checkpointing) const {
    return fixed() + (checkpointing ? activations_checkpointed : activations);
  }
  // Checkpointing every layer but the last `unchecked`, which keep their activations (train.checkpoint_layers).
  uint64_t total_checkpointing_all_but(int64_t unchecked) const {
    return total(true) + uint64_t(unchecked) * (layer_activations - layer_input) -
           (unchecked >= layers ? layer_activations : 0);
  }
  uint64_t floor(bool checkpointing) const { return checkpointing ? reference_floor : reference_floor_unchecked; }
};

TrainingMemoryEstimate estimate_training_memory(const ModelConfig& config, const TrainingMemoryOptions& options);

// How many of the last layers can skip checkpointing (keep their activations) while the estimated peak stays
// within the PyTorch floor and, when available_bytes is known (non-zero), within it beside half the training
// state again (train.checkpoint_layers auto).
int64_t layers_to_leave_unchecked(const TrainingMemoryEstimate& estimate, uint64_t available_bytes);

}  // namespace lmtune::models
