// The serving engine (infer::BatchEngine): sequences that join a running batch at different times, each with
// its own adapter (or none), produce exactly the tokens that the plain generation engine (infer::Session) gives
// for them alone on a decoder carrying only that adapter; rows leave as they finish; the cache stays trimmed;
// greedy steps are pipelined.
#include <gtest/gtest.h>

#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "infer/batch_engine.h"
#include "infer/generator.h"
#include "serve_test_util.h"

namespace lmtune::serve {
namespace {

using test::adapter_dir;
using test::tiny_model_dir;

models::Decoder decoder_with(const std::vector<std::string>& adapters, Device device = Device::cpu()) {
  models::Decoder m = models::load_decoder(tiny_model_dir(), DType::f32, DType::f32, device);
  for (const std::string& a : adapters) models::attach_peft(m.weights(), load_peft_adapter(adapter_dir(a)), a, 1.0f);
  return m;
}

struct Case {
  std::vector<int32_t> prompt;
  std::string adapter;
  infer::SamplingParams sampling;
  int max_tokens;
};

std::vector<Case> cases() {
  infer::SamplingParams greedy;
  infer::SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_k = 20;
  seeded.seed = 7;
  infer::SamplingParams full;  // reads whole rows back (top-p without top-k)
  full.temperature = 0.7f;
  full.top_p = 0.9f;
  full.seed = 3;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 99},     {3, 42, 7, 1, 2, 64, 100}, {11, 9},
                                                     {120, 33, 8, 6}, {71, 20, 2, 14, 15, 16},   {1000}};
  const std::vector<std::string> adapters = {"", "alpha", "beta", "gamma"};
  std::vector<Case> out;
  for (size_t i = 0; i < 12; ++i) {
    infer::SamplingParams sp = i % 5 == 3 ? seeded : i % 7 == 5 ? full : greedy;
    out.push_back({prompts[i % prompts.size()], adapters[i % adapters.size()], sp, int(4 + (i * 5) % 11)});
  }
  return out;
}

std::vector<int32_t> alone(const Case& c, Device device = Device::cpu()) {
  models::Decoder m = decoder_with(c.adapter.empty() ? std::vector<std::string>{} : std::vector<std::string>{c.adapter},
                                   device);
  infer::StopParams stop;
  stop.max_tokens = c.max_tokens;
  std::vector<infer::Sequence> seqs;
  seqs.emplace_back(c.prompt, c.sampling, stop);
  infer::generate(m, seqs, 1);
  return seqs[0].generated();
}

// Joins of one to three requests at a time into a batch of up to 8 rows: each one gives the tokens it gives alone.
void expect_staggered_requests_equal_each_alone(const models::Decoder& served, Device device = Device::cpu()) {
  const std::vector<Case> cs = cases();
  infer::BatchEngine engine(served, 8, /*cache_chunk=*/8);
  std::vector<std::unique_ptr<infer::Sequence>> seqs;
  for (const Case& c : cs) {
    infer::StopParams stop;
    stop.max_tokens = c.max_tokens;
    seqs.push_back(std::make_unique<infer::Sequence>(c.prompt, c.sampling, stop));
  }
  size_t next = 0;
  int steps = 0;
  while (next < cs.size() || engine.size() > 0) {
    // Join one, two or three at a time, whenever there is room.
    std::vector<infer::Sequence*> join;
    std::vector<std::string> names;
    size_t want = 1 + steps % 3;
    while (next < cs.size() && join.size() < want && engine.size() + int64_t(join.size()) < engine.max_batch()) {
      join.push_back(seqs[next].get());
      names.push_back(cs[next].adapter);
      ++next;
    }
    engine.join(join, names);
    engine.step();
    std::vector<infer::Sequence*> done;
    for (infer::Sequence* s : engine.sequences())
      if (s->finished()) done.push_back(s);
    engine.remove(done);
    ++steps;
    ASSERT_LT(steps, 500);
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    EXPECT_TRUE(seqs[i]->finished());
    EXPECT_EQ(seqs[i]->generated(), alone(cs[i], device)) << "case " << i << " adapter '" << cs[i].adapter << "'";
  }
  EXPECT_EQ(engine.cache_bytes(), 0u);  // everything left: the cache holds no rows
}

TEST(BatchEngine, StaggeredMixedAdapterRequestsEqualEachAlone) {
  expect_staggered_requests_equal_each_alone(decoder_with({"alpha", "beta", "gamma"}));
}

// As `lmtune serve` loads it: q, k, v and gate, up as one product each (models::fuse_projections), the rows'
// deltas by id on the parts that have them.
TEST(BatchEngine, StaggeredMixedAdapterRequestsEqualEachAloneThroughProjectionGroups) {
  models::Decoder served = decoder_with({"alpha", "beta", "gamma"});
  models::fuse_projections(served.weights());
  expect_staggered_requests_equal_each_alone(served);
}

// On Vulkan (lavapipe in CI): the cache's rows move by Backend::copy there.
TEST(BatchEngine, StaggeredMixedAdapterRequestsEqualEachAloneOnVulkan) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  const Device gpu = parse_device("vulkan:0");
  expect_staggered_requests_equal_each_alone(decoder_with({"alpha", "beta", "gamma"}, gpu), gpu);
}

