// Run by ctest under `mpirun -np 2` (test_dist_mpi); skipped in a plain process. The MPI collectives, the
// bucketed gradient all-reduce, and the heart of data parallelism: a training step shared by the ranks, each
// reading only its own slice of the micro-batches, gives the loss, gradient norm and updated weights of the same
// step on one process, within f32 reduction-order tolerance.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/vulkan/vulkan_backend.h"
#include "core/autodiff.h"
#include "core/ops/view.h"
#include "dist/communicator.h"
#include "train/grad_sync.h"
#include "train/model_setup.h"
#include "train/token_batches.h"
#include "train/train_step.h"
#include "train/train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;

namespace {

dist::Communicator* mpi_ranks() {
  if (!dist::launched_by_mpi()) return nullptr;
  dist::Communicator& w = dist::world();
  return w.size() >= 2 ? &w : nullptr;
}

#define REQUIRE_RANKS(var)                                               \
  dist::Communicator* var = mpi_ranks();                                 \
  if (!var) GTEST_SKIP() << "needs mpirun -np 2 or more (test_dist_mpi)"

}  // namespace

TEST(MpiCollectives, SumsGathersAndNamesTheRank) {
  REQUIRE_RANKS(ranks);
  const int n = ranks->size(), r = ranks->rank();
  std::vector<double> d{double(r + 1), 0.5};
  ranks->all_reduce_sum(d);
  EXPECT_EQ(d[0], double(n * (n + 1) / 2));
  EXPECT_EQ(d[1], 0.5 * n);
  std::vector<float> f(1001, float(r));  // odd size
  ranks->start_all_reduce_sum(f)->wait();
  EXPECT_EQ(f.front(), float(n * (n - 1) / 2));
  EXPECT_EQ(f.back(), f.front());
  const std::vector<double> g = ranks->all_gather(10.0 * r);
  ASSERT_EQ(int(g.size()), n);
  for (int k = 0; k < n; ++k) EXPECT_EQ(g[size_t(k)], 10.0 * k);
  EXPECT_NE(ranks->where().find("rank " + std::to_string(r) + " of " + std::to_string(n) + " on "),
            std::string::npos);
  EXPECT_EQ(ranks->local_size(), n);  // mpirun -np N on one host
}

// On each device: the buckets are packed and unpacked on the device the gradients live on.
static void expect_gradients_summed(Device device) {
  dist::Communicator* ranks = mpi_ranks();
  const int r = ranks->rank(), n = ranks->size();
  auto param = [device](const std::string& name, Shape shape) {
    return NamedParam{name, Tensor::zeros(shape, DType::f32, device).set_requires_grad(true)};
  };
  std::vector<NamedParam> params{param("a", {37, 3}), param("only_on_rank_1", {5}), param("never", {4}),
                                 param("b", {300})};
  auto grad_of = [&](size_t i, int rank) {
    std::vector<float> g(size_t(params[i].tensor.numel()));
    for (size_t k = 0; k < g.size(); ++k) g[k] = float(rank + 1) * 0.25f + float(k % 7) - float(i);
    return g;
  };
  for (size_t i : {size_t(0), size_t(3)})
    params[i].tensor.impl()->grad =
        Tensor::from_floats(grad_of(i, r), params[i].tensor.shape(), DType::f32, device).impl_ptr();
  if (r == 1)
    params[1].tensor.impl()->grad =
        Tensor::from_floats(grad_of(1, r), params[1].tensor.shape(), DType::f32, device).impl_ptr();
  all_reduce_gradients(params, *ranks, 200 * sizeof(float));  // buckets of 200 floats: "a" and "b" apart
  for (size_t i : {size_t(0), size_t(3)}) {
    const std::vector<float> got = params[i].tensor.grad().to_floats();
    for (size_t k = 0; k < got.size(); ++k) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += grad_of(i, q)[k];
      ASSERT_FLOAT_EQ(got[k], want) << params[i].name << "[" << k << "]";
    }
  }
  ASSERT_TRUE(params[1].tensor.grad().defined()) << "a gradient of rank 1 alone must reach rank 0";
  EXPECT_EQ(params[1].tensor.grad().to_floats(), grad_of(1, 1));
  EXPECT_FALSE(params[2].tensor.grad().defined()) << "no rank had one: it stays undefined as on one device";
}

TEST(MpiGradSync, SumsGradientsInSeveralBucketsAndKeepsMissingOnesMissing) {
  REQUIRE_RANKS(ranks);
  expect_gradients_summed(Device::cpu());
}

