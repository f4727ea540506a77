// `lmtune train --devices 0,1` end to end on the CPU (two ranks under mpirun, started by the launcher): the same
// losses and adapter or model as one rank with twice the accumulation (SFT, DPO, ORPO), exact resume after kill -9, resume on
// another number of ranks (same global batch: allowed with a warning; another one: refused), and a rank that
// cannot open its device stopping the job with a message naming it while the last checkpoint stays intact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "dist/communicator.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

// Exercises what ranks must agree on: accumulation across ranks, LoRA dropout masks, clipping, a schedule,
// packing with uneven trainable tokens per micro-batch.
const std::vector<std::string> kSettings = {"train.steps=6",      "train.batch_size=2", "lora.dropout=0.1",
                                            "schedule.name=cosine", "schedule.warmup_steps=2", "save.every=2"};

struct DistRun {
  TempDir dir{"dist"};
  fs::path model, data;
  DistRun() {
    model = make_tiny_model(dir.path / "model");
    data = dir.write("train.jsonl", text_corpus(40));
  }
  // `lmtune train` into save.dir `name` on `devices` ("" = one process) with train.grad_accum `accum`.
  ChildResult train(const std::string& name, const std::string& devices, int accum,
                    std::vector<std::string> extra = {}, const std::map<std::string, std::string>& env = {}) {
    const fs::path recipe = dir.write(name + ".yaml", recipe_yaml(model, data, dir.path / name));
    std::vector<std::string> args{"train", recipe.string()};
    if (std::find(extra.begin(), extra.end(), "--device") == extra.end()) args.insert(args.end(), {"--device", "cpu"});
    if (!devices.empty()) args.insert(args.end(), {"--devices", devices});
    args.insert(args.end(), kSettings.begin(), kSettings.end());
    args.push_back("train.grad_accum=" + std::to_string(accum));
    args.insert(args.end(), extra.begin(), extra.end());
    return run_lmtune(args, env);
  }
  fs::path save(const std::string& name) const { return dir.path / name; }
};

std::vector<std::string> file_names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every tensor of every .safetensors file under `a` is within `rel` (relative to the tensor's largest value) of
// the one under `b`.
void expect_close_weights(const fs::path& a, const fs::path& b, double rel) {
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    SafetensorsFile fa(e.path()), fb(b / e.path().filename());
    ASSERT_EQ(fa.tensors().size(), fb.tensors().size());
    for (const SafetensorsTensor& ta : fa.tensors()) {
      const std::vector<float> va = ta.to_f32(), vb = fb.at(ta.name).to_f32();
      ASSERT_EQ(va.size(), vb.size()) << ta.name;
      double worst = 0, scale = 1e-3;
      for (size_t k = 0; k < va.size(); ++k) {
        worst = std::max(worst, double(std::abs(va[k] - vb[k])));
        scale = std::max(scale, double(std::abs(vb[k])));
      }
      EXPECT_LT(worst, rel * scale) << ta.name << " in " << e.path();
    }
  }
  EXPECT_GT(files, 0u) << a;
}

void expect_close_losses(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(got[s], want[s], rel * std::abs(want[s])) << "step " << s + 1;
}

// Preference pairs: the chosen response is always " ok!", the rejected one a word that varies; prompts vary.
std::string preference_pairs(int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += R"({"prompt": "question )" + std::to_string(i) + R"(:", "chosen": " ok!", "rejected": " no)" +
           std::string(size_t(1 + i % 5), 'o') + "\"}\n";
  return out;
}

#define REQUIRE_MPI() \
  if (!dist::mpi_built_in()) GTEST_SKIP() << "built without MPI"

}  // namespace

TEST(TrainDistCli, TwoRanksEqualOneRankWithTwiceTheAccumulation) {
  REQUIRE_MPI();
  DistRun run;
  ChildResult one = run.train("one", "", 2);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ChildResult two = run.train("two", "0,1", 1);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("launching 2 ranks"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("[rank 0] [info] done: 6 steps"), std::string::npos) << two.output;
  EXPECT_EQ(two.output.find("[rank 1] [info]"), std::string::npos) << "rank 1 logs only trouble:\n" << two.output;
  const std::vector<double> want = train_losses(run.save("one"));
  ASSERT_EQ(want.size(), 6u);
  expect_close_losses(train_losses(run.save("two")), want, 1e-5);
  expect_close_weights(run.save("two") / "adapter", run.save("one") / "adapter", 1e-4);
  EXPECT_EQ(file_names(run.save("two") / "checkpoints"), file_names(run.save("one") / "checkpoints"));
}

