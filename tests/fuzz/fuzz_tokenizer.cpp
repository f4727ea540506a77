// Fuzzes tokenizer.json loading (normalizers, pre-tokenizers, BPE/WordPiece/Unigram models, added tokens,
// post-processors, decoders); a tokenizer that loads then encodes and decodes a fixed mixed-script text.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string json = lmtune::fuzz::text(data, size);
  return lmtune::fuzz::expect_project_errors([&] {
    auto t = lmtune::Tokenizer::from_json_string(json, "tokenizer.json");
    auto ids = t.encode("Hello, world! 123 héllo 日本語 <s> \n\t  end", true);
    (void)t.decode(ids, false);
    (void)t.decode(ids, true);
  });
}
