// Model / tokenizer / request checks (see model_checks.h).
#include "infer/model_checks.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace lmtune::infer {

void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& model_dir) {
  if (tokenizer.vocab_size() > config.vocab_size)
    throw ConfigError(model_dir + ": the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                      " ids but config.json's vocab_size is " + std::to_string(config.vocab_size) +
                      ": ids from " + std::to_string(config.vocab_size) + " on would have no embedding row");
}

int64_t model_context(const ModelConfig& config) {
  const int64_t n = config.max_position_embeddings;
  if (config.rope.type != RopeType::dynamic || config.rope.factor <= 1) return n;
  return int64_t(double(n) * config.rope.factor);
}

void warn_past_context(const ModelConfig& config, int64_t prompt_tokens, int64_t max_tokens) {
  const int64_t context = model_context(config);
  if (prompt_tokens + max_tokens > context)
    spdlog::warn("{} prompt tokens + up to {} new tokens pass the model's context {}: text past the trained "
                 "context may degrade", prompt_tokens, max_tokens, context);
}

}  // namespace lmtune::infer
