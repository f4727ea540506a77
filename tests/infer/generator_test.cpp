// The generation engine: greedy decoding over the KV cache equals full recomputation token for token on every
// fixture architecture (prompts and outputs longer than the sliding window of 4), batches of prompts of different
// lengths equal each prompt alone (greedy and seeded sampling), stop ids / stop strings / max_tokens, and
// streamed text equal to the full decode.
#include <gtest/gtest.h>

#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "infer/generator.h"
#include "infer/text_stream.h"
#include "infer_test_util.h"
#include "models/weights.h"

namespace lmtune::infer {
namespace {

using test::model_fixture;

const std::vector<std::vector<int32_t>> kPrompts = {{5, 17, 99}, {3, 42, 7, 1, 2, 64, 100}, {11, 9, 120, 33, 8, 6, 71, 20, 2, 14}};

std::vector<std::vector<int32_t>> run(const models::Decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                      const SamplingParams& sp, int max_tokens, int64_t batch, bool use_cache) {
  std::vector<Sequence> seqs;
  for (const auto& p : prompts) {
    StopParams stop;
    stop.max_tokens = max_tokens;
    seqs.emplace_back(p, sp, stop);
  }
  SessionOptions opt;
  opt.use_cache = use_cache;
  opt.cache_chunk = 4;  // buffers grow several times
  GenerationStats st = generate(model, seqs, batch, {}, opt);
  EXPECT_GT(st.decode_tokens, 0);
  std::vector<std::vector<int32_t>> out;
  for (auto& s : seqs) {
    EXPECT_EQ(s.finish_reason(), FinishReason::length);
    out.push_back(s.generated());
  }
  return out;
}

class GenerateFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateFixture, CacheEqualsRecomputeAndBatchEqualsAlone) {
  models::Decoder model = models::load_decoder(model_fixture(GetParam()), DType::f32, DType::f32, Device::cpu());
  const int n = 12;  // prompt + output up to 22 tokens, windows of 4
  SamplingParams greedy;
  auto cached_batch = run(model, kPrompts, greedy, n, 3, true);
  EXPECT_EQ(cached_batch, run(model, kPrompts, greedy, n, 3, false)) << "batched: cache vs recompute";
  EXPECT_EQ(cached_batch, run(model, kPrompts, greedy, n, 1, true)) << "batched vs alone (cache)";
  EXPECT_EQ(cached_batch, run(model, kPrompts, greedy, n, 1, false)) << "batched vs alone (recompute)";
  // Seeded sampling: a sequence draws the same tokens in a batch as alone, through the device top-k path
  // (top_k set) and the full-row path (repetition penalty).
  SamplingParams topk;
  topk.temperature = 0.8f;
  topk.top_k = 20;
  topk.seed = 9;
  EXPECT_EQ(run(model, kPrompts, topk, n, 3, true), run(model, kPrompts, topk, n, 1, true));
  SamplingParams full = topk;
  full.top_k = 0;
  full.top_p = 0.9f;
  full.repetition_penalty = 1.3f;
  EXPECT_EQ(run(model, kPrompts, full, n, 3, true), run(model, kPrompts, full, n, 1, true));
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateFixture, ::testing::ValuesIn(test::fixture_names()));

TEST(Generate, VulkanMatchesCpu) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  const Device d = Device::vulkan(0);
  models::Decoder cpu = models::load_decoder(model_fixture("gemma2"), DType::f32, DType::f32, Device::cpu());
  models::Decoder gpu = models::load_decoder(model_fixture("gemma2"), DType::f32, DType::f32, d);
  SamplingParams greedy;
  EXPECT_EQ(run(gpu, kPrompts, greedy, 8, 3, true), run(cpu, kPrompts, greedy, 8, 3, true));
}

// Greedy steps over a cache are pipelined (a step is recorded on the device's argmax of the one before, and the
// host reads that argmax afterwards): the first step accepts nothing, and the tokens equal those of the
// unpipelined path (taken when log-probs are asked for), rows finishing at different steps, on the CPU and on
// Vulkan.
TEST(Generate, PipelinedGreedyStepsLagOneAndEqualUnpipelined) {
  std::vector<Device> devices{Device::cpu()};
  if (!vk::list_devices().empty()) devices.push_back(Device::vulkan(0));
  for (const Device& d : devices) {
    SCOPED_TRACE(d.str());
    models::Decoder model = models::load_decoder(model_fixture("qwen3"), DType::f32, DType::f32, d);
    auto decode = [&](bool logprobs) {
      std::vector<Sequence> seqs;
      const int max_tokens[] = {5, 9, 12};
      for (size_t i = 0; i < kPrompts.size(); ++i) {
        StopParams stop;
        stop.max_tokens = max_tokens[i];
        seqs.emplace_back(kPrompts[i], SamplingParams{}, stop);
        if (logprobs) seqs.back().set_logprobs(0);
      }
      std::vector<Sequence*> rows;
      for (auto& s : seqs) rows.push_back(&s);
      Session session(model, 3);
      session.prefill(rows);
      session.step();
      for (const auto& s : seqs) EXPECT_EQ(s.generated().size(), logprobs ? 2u : 1u);
      while (session.step() > 0) {
      }
      std::vector<std::vector<int32_t>> out;
      for (const auto& s : seqs) {
        EXPECT_EQ(s.finish_reason(), FinishReason::length);
        out.push_back(s.generated());
      }
      return out;
    };
    const auto pipelined = decode(false);
    EXPECT_EQ(pipelined, decode(true));
    EXPECT_EQ(pipelined[2].size(), 12u);
  }
}

