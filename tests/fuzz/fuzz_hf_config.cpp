// Fuzzes config.json and generation_config.json parsing (model type, sizes, rope_scaling, eos ids, ...).
#include "fuzz_util.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string json = lmtune::fuzz::text(data, size);
  lmtune::fuzz::expect_project_errors([&] {
    auto config = lmtune::parse_model_config(json, "config.json");
    (void)lmtune::rope_inv_freq(config.rope, int(config.rotary_dim));
    // Past the original length too (dynamic's grown base, longrope's long factors).
    (void)lmtune::rope_inv_freq(config.rope, int(config.rotary_dim), config.max_position_embeddings + 1);
  });
  return lmtune::fuzz::expect_project_errors([&] { (void)lmtune::parse_generation_config(json, "gen.json"); });
}
