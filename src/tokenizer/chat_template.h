// Chat templates: renders a conversation with the model's Jinja chat_template (as transformers'
// apply_chat_template does), tokenizes prompts for generation, and builds training examples whose mask marks
// the assistant tokens (the only ones the loss should see). See docs/tokenizers.md for the masking rule.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {

class ChatTemplate {
 public:
  // Uses tokenizer.chat_template(); ConfigError when the model has none.
  explicit ChatTemplate(const Tokenizer& tokenizer);
  ChatTemplate(const Tokenizer& tokenizer, std::string source);

  // `messages`: [{"role": ..., "content": ...}, ...]. `extra`: more template variables (tools, enable_thinking,
  // ...). bos_token / eos_token come from the tokenizer.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  // The generation prompt (add_generation_prompt=true) as ids; the template supplies any BOS itself.
  std::vector<int32_t> encode_prompt(const nlohmann::json& messages,
                                     const nlohmann::json& extra = nlohmann::json::object()) const;

  struct Example {
    std::vector<int32_t> ids;
    std::vector<uint8_t> assistant_mask;  // 1 for tokens of assistant contents and their end-of-turn token
  };
  Example encode_with_assistant_mask(const nlohmann::json& messages,
                                     const nlohmann::json& extra = nlohmann::json::object()) const;

  // Ids that end generation: the tokenizer's eos ids plus the template's end-of-turn token when it is a special
  // token (e.g. <|eot_id|>, <|im_end|>, <end_of_turn>).
  std::vector<int32_t> stop_ids() const;

 private:
  // Where message m's turn starts in the rendered conversation (0 when that cannot be told).
  size_t rendered_before(const nlohmann::json& messages, size_t m, const std::string& rendered,
                         const nlohmann::json& extra) const;
  // The special token starting at text[pos] (after optional whitespace); returns its end or npos.
  size_t end_of_turn_token_end(const std::string& text, size_t pos, int32_t* id = nullptr) const;

  const Tokenizer& tokenizer_;
  jinja::Template template_;
  std::vector<std::pair<std::string, int32_t>> special_tokens_;  // content → id, longest first
};

}  // namespace lmtune
