// The tokenizer as GGUF metadata and back: for each fixture (byte-level BPE with the llama3 and qwen2
// pre-tokenizers, SentencePiece-style BPE with and without the ▁ prefix), gguf_tokenizer_metadata written to a GGUF
// file and read by Tokenizer::from_gguf must encode the whole corpus to the same ids, decode them to the same text,
// and keep the special ids and the chat template; tokenizers llama.cpp would run differently are refused.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "fixtures.h"
#include "io/gguf.h"
#include "tokenizer/gguf_vocab.h"

namespace lmtune::test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  std::ifstream in(fs::path(LMTUNE_SOURCE_DIR) / "tests/tokenizer/corpus.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  return texts;
}

fs::path temp_file(const std::string& name) {
  fs::path dir = fs::path(LMTUNE_BINARY_DIR) / "test_tmp" / "gguf_vocab";
  fs::create_directories(dir);
  return dir / name;
}

// The tokenizer through a GGUF file holding only its metadata (padded to vocab + 3 rows, as a model may be).
Tokenizer round_trip(const Tokenizer& t, const std::string& name, GgufMetadata* out = nullptr) {
  GgufMetadata m = gguf_tokenizer_metadata(t, t.vocab_size() + 3);
  const fs::path file = temp_file(name + ".gguf");
  write_gguf(file, m, {});
  if (out) *out = m;
  return Tokenizer::from_gguf(GgufFile(file));
}

class GgufVocab : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufVocab, RoundTripsIdsSpecialsAndTemplate) {
  const Tokenizer& t = fixture_tokenizer(GetParam());
  const Tokenizer back = round_trip(t, GetParam());
  EXPECT_EQ(back.vocab_size(), t.vocab_size() + 3);
  for (const std::string& text : corpus()) {
    const std::vector<int32_t> ids = t.encode(text, true);
    ASSERT_EQ(back.encode(text, true), ids) << GetParam() << ": " << text;
    EXPECT_EQ(back.decode(ids), t.decode(ids)) << text;
  }
  EXPECT_EQ(back.bos_id(), t.bos_id());
  std::vector<int32_t> eos = t.eos_ids();
  eos.resize(std::min<size_t>(eos.size(), 3));  // GGUF names three: eos, eot, eom
  EXPECT_EQ(back.eos_ids(), eos);
  EXPECT_EQ(back.pad_id(), t.pad_id());
  EXPECT_EQ(back.chat_template(), t.chat_template());
  EXPECT_EQ(back.token(t.vocab_size() + 2), "[PAD" + std::to_string(t.vocab_size() + 2) + "]");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufVocab, ::testing::ValuesIn(kFixtureNames));

const GgufValue& value(const GgufMetadata& m, const std::string& key) {
  for (const auto& [k, v] : m)
    if (k == key) return v;
  throw std::runtime_error("no key " + key);
}

TEST(GgufVocabKeys, NameTheModelPreTokenizerAndTypes) {
  GgufMetadata m = gguf_tokenizer_metadata(fixture_tokenizer("llama3"), fixture_tokenizer("llama3").vocab_size());
  EXPECT_EQ(value(m, "tokenizer.ggml.model").str, "gpt2");
  EXPECT_EQ(value(m, "tokenizer.ggml.pre").str, "llama-bpe");
  const Tokenizer& q = fixture_tokenizer("qwen3");
  EXPECT_EQ(value(gguf_tokenizer_metadata(q, q.vocab_size()), "tokenizer.ggml.pre").str, "qwen2");
  const Tokenizer& s = fixture_tokenizer("llama2");
  m = gguf_tokenizer_metadata(s, s.vocab_size());
  EXPECT_EQ(value(m, "tokenizer.ggml.model").str, "llama");
  EXPECT_EQ(value(m, "tokenizer.ggml.add_space_prefix").integer, 1u);
  EXPECT_EQ(value(m, "tokenizer.ggml.add_bos_token").integer, 1u);
  const auto& types = value(m, "tokenizer.ggml.token_type").items;
  EXPECT_EQ(types.at(size_t(*s.token_to_id("<0x41>"))).integer, 6u);  // byte
  EXPECT_EQ(types.at(size_t(*s.token_to_id("<unk>"))).integer, 2u);   // unknown
  EXPECT_EQ(types.at(size_t(*s.bos_id())).integer, 3u);               // control
  const Tokenizer& g = fixture_tokenizer("gemma3");
  EXPECT_EQ(value(gguf_tokenizer_metadata(g, g.vocab_size()), "tokenizer.ggml.add_space_prefix").integer, 0u);
}

