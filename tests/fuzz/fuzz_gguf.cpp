// Fuzzes the GGUF reader (header, metadata values and arrays, tensor infos, alignment, data ranges) and what is
// read from a GGUF model's metadata: the model config and the tokenizer (tokenizer.ggml.*, chat template).
#include "fuzz_util.h"
#include "io/gguf.h"
#include "io/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = lmtune::fuzz::write_temp(data, size, ".gguf");
  return lmtune::fuzz::expect_project_errors([&] {
    lmtune::GgufFile file(path);
    for (const auto& t : file.tensors()) (void)file.tensor(t.name).numel();
    lmtune::fuzz::expect_project_errors([&] { (void)lmtune::gguf_model_config(file); });
    auto tokenizer = lmtune::Tokenizer::from_gguf(file);
    (void)tokenizer.decode(tokenizer.encode("Hello, world! héllo 日本語", true));
  });
}
