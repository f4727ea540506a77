// End-to-end training in-process: the loss falls on a learnable task and validation beats the base model;
// gradient checkpointing gives the same losses with less memory; CPU and Vulkan agree; the files a run writes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "core/ops/view.h"
#include "models/weights.h"
#include "io/hdf5_file.h"
#include "io/peft_adapter.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

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

TEST(Trainer, VulkanAndCpuGiveTheSameLosses) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  TrainRun run(text_corpus(16));
  std::vector<std::vector<double>> losses;
  for (const char* device : {"cpu", "vulkan:0"}) {
    TrainOptions o;
    o.device = device;
    o.overwrite = true;
    train(run.recipe({"train.steps=20", "train.batch_size=2", "data.max_seq_len=32", "lora.dropout=0.1",
                      "train.grad_checkpointing=true"}),
          o);
    losses.push_back(train_losses(run.save));
  }
  ASSERT_EQ(losses[0].size(), 20u);
  ASSERT_EQ(losses[1].size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 2e-3 * losses[0][i]) << "step " << i + 1;
  EXPECT_LT(losses[0].back(), losses[0].front());
}

TEST(Trainer, GradientCheckpointingSameLossesLessMemory) {
  TinyModelSpec spec;
  spec.layers = 6;
  spec.hidden = 64;
  spec.intermediate = 256;
  TrainRun run(text_corpus(32), spec);
  std::vector<std::vector<double>> losses;
  std::vector<size_t> peaks;
  for (bool ckpt : {false, true}) {
    TrainOptions o;
    o.overwrite = true;
    TrainSummary s = train(run.recipe({"train.steps=3", "data.max_seq_len=128", "train.batch_size=4",
                                       std::string("train.grad_checkpointing=") + (ckpt ? "true" : "false")}),
                           o);
    losses.push_back(train_losses(run.save));
    peaks.push_back(s.peak_bytes);
  }
  std::printf("peak memory per step: without checkpointing %.2f MiB, with %.2f MiB\n", double(peaks[0]) / (1 << 20),
              double(peaks[1]) / (1 << 20));
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_LT(double(peaks[1]), 0.8 * double(peaks[0]));
}

// Finite weights that overflow the logits: every loss is NaN or Inf while loading accepts the model.
void poison_lm_head(const fs::path& model) {
  models::Decoder d = models::load_decoder(model, DType::f32, DType::f32, Device::cpu());
  Tensor& w = d.weights().lm_head;
  copy_into(w, Tensor::full(w.shape(), std::numeric_limits<float>::max(), w.dtype(), w.device()));
  models::save_weights(d.config(), d.weights(), model, DType::f32);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// fp32 has no loss scaler that could skip its way out: the first non-finite loss stops the run, well before
// train.max_skipped_steps, and the adapter of the last good run stays as it was.
TEST(Trainer, NonFiniteLossWithoutLossScalerStopsBeforeSaving) {
  TrainRun run;
  train(run.recipe({"train.steps=2", "save.every=1"}));
  const std::string adapter = file_bytes(run.save / "adapter/adapter_model.safetensors");
  ASSERT_FALSE(adapter.empty());
  poison_lm_head(run.model);
  TrainOptions o;
  o.overwrite = true;
  try {
    train(run.recipe({"train.steps=3", "save.every=1"}), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("training stopped at step 1: loss is"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nothing was saved"), std::string::npos) << msg;
  }
  EXPECT_EQ(file_bytes(run.save / "adapter/adapter_model.safetensors"), adapter);
  const std::optional<ResumePoint> last = find_resume_checkpoint(run.save);
  ASSERT_TRUE(last);
  EXPECT_EQ(last->file, run.save / "checkpoints/step-2.h5");
}

// With a loss scaler (fp16), non-finite steps are skipped and counted until train.max_skipped_steps.
TEST(Trainer, ConsecutiveSkippedStepsStopTraining) {
  TrainRun run;
  poison_lm_head(run.model);
  try {
    train(run.recipe({"precision=fp16", "train.max_skipped_steps=3", "save.every=1"}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training stopped at step 3 after 3 consecutive skipped steps"),
              std::string::npos)
        << e.what();
  }
  std::vector<MetricsRow> rows = read_metrics_jsonl(run.save / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);  // steps 1 and 2 were logged (and checkpointed) before step 3 stopped the run
  EXPECT_EQ(rows[1].get("skipped"), 1.0);
}
