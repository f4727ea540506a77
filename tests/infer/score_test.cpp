// infer::score_tokens against the float64 reference of scripts/reference_logprobs.py (the Llama fixture with a
// character-level tokenizer): per-token log-probs and top-5 alternatives, batched or not, with and without the
// LoRA adapter, on the CPU and on Vulkan; multiple-choice predictions and accuracy; bad records name file:line.
#include <gtest/gtest.h>

#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "infer/adapters.h"
#include "infer/score.h"
#include "logprobs_fixture.h"
#include "models/weights.h"

namespace lmtune::infer::test {
namespace {

std::vector<ScoreRequest> fixture_requests(const Tokenizer& tok) {
  std::vector<ScoreRequest> out;
  for (const CompletionRecord& r : read_completion_records(logprobs_fixture("records.jsonl")))
    out.push_back(completion_request(tok, r.prompt, r.completion, "records"));
  return out;
}

void expect_matches(const std::vector<std::vector<TokenScore>>& got, const std::string& which, bool top) {
  const nlohmann::json& want = logprobs_expected()[which];
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "record " << i;
    for (size_t j = 0; j < got[i].size(); ++j) {
      const nlohmann::json& w = want[i][j];
      EXPECT_EQ(got[i][j].id, w["id"].get<int32_t>());
      EXPECT_NEAR(got[i][j].logprob, w["logprob"].get<double>(), kLogprobTol) << which << " " << i << "." << j;
      if (!top) continue;
      ASSERT_EQ(got[i][j].top.size(), w["top"].size());
      for (size_t k = 0; k < got[i][j].top.size(); ++k) {
        EXPECT_NEAR(got[i][j].top[k].logprob, w["top"][k][1].get<double>(), kLogprobTol);
        // Near-ties may swap between float32 and float64; the value above is what must agree.
        if (k + 1 < w["top"].size() && w["top"][k][1].get<double>() - w["top"][k + 1][1].get<double>() > 1e-3) {
          EXPECT_EQ(got[i][j].top[k].id, w["top"][k][0].get<int32_t>());
        }
      }
    }
  }
}

class ScoreReference : public ::testing::TestWithParam<std::string> {
 protected:
  Device device() {
    if (GetParam() == "cpu") return Device::cpu();
    if (vk::list_devices().empty()) return Device::cpu();
    return Device::vulkan(0);
  }
  void SetUp() override {
    if (GetParam() == "vulkan" && vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  }
};

TEST_P(ScoreReference, TokenLogprobsEqualReference) {
  Tokenizer tok = Tokenizer::load(logprobs_model_dir());
  models::Decoder decoder = models::load_decoder(logprobs_model_dir(), DType::f32, DType::f32, device());
  auto requests = fixture_requests(tok);
  for (int batch : {1, 3}) {
    ScoreOptions opt;
    opt.batch_size = batch;
    expect_matches(score_tokens(decoder, requests, opt), "base", false);  // fused losses
    opt.top_n = 5;
    expect_matches(score_tokens(decoder, requests, opt), "base", true);  // logits + log-softmax
  }
  load_adapter(decoder, parse_adapter_spec(logprobs_adapter().string()));
  ScoreOptions opt;
  opt.batch_size = 4;
  expect_matches(score_tokens(decoder, requests, opt), "lora", false);
  opt.adapter = "";  // the server's "base model alone" with the adapter attached
  expect_matches(score_tokens(decoder, requests, opt), "base", false);
  opt.adapter = "adapter";  // the slot's name: the directory's
  opt.top_n = 3;
  expect_matches(score_tokens(decoder, requests, opt), "lora", false);
}

TEST_P(ScoreReference, ChoicesPredictTheReferenceAnswers) {
  Tokenizer tok = Tokenizer::load(logprobs_model_dir());
  models::Decoder decoder = models::load_decoder(logprobs_model_dir(), DType::f32, DType::f32, device());
  const std::string file = logprobs_fixture("choices.jsonl").string();
  std::vector<ChoiceRecord> records = read_choice_records(file);
  std::vector<ChoiceScores> got = score_choices(decoder, tok, records, file, 5);
  const nlohmann::json& want = logprobs_expected()["choices"];
  ASSERT_EQ(got.size(), want.size());
  int64_t norm_right = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].choices.size(), want[i]["logprobs"].size());
    for (size_t c = 0; c < got[i].choices.size(); ++c) {
      EXPECT_NEAR(got[i].choices[c].logprob, want[i]["logprobs"][c].get<double>(), 4 * kLogprobTol);
      EXPECT_EQ(got[i].choices[c].chars, int64_t(records[i].choices[c].size()));
    }
    EXPECT_EQ(got[i].predicted, want[i]["answer"].get<int>());
    EXPECT_EQ(got[i].predicted_norm, want[i]["answer_norm"].get<int>());
    norm_right += want[i]["answer_norm"].get<int>() == records[i].answer;
  }
  ChoiceAccuracy acc = choice_accuracy(records, got);
  EXPECT_EQ(acc.examples, 4);
  EXPECT_DOUBLE_EQ(acc.acc, 1.0);  // the answers are the reference's argmax
  EXPECT_DOUBLE_EQ(acc.acc_norm, double(norm_right) / 4);
  EXPECT_LT(norm_right, 4) << "the fixture should make acc and acc_norm differ";
}

INSTANTIATE_TEST_SUITE_P(Devices, ScoreReference, ::testing::Values("cpu", "vulkan"),
                         [](const auto& info) { return info.param; });

TEST(ScoreRecords, BadRecordsNameFileAndLine) {
  TempDir dir;
  auto message = [&](const std::string& text, bool choices) {
    fs::path f = dir.write("bad.jsonl", text);
    try {
      if (choices)
        read_choice_records(f);
      else
        read_completion_records(f);
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  EXPECT_NE(message(ok + "\n{\"prompt\": \"a\"}\n", false).find("bad.jsonl:3: expected a string \"completion\""),
            std::string::npos);
  EXPECT_NE(message(ok + "{nope\n", false).find("bad.jsonl:2: invalid JSON"), std::string::npos);
  EXPECT_NE(message("[1]\n", false).find("bad.jsonl:1: expected a JSON object"), std::string::npos);
  EXPECT_NE(message("", false).find("no records"), std::string::npos);
  const std::string mc = "{\"prompt\": \"a\", \"choices\": [\"x\", \"y\"], \"answer\": ";
  EXPECT_EQ(message(mc + "1}\n", true), "no error");
  EXPECT_NE(message(mc + "2}\n", true).find("bad.jsonl:1: expected \"answer\""), std::string::npos);
  EXPECT_NE(message(mc + "\"1\"}\n", true).find("bad.jsonl:1: expected \"answer\""), std::string::npos);
  EXPECT_NE(message("{\"prompt\": \"a\", \"choices\": [\"x\"], \"answer\": 0}\n", true).find("at least 2"),
            std::string::npos);
  EXPECT_NE(message(mc + "0}\n", false).find("--choices"), std::string::npos);
  Tokenizer tok = Tokenizer::load(logprobs_model_dir());
  EXPECT_THROW(completion_request(tok, "a", "", "f:1"), FileError);
}

TEST(ScoreRecords, TopLogprobsOrder) {
  std::vector<float> row = {-3, -1, -2, -1, -5};
  std::vector<TopLogprob> top = top_logprobs(row.data(), 5, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);  // ties by lower id
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 2);
  EXPECT_EQ(top_logprobs(row.data(), 5, 9).size(), 5u);
  EXPECT_TRUE(top_logprobs(row.data(), 5, 0).empty());
}

}  // namespace
}  // namespace lmtune::infer::test