// DPO (with its reference pass) and ORPO (with its NLL term over the chosen tokens of the whole step): the losses,
// reward metrics and adapter of two ranks equal one rank with twice the accumulation.
TEST(TrainDistCli, PreferenceObjectivesOnTwoRanksEqualOneRank) {
  REQUIRE_MPI();
  for (const std::string objective : {"dpo", "orpo"}) {
    DistRun run;
    run.data = run.dir.write("pairs.jsonl", preference_pairs(24));
    const std::vector<std::string> pref{"objective=" + objective, "train.steps=3", "save.every=0"};
    ChildResult one = run.train("one", "", 2, pref);
    ASSERT_EQ(one.exit_code, 0) << objective << "\n" << one.output;
    ChildResult two = run.train("two", "0,1", 1, pref);
    ASSERT_EQ(two.exit_code, 0) << objective << "\n" << two.output;
    const std::vector<double> want = train_losses(run.save("one"));
    ASSERT_EQ(want.size(), 3u) << objective;
    if (objective == "dpo") {
      EXPECT_NEAR(want[0], std::log(2.0), 1e-4);  // the policy starts as its reference
    }
    expect_close_losses(train_losses(run.save("two")), want, 1e-5);
    expect_close_weights(run.save("two") / "adapter", run.save("one") / "adapter", 1e-4);
  }
}

TEST(TrainDistCli, FullFinetuneOnTwoRanksEqualsOneRank) {
  REQUIRE_MPI();
  DistRun run;
  const std::vector<std::string> full{"finetune=full", "optimizer.lr=1.0e-3", "train.steps=3", "save.every=0"};
  ChildResult one = run.train("one", "", 2, full);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ChildResult two = run.train("two", "0,1", 1, full);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  expect_close_losses(train_losses(run.save("two")), train_losses(run.save("one")), 1e-5);
  expect_close_weights(run.save("two") / "model", run.save("one") / "model", 1e-4);
}

TEST(TrainDistCli, ResumeAfterKillOnTwoRanksIsExact) {
  REQUIRE_MPI();
  DistRun run;
  ChildResult straight = run.train("straight", "0,1", 1);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::vector<double> want = train_losses(run.save("straight"));
  const std::string adapter = read_file_text(run.save("straight") / "adapter/adapter_model.safetensors");
  for (const char* crash : {"step-start@4", "checkpoint-write@4"}) {
    SCOPED_TRACE(crash);
    const std::string name = std::string("crash-") + std::string(crash).substr(0, 10);
    ChildResult killed = run.train(name, "0,1", 1, {}, {{"LMTUNE_TEST_CRASH_AT", crash}});
    EXPECT_NE(killed.exit_code, 0) << killed.output;
    EXPECT_NE(killed.output.find("exited on signal 9"), std::string::npos) << killed.output;  // mpirun names it
    EXPECT_TRUE(fs::exists(run.save(name) / "checkpoints/step-2.h5"));
    ChildResult resumed = run.train(name, "0,1", 1, {"resume=true"});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("step-2.h5 at step 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(train_losses(run.save(name)), want);
    EXPECT_TRUE(read_file_text(run.save(name) / "adapter/adapter_model.safetensors") == adapter)
        << "the resumed adapter differs from the uninterrupted run's";
  }
}

TEST(TrainDistCli, ResumeOnOtherRanksNeedsTheSameGlobalBatch) {
  REQUIRE_MPI();
  DistRun run;
  ChildResult straight = run.train("straight", "0,1", 1);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  ChildResult first = run.train("part", "0,1", 1, {"train.steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = read_file_text(run.save("part") / "checkpoints/step-2.h5");

  ChildResult refused = run.train("part", "", 1, {"resume=true"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("was trained on 2 rank(s) with train.grad_accum 1 (2 micro-batches per step), this "
                                "run has 1 rank(s) with 1 (1)"),
            std::string::npos)
      << refused.output;
  EXPECT_TRUE(read_file_text(run.save("part") / "checkpoints/step-2.h5") == before);

  ChildResult resumed = run.train("part", "", 2, {"resume=true"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("was trained on 2 rank(s), this run has 1"), std::string::npos) << resumed.output;
  expect_close_losses(train_losses(run.save("part")), train_losses(run.save("straight")), 1e-5);
}

TEST(TrainDistCli, RankThatCannotOpenItsDeviceStopsTheJob) {
  REQUIRE_MPI();
  DistRun run;
  ChildResult first = run.train("out", "0,1", 1, {"train.steps=2"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = read_file_text(run.save("out") / "checkpoints/step-2.h5");
  // Rank 1 asks for a Vulkan device that does not exist (rank 0 may get lavapipe's, or fail the same way).
  ChildResult failed = run.train("out", "0,7", 1, {"resume=true", "--device", "vulkan"});
  EXPECT_NE(failed.exit_code, 0) << failed.output;
  EXPECT_NE(failed.output.find("rank 1 of 2 on "), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("failed, stopping all ranks: device 'vulkan:7' does not exist"), std::string::npos)
      << failed.output;
  EXPECT_TRUE(read_file_text(run.save("out") / "checkpoints/step-2.h5") == before) << "the checkpoint changed";
  EXPECT_EQ(train_losses(run.save("out")).size(), 2u);
}
