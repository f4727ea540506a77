// `lmtune export --format gguf`: a model with its adapters merged, as one GGUF file that llama.cpp and Ollama load
// (what convert_hf_to_gguf.py writes, optionally quantized as llama-quantize does by default), or a LoRA adapter as
// llama.cpp's GGUF LoRA (what convert_lora_to_gguf.py writes); each with an Ollama Modelfile beside it.
// See docs/formats.md ("GGUF output").
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "infer/adapters.h"
#include "io/gguf.h"

namespace lmtune::infer {

// The tensor types of an exported model: f32 / f16 matrices, or q8_0 / q4_k linear weights.
enum class GgufQuant { f32, f16, q8_0, q4_k };
// "f32" | "f16" | "q8_0" | "q4_k" (case-insensitive); throws ConfigError naming the accepted values.
GgufQuant parse_gguf_quant(std::string_view name);
// general.file_type (llama_ftype): 0 ALL_F32, 1 MOSTLY_F16, 7 MOSTLY_Q8_0, 14 MOSTLY_Q4_K_S.
int gguf_file_type(GgufQuant quant);

// The type llama.cpp's tools give a tensor named `name` with ggml-order `dims` in a `quant` file: 1-D tensors F32;
// matrices F32 / F16; for q8_0 every matrix Q8_0; for q4_k matrices Q4_K and the output head (output.weight, or
// token_embd.weight when it is the tied head) Q6_K, as llama-quantize keeps the head at 6 bits. A matrix whose row
// length is not a multiple of the format's block stays F16.
GgmlType gguf_tensor_type(const std::string& name, std::span<const int64_t> dims, GgufQuant quant, bool tied_head);

// Where `--out` puts the file: `out` itself when it ends in ".gguf", otherwise out/<default_name>.
std::filesystem::path gguf_output_file(const std::filesystem::path& out, const std::string& default_name);

// Loads the model (CPU, f32), merges the adapters into its weights (W + Σ scale · B A in f32) and writes `file`:
// general.* and {arch}.* metadata (gguf_config_metadata), the tokenizer (gguf_tokenizer_metadata), the tensors under
// llama.cpp's names with the converter's changes (llama q/k rows permuted, Gemma norms + 1, rope_freqs.weight for
// Llama 3 rope), in `quant`'s types. Tensors are converted one at a time as the file is written.
void export_merged_gguf(const std::filesystem::path& model, const std::vector<AdapterSpec>& adapters,
                        const std::filesystem::path& file, GgufQuant quant);

// Writes the adapter of `spec` (validated against `model`) as a GGUF LoRA: general.type "adapter", adapter.type
// "lora", adapter.lora.alpha (llama.cpp scales by alpha / r, so rsLoRA and the spec's multiplier are folded into
// alpha), and per module blk.N.<tensor>.weight.lora_a (ggml dims {in, r}: PEFT's lora_A) and .lora_b (dims
// {r, out}: lora_B, rows permuted as the base weight's for the llama architecture's q/k), in f32.
void export_adapter_gguf(const std::filesystem::path& model, const AdapterSpec& spec,
                         const std::filesystem::path& file);

// An Ollama Modelfile in dir: "FROM <from>" and, when given, "ADAPTER <adapter>". No TEMPLATE: Ollama uses the
// GGUF's tokenizer.chat_template.
void write_modelfile(const std::filesystem::path& dir, const std::string& from,
                     const std::optional<std::string>& adapter);

}  // namespace lmtune::infer
