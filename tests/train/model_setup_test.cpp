// The checks a recipe passes before its model loads: data.max_seq_len against max_position_embeddings (an error,
// a warning for rope-scaled models) and the memory estimate against what the device has.
#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/error.h"
#include "train/model_setup.h"

using namespace lmtune;

namespace {

const char* kConfig = R"({"model_type": "llama", "vocab_size": 259, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512)";

Recipe recipe(const std::vector<std::string>& overrides) {
  return parse_recipe("model: m\ndata:\n  train: t.jsonl\n", "r.yaml", overrides);
}

template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(RecipeFits, MaxSeqLenBeyondPositionsIsAnErrorUnlessRopeIsScaled) {
  const ModelConfig plain = parse_model_config(std::string(kConfig) + "}");
  EXPECT_NO_THROW(check_max_seq_len(recipe({"data.max_seq_len=512"}), plain));
  const std::string msg = config_error([&] { check_max_seq_len(recipe({"data.max_seq_len=513"}), plain); });
  EXPECT_NE(msg.find("data.max_seq_len 513 is beyond the model's max_position_embeddings 512 (m/config.json)"),
            std::string::npos) << msg;
  const ModelConfig scaled =
      parse_model_config(std::string(kConfig) + R"(, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})");
  EXPECT_NO_THROW(check_max_seq_len(recipe({"data.max_seq_len=2048"}), scaled));
}

TEST(RecipeFits, MemoryEstimateBeyondTheDeviceIsAnError) {
  const ModelConfig c = parse_model_config(std::string(kConfig) + "}");
  const Recipe small = recipe({"train.batch_size=2", "data.max_seq_len=64"});
  const Recipe big = recipe({"train.batch_size=4096", "data.max_seq_len=512", "lora.rank=64"});
  const uint64_t need = estimated_training_bytes(big, c);
  EXPECT_GT(need, 100 * estimated_training_bytes(small, c));
  EXPECT_NO_THROW(check_training_memory(big, need, need, "cpu"));
  EXPECT_NO_THROW(check_training_memory(big, need, 0, "cpu"));  // the backend cannot tell
  const std::string msg = config_error([&] { check_training_memory(big, need, need / 2, "vulkan:0"); });
  for (const char* s : {"training needs an estimated", "GiB but vulkan:0 has", "available (train.batch_size 4096 x "
                        "data.max_seq_len 512, lora.rank 64", "lower train.batch_size"})
    EXPECT_NE(msg.find(s), std::string::npos) << s << "\n" << msg;
  // Full fine-tuning adds gradients and AdamW moments for every weight.
  EXPECT_GT(estimated_training_bytes(recipe({"finetune=full"}), c),
            estimated_training_bytes(recipe({"lora.rank=1"}), c));
}

TEST(RecipeFits, CpuReportsAvailableHostMemory) {
  const size_t available = backend(Device::cpu()).available_bytes();
  EXPECT_GT(available, size_t(1) << 20);
}
