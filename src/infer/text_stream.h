// Streaming the text of generated ids with stop strings: pieces come from StreamDecoder (whole UTF-8 characters
// only), and text that could still turn into a stop string is held back until it cannot. When a stop string
// appears, the text before it is emitted and the rest (the stop string included) is not.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lmtune::infer {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings, bool skip_special_tokens = true);

  // Feeds one generated id; returns the text now safe to emit (often ""). After a stop string, returns "".
  std::string push(int32_t id);
  // The end of generation: emits the held-back text (unless a stop string ended it).
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything emitted so far

 private:
  std::string emit(size_t n);  // moves the first n bytes of pending_ to the output
  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::string pending_, text_;
  bool stopped_ = false;
};

}  // namespace lmtune::infer
