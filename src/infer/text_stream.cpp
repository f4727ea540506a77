// TextStream (see text_stream.h). Invariant: no emitted text is a prefix of a stop string still being matched,
// so a stop string always lies entirely inside pending_.
#include "infer/text_stream.h"

#include <algorithm>

namespace lmtune::infer {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop_strings, bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::emit(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return "";
  pending_ += decoder_.step(id);
  // The earliest stop string wins.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = emit(first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix of pending_ that begins some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  return emit(pending_.size() - hold);
}

std::string TextStream::finish() {
  if (stopped_) return "";
  pending_ += decoder_.flush();
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = emit(first);
    pending_.clear();
    return out;
  }
  return emit(pending_.size());
}

}  // namespace lmtune::infer
