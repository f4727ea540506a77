// Malformed tokenizer files give a FileError that names the file and the problem, never a crash; plus small
// hand-written tokenizers exercising components the real fixtures do not use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace lmtune {
namespace {

std::string error_of(const std::string& json) {
  try {
    Tokenizer::from_json_string(json, "bad.json");
  } catch (const FileError& e) {
    return e.what();
  }
  return "no error";
}

const char* const kTinyModel = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "c": 4},
                                  "merges": ["a b"], "unk_token": "<unk>"})";

// The bug fuzz_dataset found in tokenize_record, here too: a number beyond double's range is json::out_of_range,
// not parse_error, and escaped from_json_string as a foreign exception.
TEST(TokenizerErrors, NumberOutOfRangeIsInvalidJson) {
  const std::string e = error_of(R"({"version": 1e999, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  EXPECT_NE(e.find("bad.json: invalid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
}

// Found by fuzz_tokenizer: a TemplateProcessing item whose SpecialToken id is a number escaped as nlohmann's
// type_error; so did ids that are not integers.
TEST(TokenizerErrors, TemplateProcessingWithWrongTypesNamesTheItem) {
  auto with_post = [](const std::string& post) {
    return std::string("{") + kTinyModel + R"(, "post_processor": )" + post + "}";
  };
  const std::pair<std::string, std::string> cases[] = {
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 7}}], "special_tokens": {}})",
       "post_processor.single[0].SpecialToken: expected an object with a string 'id'"},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": "x"}], "special_tokens": {}})",
       "post_processor.single[0].SpecialToken: expected an object with a string 'id'"},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "x"}}],
           "special_tokens": {"x": {"ids": ["0"]}}})",
       "post_processor.special_tokens.x: ids must be non-negative integers, got \"0\""},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "x"}}],
           "special_tokens": {"x": {"ids": [-1]}}})",
       "ids must be non-negative integers, got -1"},
      {R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "x"}}], "special_tokens": [1]})",
       "special token 'x' is not listed in special_tokens"},
  };
  for (const auto& [post, want] : cases) {
    const std::string e = error_of(with_post(post));
    EXPECT_NE(e.find(want), std::string::npos) << post << ": " << e;
  }
}

// Found by fuzz_tokenizer too: any field read with a default (`"invert": "ByteLevel"` where a boolean belongs)
// escaped as nlohmann's type_error; every section now names itself in a FileError.
TEST(TokenizerErrors, FieldsOfTheWrongTypeNameTheSection) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"},
          "invert": "ByteLevel"}]})", "bad.json: pre_tokenizer: a field has the wrong type"},
      {R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": 1})",
       "bad.json: pre_tokenizer: a field has the wrong type"},
      {R"("decoder": {"type": "ByteLevel", "trim_offsets": []})", "no error"},
      {R"("added_tokens": [{"id": 5, "content": "<x>", "special": "yes"}])",
       "bad.json: added_tokens[0]: a field has the wrong type"},
      // Found by fuzz_tokenizer: a float where a count belongs was converted to size_t (undefined beyond its range).
      {R"("decoder": {"type": "Strip", "content": " ", "start": 15555555555555555555555555555, "stop": 5})",
       "decoder.start: expected a non-negative integer, got 1.5555555555555557e+28"},
      {R"("decoder": {"type": "Strip", "content": " ", "stop": -2})",
       "decoder.stop: expected a non-negative integer, got -2"},
      {R"("post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 3e9], "sep": ["[SEP]", 1]})",
       "post_processor.cls: [token, id]: id 3000000000.0 is not an integer"},
  };
  for (const auto& [part, want] : cases) {
    const std::string e = error_of(std::string("{") + kTinyModel + ", " + part + "}");
    EXPECT_NE(e.find(want), std::string::npos) << part << ": " << e;
  }
}

TEST(TokenizerErrors, MalformedFilesNameTheProblem) {
  EXPECT_NE(error_of("{not json").find("bad.json: invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("{}").find("bad.json: missing 'model'"), std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "a xy"]}})")
                .find("bad.json: model.merges[1]: names unknown token 'xy'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})").find("unsupported model type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string("{") + kTinyModel + R"(, "normalizer": {"type": "BertNormalizer"}})")
                .find("normalizer: unsupported normalizer type 'BertNormalizer'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string("{") + kTinyModel + R"(, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}})")
                .find("pre_tokenizer.pretokenizers[0]: unsupported pre_tokenizer type 'Whitespace'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string("{") + kTinyModel + R"(, "decoder": {"type": "CTC"}})").find("unsupported decoder type 'CTC'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string("{") + kTinyModel + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}}})")
                .find("bad regex"),
            std::string::npos);
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), FileError);
}

