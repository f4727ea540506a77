// End-to-end training in-process: the loss falls on a learnable task and validation beats the base model;
// gradient checkpointing gives the same losses with less memory; CPU and Vulkan agree; the files a run writes.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/vulkan/vulkan_backend.h"
#include "io/hdf5_file.h"
#include "io/peft_adapter.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

std::vector<double> train_losses(const fs::path& save_dir) {
  std::vector<double> out;
  for (const MetricsRow& r : read_metrics_jsonl(save_dir / "metrics.jsonl"))
    if (r.split == "train") out.push_back(r.get("loss"));
  return out;
}

struct TrainRun {
  TempDir dir{"run"};
  fs::path model, data, save;
  TrainRun(const std::string& corpus = text_corpus(48), const TinyModelSpec& spec = {}) {
    model = make_tiny_model(dir.path / "model", spec);
    data = dir.write("train.jsonl", corpus);
    save = dir.path / "out";
  }
  Recipe recipe(const std::vector<std::string>& overrides = {}) const {
    fs::path file = dir.write("recipe.yaml", recipe_yaml(model, data, save));
    return load_recipe(file, overrides);
  }
};

}  // namespace

TEST(Trainer, LossFallsAndValidationBeatsBaseModel) {
  TrainRun run;
  Recipe r = run.recipe({"train.steps=30", "data.valid_split=0.25", "eval.every=15", "save.every=15"});
  TrainSummary s = train(r);
  std::vector<double> losses = train_losses(run.save);
  ASSERT_EQ(losses.size(), 30u);
  std::printf("first loss %.4f, last loss %.4f, base valid %.4f, final valid %.4f, %.0f tok/s, peak %.1f MiB\n",
              losses.front(), losses.back(), s.base_valid_loss, s.final_valid_loss, s.tokens_per_s,
              double(s.peak_bytes) / (1 << 20));
  EXPECT_LT(losses.back(), 0.8 * losses.front());
  EXPECT_LT(s.final_valid_loss, s.base_valid_loss - 0.3);
  EXPECT_EQ(s.steps, 30);
  EXPECT_EQ(s.skipped_steps, 0);
  // What a run leaves: two checkpoints, the adapter, metrics in JSONL and HDF5.
  EXPECT_TRUE(fs::exists(run.save / "checkpoints/step-15.h5"));
  EXPECT_TRUE(fs::exists(run.save / "checkpoints/step-30.h5"));
  PeftAdapter a = load_peft_adapter(run.save / "adapter");
  EXPECT_EQ(a.rank, 4);
  EXPECT_EQ(a.modules.size(), 14u);  // 7 projections x 2 layers
  EXPECT_EQ(a.base_model, fs::absolute(run.model).lexically_normal().string());
  Hdf5File m = Hdf5File::open(run.save / "metrics.h5");
  EXPECT_EQ(m.read<int64_t>("train/step").size(), 30u);
  EXPECT_EQ(m.read<float>("train/loss").size(), 30u);
  EXPECT_EQ(m.read<int64_t>("valid/step"), (std::vector<int64_t>{0, 15, 30}));
}
