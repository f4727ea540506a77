// `lmtune bench train`: LoRA training throughput of a model directory on random token batches, measured on the
// trainer's own code (train/model_setup: the model and adapters, train/train_step: the step, train/optimizer:
// AdamW). W warm-up steps, then N timed steps, each split into forward / backward / optimizer (the device is
// synchronized between phases). Reports tokens/s, peak device memory, parameter counts, model FLOPs per token
// and MFU against the device's own measured matmul peak and a given one. bench/peft_baseline.py measures the
// same for PyTorch + PEFT with the same field names; bench/compare.sh runs both. docs/benchmarks.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/recorder.h"
#include "backend/vulkan/vulkan_backend.h"
#include "cli/bench_timing.h"
#include "cli/commands.h"
#include "cli/infer_options.h"
#include "cli/ranks.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/weights.h"
#include "train/model_setup.h"
#include "train/token_batches.h"
#include "train/train_step.h"

namespace lmtune::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct BenchTrainOptions {
  std::string model;
  int64_t seq = 2048, batch = 1;
  int rank = 16;
  double alpha = 0;  // 0: 2 * rank (configs/lora.yaml's 32 for rank 16)
  std::string targets = "all-linear";
  int steps = 10, warmup = 2;
  std::string grad_checkpointing = "on";
  std::string transposed_weights = "auto";
  std::string checkpoint_layers = "auto";
  std::string precision = "bf16";
  std::string quantize = "none";  // the base projections (QLoRA): none | nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0
  double peak_tflops = 0;         // given peak; 0: none
  int64_t peak_matmul_size = -1;  // -1: auto (4096 on GPUs, smaller on CPU devices); 0: do not measure
  double lr = 2e-4;
  uint64_t seed = 42;
  bool json = false, losses = false;
  std::string save_batches, batches, init_adapter, save_init_adapter;
  std::string devices;  // --devices: one rank per listed device (several: under mpirun)
};

void check_options(const BenchTrainOptions& o) {
  if (!fs::is_regular_file(fs::path(o.model) / "config.json"))
    throw FileError("bench train: --model " + o.model + ": no config.json there");
  if (o.seq < 2) throw ConfigError("bench train: --seq must be at least 2 (got " + std::to_string(o.seq) + ")");
  if (o.batch < 1) throw ConfigError("bench train: --batch must be at least 1 (got " + std::to_string(o.batch) + ")");
  if (o.rank < 1) throw ConfigError("bench train: --rank must be at least 1 (got " + std::to_string(o.rank) + ")");
  if (o.steps < 1) throw ConfigError("bench train: --steps must be at least 1 (got " + std::to_string(o.steps) + ")");
  if (o.warmup < 0) throw ConfigError("bench train: --warmup must be >= 0 (got " + std::to_string(o.warmup) + ")");
  if (o.grad_checkpointing != "on" && o.grad_checkpointing != "off")
    throw ConfigError("bench train: --grad-checkpointing must be on or off (got '" + o.grad_checkpointing + "')");
  if (o.checkpoint_layers != "auto" && o.checkpoint_layers != "all")
    throw ConfigError("bench train: --checkpoint-layers must be auto or all (got '" + o.checkpoint_layers + "')");
  if (o.transposed_weights != "auto" && o.transposed_weights != "on" && o.transposed_weights != "off")
    throw ConfigError("bench train: --transposed-weights must be auto, on or off (got '" + o.transposed_weights + "')");
  if (o.precision != "bf16" && o.precision != "f32" && o.precision != "fp32")
    throw ConfigError("bench train: --precision must be bf16 or f32 (got '" + o.precision + "')");
  if (!(o.lr > 0)) throw ConfigError("bench train: --lr must be positive");
  if (o.peak_tflops < 0) throw ConfigError("bench train: --peak-tflops must be positive");
  if (split_commas(o.targets).empty()) throw ConfigError("bench train: --targets is empty");
}

