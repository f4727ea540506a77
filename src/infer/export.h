// `lmtune export`: an adapter re-saved in PEFT form (validated against its base model), or a full HF-layout
// model with the adapters folded into the base weights (W + Σ scale · B A, computed in f32).
#pragma once
#include <filesystem>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "infer/adapters.h"

namespace lmtune::infer {

// Loads the model (CPU, f32), validates and attaches the adapter, and writes it back as adapter_config.json +
// adapter_model.safetensors into `out` (the same modules, rank, alpha and options; the multiplier of `spec` is
// folded into lora_B when it is not 1).
void export_adapter(const std::filesystem::path& model_dir, const AdapterSpec& spec, const std::filesystem::path& out);

// Loads each adapter onto the decoder (validated) and folds them all into the base weights, W + Σ scale · B A in
// f32 (a quantized base weight is dequantized first), leaving no adapter attached.
void merge_adapters(models::Decoder& decoder, const std::vector<AdapterSpec>& adapters);

// Writes config.json (the input's, torch_dtype updated), generation_config.json, model.safetensors (sharded as
// save_weights does) and the tokenizer files of model_dir into `out`, with every adapter merged. dtype: the
// output weights' dtype; default the base checkpoint's (config torch_dtype, else f32).
void export_merged(const std::filesystem::path& model_dir, const std::vector<AdapterSpec>& adapters,
                   const std::filesystem::path& out, std::optional<DType> dtype = std::nullopt);

}  // namespace lmtune::infer
