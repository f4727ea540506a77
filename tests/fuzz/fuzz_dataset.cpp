// Fuzzes the JSONL record reader: each input line is tokenized as a record of a dataset (text, prompt/completion
// or chat messages) in the order load_dataset reads them, the format detected on the first line held after it.
// The first byte picks the configured format (auto, text, completion, chat).
#include "data/dataset.h"
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const lmtune::ChatTemplate chat(lmtune::fuzz::byte_tokenizer());
  static const char* const kFormats[] = {"auto", "text", "completion", "chat"};
  std::string format = kFormats[data[0] % 4];
  std::string jsonl = lmtune::fuzz::text(data + 1, size - 1);
  size_t start = 0;
  for (int line = 1; start <= jsonl.size(); ++line) {
    size_t end = jsonl.find('\n', start);
    if (end == std::string::npos) end = jsonl.size();
    std::string record = jsonl.substr(start, end - start);
    start = end + 1;
    if (!record.empty() && record.back() == '\r') record.pop_back();  // as load_dataset reads lines
    if (record.find_first_not_of(" \t") == std::string::npos) continue;
    lmtune::fuzz::expect_project_errors([&] {
      (void)lmtune::tokenize_record(record, lmtune::fuzz::byte_tokenizer(), format,
                                    "fuzz.jsonl:" + std::to_string(line), &chat);
    });
  }
  return 0;
}