// ---- stops and streaming (tiny qwen3 with its tokenizer) ----

struct Tiny {
  models::Decoder model = models::load_decoder(test::tiny_model_dir(), DType::f32, DType::f32, Device::cpu());
  const Tokenizer& tok = test::tiny_tokenizer();
  std::vector<int32_t> prompt = tok.encode("The quick brown fox", true);

  Sequence generate_one(StopParams stop, std::string* streamed = nullptr) {
    std::vector<Sequence> seqs;
    seqs.emplace_back(prompt, SamplingParams{}, std::move(stop), &tok);
    generate(model, seqs, 1, [&](size_t, const std::string& piece) {
      if (streamed) *streamed += piece;
    });
    return std::move(seqs[0]);
  }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

TEST(Generate, StreamedTextEqualsFullDecode) {
  StopParams stop;
  stop.max_tokens = 24;
  std::string streamed;
  Sequence s = tiny().generate_one(stop, &streamed);
  EXPECT_EQ(s.finish_reason(), FinishReason::length);
  ASSERT_EQ(s.generated().size(), 24u);
  EXPECT_EQ(streamed, tiny().tok.decode(s.generated(), /*skip_special_tokens=*/true));
  EXPECT_EQ(streamed, s.text());
}

TEST(Generate, StopIdsEndGenerationAndAreNotEmitted) {
  StopParams stop;
  stop.max_tokens = 24;
  Sequence full = tiny().generate_one(stop);
  const auto& g = full.generated();
  stop.stop_ids = tiny().tok.eos_ids();
  stop.stop_ids.push_back(g[6]);
  size_t first = size_t(std::find(g.begin(), g.end(), g[6]) - g.begin());
  Sequence s = tiny().generate_one(stop);
  EXPECT_EQ(s.finish_reason(), FinishReason::stop_id);
  EXPECT_EQ(s.generated(), std::vector<int32_t>(g.begin(), g.begin() + std::ptrdiff_t(first)));
  EXPECT_EQ(s.text(), tiny().tok.decode(s.generated(), true));
}

TEST(Generate, StopStringsCutTheTextBeforeThem) {
  StopParams stop;
  stop.max_tokens = 24;
  Sequence full = tiny().generate_one(stop);
  const std::string text = full.text();
  ASSERT_GT(text.size(), 8u);
  // A stop string made of a later token's text (and one that never occurs).
  std::string piece = tiny().tok.decode({full.generated()[10]}, true);
  ASSERT_FALSE(piece.empty());
  stop.stop_strings = {"\x01never\x02", piece};
  std::string streamed;
  Sequence s = tiny().generate_one(stop, &streamed);
  EXPECT_EQ(s.finish_reason(), FinishReason::stop_string);
  EXPECT_EQ(s.text(), text.substr(0, text.find(piece)));
  EXPECT_EQ(streamed, s.text());
  EXPECT_LE(s.generated().size(), 11u);
}

TEST(TextStream, HoldsBackPossibleStopPrefixes) {
  const Tokenizer& tok = tiny().tok;
  std::vector<int32_t> ids = tok.encode("hello world, this is the end. More text", false);
  TextStream st(tok, {"the end"});
  std::string out;
  for (int32_t id : ids) out += st.push(id);
  out += st.finish();
  EXPECT_TRUE(st.stopped());
  EXPECT_EQ(out, "hello world, this is ");
  TextStream plain(tok, {});
  out.clear();
  for (int32_t id : ids) out += plain.push(id);
  out += plain.finish();
  EXPECT_EQ(out, "hello world, this is the end. More text");
}

TEST(Generate, BadRequestsThrow) {
  EXPECT_THROW(Sequence({}, SamplingParams{}, StopParams{}), ConfigError);
  SamplingParams bad;
  bad.top_p = 0;
  EXPECT_THROW(Sequence({1}, bad, StopParams{}), ConfigError);
  StopParams s;
  s.stop_strings = {"x"};
  EXPECT_THROW(Sequence({1}, SamplingParams{}, s), ConfigError);  // stop strings need a tokenizer
  s = {};
  s.max_tokens = 0;
  Sequence done({1}, SamplingParams{}, s);
  EXPECT_TRUE(done.finished());
}

}  // namespace
}  // namespace lmtune::infer