TEST(MpiGradSync, SumsGradientsOnAVulkanDevice) {
  REQUIRE_RANKS(ranks);
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  expect_gradients_summed(Device::vulkan(0));
}

namespace {

struct StepRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
};

// Three AdamW steps with clipping over `micro` (4 micro-batches of uneven trainable tokens) on a fresh tiny LoRA
// model, shared by `ranks` or all on this process.
StepRun three_steps(const std::vector<Batch>& micro, dist::Communicator* ranks, const std::string& finetune) {
  TempDir dir("mpistep");
  const fs::path model = make_tiny_model(dir.path / "model");
  const fs::path data = dir.write("d.jsonl", text_corpus(4));
  Recipe r = load_recipe(dir.write("r.yaml", recipe_yaml(model, data, dir.path / "out")),
                         {"finetune=" + finetune, "lora.dropout=0.1", "train.grad_clip=0.05"});
  TrainableModel tm = build_trainable_model(r, Device::cpu());
  {  // LoRA B starts at zero; give it values so both factors train from the first step
    NoGrad ng;
    uint64_t seed = 100;
    for (NamedParam& p : tm.params)
      if (p.name.find("lora_B") != std::string::npos)
        copy_into(p.tensor, Tensor::randn(p.tensor.shape(), seed++, 0.1f, DType::f32, p.tensor.device()));
  }
  Optimizer opt(tm.params, r.optimizer);
  LossScaler scaler;
  StepRun out;
  for (int64_t s = 0; s < 3; ++s) {
    StepOptions so = step_options(r, s, 1e-2);
    so.ranks = ranks;
    StepResult res = train_step(*tm.decoder, opt, scaler, micro, so);
    EXPECT_TRUE(res.applied) << res.skip_reason;
    out.losses.push_back(res.loss);
    out.norms.push_back(res.grad_norm);
  }
  for (const NamedParam& p : tm.params) out.params.push_back(p.tensor.to_floats());
  return out;
}

std::vector<Batch> uneven_micro_batches(int n) {
  const TokenBatches tb = random_token_batches(259, 1, n, 24, 5);
  std::vector<Batch> micro;
  for (int k = 0; k < n; ++k) {
    Batch b = tb.batch(0, k, 1);
    for (int t = 0; t < 3 * k; ++t) b.targets[size_t(t)] = -100;  // fewer trainable tokens in later ones
    b.trainable_tokens -= 3 * k;
    micro.push_back(b);
  }
  return micro;
}

// The micro-batches as rank `rank` of `n` may see them: other ranks' slices scrambled (other ids and targets, the
// same trainable-token counts). A rank that computed more than its own slice would then train on garbage.
std::vector<Batch> scramble_others(std::vector<Batch> micro, int rank, int n) {
  const size_t per_rank = micro.size() / size_t(n);
  for (size_t i = 0; i < micro.size(); ++i) {
    if (i / per_rank == size_t(rank)) continue;
    for (int32_t& id : micro[i].ids) id = (id + 7) % 259;
    for (int32_t& t : micro[i].targets)
      if (t != -100) t = (t + 11) % 259;
  }
  return micro;
}

void expect_same_step(const std::string& finetune) {
  REQUIRE_RANKS(ranks);
  const std::vector<Batch> micro = uneven_micro_batches(2 * ranks->size());
  const StepRun alone = three_steps(micro, nullptr, finetune);
  const StepRun shared = three_steps(scramble_others(micro, ranks->rank(), ranks->size()), ranks, finetune);
  for (size_t s = 0; s < alone.losses.size(); ++s) {
    EXPECT_NEAR(shared.losses[s], alone.losses[s], 1e-5 * std::abs(alone.losses[s])) << "step " << s + 1;
    EXPECT_NEAR(shared.norms[s], alone.norms[s], 1e-4 * alone.norms[s]) << "step " << s + 1;
  }
  double worst = 0, scale = 0;
  for (size_t i = 0; i < alone.params.size(); ++i)
    for (size_t k = 0; k < alone.params[i].size(); ++k) {
      worst = std::max(worst, double(std::abs(shared.params[i][k] - alone.params[i][k])));
      scale = std::max(scale, double(std::abs(alone.params[i][k])));
    }
  EXPECT_LT(worst, 1e-5 * std::max(scale, 1.0)) << "largest weight difference after 3 steps";
}

}  // namespace

TEST(MpiTrainStep, LoraStepSharedByRanksEqualsOneProcess) { expect_same_step("lora"); }

TEST(MpiTrainStep, FullFinetuneStepSharedByRanksEqualsOneProcess) { expect_same_step("full"); }
