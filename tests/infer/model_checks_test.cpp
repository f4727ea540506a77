// infer::model_context: the context serving, scoring and generate's warning use.
#include "infer/model_checks.h"

#include <gtest/gtest.h>

namespace lmtune::infer {
namespace {

ModelConfig with_rope(const std::string& rope_scaling) {
  return parse_model_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 2048,
    "rope_scaling": )" + rope_scaling + "}");
}

TEST(ModelContext, MaxPositionsTimesTheDynamicFactor) {
  EXPECT_EQ(model_context(with_rope("null")), 2048);
  // yarn and longrope configs already raised max_position_embeddings to the extended length.
  EXPECT_EQ(model_context(with_rope(R"({"rope_type": "yarn", "factor": 4,
      "original_max_position_embeddings": 512})")), 2048);
  // dynamic scales itself past max_position_embeddings.
  EXPECT_EQ(model_context(with_rope(R"({"type": "dynamic", "factor": 3})")), 3 * 2048);
  EXPECT_EQ(model_context(with_rope(R"({"type": "dynamic", "factor": 0.5})")), 2048);
}

}  // namespace
}  // namespace lmtune::infer
