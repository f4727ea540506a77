// `lmtune bench train` as a child process on a tiny model: the JSON's fields are present and sane (tokens/s, the
// phase split, peak memory, parameter and FLOP counts, losses that fall at a high learning rate) on the CPU and on
// Vulkan; --save-batches round-trips through --batches; bad arguments fail with one clear line; and, where
// /usr/bin/python3 has torch, bench/torch_cpu_baseline.py (the independent reference decoder + LoRA + AdamW) gives
// the same f32 loss curve from lmtune's initial adapter on lmtune's batches.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>

#include "backend/vulkan/vulkan_backend.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train_test_util.h"

using namespace lmtune;
using namespace lmtune::train_test;
using nlohmann::json;

namespace {

struct BenchRun {
  TempDir dir{"bench"};
  fs::path model = make_tiny_model(dir.path / "model");  // llama, 2 layers, hidden 32, 4 heads (D 8), 259 ids

  std::vector<std::string> args(const std::string& device, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a{"--device",  device,     "bench",  "train", "--model",  model.string(),
                               "--seq",     "32",       "--batch", "2",    "--rank",   "4",
                               "--steps",   "10",       "--warmup", "1",   "--lr",     "1e-2",
                               "--precision", "f32",    "--grad-checkpointing", "off", "--json", "--losses"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// The JSON object among the child's output lines (its log lines go to stderr, which run_lmtune merges).
json parse_result(const ChildResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string line, found;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') found = line;
  if (found.empty()) ADD_FAILURE() << "no JSON line in:\n" << r.output;
  return found.empty() ? json::object() : json::parse(found);
}

std::vector<double> losses_of(const json& j) {
  std::vector<double> out;
  for (const json& x : j.at("losses")) out.push_back(x.is_null() ? std::nan("") : x.get<double>());
  return out;
}

void expect_sane(const json& j, int64_t steps_run) {
  for (const char* key : {"tool", "device", "model", "seq", "batch", "rank", "grad_checkpointing", "tokens_per_s",
                          "step_s", "forward_s", "backward_s", "optimizer_s", "gpu_kernel_s", "peak_mem_bytes",
                          "params_total", "params_trainable", "flops_per_token", "flops_per_token_lora",
                          "measured_peak_tflops", "mfu_measured_peak", "mfu_given_peak", "losses"})
    EXPECT_TRUE(j.contains(key)) << key << " missing from " << j.dump();
  EXPECT_EQ(j.value("tool", ""), "lmtune");
  EXPECT_EQ(j.value("seq", 0), 32);
  EXPECT_EQ(j.value("batch", 0), 2);
  EXPECT_EQ(j.value("rank", 0), 4);
  EXPECT_GT(j.value("tokens_per_s", 0.0), 0);
  const double step = j.value("step_s", 0.0);
  const double phases = j.value("forward_s", 0.0) + j.value("backward_s", 0.0) + j.value("optimizer_s", 0.0);
  EXPECT_GT(j.value("forward_s", 0.0), 0);
  EXPECT_GT(j.value("backward_s", 0.0), 0);
  EXPECT_GT(j.value("optimizer_s", 0.0), 0);
  EXPECT_LE(phases, step * 1.001 + 1e-4) << "the phases are parts of the step";
  EXPECT_NEAR(j.value("tokens_per_s", 0.0), 64.0 / step, 1e-6 * 64.0 / step);
  EXPECT_GT(j.value("peak_mem_bytes", int64_t(0)), 0);
  // LoRA rank 4 on q (32->32), k, v (32->16), o (32->32), gate, up (32->64), down (64->32), 2 layers.
  const int64_t lora = 2 * 4 * ((32 + 32) + 2 * (32 + 16) + (32 + 32) + 2 * (32 + 64) + (64 + 32));
  EXPECT_EQ(j.value("params_trainable", int64_t(0)), lora);
  // Base: embeddings and lm_head 259 x 32 (untied), per layer 2 norms + q,k,v,o + MLP, final norm.
  const int64_t layer = 2 * 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 32 * 64;
  const int64_t base = 2 * 259 * 32 + 2 * layer + 32;
  EXPECT_EQ(j.value("params_total", int64_t(0)), base + lora);
  // 6 N (N without the untied input embedding) + 12 L H D T.
  const double attention = 12.0 * 2 * 4 * 8 * 32;
  EXPECT_DOUBLE_EQ(j.value("flops_per_token", 0.0), 6.0 * double(base - 259 * 32 + lora) + attention);
  EXPECT_DOUBLE_EQ(j.value("flops_per_token_lora", 0.0), 4.0 * double(base - 259 * 32) + 6.0 * lora + attention);
  EXPECT_GT(j.value("measured_peak_tflops", 0.0), 0);
  EXPECT_GT(j.value("mfu_measured_peak", 0.0), 0);
  EXPECT_TRUE(j.at("mfu_given_peak").is_null()) << "no --peak-tflops given";
  const std::vector<double> l = losses_of(j);
  ASSERT_EQ(int64_t(l.size()), steps_run);
  for (double x : l) EXPECT_TRUE(std::isfinite(x));
  // Zipf-distributed ids: the loss starts near ln(259) = 5.56 and a high learning rate lowers it quickly.
  EXPECT_GT(l.front(), 4.5);
  EXPECT_LT(l.back(), l.front() - 0.3) << "losses do not fall: " << j.at("losses").dump();
}

}  // namespace

TEST(BenchTrain, CpuReportsSaneFiguresAndLearns) {
  BenchRun run;
  json j = parse_result(run_lmtune(run.args("cpu", {"--peak-matmul-size", "64", "--peak-tflops", "2"})));
  j["mfu_given_peak"] = nullptr;  // checked here instead of in expect_sane
  expect_sane(j, 11);
  EXPECT_EQ(j.value("device", ""), "cpu");
  EXPECT_TRUE(j.at("gpu_kernel_s").is_null());
  EXPECT_EQ(j.value("given_peak_tflops", 0.0), 2.0);
}

TEST(BenchTrain, SaveBatchesRoundTrips) {
  BenchRun run;
  const fs::path saved = run.dir.path / "batches.safetensors", again = run.dir.path / "again.safetensors";
  json a = parse_result(run_lmtune(run.args("cpu", {"--peak-matmul-size", "0", "--save-batches", saved.string()})));
  SafetensorsFile f(saved);
  const SafetensorsTensor& t = f.at("input_ids");
  EXPECT_EQ(t.st_dtype, StDType::I32);
  EXPECT_EQ(t.shape, (Shape{11, 2, 32}));
  const auto* ids = reinterpret_cast<const int32_t*>(t.data.data());
  int distinct_low = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_GE(ids[i], 0);
    ASSERT_LT(ids[i], 259);
    distinct_low += ids[i] < 8;
  }
  EXPECT_GT(distinct_low, t.numel() / 5) << "ids should follow the Zipf distribution (p(id < 8) ~ 0.45)";
  // Training on the saved batches reproduces the run exactly (and saving them again gives the same file).
  json b = parse_result(run_lmtune(run.args(
      "cpu", {"--peak-matmul-size", "0", "--batches", saved.string(), "--save-batches", again.string()})));
  EXPECT_EQ(losses_of(a), losses_of(b));
  EXPECT_EQ(read_file_text(saved), read_file_text(again));
  // Other batches (another seed) give other losses.
  json c = parse_result(run_lmtune(run.args("cpu", {"--peak-matmul-size", "0", "--seed", "5"})));
  EXPECT_NE(losses_of(a), losses_of(c));
}

TEST(BenchTrain, VulkanReportsSaneFiguresAndMatchesCpu) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  BenchRun run;
  json cpu = parse_result(run_lmtune(run.args("cpu", {"--peak-matmul-size", "0"})));
  json j = parse_result(run_lmtune(run.args("vulkan:0")));
  expect_sane(j, 11);
  EXPECT_NE(j.value("device", "").find("vulkan:0"), std::string::npos);
  EXPECT_GT(j.at("gpu_kernel_s").get<double>(), 0) << "one profiled step's kernel time";
  const std::vector<double> a = losses_of(cpu), b = losses_of(j);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << "step " << i + 1;
}

TEST(BenchTrain, BadArgumentsFailWithAClearMessage) {
  BenchRun run;
  const fs::path saved = run.dir.path / "b.safetensors";
  ASSERT_EQ(run_lmtune(run.args("cpu", {"--peak-matmul-size", "0", "--steps", "1", "--save-batches", saved.string()}))
                .exit_code, 0);
  struct Case {
    std::vector<std::string> extra;
    std::string want;
  };
  const Case cases[] = {
      {{"--seq", "1"}, "--seq must be at least 2"},
      {{"--batch", "0"}, "--batch must be at least 1"},
      {{"--steps", "0"}, "--steps must be at least 1"},
      {{"--grad-checkpointing", "maybe"}, "--grad-checkpointing must be on or off"},
      {{"--precision", "fp8"}, "--precision must be bf16 or f32"},
      {{"--targets", "qkv"}, "qkv"},
      {{"--model", (run.dir.path / "nothing").string()}, "no config.json"},
      {{"--batches", saved.string(), "--seq", "16"}, "but --batch/--seq ask for 2 x 16"},
      {{"--batches", saved.string()}, "holds 2 steps, --warmup + --steps need 11"},
      {{"--batches", (run.dir.path / "missing.safetensors").string()}, "missing.safetensors"},
      {{"--init-adapter", (run.dir.path / "none").string()}, "adapter_config.json"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    ChildResult r = run_lmtune(run.args("cpu", c.extra));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(c.want), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("{\""), std::string::npos) << "no JSON on failure";
  }
}

// The loss curve against an independent implementation: lmtune writes its initial adapter and batches, the
// reference decoder of scripts/reference_models.py with hand-written LoRA and torch's AdamW trains from them.
TEST(BenchTrain, LossCurveMatchesTheTorchReference) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  BenchRun run;
  const fs::path batches = run.dir.path / "b.safetensors", adapter = run.dir.path / "adapter";
  const fs::path out = run.dir.path / "torch.json";
  const std::vector<std::string> common{"--steps", "5", "--warmup", "0", "--lr", "1e-2"};
  std::vector<std::string> extra{"--peak-matmul-size", "0", "--save-batches", batches.string(),
                                 "--save-init-adapter", adapter.string()};
  extra.insert(extra.end(), common.begin(), common.end());
  json a = parse_result(run_lmtune(run.args("cpu", extra)));
  std::string cmd = "/usr/bin/python3 " + source_path("bench/torch_cpu_baseline.py").string() + " --model " +
                    run.model.string() + " --seq 32 --batch 2 --threads 1 --peak-matmul-size 0 --json --losses" +
                    " --batches " + batches.string() + " --init-adapter " + adapter.string();
  for (const std::string& s : common) cmd += " " + s;
  ASSERT_EQ(std::system((cmd + " > " + out.string() + " 2> " + out.string() + ".log").c_str()), 0)
      << read_file_text(out.string() + ".log");
  json b = json::parse(read_file_text(out));
  EXPECT_EQ(b.value("tool", ""), "torch-reference");
  EXPECT_EQ(b.value("params_trainable", int64_t(0)), a.value("params_trainable", int64_t(-1)));
  EXPECT_EQ(b.value("params_total", int64_t(0)), a.value("params_total", int64_t(-1)));
  EXPECT_DOUBLE_EQ(b.value("flops_per_token", 0.0), a.value("flops_per_token", -1.0));
  const std::vector<double> la = losses_of(a), lb = losses_of(b);
  ASSERT_EQ(la.size(), 5u);
  ASSERT_EQ(lb.size(), 5u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 2e-4 * lb[i]) << "step " << i + 1;
  EXPECT_LT(la.back(), la.front() - 0.1) << "the curve should move, or the check is weak";
}

// `lmtune bench generate` on a dense model and on a mixture of experts (whose expert layers have no dense MLP
// projections; it once crashed counting their bytes): JSON with positive speeds and bytes per step.
TEST(BenchGenerate, DenseAndMixtureOfExpertsModels) {
  TempDir dir{"bench_generate"};
  const fs::path dense = make_tiny_model(dir.path / "model");
  const fs::path moe = source_path("tests/models/fixtures/qwen3_moe");
  for (const fs::path& model : {dense, moe}) {
    SCOPED_TRACE(model.string());
    const ChildResult r = run_lmtune({"--device", "cpu", "bench", "generate", "--model", model.string(),
                                      "--prompt-tokens", "9", "--new-tokens", "5", "--bandwidth-gbs", "10", "--json"});
    const json j = parse_result(r);
    EXPECT_GT(j.value("prefill_tokens_per_s", 0.0), 0);
    EXPECT_GT(j.value("decode_tokens_per_s", 0.0), 0);
    EXPECT_GT(j.value("bytes_per_step", 0.0), 0);
    EXPECT_TRUE(std::isfinite(j.value("fraction_of_bound", std::nan(""))));
  }
}
