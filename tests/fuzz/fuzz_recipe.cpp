// Fuzzes recipe YAML parsing and validation (model, data, lora, optimizer, schedule, precision, ... sections).
#include "fuzz_util.h"
#include "train/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string yaml = lmtune::fuzz::text(data, size);
  return lmtune::fuzz::expect_project_errors([&] { (void)lmtune::parse_recipe(yaml, "fuzz.yaml"); });
}
