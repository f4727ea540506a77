// Exact ids against the reference outputs (tests/tokenizer/expected, from scripts/tokenizer_reference.mjs) for
// the four real tokenizers, with and without special tokens, plus decode and streaming decode.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "tokenizer/tokenizer_internal.h"

namespace lmtune::test {
namespace {

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

TEST_P(RealTokenizer, EncodesCorpusExactly) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  int checked = 0;
  for (const auto& e : expected(GetParam())["encode"]) {
    const std::string text = e["text"];
    EXPECT_EQ(t.encode(text, false), ids_of(e["ids"])) << "text: " << text;
    EXPECT_EQ(t.encode(text, true), ids_of(e["ids_special"])) << "text (special): " << text;
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

TEST_P(RealTokenizer, DecodesLikeReference) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  for (const auto& e : expected(GetParam())["encode"]) {
    EXPECT_EQ(t.decode(ids_of(e["ids"]), false), e["decoded"].get<std::string>()) << e["text"];
    EXPECT_EQ(t.decode(ids_of(e["ids_special"]), true), e["decoded_skip"].get<std::string>()) << e["text"];
  }
}

TEST_P(RealTokenizer, RoundTripsWhereLossless) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  int lossless = 0;
  for (const auto& e : expected(GetParam())["encode"]) {
    const std::string text = e["text"];
    if (e["decoded"] != text) continue;  // NFC, ▁ or prepended-space cases are lossy by design
    EXPECT_EQ(t.decode(t.encode(text, false)), text);
    ++lossless;
  }
  EXPECT_GT(lossless, 30);
}

TEST_P(RealTokenizer, StreamingDecodeMatchesFullDecode) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  for (const auto& e : expected(GetParam())["encode"]) {
    for (bool skip : {false, true}) {
      auto ids = ids_of(e["ids_special"]);
      StreamDecoder stream(t, skip);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = stream.step(id);
        EXPECT_TRUE(tok::is_valid_utf8(piece)) << "invalid UTF-8 piece while streaming " << e["text"];
        streamed += piece;
      }
      streamed += stream.flush();
      EXPECT_EQ(streamed, t.decode(ids, skip)) << e["text"];
    }
  }
}

TEST_P(RealTokenizer, StreamingWaitsForWholeCharacters) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  // An emoji family (ZWJ sequence) is split over several byte-level / byte-fallback tokens.
  const std::string text = "ok 👨‍👩‍👧‍👦 ∑ 日本";
  auto ids = t.encode(text, false);
  StreamDecoder stream(t);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = stream.step(id);
    ASSERT_TRUE(tok::is_valid_utf8(piece));
    streamed += piece;
  }
  EXPECT_EQ(streamed + stream.flush(), text);
}

TEST_P(RealTokenizer, SpecialTokenQueries) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  EXPECT_GT(t.vocab_size(), 30000);
  ASSERT_FALSE(t.eos_ids().empty());
  EXPECT_TRUE(t.is_special(t.eos_ids()[0]));
  EXPECT_EQ(t.token_to_id(t.token(t.eos_ids()[0])), t.eos_ids()[0]);
  EXPECT_FALSE(t.token_to_id("this token does not exist"));
}

TEST_P(RealTokenizer, TokenizerSpeed) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  std::string corpus;
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog. It's a well-known pangram, used for typing practice since "
      "the late 19th century; it contains every letter of the English alphabet at least once.\n"
      "Tokenizers split text into pieces that the model knows, and they have to be fast: a training run reads "
      "billions of words, and 1,234,567 numbers, names like O'Neill, and URLs such as https://example.com.\n";
  while (corpus.size() < (2u << 20)) corpus += paragraph + std::to_string(corpus.size()) + " words\n";
  bench_encode_mb_per_s(t, std::string_view(corpus).substr(0, 200000));  // warm the word cache
  double mb_s = bench_encode_mb_per_s(t, corpus);
  std::printf("[ TokenizerSpeed ] %s: %.1f MB/s encoding English text (one core)\n", GetParam().c_str(), mb_s);
  RecordProperty("mb_per_s", std::to_string(mb_s));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RealTokenizer, ::testing::Values("llama3", "qwen3", "gemma3", "llama2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lmtune::test