std::string with_vocab(const std::string& vocab, const std::string& added = "[]") {
  return R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": []}, "added_tokens": )" + added + "}";
}

std::string added_token(const std::string& id, const std::string& content) {
  return R"({"id": )" + id + R"(, "content": ")" + content + R"(", "special": true})";
}

TEST(TokenizerErrors, IdsOutsideTheIdRangeNameTheToken) {
  for (const char* id : {"4294967297", "2147483648", "-1", "16777216", "18446744073709551615"}) {
    std::string msg = error_of(with_vocab(std::string(R"({"a": 0, "b": )") + id + "}"));
    EXPECT_NE(msg.find("bad.json: model.vocab: token 'b': id " + std::string(id) + " is outside [0, 16777215]"),
              std::string::npos) << msg;
    msg = error_of(with_vocab(R"({"a": 0})", "[" + added_token(id, "<x>") + "]"));
    EXPECT_NE(msg.find("bad.json: added_tokens[0]: token '<x>': id " + std::string(id) + " is outside"),
              std::string::npos) << msg;
  }
}

TEST(TokenizerErrors, TwoTokensWithOneIdAreRefused) {
  std::string msg = error_of(with_vocab(R"({"a": 0, "b": 1, "c": 1})"));
  EXPECT_NE(msg.find("bad.json: model.vocab: tokens '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("have the same id 1"), std::string::npos) << msg;
  msg = error_of(with_vocab(R"({"a": 0, "b": 1})", "[" + added_token("1", "<x>") + "]"));
  EXPECT_NE(msg.find("bad.json: added_tokens[0]: token '<x>' has id 1, already the id of 'b' in model.vocab"),
            std::string::npos) << msg;
  msg = error_of(with_vocab(R"({"a": 0})", "[" + added_token("2", "<x>") + ", " + added_token("2", "<y>") + "]"));
  EXPECT_NE(msg.find("bad.json: added_tokens[1]: token '<y>' has id 2, already the id of '<x>' in added_tokens"),
            std::string::npos) << msg;
  // An added token may repeat its own vocab entry, as HF files do for <s> and </s>.
  auto t = Tokenizer::from_json_string(with_vocab(R"({"a": 0, "<s>": 1})", "[" + added_token("1", "<s>") + "]"));
  EXPECT_EQ(t.token_to_id("<s>"), 1);
  EXPECT_TRUE(t.is_special(1));
}

TEST(TokenizerErrors, GenerationConfigIdsOutsideTheVocabulary) {
  const std::filesystem::path dir = std::filesystem::path(LMTUNE_BINARY_DIR) / "test_tokenizer_tmp" / "gen_ids";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << with_vocab(R"({"a": 0, "b": 1, "</s>": 2})");
  auto message = [&](const std::string& gen) {
    std::ofstream(dir / "generation_config.json", std::ios::trunc) << gen;
    try {
      Tokenizer::load(dir);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string file = (dir / "generation_config.json").string();
  for (const char* id : {"3", "-1", "4294967298", "[2, 4294967296]"}) {
    std::string msg = message(std::string(R"({"eos_token_id": )") + id + "}");
    EXPECT_NE(msg.find(file + ": eos_token_id "), std::string::npos) << msg;
    EXPECT_NE(msg.find("is outside the tokenizer's vocabulary [0, 3)"), std::string::npos) << msg;
  }
  std::string msg = message(R"({"bos_token_id": 4294967296})");
  EXPECT_NE(msg.find(file + ": bos_token_id 4294967296 is outside"), std::string::npos) << msg;
  EXPECT_EQ(message(R"({"eos_token_id": [2], "bos_token_id": 0})"), "no error");
  EXPECT_EQ(Tokenizer::load(dir).eos_ids(), std::vector<int32_t>{2});
}

TEST(TokenizerComponents, UnknownTokensAndFuseUnk) {
  auto t = Tokenizer::from_json_string(std::string("{") + kTinyModel + "}");
  EXPECT_EQ(t.encode("abxyc", false), (std::vector<int32_t>{2, 3, 3, 4}));
  auto fused = Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "<unk>": 1}, "merges": [],
                                             "unk_token": "<unk>", "fuse_unk": true}})");
  EXPECT_EQ(fused.encode("axyza", false), (std::vector<int32_t>{0, 1, 0}));
}