// FLOPs per token, PaLM's convention (appendix B; torchtune and most MFU calculators use it): 6 per weight that
// takes part in a matmul (2 forward, 4 backward) plus 12·L·H·D·T for the attention scores and their use. Weights
// in matmuls: every parameter except an untied input-embedding table (a lookup, not a matmul; a tied table is
// the lm_head and counts once), plus the LoRA tensors; of a mixture of experts, only the experts a token is routed
// to (active parameters). The "LoRA" count drops the frozen weights' weight-gradient
// matmuls: 4 per frozen weight. Recomputation under checkpointing counts in neither (model FLOPs, not hardware).
struct Flops {
  int64_t matmul_params = 0;
  double per_token = 0, per_token_lora = 0;
};

Flops flops_per_token(const ModelConfig& c, int64_t lora_params, int64_t seq) {
  Flops f;
  const int64_t base =
      models::active_parameter_count(c) - (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size);
  f.matmul_params = base + lora_params;
  const double attention = 12.0 * double(c.num_hidden_layers) * double(c.num_attention_heads) *
                           double(c.head_dim) * double(seq);
  f.per_token = 6.0 * double(f.matmul_params) + attention;
  f.per_token_lora = 4.0 * double(base) + 6.0 * double(lora_params) + attention;
  return f;
}

int64_t default_peak_size(Device dev) {
  if (!is_cpu_class(dev)) return 4096;
  return dev.is_cpu() ? 1024 : 256;  // lavapipe runs a few GFLOP/s
}

Recipe bench_recipe(const BenchTrainOptions& o) {
  Recipe r;
  r.model = o.model;
  r.precision = o.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  r.quantize = quantize_option(o.quantize);
  r.lora.rank = o.rank;
  r.lora.alpha = o.alpha > 0 ? o.alpha : 2.0 * o.rank;
  r.lora.dropout = 0;
  r.lora.targets = split_commas(o.targets);
  r.lora.init_from = o.init_adapter;
  r.optimizer.lr = o.lr;
  r.train.grad_checkpointing = o.grad_checkpointing == "on";
  r.train.transposed_weights = o.transposed_weights;
  r.train.checkpoint_layers = o.checkpoint_layers;
  r.train.batch_size = o.batch;
  r.data.max_seq_len = o.seq;
  r.train.seed = o.seed;
  return r;
}

// Each step's rows: --batch per rank, rank r taking rows [r·batch, (r+1)·batch).
TokenBatches bench_batches(const BenchTrainOptions& o, int64_t vocab, int ranks) {
  const int64_t needed = int64_t(o.warmup) + o.steps;
  if (o.batches.empty()) return random_token_batches(vocab, needed, o.batch * ranks, o.seq, o.seed);
  TokenBatches tb = load_token_batches(o.batches, vocab);
  if (tb.B != o.batch * ranks || tb.T != o.seq)
    throw ConfigError("bench train: --batches " + o.batches + " holds batch " + std::to_string(tb.B) + " x seq " +
                      std::to_string(tb.T) + ", but --batch/--seq ask for " + std::to_string(o.batch) + " x " +
                      std::to_string(o.seq) + " on each of " + std::to_string(ranks) + " rank(s)");
  if (tb.steps < needed)
    throw ConfigError("bench train: --batches " + o.batches + " holds " + std::to_string(tb.steps) +
                      " steps, --warmup + --steps need " + std::to_string(needed));
  return tb;
}

double total_kernel_ns() {
  double ns = 0;
  for (const auto& [kernel, stats] : vk::profile_stats()) ns += stats.ns;
  return ns;
}

