// Chat templates of the real tokenizers rendered exactly as the reference (transformers.js' Jinja), the
// assistant-token mask used for training, and stop ids for generation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "fixtures.h"
#include "tokenizer/chat_template.h"

namespace lmtune::test {
namespace {

const nlohmann::json& conversations() {
  static const nlohmann::json convs = [] {
    std::ifstream in(std::filesystem::path(LMTUNE_SOURCE_DIR) / "tests/tokenizer/conversations.json");
    return nlohmann::json::parse(in);
  }();
  return convs;
}

std::string template_for(const std::string& tokenizer, const std::string& name) {
  if (name == "default") return fixture_tokenizer(tokenizer).chat_template();
  return conversations()["extra_templates"][name];
}

class RealChatTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(RealChatTemplate, RendersLikeReference) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  int checked = 0;
  for (const auto& c : expected(GetParam())["chat"]) {
    ChatTemplate chat(t, template_for(GetParam(), c["template"]));
    const auto& messages = conversations()["conversations"][c["conversation"].get<size_t>()];
    bool gen = c["add_generation_prompt"];
    SCOPED_TRACE(c["template"].get<std::string>() + " conversation " + c["conversation"].dump() + " gen=" + (gen ? "1" : "0"));
    if (c["rendered"].is_string()) {
      EXPECT_EQ(chat.render(messages, gen), c["rendered"].get<std::string>());
    } else {
      try {
        chat.render(messages, gen);
        ADD_FAILURE() << "expected the template to raise: " << c["error"];
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

TEST_P(RealChatTemplate, AssistantMaskCoversContentsAndEndOfTurn) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  const std::string name = GetParam() == "llama2" ? "llama2-chat" : "default";
  ChatTemplate chat(t, template_for(GetParam(), name));
  for (size_t ci = 1; ci < conversations()["conversations"].size(); ++ci) {
    const auto& messages = conversations()["conversations"][ci];
    auto ex = chat.encode_with_assistant_mask(messages);
    ASSERT_EQ(ex.ids, t.encode(chat.render(messages, false), false));
    ASSERT_EQ(ex.ids.size(), ex.assistant_mask.size());
    // Collect the masked runs and compare with the assistant contents.
    std::vector<std::string> runs;
    for (size_t k = 0; k < ex.ids.size(); ++k) {
      if (!ex.assistant_mask[k]) continue;
      std::vector<int32_t> run;
      while (k < ex.ids.size() && ex.assistant_mask[k]) run.push_back(ex.ids[k++]);
      EXPECT_TRUE(t.is_special(run.back())) << "run does not end with an end-of-turn token: " << t.decode(run);
      runs.push_back(t.decode(run));
    }
    std::vector<std::string> contents;
    for (const auto& m : messages)
      if (m["role"] == "assistant") contents.push_back(m["content"]);
    ASSERT_EQ(runs.size(), contents.size()) << "conversation " << ci;
    for (size_t r = 0; r < runs.size(); ++r) {
      std::string content = contents[r];
      content.erase(0, content.find_first_not_of(" \n"));
      content.erase(content.find_last_not_of(" \n") + 1);
      EXPECT_NE(runs[r].find(content), std::string::npos) << runs[r] << " vs " << content;
      EXPECT_LE(runs[r].size(), content.size() + 16) << "mask covers more than the answer: " << runs[r];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealChatTemplate, ::testing::Values("llama3", "qwen3", "gemma3", "llama2"),
                         [](const auto& info) { return info.param; });

TEST(ChatTemplate, ExactMaskForQwen3) {
  const Tokenizer& t = fixture_tokenizer("qwen3");
  ChatTemplate chat(t);
  auto messages = conversations()["conversations"][1];
  auto ex = chat.encode_with_assistant_mask(messages);
  std::vector<int32_t> masked;
  for (size_t k = 0; k < ex.ids.size(); ++k)
    if (ex.assistant_mask[k]) masked.push_back(ex.ids[k]);
  EXPECT_EQ(t.decode(masked), "2+2 = 4.<|im_end|>");
}

TEST(ChatTemplate, StopIdsIncludeEndOfTurnToken) {
  auto has = [](const std::vector<int32_t>& ids, std::optional<int32_t> id) {
    return id && std::find(ids.begin(), ids.end(), *id) != ids.end();
  };
  const Tokenizer& llama3 = fixture_tokenizer("llama3");
  auto stops = ChatTemplate(llama3).stop_ids();
  EXPECT_TRUE(has(stops, llama3.token_to_id("<|eot_id|>")));
  EXPECT_TRUE(has(stops, llama3.token_to_id("<|end_of_text|>")));
  const Tokenizer& qwen = fixture_tokenizer("qwen3");
  EXPECT_TRUE(has(ChatTemplate(qwen).stop_ids(), qwen.token_to_id("<|im_end|>")));
  const Tokenizer& gemma = fixture_tokenizer("gemma3");
  EXPECT_TRUE(has(ChatTemplate(gemma).stop_ids(), gemma.token_to_id("<end_of_turn>")));
}

TEST(ChatTemplate, PromptEndsWithGenerationPrompt) {
  const Tokenizer& t = fixture_tokenizer("gemma3");
  ChatTemplate chat(t);
  auto ids = chat.encode_prompt(nlohmann::json::array({{{"role", "user"}, {"content", "Hi"}}}));
  EXPECT_EQ(ids.front(), *t.bos_id());
  EXPECT_EQ(t.decode(ids), "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, MissingTemplateIsAConfigError) {
  EXPECT_THROW(ChatTemplate{fixture_tokenizer("llama2")}, ConfigError);
}

}  // namespace
}  // namespace lmtune::test