TEST(TokenizerComponents, SplitBehaviours) {
  auto make = [](const std::string& behavior, bool invert) {
    return Tokenizer::from_json_string(
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "-": 1, "a-": 2, "-a": 3, "--": 4, "aa": 5},
            "merges": [], "ignore_merges": true},
            "pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
        R"(", "invert": )" + (invert ? "true" : "false") + "}}");
  };
  // With ignore_merges a whole piece found in the vocab is one token, which exposes the split pieces.
  EXPECT_EQ(make("Isolated", false).encode("a-a", false), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(make("Removed", false).encode("a-a", false), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(make("MergedWithPrevious", false).encode("a-a", false), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(make("MergedWithNext", false).encode("a-a", false), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(make("Contiguous", false).encode("a--a", false), (std::vector<int32_t>{0, 4, 0}));
  EXPECT_EQ(make("Removed", true).encode("aa-a", false), (std::vector<int32_t>{1}));
}

TEST(TokenizerComponents, NormalizersAndAddedTokenOptions) {
  auto t = Tokenizer::from_json_string(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, " ": 3, "é": 4, "x": 6}, "merges": []},
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}, {"type": "Strip"}]},
    "added_tokens": [
      {"id": 5, "content": "<T>", "special": true, "lstrip": true, "rstrip": true, "single_word": false, "normalized": false},
      {"id": 7, "content": "ab", "special": false, "lstrip": false, "rstrip": false, "single_word": true, "normalized": true}]})");
  EXPECT_EQ(t.encode("  AE\u0301 ", false), (std::vector<int32_t>{0, 4}));  // strip, lowercase, NFC
  EXPECT_EQ(t.encode("a  <T>  b", false), (std::vector<int32_t>{0, 5, 1}));  // lstrip/rstrip eat the spaces
  EXPECT_EQ(t.encode("ab c", false), (std::vector<int32_t>{7, 3, 2}));        // single word: matches
  EXPECT_EQ(t.encode("xab", false), (std::vector<int32_t>{6, 0, 1}));         // inside a word: no match
  EXPECT_EQ(t.decode({5, 0}, true), "a");
  EXPECT_TRUE(t.is_special(5));
  EXPECT_FALSE(t.is_special(7));
}

TEST(TokenizerComponents, MetaspaceByteFallbackAndLiteralByteText) {
  auto t = Tokenizer::from_json_string(R"({
    "model": {"type": "BPE", "byte_fallback": true, "merges": [["▁", "a"]],
              "vocab": {"▁": 0, "a": 1, "▁a": 2, "<0x40>": 3, "<": 4, "0": 5, "x": 6, "4": 7, ">": 8, "<0xC3>": 9, "<0xA9>": 10}},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"}]}})");
  EXPECT_EQ(t.encode("a @", false), (std::vector<int32_t>{2, 0, 3}));
  EXPECT_EQ(t.encode("<0x40>", false), (std::vector<int32_t>{0, 4, 5, 6, 7, 5, 8}));  // literal text stays text
  EXPECT_EQ(t.encode("é", false), (std::vector<int32_t>{0, 9, 10}));
  EXPECT_EQ(t.decode(t.encode("a @ é", false)), "a @ é");
  EXPECT_EQ(t.decode({9}), "\xEF\xBF\xBD");  // half a character decodes to U+FFFD
  EXPECT_EQ(t.decode({1, 99, 1}), "aa");  // ids past the vocabulary decode to nothing, as in HF tokenizers
  EXPECT_THROW(t.encode("\xC3(", false), Error);  // invalid UTF-8 input
}

}  // namespace
}  // namespace lmtune

namespace lmtune {
namespace {

TEST(TokenizerComponents, SentencePieceWordSplitKeepsMergesAcrossMetaspace) {
  // "x▁" is produced by a merge, so the cut before "▁" (a speed-up for pre-tokenizer-less BPE) must not happen
  // after "x"; after "z" it may.
  auto t = Tokenizer::from_json_string(R"({"model": {"type": "BPE",
      "vocab": {"x": 0, "▁": 1, "y": 2, "x▁": 3, "x▁y": 4, "▁y": 5, "z": 6},
      "merges": [["x", "▁"], ["x▁", "y"], ["▁", "y"]]}})");
  EXPECT_EQ(t.encode("x▁y", false), (std::vector<int32_t>{4}));
  EXPECT_EQ(t.encode("z▁y", false), (std::vector<int32_t>{6, 5}));
  EXPECT_EQ(t.encode("x▁yz▁y▁▁y", false), (std::vector<int32_t>{4, 6, 5, 1, 5}));
}

}  // namespace
}  // namespace lmtune