// GPU time of one extra training step, summed over its kernels (timestamps around every dispatch slow the step,
// so it is not one of the timed ones). The five slowest kernels go to the log. NaN off Vulkan.
double gpu_kernel_seconds(Device dev, const std::function<void()>& step) {
  if (!dev.is_vulkan() || !vk::context_for(dev).features().timestamps) return std::nan("");
  backend(dev).synchronize();
  const bool was = vk::profiling();
  vk::reset_profile();
  vk::set_profiling(true);
  step();
  backend(dev).synchronize();
  vk::set_profiling(was);
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [kernel, stats] : vk::profile_stats()) top.push_back({stats.ns, kernel});
  std::sort(top.rbegin(), top.rend());
  const double ns = total_kernel_ns();
  for (size_t i = 0; i < std::min<size_t>(5, top.size()); ++i)
    spdlog::info("  gpu kernel {:<32} {:8.2f} ms ({:.0f}%)", top[i].second, top[i].first * 1e-6,
                 100.0 * top[i].first / std::max(ns, 1.0));
  return ns * 1e-9;
}

nlohmann::json number_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }

void run_bench_train(const RankSetup& setup, const BenchTrainOptions& o) {
  apply_device_option(setup.device);
  check_options(o);
  dist::Communicator* ranks = setup.ranks && setup.ranks->size() > 1 ? setup.ranks : nullptr;
  const int n_ranks = ranks ? ranks->size() : 1, rank = ranks ? ranks->rank() : 0;
  const bool root = rank == 0;
  const Device dev = default_device();
  const ModelConfig config = load_model_config(o.model);
  const TokenBatches tb = bench_batches(o, config.vocab_size, n_ranks);
  if (root && !o.save_batches.empty()) save_token_batches(o.save_batches, tb);
  const Recipe r = bench_recipe(o);
  const DType compute = compute_dtype(r);

  // The device's own matmul peak, before the model takes its memory.
  const int64_t peak_n = o.peak_matmul_size < 0 ? default_peak_size(dev) : o.peak_matmul_size;
  double measured_peak = std::nan("");
  if (peak_n > 0) {
    measured_peak = matmul_tflops(dev, compute, peak_n, 5);
    spdlog::info("matmul {}^3 {}: {:.3g} TFLOP/s (the measured peak)", peak_n, dtype_name(compute), measured_peak);
  }

  TrainableModel tm = build_trainable_model(r, dev);
  const int64_t lora_params = tm.trainable_count();
  if (root && !o.save_init_adapter.empty()) {
    save_peft_adapter(models::extract_peft(tm.decoder->weights(), "default", tm.lora_rank, tm.lora_alpha,
                                           tm.lora_rslora, 0.0, fs::absolute(o.model).lexically_normal().string()),
                      o.save_init_adapter);
    spdlog::info("initial adapter written to {}", o.save_init_adapter);
  }
  Optimizer optimizer(tm.params, r.optimizer);
  LossScaler scaler = LossScaler::for_training(r.precision, dev);
  if (scaler.enabled) spdlog::info("bf16 products run on f16 tensor cores: dynamic loss scaling on");
  Backend& be = backend(dev);
  spdlog::info("bench train: {} ({} layers) on {}, {}, batch {} x seq {}{}, LoRA rank {} on {}, checkpointing {}, "
               "{} trainable parameters; {} warm-up + {} timed steps",
               config.model_type, config.num_hidden_layers, dev.str(), dtype_name(compute), o.batch, o.seq,
               ranks ? fmt::format(" on each of {} ranks", n_ranks) : "", tm.lora_rank, o.targets,
               o.grad_checkpointing, lora_params, o.warmup, o.steps);

  StepPhaseTimes phases;
  std::vector<double> losses;
  int64_t skipped = 0;
  // One step: this rank's rows alone (with_ranks null), or every rank's, each rank running its own.
  auto run_step = [&](int64_t s, StepPhaseTimes* times, dist::Communicator* with_ranks) {
    StepOptions so = step_options(r, s, o.lr);
    so.dropout = false;
    so.unchecked_layers = tm.unchecked_layers;
    so.phase_times = times;
    so.ranks = with_ranks;
    const int64_t step = std::min(s, tb.steps - 1);
    std::vector<Batch> micro;
    if (!with_ranks) micro.push_back(tb.batch(step, int64_t(rank) * o.batch, o.batch));
    for (int k = 0; with_ranks && k < n_ranks; ++k) micro.push_back(tb.batch(step, int64_t(k) * o.batch, o.batch));
    return train_step(*tm.decoder, optimizer, scaler, micro, so);
  };
  const int64_t total = int64_t(o.warmup) + o.steps;
  // W warm-up and N timed steps; returns the timed steps' wall time.
  auto timed_run = [&](dist::Communicator* with_ranks, const char* label) {
    double timed_s = 0;
    losses.clear();
    for (int64_t s = 0; s < total; ++s) {
      const bool timed = s >= o.warmup;
      if (s == o.warmup) {
        be.synchronize();
        be.reset_peak();
      }
      const auto t0 = Clock::now();
      StepResult res = run_step(s, timed ? &phases : nullptr, with_ranks);
      if (timed) be.synchronize();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (timed) timed_s += dt;
      losses.push_back(res.loss);
      if (!res.applied) {
        ++skipped;
        spdlog::warn("step {} skipped: {}", s + 1, res.skip_reason);
      }
      spdlog::info("{}{} step {}/{} | loss {:.4f} | {:.3f} s | {:.0f} tok/s", label, timed ? "timed" : "warm-up",
                   s + 1, total, res.loss, dt, double(o.batch * tb.T) / std::max(dt, 1e-9));
    }
    return timed_s;
  };
  // Several ranks: rank 0 first runs alone (the one-device figure scaling is measured against), then all ranks.
  double single_s = std::nan("");
  if (ranks) {
    if (root) single_s = timed_run(nullptr, "one device: ");
    ranks->barrier();
    phases = {};
    skipped = 0;
  }
  const double timed_s = timed_run(ranks, ranks ? "all ranks: " : "");
  const size_t peak_bytes = be.peak_bytes();
  const double gpu_s = gpu_kernel_seconds(dev, [&] { run_step(total, nullptr, ranks); });

  const double n = double(o.steps);
  const double tokens_per_step = double(tb.B * tb.T);  // of all ranks
  // The job's pace is its slowest rank's: every step waits for all of them in the all-reduce.
  const std::vector<double> rank_s = ranks ? ranks->all_gather(timed_s) : std::vector<double>{timed_s};
  const double tokens_per_s = tokens_per_step * n / *std::max_element(rank_s.begin(), rank_s.end());
  if (!root) return;
  const Flops f = flops_per_token(config, lora_params, tb.T);
  const double achieved = f.per_token * tokens_per_s / 1e12;
  const double achieved_lora = f.per_token_lora * tokens_per_s / 1e12;
  const double given = o.peak_tflops > 0 ? o.peak_tflops : std::nan("");

  nlohmann::json j;
  j["tool"] = "lmtune";
  j["device"] = device_description(dev);
  j["model"] = o.model;
  j["model_type"] = config.model_type;
  j["seq"] = tb.T;
  j["batch"] = o.batch;  // per rank
  j["rank"] = tm.lora_rank;
  j["alpha"] = tm.lora_alpha;
  j["targets"] = o.targets;
  j["grad_checkpointing"] = r.train.grad_checkpointing;
  j["unchecked_layers"] = tm.unchecked_layers;
  j["precision"] = o.precision == "bf16" ? "bf16" : "f32";
  j["quantize"] = o.quantize;
  j["lr"] = o.lr;
  j["warmup"] = o.warmup;
  j["steps"] = o.steps;
  j["tokens_per_step"] = tokens_per_step;
  j["tokens_per_s"] = tokens_per_s;
  j["step_s"] = timed_s / n;
  j["forward_s"] = phases.forward_s / n;
  j["backward_s"] = phases.backward_s / n;
  j["optimizer_s"] = phases.optimizer_s / n;
  j["all_reduce_s"] = phases.all_reduce_s / n;
  j["ranks"] = n_ranks;
  if (ranks) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (double t : rank_s) per_rank.push_back(double(o.batch * tb.T) * n / t);
    const double single = double(o.batch * tb.T) * n / single_s;
    j["per_rank_tokens_per_s"] = per_rank;
    j["single_device_tokens_per_s"] = single;
    j["scaling"] = tokens_per_s / single;
    j["scaling_efficiency"] = tokens_per_s / (single * n_ranks);
  }
  j["gpu_kernel_s"] = number_or_null(gpu_s);
  j["peak_mem_bytes"] = peak_bytes;
  j["peak_mem_kind"] = "live tensors (device allocator)";
  j["params_total"] = models::parameter_count(config) + lora_params;
  j["params_trainable"] = lora_params;
  j["params_matmul"] = f.matmul_params;
  j["flops_per_token"] = f.per_token;
  j["flops_per_token_lora"] = f.per_token_lora;
  j["achieved_tflops"] = achieved;
  j["measured_peak_tflops"] = number_or_null(measured_peak);
  j["mfu_measured_peak"] = number_or_null(achieved / measured_peak);
  j["mfu_lora_measured_peak"] = number_or_null(achieved_lora / measured_peak);
  j["given_peak_tflops"] = number_or_null(given);
  j["mfu_given_peak"] = number_or_null(achieved / given);
  j["mfu_lora_given_peak"] = number_or_null(achieved_lora / given);
  j["skipped_steps"] = skipped;
  j["loss_scale"] = scaler.enabled ? scaler.scale : 1.0;
  j["final_loss"] = number_or_null(losses.back());
  if (o.losses) {
    nlohmann::json arr = nlohmann::json::array();
    for (double l : losses) arr.push_back(number_or_null(l));
    j["losses"] = arr;
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  auto pct = [](double x) { return std::isfinite(x) ? fmt::format("{:.1f}%", 100 * x) : std::string("-"); };
  std::printf("lmtune bench train on %s\n", j["device"].get<std::string>().c_str());
  std::printf("  model           %s (%s), %lld parameters, %lld trainable (LoRA rank %d)\n", o.model.c_str(),
              config.model_type.c_str(), (long long)j["params_total"].get<int64_t>(), (long long)lora_params,
              tm.lora_rank);
  std::printf("  batch x seq     %lld x %lld, %s%s%s, checkpointing %s, %d timed steps after %d warm-up\n",
              (long long)o.batch, (long long)tb.T, j["precision"].get<std::string>().c_str(),
              o.quantize == "none" ? "" : ", base projections ", o.quantize == "none" ? "" : o.quantize.c_str(),
              o.grad_checkpointing.c_str(), o.steps, o.warmup);
  std::printf("  throughput      %.1f tokens/s, %.4f s/step (forward %.4f, backward %.4f, optimizer %.4f)\n",
              tokens_per_s, timed_s / n, phases.forward_s / n, phases.backward_s / n, phases.optimizer_s / n);
  if (std::isfinite(gpu_s)) std::printf("  gpu kernels     %.4f s per step (one profiled step)\n", gpu_s);
  std::printf("  peak memory     %.1f MiB\n", double(peak_bytes) / double(1 << 20));
  std::printf("  FLOPs/token     %.4g (6N + 12LHDT), %.4g (LoRA: 4N_frozen + 6N_lora + 12LHDT)\n", f.per_token,
              f.per_token_lora);
  std::printf("  achieved        %.4g TFLOP/s; MFU %s of the measured %.4g TFLOP/s, %s of the given %s\n", achieved,
              pct(achieved / measured_peak).c_str(), measured_peak, pct(achieved / given).c_str(),
              std::isfinite(given) ? fmt::format("{:.4g} TFLOP/s", given).c_str() : "-");
  std::printf("  final loss      %.4f\n", losses.back());
  if (ranks) {
    std::string per_rank;
    for (const auto& t : j["per_rank_tokens_per_s"]) per_rank += fmt::format(" {:.1f}", t.get<double>());
    std::printf("  ranks           %d, tokens/s per rank:%s; all-reduce %.4f s/step\n", n_ranks, per_rank.c_str(),
                phases.all_reduce_s / n);
    std::printf("  scaling         %.2fx one device's %.1f tokens/s (efficiency %.1f%%)\n", j["scaling"].get<double>(),
                j["single_device_tokens_per_s"].get<double>(), 100 * j["scaling_efficiency"].get<double>());
  }
}

}  // namespace

