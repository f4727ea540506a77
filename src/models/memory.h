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
  // adapter state, the layer inputs it checkpoints (else activations at least as large as ours), and the f32 [N, V]
  // logits with their gradient, which transformers' loss materialises. Caches that only save time are kept within
  // this floor (train.transposed_weights), so lmtune never takes more memory than the PyTorch step it replaces.
  uint64_t reference_floor = 0;          // with checkpointing
  uint64_t reference_floor_unchecked = 0;  // without
  int64_t lora_param_count = 0;

  uint64_t fixed() const { return weights + lora_params + lora_grads + optimizer; }
  uint64_t total(bool checkpointing) const {
    return fixed() + (checkpointing ? activations_checkpointed : activations);
  }
  uint64_t floor(bool checkpointing) const { return checkpointing ? reference_floor : reference_floor_unchecked; }
};

TrainingMemoryEstimate estimate_training_memory(const ModelConfig& config, const TrainingMemoryOptions& options);

}  // namespace lmtune::models