// Found by fuzz_gguf: a token that is not UTF-8 made nlohmann's dump() throw json::type_error out of from_gguf.
TEST(GgufVocabKeys, TokensAndMergesMustBeUtf8) {
  const std::vector<std::string> good = {"a", "b", "ab"}, bad = {"a", std::string("\xff\xfe"), "ab"};
  for (const std::string key : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}) {
    const bool bad_tokens = key == "tokenizer.ggml.tokens";
    GgufMetadata m = {{"tokenizer.ggml.model", GgufValue::of_string("gpt2")},
                      {"tokenizer.ggml.pre", GgufValue::of_string("llama-bpe")},
                      {"tokenizer.ggml.tokens", GgufValue::of_strings(bad_tokens ? bad : good)},
                      {"tokenizer.ggml.merges", GgufValue::of_strings({"a b", bad_tokens ? "a b" : "\xc3"})}};
    const fs::path file = temp_file("bad_utf8.gguf");
    write_gguf(file, m, {});
    try {
      Tokenizer::from_gguf(GgufFile(file));
      ADD_FAILURE() << key << ": expected a FileError";
    } catch (const FileError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("element 1 is not valid UTF-8"), std::string::npos) << e.what();
    }
  }
}

// Found by fuzz_gguf: a SentencePiece vocabulary's unknown_token_id past the tokens threw std::out_of_range (.at).
TEST(GgufVocabKeys, UnknownTokenIdOutsideVocabulary) {
  GgufMetadata m = {{"tokenizer.ggml.model", GgufValue::of_string("llama")},
                    {"tokenizer.ggml.tokens", GgufValue::of_strings({"<unk>", "a", "b"})},
                    {"tokenizer.ggml.scores", GgufValue::of_array(GgufType::f32, {GgufValue::of_f32(0),
                                                GgufValue::of_f32(-1), GgufValue::of_f32(-2)})},
                    {"tokenizer.ggml.unknown_token_id", GgufValue::of_u32(16)}};
  const fs::path file = temp_file("bad_unk.gguf");
  write_gguf(file, m, {});
  try {
    Tokenizer::from_gguf(GgufFile(file));
    ADD_FAILURE() << "expected a FileError";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.unknown_token_id"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("16 is outside the vocabulary [0, 3)"), std::string::npos) << e.what();
  }
}

TEST(GgufVocabKeys, RefusesWhatLlamaCppWouldRunDifferently) {
  const Tokenizer& t = fixture_tokenizer("llama3");
  EXPECT_THROW(gguf_tokenizer_metadata(t, t.vocab_size() - 1), ConfigError);  // more tokens than rows
  // A lower-casing normalizer and a Metaspace pre-tokenizer that splits have no GGUF form.
  const std::string vocab = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  const std::pair<std::string, std::string> cases[] = {
      {R"("normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "ByteLevel"})", "the normalizer"},
      {R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated"})",
       "the pre-tokenizer"},
  };
  for (const auto& [json, what] : cases) {
    Tokenizer w = Tokenizer::from_json_string("{" + vocab + ", " + json + "}", "w.json");
    try {
      gguf_tokenizer_metadata(w, 3);
      ADD_FAILURE() << "no error for " << json;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("w.json: " + what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lmtune::test
