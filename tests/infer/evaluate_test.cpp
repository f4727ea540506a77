// Evaluation: evaluate_loss equals a direct per-sample computation (each sample alone, full logits, the
// dataset's trainable mask) with and without packing and for any batch size, and the generation metrics.
#include <gtest/gtest.h>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "infer/evaluate.h"
#include "infer/generator.h"
#include "infer_test_util.h"
#include "models/weights.h"

namespace lmtune::infer {
namespace {

using test::TempDir;

// Σ -log p(ids[i] | ids[<i]) over trainable i >= 1, each sample run alone without padding.
std::pair<double, int64_t> direct_loss(const models::Decoder& m, const Dataset& ds) {
  NoGrad no_grad;
  double sum = 0;
  int64_t n = 0;
  for (const Sample& s : ds.samples) {
    const int64_t T = int64_t(s.ids.size());
    std::vector<float> logits = m.forward(Tensor::from_ints(s.ids, {1, T}, Device::cpu()),
                                          models::default_positions(1, T, Device::cpu())).to_floats();
    const int64_t V = int64_t(logits.size()) / T;
    for (int64_t i = 1; i < T; ++i) {
      if (!s.trainable[size_t(i)]) continue;
      const float* row = logits.data() + (i - 1) * V;
      double mx = *std::max_element(row, row + V), z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      sum += mx + std::log(z) - double(row[s.ids[size_t(i)]]);
      ++n;
    }
  }
  return {sum / double(n), n};
}

TEST(EvaluateLoss, EqualsDirectComputation) {
  models::Decoder m = models::load_decoder(test::tiny_model_dir(), DType::f32, DType::f32, Device::cpu());
  const Tokenizer& tok = test::tiny_tokenizer();
  TempDir dir;
  auto file = dir.write("eval.jsonl",
                        "{\"prompt\": \"What is two plus two?\", \"completion\": \" Four.\"}\n"
                        "{\"prompt\": \"Name a colour:\", \"completion\": \" Blue, or perhaps green.\"}\n"
                        "{\"prompt\": \"Hi\", \"completion\": \" Hello there, how are you today?\"}\n");
  DataOptions o;
  o.max_seq_len = 64;
  Dataset ds = load_dataset(file, tok, o);
  auto [want, count] = direct_loss(m, ds);
  for (bool packing : {false, true})
    for (int batch : {1, 2}) {
      LossResult r = evaluate_loss(m, ds, batch, 64, packing);
      EXPECT_EQ(r.tokens, count) << packing << " " << batch;
      EXPECT_NEAR(r.loss, want, 1e-5 * want) << "packing " << packing << " batch " << batch;
      EXPECT_NEAR(r.ppl(), std::exp(want), 1e-4 * std::exp(want));
    }
  LossResult first = evaluate_loss(m, ds, 1, 64, false, /*max_batches=*/1);
  EXPECT_EQ(first.batches, 1);
  EXPECT_EQ(first.tokens, int64_t(std::count(ds.samples[0].trainable.begin() + 1, ds.samples[0].trainable.end(), 1)));
}

TEST(EvaluateGeneration, ExactMatchAndContains) {
  models::Decoder m = models::load_decoder(test::tiny_model_dir(), DType::f32, DType::f32, Device::cpu());
  const Tokenizer& tok = test::tiny_tokenizer();
  // The model's own greedy continuation is an exact match; an unrelated completion is not.
  std::vector<Sequence> seqs;
  StopParams stop;
  stop.max_tokens = 6;
  stop.stop_ids = tok.eos_ids();
  seqs.emplace_back(tok.encode("Once upon a time", true), SamplingParams{}, stop, &tok);
  generate(m, seqs, 1);
  std::string own = seqs[0].text();
  ASSERT_FALSE(strip(own).empty());
  // The metric generates completion tokens + 16, so the own continuation appears inside a longer output.
  GenerationMetrics g = evaluate_generation(m, tok, {{"Once upon a time", own}, {"Hello", "zebra crossing"}}, 2);
  EXPECT_EQ(g.examples, 2);
  EXPECT_DOUBLE_EQ(g.contains, 0.5);
  EXPECT_LE(g.exact_match, 0.5);
  EXPECT_EQ(strip("  a b \n"), "a b");
}

TEST(EvaluateGeneration, ReadsPromptCompletionFilesOnly) {
  TempDir dir;
  EXPECT_TRUE(read_prompt_completions(dir.write("t.jsonl", "{\"text\": \"abc\"}\n")).empty());
  EXPECT_EQ(read_prompt_completions(dir.write("c.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n")).size(), 1u);
  EXPECT_THROW(read_prompt_completions(dir.path / "missing.jsonl"), FileError);
  EXPECT_THROW(read_prompt_completions(dir.write("bad.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n{oops\n")),
               FileError);
  // A number beyond double is nlohmann's out_of_range, not a parse_error: still the file's own error, with its line.
  try {
    read_prompt_completions(dir.write("big.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\", \"w\": 1e999}\n"));
    ADD_FAILURE() << "no error";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("big.jsonl:1: invalid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmtune::infer
