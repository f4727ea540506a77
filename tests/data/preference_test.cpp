// Preference data: text and chat pairs with masks on the responses only, errors naming file and line, over-long
// policies, the validation split, and pair batching (both sequences of a pair in one batch, packed or padded).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/preference.h"
#include "tokenizer/tokenizer.h"

using namespace lmtune;
namespace fs = std::filesystem;

namespace {

// The byte-level tokenizer of the training tests: one id per byte, <|im_end|> as EOS, a ChatML template.
const Tokenizer& bytes() {
  static Tokenizer t = Tokenizer::load(fs::path(LMTUNE_SOURCE_DIR) / "tests/train/fixtures/byte_tokenizer");
  return t;
}

struct TempDir {
  fs::path path;
  TempDir() : path(fs::temp_directory_path() / ("lmtune_pref_" + std::to_string(::getpid()) + "_" +
                                                std::to_string(reinterpret_cast<uintptr_t>(this)))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};

std::string error_of(const fs::path& file, DataOptions opt = {}) {
  try {
    load_preference_dataset(file, bytes(), opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string trained_text(const Sample& s) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.trainable[i]) ids.push_back(s.ids[i]);
  return bytes().decode(ids);
}

}  // namespace

TEST(PreferenceData, TextPairsScoreOnlyTheResponses) {
  TempDir d;
  auto f = d.write("p.jsonl", R"({"prompt": "Q: 2+2?", "chosen": " 4", "rejected": " five"})" "\n\n"
                              R"({"prompt": "Q: sky?", "chosen": " blue", "rejected": " green"})" "\n");
  PreferenceDataset ds = load_preference_dataset(f, bytes(), {});
  ASSERT_EQ(ds.pairs.size(), 2u);
  EXPECT_EQ(ds.stats.lines, 2);
  const PreferencePair& p = ds.pairs[0];
  const std::vector<int32_t> prompt = bytes().encode("Q: 2+2?", true);
  std::vector<int32_t> want = prompt, chosen = bytes().encode(" 4", false);
  want.insert(want.end(), chosen.begin(), chosen.end());
  want.push_back(bytes().eos_ids().at(0));
  EXPECT_EQ(p.chosen.ids, want);
  EXPECT_EQ(trained_text(p.chosen), " 4<|im_end|>");
  EXPECT_EQ(trained_text(p.rejected), " five<|im_end|>");
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(p.rejected.trainable[i], 0) << i;
  EXPECT_EQ(ds.stats.trainable_tokens, 3 + 6 + 6 + 7);  // the responses with their EOS
}

TEST(PreferenceData, ChatPairsUseTheTemplateAndMaskThePromptsAssistantTurns) {
  TempDir d;
  // The prompt holds an earlier assistant turn: context, not part of the compared response.
  auto f = d.write("c.jsonl",
                   R"({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},)"
                   R"( {"role": "user", "content": "2+2?"}], "chosen": {"role": "assistant", "content": "4"},)"
                   R"( "rejected": [{"role": "assistant", "content": "22"}]})" "\n"
                   R"({"prompt": [{"role": "user", "content": "x"}], "chosen": "yes", "rejected": "no"})" "\n");
  PreferenceDataset ds = load_preference_dataset(f, bytes(), {});
  ASSERT_EQ(ds.pairs.size(), 2u);
  const PreferencePair& p = ds.pairs[0];
  const std::string rendered = bytes().decode(p.chosen.ids);
  EXPECT_EQ(rendered, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\n"
                      "2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(trained_text(p.chosen).find("hello"), std::string::npos) << trained_text(p.chosen);
  EXPECT_EQ(trained_text(p.chosen).rfind("4<|im_end|>", 0), 0u) << trained_text(p.chosen);
  EXPECT_EQ(trained_text(p.rejected).rfind("22<|im_end|>", 0), 0u) << trained_text(p.rejected);
  EXPECT_EQ(trained_text(ds.pairs[1].chosen).rfind("yes<|im_end|>", 0), 0u);
  EXPECT_EQ(trained_text(ds.pairs[1].rejected).rfind("no<|im_end|>", 0), 0u);
}

TEST(PreferenceData, BadRecordsNameFileAndLine) {
  TempDir d;
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {R"({"prompt": "a", "chosen": "b"})", "missing key \"rejected\""},
      {R"({"chosen": "b", "rejected": "c"})", "missing key \"prompt\""},
      {R"({"prompt": "a", "chosen": 3, "rejected": "c"})", "key \"chosen\" must be a string"},
      {R"({"prompt": 7, "chosen": "b", "rejected": "c"})", "\"prompt\" must be a string or a list"},
      {R"({"prompt": [{"role": "user"}], "chosen": "b", "rejected": "c"})", "prompt[0] must be an object"},
      {R"({"prompt": [{"role": "user", "content": "a"}], "chosen": "b", "rejected": 5})", "\"rejected\" must be"},
      {R"(["prompt"])", "must be a JSON object"},
      {R"({"prompt": "a",)", "invalid JSON"},
  };
  for (const Case& c : cases) {
    auto f = d.write("bad.jsonl", std::string(R"({"prompt": "ok", "chosen": "x", "rejected": "y"})") + "\n\n" +
                                      c.line + "\n");
    const std::string e = error_of(f);
    EXPECT_NE(e.find("bad.jsonl:3: "), std::string::npos) << c.line << " -> " << e;
    EXPECT_NE(e.find(c.message), std::string::npos) << c.line << " -> " << e;
  }
  DataOptions completion;
  completion.format = "completion";
  EXPECT_NE(error_of(d.write("ok.jsonl", R"({"prompt": "a", "chosen": "b", "rejected": "c"})" "\n"), completion)
                .find("data.format"),
            std::string::npos);
}

TEST(PreferenceData, OverlongPolicyAppliesPerPair) {
  TempDir d;
  auto f = d.write("o.jsonl", R"({"prompt": "abc", "chosen": "d", "rejected": "a long rejected answer"})" "\n"
                              R"({"prompt": "abc", "chosen": "d", "rejected": "e"})" "\n"
                              R"({"prompt": "a very long prompt indeed", "chosen": "d", "rejected": "e"})" "\n");
  DataOptions o;
  o.max_seq_len = 12;
  o.overlong = "drop";
  PreferenceDataset dropped = load_preference_dataset(f, bytes(), o);
  EXPECT_EQ(dropped.pairs.size(), 1u);
  EXPECT_EQ(dropped.stats.dropped_overlong, 2);
  o.overlong = "truncate";
  PreferenceDataset cut = load_preference_dataset(f, bytes(), o);
  EXPECT_EQ(cut.pairs.size(), 2u);  // the long prompt leaves no response: that pair is rejected
  EXPECT_EQ(cut.stats.rejected_untrainable, 1);
  EXPECT_EQ(cut.pairs[0].rejected.ids.size(), 12u);
  o.overlong = "error";
  EXPECT_NE(error_of(f, o).find("o.jsonl:1: "), std::string::npos);
}

TEST(PreferenceData, SplitKeepsPairsWhole) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += R"({"prompt": "p)" + std::to_string(i) + R"(", "chosen": "c", "rejected": "r"})" "\n";
  PreferenceDataset train = load_preference_dataset(d.write("s.jsonl", text), bytes(), {});
  PreferenceDataset valid = split_preference_dataset(train, 0.2, 5);
  EXPECT_EQ(train.pairs.size(), 8u);
  EXPECT_EQ(valid.pairs.size(), 2u);
  EXPECT_EQ(valid.stats.samples, 2);
}

TEST(PairBatcher, KeepsPairsTogetherPackedOrPadded) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 5; ++i)
    text += R"({"prompt": "q)" + std::to_string(i) + R"(", "chosen": "yes", "rejected": ")" +
            std::string(size_t(i + 1), 'n') + "\"}\n";
  PreferenceDataset ds = load_preference_dataset(d.write("b.jsonl", text), bytes(), {});
  for (bool packing : {false, true}) {
    SCOPED_TRACE(packing);
    PairBatcher b(ds, 2, 32, packing, 0, false);
    int64_t pairs = 0;
    while (!b.epoch_finished()) {
      PairBatch pb = b.next();
      ASSERT_EQ(pb.response_tokens.size(), size_t(2 * pb.pairs));
      // Each sequence's targets are its response tokens (the EOS included), in one contiguous run.
      for (int64_t s = 0; s < 2 * pb.pairs; ++s) {
        const PreferencePair& p = ds.pairs[size_t(pairs + s / 2)];
        const Sample& want = s % 2 == 0 ? p.chosen : p.rejected;
        int64_t n = 0;
        for (uint8_t t : want.trainable) n += t;
        EXPECT_EQ(pb.response_tokens[size_t(s)], n) << s;
      }
      for (size_t i = 0; i < pb.sequence.size(); ++i)
        EXPECT_EQ(pb.sequence[i] >= 0, pb.batch.targets[i] != -100) << i;
      if (packing) EXPECT_LT(pb.batch.B, 2 * pb.pairs);
      else EXPECT_EQ(pb.batch.B, 2 * pb.pairs);
      pairs += pb.pairs;
    }
    EXPECT_EQ(pairs, 5);
  }
  // Shuffled epochs visit every pair once per epoch.
  PairBatcher shuffled(ds, 5, 32, true, 9);
  EXPECT_EQ(shuffled.next().pairs, 5);
  EXPECT_TRUE(shuffled.epoch_finished());
}

// The prompt lists both answers: the masks must cover the responses, not the same words in the question.
TEST(PreferenceData, ChatResponsesQuotedInThePromptAreFoundInTheirOwnTurn) {
  TempDir d;
  auto f = d.write("q.jsonl", R"({"prompt": [{"role": "user", "content": "positive or negative?"}],)"
                              R"( "chosen": "negative", "rejected": "positive"})" "\n");
  PreferenceDataset ds = load_preference_dataset(f, bytes(), {});
  ASSERT_EQ(ds.pairs.size(), 1u);
  EXPECT_EQ(trained_text(ds.pairs[0].chosen), "negative<|im_end|>");
  EXPECT_EQ(trained_text(ds.pairs[0].rejected), "positive<|im_end|>");
}