void add_bench_train_command(CLI::App& bench, const std::string& device) {
  auto* cmd = bench.add_subcommand("train", "LoRA training throughput, memory and MFU on random token batches");
  auto o = std::make_shared<BenchTrainOptions>();
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated option: the last wins
  cmd->add_option("--model", o->model, "model directory (config.json + weights)")->required();
  cmd->add_option("--seq", o->seq, "sequence length (default 2048)");
  cmd->add_option("--batch", o->batch, "sequences per step (default 1)");
  cmd->add_option("--rank", o->rank, "LoRA rank (default 16)");
  cmd->add_option("--alpha", o->alpha, "LoRA alpha (default 2 x rank)");
  cmd->add_option("--targets", o->targets, "comma list of module kinds, or all-linear (default)");
  cmd->add_option("--steps", o->steps, "timed steps (default 10)");
  cmd->add_option("--warmup", o->warmup, "warm-up steps before the timed ones (default 2)");
  cmd->add_option("--grad-checkpointing", o->grad_checkpointing, "on | off (default on)");
  cmd->add_option("--checkpoint-layers", o->checkpoint_layers,
                  "auto | all: with checkpointing, which layers recompute (recipe train.checkpoint_layers)");
  cmd->add_option("--transposed-weights", o->transposed_weights,
                  "auto | on | off: keep the frozen weights transposed too (recipe train.transposed_weights)");
  cmd->add_option("--precision", o->precision, "bf16 | f32 (default bf16)");
  cmd->add_option("--quantize", o->quantize,
                  "the base projections quantized at load (QLoRA): none | nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0")
      ->check(CLI::IsMember({"none", "nf4", "q4_0", "q4_k", "q5_k", "q6_k", "q8_0"}));
  cmd->add_option("--peak-tflops", o->peak_tflops, "the device's peak TFLOP/s for MFU (e.g. 989 for H100 SXM bf16)");
  cmd->add_option("--peak-matmul-size", o->peak_matmul_size,
                  "n of the n^3 matmul that measures the device's peak (default 4096 on GPUs; 0: skip)");
  cmd->add_option("--lr", o->lr, "AdamW learning rate, constant (default 2e-4)");
  cmd->add_option("--seed", o->seed, "seed of the token batches and the fresh adapters (default 42)");
  cmd->add_flag("--json", o->json, "print one JSON object (docs/cli.md lists its fields)");
  cmd->add_flag("--losses", o->losses, "include every step's loss (warm-up first) in the JSON");
  cmd->add_option("--save-batches", o->save_batches, "write the token batches (safetensors input_ids i32 [steps, batch, seq])");
  cmd->add_option("--batches", o->batches, "train on token batches from a file --save-batches wrote");
  cmd->add_option("--init-adapter", o->init_adapter, "start from this PEFT adapter directory");
  cmd->add_option("--save-init-adapter", o->save_init_adapter, "write the adapters as initialized (PEFT format)");
  cmd->add_option("--devices", o->devices,
                  "one rank per listed device of this host, e.g. 0,1 (runs mpirun): per-rank and aggregate tokens/s "
                  "and scaling against device 0 alone");
  cmd->callback([&device, o] {
    run_on_ranks(o->devices, device.empty() ? "auto" : device, [&](const RankSetup& s) { run_bench_train(s, *o); });
  });
}

}  // namespace lmtune::cli
