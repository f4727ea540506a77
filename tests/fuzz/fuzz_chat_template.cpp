// Fuzzes the Jinja chat-template parser and renderer: the input is a template, rendered over a fixed
// conversation (system, user, assistant with a tool call, tool result) with and without the generation prompt,
// then encoded with the assistant mask as the chat dataset does.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

namespace {

const nlohmann::json& messages() {
  static const nlohmann::json m = nlohmann::json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "tool_calls": [{"type": "function",
      "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
    {"role": "tool", "content": "4"},
    {"role": "assistant", "content": "Four."}])");
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tokenizer = lmtune::fuzz::byte_tokenizer();
  std::string source = lmtune::fuzz::text(data, size);
  return lmtune::fuzz::expect_project_errors([&] {
    lmtune::ChatTemplate chat(tokenizer, source);
    nlohmann::json extra = {{"tools", nlohmann::json::array()}, {"enable_thinking", false}};
    (void)chat.render(messages(), true, extra);
    (void)chat.render(messages(), false);
    (void)chat.encode_with_assistant_mask(messages());
  });
}
