// PEFT LoRA adapters on disk: adapter_config.json + adapter_model.safetensors, the layout peft, vLLM and
// llama.cpp's converter load. The in-memory form is neutral (module path -> A, B as f32) so the decoder, the
// trainer, export and serving share one reader and one writer.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/shape.h"

namespace lmtune {

struct LoraWeights {
  std::vector<float> a;  // lora_A [rank, in_features]
  std::vector<float> b;  // lora_B [out_features, rank]
  Shape a_shape, b_shape;
};

struct PeftAdapter {
  int rank = 0;
  double alpha = 0;
  double dropout = 0;
  bool rslora = false;
  std::vector<std::string> target_modules;  // e.g. q_proj, v_proj
  // Parameters adapted in place of modules (PEFT's ParamWrapper), e.g. mlp.experts.gate_up_proj: their lora_A has
  // rank x experts rows and lora_B as many columns (models/adapters.h gives the layout).
  std::vector<std::string> target_parameters;
  std::string base_model;                   // base_model_name_or_path
  // Keyed by module path as in the base model, e.g. "model.layers.0.self_attn.q_proj".
  std::map<std::string, LoraWeights> modules;

  // The factor applied to B·A: alpha / rank, or alpha / sqrt(rank) with rsLoRA.
  double scale() const;
};

// Reads a PEFT adapter directory. Errors name the file and tensor (unknown keys, missing A or B, rank
// mismatch, unsupported PEFT options such as DoRA or bias training).
PeftAdapter load_peft_adapter(const std::filesystem::path& dir);
// Writes adapter_config.json and adapter_model.safetensors (f32) atomically into dir (created if needed).
void save_peft_adapter(const PeftAdapter& adapter, const std::filesystem::path& dir);

}  // namespace lmtune
