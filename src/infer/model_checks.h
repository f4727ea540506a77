// Checks where a model directory's tokenizer, config.json and what a command asks of them meet.
#pragma once
#include <cstdint>
#include <string>

#include "io/hf_config.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::infer {

// Every tokenizer id must have an embedding row: throws ConfigError naming both sizes when the tokenizer's
// vocabulary (highest id + 1) is larger than config.json's vocab_size. A larger embedding is fine (padded rows).
void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& model_dir);

// The longest sequence the model is meant for: max_position_embeddings, times the factor for dynamic rope
// (which scales itself past max_position_embeddings; the other scalings already raised it in config.json).
int64_t model_context(const ModelConfig& config);

// Warns (as transformers and llama.cpp do) when prompt + max_tokens passes model_context: positions past the
// trained context still run, but the text degrades.
void warn_past_context(const ModelConfig& config, int64_t prompt_tokens, int64_t max_tokens);

}  // namespace lmtune::infer
