// What a recipe trains: the device and dtypes it asks for, the decoder loaded from `model`, and the trainable
// tensors — fresh LoRA adapters, adapters continued from `lora.init_from`, or (finetune: full) every weight as an
// f32 master copy.
#pragma once
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "models/decoder.h"
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
  int64_t trainable_count() const;
};

// "auto" | "cpu" | "vulkan" | "vulkan:N"; `override_spec` (the CLI's --device) wins when non-empty.
Device training_device(const Recipe& recipe, const std::string& override_spec = {});
// fp32 | fp16 | bf16 -> the compute dtype.
DType compute_dtype(const Recipe& recipe);
// Loads the model and makes its trainable tensors. Throws FileError for missing or bad model files.
TrainableModel build_trainable_model(const Recipe& recipe, Device device);
// The LoRA scale for a rank and alpha: alpha / r, or alpha / sqrt(r) with rsLoRA.
double lora_scale(int rank, double alpha, bool rslora);

}  // namespace lmtune
