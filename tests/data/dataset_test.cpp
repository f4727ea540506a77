// Data loading: formats and loss masks, errors with file:line, over-long policies, the HDF5 token cache, and
// packing (positions, document ids, targets) with resumable cursors.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/batcher.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"

using namespace lmtune;
namespace fs = std::filesystem;

namespace {

const Tokenizer& qwen() {
  static Tokenizer t = [] {
    fs::path dir = fs::path(LMTUNE_SOURCE_DIR) / "tests/fixtures/npm/qwen3/models";
    if (!fs::exists(dir / "tokenizer.json")) throw std::runtime_error("run scripts/fetch_fixtures.sh: missing " + dir.string());
    return Tokenizer::load(dir);
  }();
  return t;
}

struct TempDir {
  fs::path path;
  TempDir() : path(fs::temp_directory_path() / ("lmtune_data_" + std::to_string(::getpid()) + "_" +
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
    load_dataset(file, qwen(), opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Dataset, TextFormatTrainsOnAllTokensAndEndsWithEos) {
  TempDir d;
  auto f = d.write("t.jsonl", "{\"text\": \"Hello world, this is a test.\"}\n\n{\"text\": \"Second line\"}\n");
  Dataset ds = load_dataset(f, qwen(), {});
  ASSERT_EQ(ds.samples.size(), 2u);
  EXPECT_EQ(ds.stats.format, "text");
  EXPECT_EQ(ds.stats.lines, 2);
  auto expected = qwen().encode("Hello world, this is a test.", true);
  expected.push_back(qwen().eos_ids().at(0));
  EXPECT_EQ(ds.samples[0].ids, expected);
  EXPECT_EQ(ds.samples[0].trainable[0], 0);
  for (size_t i = 1; i < expected.size(); ++i) EXPECT_EQ(ds.samples[0].trainable[i], 1);
}

TEST(Dataset, CompletionFormatMasksThePrompt) {
  TempDir d;
  auto f = d.write("c.jsonl", "{\"prompt\": \"Q: 2+2?\\nA:\", \"completion\": \" 4\"}\n");
  Dataset ds = load_dataset(f, qwen(), {});
  const Sample& s = ds.samples.at(0);
  auto prompt = qwen().encode("Q: 2+2?\nA:", true);
  auto completion = qwen().encode(" 4", false);
  ASSERT_EQ(s.ids.size(), prompt.size() + completion.size() + 1);
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(s.trainable[i], 0) << i;
  for (size_t i = prompt.size(); i < s.ids.size(); ++i) EXPECT_EQ(s.trainable[i], 1) << i;
  EXPECT_EQ(ds.stats.trainable_tokens, int64_t(completion.size() + 1));
}

TEST(Dataset, MalformedLinesNameFileAndLine) {
  TempDir d;
  auto f = d.write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  std::string e = error_of(f);
  EXPECT_NE(e.find("bad.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("invalid JSON"), std::string::npos) << e;
  e = error_of(d.write("k.jsonl", "{\"text\": \"ok\"}\n{\"txt\": \"x\"}\n"));
  EXPECT_NE(e.find("k.jsonl:2"), std::string::npos) << e;
  e = error_of(d.write("t.jsonl", "{\"text\": 5}\n"));
  EXPECT_NE(e.find("must be a string"), std::string::npos) << e;
  e = error_of(d.write("a.jsonl", "[1, 2]\n"));
  EXPECT_NE(e.find("JSON object"), std::string::npos) << e;
  e = error_of(d.path / "missing.jsonl");
  EXPECT_NE(e.find("missing.jsonl"), std::string::npos) << e;
}

// Found by fuzz_dataset: a number beyond double's range made nlohmann throw json::out_of_range (not a parse_error),
// which escaped tokenize_record instead of naming the file and line.
TEST(Dataset, NumberOutOfRangeNamesFileAndLine) {
  TempDir d;
  const std::string e = error_of(d.write("big.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"x\", \"n\": 1e999}\n"));
  EXPECT_NE(e.find("big.jsonl:2: invalid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
}

// Found by fuzz_dataset: a chat record nesting 30,000 arrays overflowed the stack (its messages are copied
// recursively); records deeper than 64 levels are refused, naming the file and line.
TEST(Dataset, DeeplyNestedRecordNamesFileAndLine) {
  TempDir d;
  const std::string deep = std::string(30000, '[') + std::string(30000, ']');
  const std::string record = R"({"messages": [{"role": "user", "content": "a", "x": )" + deep +
                             R"(}, {"role": "assistant", "content": "b"}]})";
  const std::string e = error_of(d.write("deep.jsonl", "{\"text\": \"ok\"}\n" + record + "\n"));
  EXPECT_NE(e.find("deep.jsonl:2: invalid JSON: nested deeper than 64 levels"), std::string::npos) << e;
  const std::string nested = std::string(60, '[') + std::string(60, ']');
  EXPECT_EQ(error_of(d.write("ok.jsonl", R"({"text": "ok", "x": )" + nested + "}\n")), "");
}

TEST(Dataset, OverlongPoliciesAndUntrainableSamples) {
  TempDir d;
  std::string longtext(400, 'a');
  for (size_t i = 0; i < longtext.size(); i += 5) longtext[i] = ' ';
  auto f = d.write("o.jsonl", "{\"text\": \"" + longtext + "\"}\n{\"text\": \"short one\"}\n{\"text\": \"\"}\n");
  DataOptions opt;
  opt.max_seq_len = 16;
  Dataset ds = load_dataset(f, qwen(), opt);
  EXPECT_EQ(ds.stats.truncated, 1);
  EXPECT_EQ(ds.stats.rejected_untrainable, 1);  // "" becomes only an EOS: nothing to predict
  EXPECT_EQ(ds.samples.size(), 2u);
  EXPECT_EQ(ds.samples[0].ids.size(), 16u);
  opt.overlong = "drop";
  ds = load_dataset(f, qwen(), opt);
  EXPECT_EQ(ds.stats.dropped_overlong, 1);
  EXPECT_EQ(ds.samples.size(), 1u);
  opt.overlong = "error";
  EXPECT_NE(error_of(f, opt).find("o.jsonl:1"), std::string::npos);
  auto empty = d.write("e.jsonl", "{\"prompt\": \"x\", \"completion\": \"\"}\n");
  // The completion is empty but its EOS is still a target: kept.
  EXPECT_EQ(load_dataset(empty, qwen(), {}).stats.trainable_tokens, 1);
}

TEST(Dataset, TokenCacheIsReusedAndKeyedByContent) {
  TempDir d;
  auto f = d.write("c.jsonl", "{\"text\": \"cache me\"}\n{\"text\": \"and me too\"}\n");
  Dataset a = load_dataset(f, qwen(), {}, d.path / "cache");
  ASSERT_TRUE(fs::exists(d.path / "cache" / ("tokenized-" + a.hash + ".h5")));
  Dataset b = load_dataset(f, qwen(), {}, d.path / "cache");
  EXPECT_EQ(a.hash, b.hash);
  ASSERT_EQ(a.samples.size(), b.samples.size());
  for (size_t i = 0; i < a.samples.size(); ++i) {
    EXPECT_EQ(a.samples[i].ids, b.samples[i].ids);
    EXPECT_EQ(a.samples[i].trainable, b.samples[i].trainable);
  }
  EXPECT_EQ(a.stats.trainable_tokens, b.stats.trainable_tokens);
  d.write("c.jsonl", "{\"text\": \"cache me\"}\n{\"text\": \"changed\"}\n");
  Dataset c = load_dataset(f, qwen(), {}, d.path / "cache");
  EXPECT_NE(c.hash, a.hash);
  DataOptions opt;
  opt.max_seq_len = 8;
  EXPECT_NE(load_dataset(f, qwen(), opt, d.path / "cache").hash, c.hash);
}

// A full disk while the token cache is written (a child whose files may not pass 16 KiB: RLIMIT_FSIZE with
// SIGXFSZ ignored, writes fail with EFBIG as with ENOSPC): the samples are still returned, and neither the cache
// nor its temporary file is left in the cache directory.
TEST(Dataset, TokenCacheWriteThatFailsLeavesNothingBehind) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "{\"text\": \"line " + std::to_string(i) + " of a corpus too large for the cache to be written\"}\n";
  auto f = d.write("big.jsonl", text);
  const fs::path cache = d.path / "cache";
  fs::create_directories(cache);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{16384, 16384};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) std::_Exit(99);
    int code = 10;
    try {
      if (load_dataset(f, qwen(), {}, cache).samples.size() != 300) code = 11;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      code = 12;
    }
    std::exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by a signal";
  EXPECT_EQ(WEXITSTATUS(status), 10) << "11: samples lost, 12: the failed cache write stopped loading";
  EXPECT_TRUE(fs::is_empty(cache)) << (fs::is_empty(cache) ? "" : fs::directory_iterator(cache)->path().string());
  // Without the limit the cache is written.
  EXPECT_EQ(load_dataset(f, qwen(), {}, cache).samples.size(), 300u);
  EXPECT_FALSE(fs::is_empty(cache));
}

namespace {
Dataset synthetic(int n, uint32_t seed) {
  Dataset ds;
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    Sample s;
    x = x * 1664525u + 1013904223u;
    int len = 2 + int((x >> 16) % 9);
    for (int t = 0; t < len; ++t) {
      s.ids.push_back(1000 * (i + 1) + t);
      s.trainable.push_back(t == 0 ? 0 : uint8_t(t % 3 != 1));
    }
    ds.samples.push_back(s);
  }
  return ds;
}
}  // namespace

TEST(Batcher, PackingKeepsDocumentsApartAndCoversEveryTarget) {
  Dataset ds = synthetic(37, 7);
  int64_t expected_targets = 0;
  for (const auto& s : ds.samples)
    for (size_t t = 1; t < s.ids.size(); ++t) expected_targets += s.trainable[t];
  Batcher batcher(ds, 3, 16, /*packing=*/true, /*seed=*/5, /*shuffle=*/false);
  std::multiset<int32_t> seen_targets;
  int64_t total = 0;
  while (!batcher.epoch_finished()) {
    Batch b = batcher.next();
    EXPECT_EQ(b.T, 16);
    for (int r = 0; r < b.B; ++r)
      for (int t = 0; t < b.T; ++t) {
        size_t i = size_t(r * b.T + t);
        if (t > 0 && b.doc_ids[i] == b.doc_ids[i - 1]) {
          EXPECT_EQ(b.positions[i], b.positions[i - 1] + 1);
        } else {
          EXPECT_EQ(b.positions[i], 0);
        }
        if (b.targets[i] != -100) {
          ASSERT_LT(t + 1, b.T);
          EXPECT_EQ(b.doc_ids[i + 1], b.doc_ids[i]);  // never predicts across documents
          EXPECT_EQ(b.targets[i], b.ids[i + 1]);
          EXPECT_EQ(b.targets[i] / 1000, b.ids[i] / 1000);
          seen_targets.insert(b.targets[i]);
        }
      }
    total += b.trainable_tokens;
  }
  EXPECT_EQ(total, expected_targets);
  EXPECT_EQ(int64_t(seen_targets.size()), expected_targets);
}

TEST(Batcher, UnpackedRowsHoldOneSampleAndResumeFromCursor) {
  Dataset ds = synthetic(23, 11);
  Batcher a(ds, 4, 32, /*packing=*/false, 9);
  for (int i = 0; i < 3; ++i) a.next();
  Batcher::Cursor c = a.cursor();
  std::vector<Batch> rest;
  for (int i = 0; i < 8; ++i) rest.push_back(a.next());  // crosses into the next epoch
  Batcher b(ds, 4, 32, false, 9);
  b.set_cursor(c);
  for (const Batch& expected : rest) {
    Batch got = b.next();
    EXPECT_EQ(got.ids, expected.ids);
    EXPECT_EQ(got.targets, expected.targets);
  }
  Batch one = Batcher(ds, 1, 32, false, 9).next();
  std::set<int32_t> docs;
  for (int t = 0; t < one.T; ++t)
    if (one.ids[size_t(t)] != 0) docs.insert(one.ids[size_t(t)] / 1000);
  EXPECT_EQ(docs.size(), 1u);
}

// An answer whose words also occur in the question (the options listed) is masked in its own turn only.
TEST(Dataset, ChatAnswerQuotedInTheQuestionIsMaskedInItsTurn) {
  TempDir d;
  auto f = d.write("q.jsonl", R"({"messages": [{"role": "user", "content": "Is it positive or negative?"},)"
                              R"( {"role": "assistant", "content": "negative"}]})" "\n");
  const Dataset ds = load_dataset(f, qwen(), {});
  const Sample& s = ds.samples.at(0);
  std::vector<int32_t> trained_ids;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.trainable[i]) trained_ids.push_back(s.ids[i]);
  const std::string trained = qwen().decode(trained_ids);
  EXPECT_EQ(trained.find("or"), std::string::npos) << trained;
  EXPECT_EQ(trained.find("negative"), trained.rfind("negative")) << trained;
  EXPECT_NE(trained.find("negative"), std::string::npos) << trained;
  EXPECT_NE(trained.find("<|im_end|>"), std::string::npos) << trained;
}

TEST(Dataset, ChatFormatTrainsOnAssistantTurnsOnly) {
  TempDir d;
  auto f = d.write("chat.jsonl",
                   R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},)"
                   R"( {"role": "assistant", "content": "4."}, {"role": "user", "content": "3+3?"},)"
                   R"( {"role": "assistant", "content": "6."}]})"
                   "\n");
  Dataset ds = load_dataset(f, qwen(), {});
  EXPECT_EQ(ds.stats.format, "chat");
  const Sample& s = ds.samples.at(0);
  std::string trained;
  std::vector<int32_t> trained_ids;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.trainable[i]) trained_ids.push_back(s.ids[i]);
  trained = qwen().decode(trained_ids);
  EXPECT_NE(trained.find("4."), std::string::npos) << trained;
  EXPECT_NE(trained.find("6."), std::string::npos) << trained;
  EXPECT_EQ(trained.find("2+2"), std::string::npos) << trained;
  EXPECT_EQ(trained.find("Be brief"), std::string::npos) << trained;
  EXPECT_NE(trained.find("<|im_end|>"), std::string::npos) << "the end-of-turn token teaches the model to stop";
  auto bad = d.write("b.jsonl", R"({"messages": [{"role": "user"}]})" "\n");
  EXPECT_NE(error_of(bad).find("b.jsonl:1"), std::string::npos);
  // A chat-format record without "messages" (the format named explicitly) is an error, not a read past the object.
  DataOptions chat;
  chat.format = "chat";
  const std::string e = error_of(d.write("m.jsonl", R"({"text": "no messages here"})" "\n"), chat);
  EXPECT_NE(e.find("m.jsonl:1"), std::string::npos) << e;
  EXPECT_NE(e.find("\"messages\" must be a non-empty array"), std::string::npos) << e;
}
