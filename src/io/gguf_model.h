// A GGUF model's hyper-parameters as lmtune's ModelConfig, and back: the `{arch}.*` keys that llama.cpp's
// convert_hf_to_gguf.py writes (and llama.cpp reads) for the architectures llama (Llama and Mistral), qwen2, qwen3,
// gemma2 and gemma3. Where llama.cpp derives a setting instead of reading it (Gemma's attention scale, Gemma 3's
// sliding-window pattern and local rope base) the same rule is applied here, so a file means what it means to
// llama.cpp. See docs/formats.md ("GGUF models").
#pragma once
#include <string>

#include "io/gguf.h"
#include "io/hf_config.h"

namespace lmtune {

// The HF model_type of a GGUF general.architecture ("llama" → "llama", "gemma3" → "gemma3_text", ...); throws
// FileError naming the file for an architecture lmtune does not run.
std::string gguf_model_type(const GgufFile& file);

// The model's config. Throws FileError naming the file and key for a missing or wrong key, or a setting lmtune cannot
// run (rope scaling other than linear, ...).
ModelConfig gguf_model_config(const GgufFile& file);

// The GGUF architecture name of a config ("llama" for llama and mistral, "gemma3" for gemma3_text, ...).
std::string gguf_arch_name(const ModelConfig& config);

// The general.* and {arch}.* metadata convert_hf_to_gguf.py writes for `config` (tokenizer keys excluded).
// `name` is general.name; `file_type` is general.file_type (llama_ftype: 0 F32, 1 F16, 7 Q8_0, 15 Q4_K_M, 32 BF16).
GgufMetadata gguf_config_metadata(const ModelConfig& config, const std::string& name, int file_type);

}  // namespace lmtune