// Every decoder family of the fixtures (sliding windows, soft-capping, q/k norms, biases), with two random
// adapters made on the fly: staggered joins equal each sequence alone. Prompts and outputs run past the
// fixtures' sliding window, so right-aligned rows must keep window masks right.
models::Decoder fixture_with(const std::string& arch, const std::vector<std::string>& adapters) {
  models::Decoder m = models::load_decoder(infer::test::model_fixture(arch), DType::f32, DType::f32, Device::cpu());
  for (const std::string& name : adapters) {
    uint64_t seed = name == "a" ? 1 : 2;
    models::add_lora(m.weights(), {name == "a" ? "q_proj" : "all-linear"}, 2, 1.0f, seed, name);
    uint64_t s = seed * 1000;
    for (models::Linear* l : m.weights().linears())
      for (auto& a : l->adapters)
        if (a.name == name) a.B = Tensor::randn(a.B.shape(), s++, 0.3f);
  }
  return m;
}

class EngineFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineFixture, StaggeredJoinsEqualAlone) {
  const std::string arch = GetParam();
  models::Decoder served = fixture_with(arch, {"a", "b"});
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 99}, {3, 42, 7, 1, 2, 64, 100}, {11, 9, 120, 33, 8, 6},
                                                     {7}, {60, 61, 62, 63, 64, 65, 66, 67, 68}};
  const std::vector<std::string> names = {"", "a", "b", "a", ""};
  infer::BatchEngine engine(served, 4, /*cache_chunk=*/4);
  std::vector<std::unique_ptr<infer::Sequence>> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    infer::StopParams stop;
    stop.max_tokens = int(6 + 2 * i);
    seqs.push_back(std::make_unique<infer::Sequence>(prompts[i], infer::SamplingParams{}, stop));
  }
  size_t next = 0;
  for (int step = 0; next < seqs.size() || engine.size() > 0; ++step) {
    if (next < seqs.size() && engine.size() < engine.max_batch() && step % 2 == 0) {
      engine.join({seqs[next].get()}, {names[next]});
      ++next;
    }
    engine.step();
    std::vector<infer::Sequence*> done;
    for (infer::Sequence* s : engine.sequences())
      if (s->finished()) done.push_back(s);
    engine.remove(done);
    ASSERT_LT(step, 300);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    models::Decoder ref = fixture_with(arch, names[i].empty() ? std::vector<std::string>{}
                                                              : std::vector<std::string>{names[i]});
    infer::StopParams stop;
    stop.max_tokens = int(6 + 2 * i);
    std::vector<infer::Sequence> one;
    one.emplace_back(prompts[i], infer::SamplingParams{}, stop);
    infer::generate(ref, one, 1);
    EXPECT_EQ(seqs[i]->generated(), one[0].generated()) << arch << " sequence " << i << " adapter '" << names[i] << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineFixture, ::testing::ValuesIn(infer::test::fixture_names()));

TEST(BatchEngine, AdaptersChangeTheOutput) {
  // Guards the test above against adapters that do nothing on this tiny model.
  Case base{{3, 42, 7, 1, 2, 64, 100}, "", {}, 10};
  std::vector<int32_t> ref = alone(base);
  int differ = 0;
  for (const char* a : {"alpha", "beta", "gamma"}) {
    Case c = base;
    c.adapter = a;
    differ += alone(c) != ref;
  }
  EXPECT_GE(differ, 2);
}

// All-greedy rows pipeline their steps: greedy newcomers' first tokens stay on the device and are fed by the next
// step, each step feeds the one before's tokens, and a leave keeps the pipeline (the sequence that left gets
// nothing more). A sampled newcomer is sampled at once and takes the recorded tokens first; with it in the batch
// every step feeds its tokens at once.
TEST(BatchEngine, GreedyStepsLagOneAndSampledRowsDoNot) {
  models::Decoder served = decoder_with({});
  infer::BatchEngine engine(served, 4);
  infer::StopParams stop;
  stop.max_tokens = 8;
  infer::Sequence a({1, 2}, {}, stop), b({3}, {}, stop), c({5, 6}, {}, stop);
  engine.join({&a, &b}, {"", ""});
  EXPECT_EQ(a.generated().size(), 0u);
  engine.step();
  EXPECT_EQ(a.generated().size(), 1u);  // the prefill's token
  engine.step();
  EXPECT_EQ(a.generated().size(), 2u);
  EXPECT_EQ(b.generated().size(), 2u);
  engine.remove({&b});  // while a step's tokens are on their way
  engine.join({&c}, {""});
  engine.step();
  EXPECT_EQ(a.generated().size(), 3u);
  EXPECT_EQ(b.generated().size(), 2u);
  EXPECT_EQ(c.generated().size(), 1u);
  infer::SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_k = 20;
  seeded.seed = 7;
  infer::Sequence d({4}, seeded, stop);
  engine.join({&d}, {""});
  EXPECT_EQ(d.generated().size(), 1u);
  EXPECT_EQ(a.generated().size(), 4u);
  engine.step();
  EXPECT_EQ(a.generated().size(), 5u);
  EXPECT_EQ(d.generated().size(), 2u);
  // Decode tokens: a and b at the second step; a at the third; a and c at the join; a, c and d at the last.
  EXPECT_EQ(engine.stats().decode_tokens, 2 + 1 + 2 + 3);
}

TEST(BatchEngine, RefusesUnknownAdaptersAndOverfullBatches) {
  models::Decoder served = decoder_with({"alpha"});
  infer::BatchEngine engine(served, 2);
  infer::StopParams stop;
  stop.max_tokens = 3;
  infer::Sequence a({1, 2}, {}, stop), b({3}, {}, stop), c({4}, {}, stop);
  EXPECT_THROW(engine.join({&a}, {"nope"}), ConfigError);
  engine.join({&a, &b}, {"alpha", ""});
  EXPECT_EQ(engine.size(), 2);
  EXPECT_THROW(engine.join({&c}, {""}), ConfigError);
  engine.remove({&a});
  engine.join({&c}, {""});
  EXPECT_EQ(engine.size(), 2);
}

}  // namespace
}  // namespace lmtune::serve
