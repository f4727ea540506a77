// Chat template rendering and assistant-token masks (see chat_template.h and docs/tokenizers.md).
#include "tokenizer/chat_template.h"

#include <algorithm>

#include "core/error.h"

namespace lmtune {
namespace {

std::string template_source(const Tokenizer& tokenizer) {
  if (tokenizer.chat_template().empty())
    throw ConfigError("tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)");
  return tokenizer.chat_template();
}

std::string strip_whitespace(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Number of leading ids two encodings share.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The texts of an assistant message that the template copies into the rendering.
std::vector<std::string> assistant_texts(const nlohmann::json& message) {
  std::vector<std::string> texts;
  const auto content = message.value("content", nlohmann::json());
  if (content.is_string()) {
    texts.push_back(content.get<std::string>());
  } else if (content.is_array()) {  // [{"type": "text", "text": ...}, ...]
    for (const auto& part : content)
      if (part.is_object() && part.value("type", std::string()) == "text" && part.contains("text"))
        texts.push_back(part["text"].get<std::string>());
  }
  return texts;
}

}  // namespace

ChatTemplate::ChatTemplate(const Tokenizer& tokenizer) : ChatTemplate(tokenizer, template_source(tokenizer)) {}

ChatTemplate::ChatTemplate(const Tokenizer& tokenizer, std::string source)
    : tokenizer_(tokenizer), template_(std::move(source), "chat template") {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.is_special(id)) special_tokens_.emplace_back(tokenizer.token(id), id);
  std::sort(special_tokens_.begin(), special_tokens_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  if (!messages.is_array()) throw ConfigError("chat template: messages must be a list");
  nlohmann::json vars = extra.is_object() ? extra : nlohmann::json::object();
  vars["messages"] = messages;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (!tokenizer_.bos_token().empty()) vars["bos_token"] = tokenizer_.bos_token();
  if (!tokenizer_.eos_token().empty()) vars["eos_token"] = tokenizer_.eos_token();
  return template_.render(vars);
}

std::vector<int32_t> ChatTemplate::encode_prompt(const nlohmann::json& messages, const nlohmann::json& extra) const {
  return tokenizer_.encode(render(messages, true, extra), false);
}

size_t ChatTemplate::end_of_turn_token_end(const std::string& text, size_t pos, int32_t* id) const {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  for (const auto& [content, token_id] : special_tokens_) {
    if (text.compare(pos, content.size(), content) == 0) {
      if (id) *id = token_id;
      return pos + content.size();
    }
  }
  return std::string::npos;
}

// Where message m's turn starts in `rendered`: the length of the conversation before it rendered with the generation
// prompt, when that is a prefix of `rendered` (0 otherwise, or when the template rejects the shorter conversation).
// An assistant's content is searched for from there: the same words may occur in earlier turns (a question that
// lists the answer's options), and those must not be taken for the answer.
size_t ChatTemplate::rendered_before(const nlohmann::json& messages, size_t m, const std::string& rendered,
                                     const nlohmann::json& extra) const {
  if (m == 0) return 0;
  try {
    const std::string before =
        render(nlohmann::json(std::vector<nlohmann::json>(messages.begin(), messages.begin() + int64_t(m))), true,
               extra);
    return rendered.compare(0, before.size(), before) == 0 ? before.size() : 0;
  } catch (const Error&) {
    return 0;
  }
}

ChatTemplate::Example ChatTemplate::encode_with_assistant_mask(const nlohmann::json& messages,
                                                               const nlohmann::json& extra) const {
  const std::string rendered = render(messages, false, extra);
  Example ex;
  ex.ids = tokenizer_.encode(rendered, false);
  ex.assistant_mask.assign(ex.ids.size(), 0);

  // Character spans of assistant contents (+ the end-of-turn special token that follows), found in order.
  size_t cursor = 0;
  for (size_t m = 0; m < messages.size(); ++m) {
    if (!messages[m].is_object() || messages[m].value("role", std::string()) != "assistant") continue;
    cursor = std::max(cursor, rendered_before(messages, m, rendered, extra));
    for (const std::string& full : assistant_texts(messages[m])) {
      std::string text = strip_whitespace(full);
      if (text.empty()) continue;
      size_t start = rendered.find(text, cursor);
      if (start == std::string::npos && text.find("</think>") != std::string::npos) {
        // Templates such as Qwen 3 drop the reasoning of earlier turns: the answer after </think> remains.
        text = strip_whitespace(text.substr(text.rfind("</think>") + 8));
        start = text.empty() ? std::string::npos : rendered.find(text, cursor);
      }
      if (start == std::string::npos)
        throw ConfigError("chat template: content of message " + std::to_string(m) +
                          " (assistant) does not appear in the rendered conversation");
      size_t end = start + text.size();
      if (size_t eot = end_of_turn_token_end(rendered, end); eot != std::string::npos) end = eot;
      // Token boundaries: tokens shared with the encoding of the text before each boundary lie before it.
      size_t first = common_prefix(tokenizer_.encode(std::string_view(rendered).substr(0, start), false), ex.ids);
      size_t last = end == rendered.size()
                        ? ex.ids.size()
                        : common_prefix(tokenizer_.encode(std::string_view(rendered).substr(0, end), false), ex.ids);
      for (size_t k = first; k < last; ++k) ex.assistant_mask[k] = 1;
      cursor = end;
    }
  }
  return ex;
}

std::vector<int32_t> ChatTemplate::stop_ids() const {
  std::vector<int32_t> ids = tokenizer_.eos_ids();
  try {
    const std::string probe = "lmtune-probe-answer";
    nlohmann::json messages = nlohmann::json::array(
        {{{"role", "user"}, {"content", "lmtune-probe-question"}}, {{"role", "assistant"}, {"content", probe}}});
    std::string rendered = render(messages, false);
    size_t at = rendered.find(probe);
    int32_t id = -1;
    if (at != std::string::npos && end_of_turn_token_end(rendered, at + probe.size(), &id) != std::string::npos &&
        std::find(ids.begin(), ids.end(), id) == ids.end())
      ids.push_back(id);
  } catch (const Error&) {
    // A template that rejects the probe conversation just contributes no end-of-turn token.
  }
  return ids;
}

}  // namespace lmtune
