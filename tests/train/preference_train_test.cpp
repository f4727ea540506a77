// Preference training end to end through `lmtune train`: on a synthetic task (the chosen answer is always the
// same pattern, the rejected one a random word) DPO, SimPO and ORPO raise the held-out accuracy of chosen over
// rejected far above chance, and the reward metrics reach metrics.jsonl; bad recipes and data fail with the key
// or file and line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/random.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

// Pairs whose chosen response is always " ok!" and whose rejected one is a random lowercase word; prompts vary.
std::string preference_pairs(int n, uint64_t seed) {
  Rng rng(seed);
  auto word = [&](int len) {
    std::string w;
    for (int i = 0; i < len; ++i) w += char('a' + rng.next_u64() % 26);
    return w;
  };
  std::string out;
  for (int i = 0; i < n; ++i)
    out += R"({"prompt": "q )" + word(3) + R"(:", "chosen": " ok!", "rejected": " )" + word(4) + "\"}\n";
  return out;
}

struct PreferenceRun {
  TempDir dir{"pref"};
  fs::path model = make_tiny_model(dir.path / "model");
  fs::path train = dir.write("train.jsonl", preference_pairs(48, 1));
  fs::path valid = dir.write("valid.jsonl", preference_pairs(16, 2));
  fs::path save = dir.path / "out";
  fs::path recipe = dir.write("recipe.yaml", recipe_yaml(model, train, save) + "objective: dpo\n");

  ChildResult run(const std::vector<std::string>& overrides) {
    std::vector<std::string> args{"train", recipe.string(), "--device", "cpu", "data.valid=" + valid.string(),
                                  "eval.every=10", "train.steps=30", "optimizer.lr=2.0e-2"};
    args.insert(args.end(), overrides.begin(), overrides.end());
    return run_lmtune(args);
  }
  std::vector<MetricsRow> valid_rows() const {
    std::vector<MetricsRow> out;
    for (const MetricsRow& r : read_metrics_jsonl(save / "metrics.jsonl"))
      if (r.split == "valid") out.push_back(r);
    return out;
  }
};

// `lmtune eval` loss on the held-out pairs' chosen answers as prompt/completion records, with or without the
// trained adapter.
double chosen_answer_loss(PreferenceRun& run, bool adapter) {
  std::string records;
  std::ifstream in(run.valid);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json pair = nlohmann::json::parse(line);
    records += nlohmann::json{{"prompt", pair["prompt"]}, {"completion", pair["chosen"]}}.dump() + "\n";
  }
  const fs::path data = run.dir.write("chosen.jsonl", records);
  std::vector<std::string> args{"--device", "cpu", "eval", "--model", run.model.string(), "--data", data.string(),
                                "--json", "--no-generate", "--log-level", "warn"};
  if (adapter) args.insert(args.end(), {"--adapter", (run.save / "adapter").string()});
  const ChildResult r = run_lmtune(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t brace = r.output.rfind("\n{");
  return nlohmann::json::parse(r.output.substr(brace == std::string::npos ? 0 : brace + 1))["loss"].get<double>();
}

}  // namespace

class PreferenceTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(PreferenceTraining, RaisesHeldOutAccuracy) {
  PreferenceRun run;
  ChildResult r = run.run({"objective=" + GetParam(), "preference.beta=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| accuracy "), std::string::npos) << "the progress line shows the accuracy";
  std::vector<MetricsRow> valid = run.valid_rows();
  ASSERT_EQ(valid.size(), 4u);  // steps 0, 10, 20, 30
  const MetricsRow &first = valid.front(), &last = valid.back();
  EXPECT_EQ(last.get("pairs"), 16);
  EXPECT_GT(last.get("accuracy"), 0.9) << r.output;
  EXPECT_GT(last.get("reward_margin"), first.get("reward_margin") + 0.1) << r.output;
  EXPECT_LT(last.get("loss"), first.get("loss")) << r.output;
  if (GetParam() == "dpo") {
    // The adapter starts at B = 0: the policy is the reference, so every reward is 0 and no pair is won yet.
    EXPECT_EQ(first.get("accuracy"), 0);
    EXPECT_NEAR(first.get("chosen_reward"), 0, 1e-6);
  }
  // The SFT loss on the held-out chosen answers stays sane: finite, and not far above the base model's (DPO may
  // lower a chosen answer's likelihood while it widens the margin, but must not wreck the language model).
  const double base = chosen_answer_loss(run, false), tuned = chosen_answer_loss(run, true);
  EXPECT_TRUE(std::isfinite(tuned)) << tuned;
  EXPECT_LT(tuned, base + 1.0) << "chosen-answer loss " << base << " -> " << tuned;
  bool train_metrics = false;
  for (const MetricsRow& m : read_metrics_jsonl(run.save / "metrics.jsonl"))
    train_metrics = train_metrics || (m.split == "train" && !std::isnan(m.get("rejected_reward")));
  EXPECT_TRUE(train_metrics);
  EXPECT_TRUE(fs::exists(run.save / "adapter" / "adapter_model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Objectives, PreferenceTraining, ::testing::Values("dpo", "simpo", "orpo"));

// A preference run stopped after step 3 and resumed continues the same pair order and optimizer state: its losses
// equal those of a run straight through (grad accumulation and LoRA dropout included).
TEST(PreferenceTrainingResume, ResumedRunMatchesStraightRun) {
  PreferenceRun run;
  const std::vector<std::string> common{"train.grad_accum=2", "lora.dropout=0.1", "save.every=3", "eval.every=0",
                                        "train.batch_size=3"};
  auto args = [&](const fs::path& save, int steps, bool resume) {
    std::vector<std::string> a{"train", run.recipe.string(), "--device", "cpu", "save.dir=" + save.string(),
                               "train.steps=" + std::to_string(steps), resume ? "resume=true" : "resume=false"};
    a.insert(a.end(), common.begin(), common.end());
    return a;
  };
  const fs::path straight = run.dir.path / "straight", split = run.dir.path / "split";
  ASSERT_EQ(run_lmtune(args(straight, 6, false)).exit_code, 0);
  ASSERT_EQ(run_lmtune(args(split, 3, false)).exit_code, 0);
  ChildResult resumed = run_lmtune(args(split, 6, true));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  const std::vector<double> a = train_losses(straight), b = train_losses(split);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-6 * std::max(1.0, std::fabs(a[i]))) << "step " << i + 1;
}

TEST(PreferenceTrainingErrors, RecipeAndDataErrorsNameKeyOrLine) {
  PreferenceRun run;
  ChildResult full = run.run({"finetune=full"});
  EXPECT_NE(full.exit_code, 0);
  EXPECT_NE(full.output.find("key 'objective': dpo needs finetune: lora"), std::string::npos) << full.output;
  const fs::path bad = run.dir.write("bad.jsonl", preference_pairs(2, 3) + R"({"prompt": "q", "chosen": "x"})" "\n");
  ChildResult data = run.run({"data.train=" + bad.string()});
  EXPECT_NE(data.exit_code, 0);
  EXPECT_NE(data.output.find("bad.jsonl:3: missing key \"rejected\""), std::string::npos) << data.output;
}

TEST(PreferenceTrainingErrors, DryRunCountsPairs) {
  PreferenceRun run;
  ChildResult r = run_lmtune({"train", run.recipe.string(), "--dry-run", "data.valid=" + run.valid.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training data (preference pairs)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pairs             48 (of 48 lines)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pairs             16 (of 16 lines)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("steps/epoch       12 (4 pairs per step)"), std::string::npos) << r.output;
}
