// Loading PEFT LoRA adapters onto a decoder for generation, eval and export: `--adapter DIR[:scale]`
// specifications, validation against the model (target modules, module names, shapes) and several adapters at
// once (each a named slot of every Linear, summed: y = x Wᵀ + Σ scale_i (x A_iᵀ) B_iᵀ).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "io/peft_adapter.h"
#include "models/decoder.h"

namespace lmtune::infer {

struct AdapterSpec {
  std::filesystem::path dir;
  float multiplier = 1;  // on top of the adapter's own alpha / r
  std::string name;      // the adapter slot name; default: the directory's name
};

// "DIR" or "DIR:scale" (a trailing ":number" is a scale unless DIR:number is itself an existing path).
// Throws ConfigError for an empty directory or a scale that is not a finite number.
AdapterSpec parse_adapter_spec(const std::string& spec);

// Checks a PEFT adapter against the decoder: every target module is a projection kind the decoder has, every
// module exists, and the A/B shapes fit. Throws FileError naming the adapter, the module and the shapes.
void validate_adapter(const PeftAdapter& adapter, models::DecoderWeights& weights, const std::string& where);

// Loads, validates and attaches one adapter as slot spec.name (or the directory name). Returns the PEFT data.
PeftAdapter load_adapter(models::Decoder& decoder, const AdapterSpec& spec);

}  // namespace lmtune::infer
