// The inverse of io/hf_config.h for the decoder families: a complete config.json and generation_config.json
// for a ModelConfig, in the form transformers writes (rope_theta + rope_scaling, which old and new transformers
// versions both read). Used by `lmtune init` and by merged export.
#pragma once
#include <nlohmann/json.hpp>

#include "io/hf_config.h"

namespace lmtune::models {

// The transformers class for config.model_type ("LlamaForCausalLM", ...); throws ConfigError for others.
std::string causal_lm_class(const std::string& model_type);

// Every key the transformers config class of config.model_type reads, from `config`; keys of `extra` that the
// config does not determine (initializer_range, transformers_version, ...) are copied over. A multimodal
// "gemma3" config is written as its text model ("gemma3_text").
nlohmann::json hf_config_json(const ModelConfig& config, const nlohmann::json& extra = nlohmann::json::object());
nlohmann::json hf_generation_config_json(const ModelConfig& config);

}  // namespace lmtune::models
