// `lmtune bench generate`: prefill and decode throughput of a model directory on random prompts (greedy, no stop
// ids, so every run decodes exactly --new-tokens per sequence), through the same engine as `lmtune generate`
// (infer::Session). Reports the bandwidth bound of decode: one step reads every weight once plus the KV cache, so
// tokens/s can reach at most batch x bandwidth / bytes per step; the bandwidth is measured on the device (a
// streaming bf16 add) unless given. bench/hf_generate_baseline.py measures transformers' generate with the same
// field names. docs/benchmarks.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench_timing.h"
#include "cli/commands.h"
#include "cli/infer_options.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "infer/adapters.h"
#include "infer/generator.h"

namespace lmtune::cli {
namespace {

struct BenchGenerateOptions {
  ModelArgs model;
  int64_t prompt_tokens = 128, new_tokens = 256, batch = 1;
  int warmup_tokens = 16;
  double bandwidth_gbs = 0;  // 0: measure
  uint64_t seed = 42;
  bool json = false;
};

// Bytes one decode step reads at `context` tokens: every weight tensor once (the embedding only when lm_head
// is the same tensor) and every layer's keys and values.
double bytes_per_step(const models::Decoder& d, double context) {
  const models::DecoderWeights& w = d.weights();
  double bytes = double(w.final_norm.nbytes()) + double(w.lm_head.nbytes());
  for (const models::LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.input_norm, &l.post_attn_norm, &l.pre_mlp_norm, &l.post_mlp_norm, &l.attn.q_norm,
                            &l.attn.k_norm})
      if (t->defined()) bytes += double(t->nbytes());
    for (const models::Linear* lin : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.mlp.gate, &l.mlp.up,
                                      &l.mlp.down}) {
      // Mixture-of-experts layers have no dense MLP projections; quantized ones are read in their own format.
      if (lin->weight.defined()) bytes += double(lin->weight.nbytes());
      if (lin->qweight.defined()) bytes += double(lin->qweight.nbytes());
      if (lin->bias.defined()) bytes += double(lin->bias.nbytes());
      for (const models::LoraAdapter& a : lin->adapters) bytes += double(a.A.nbytes() + a.B.nbytes());
    }
    // A batch-1 step reads the router and k of the E experts.
    if (l.moe.router.defined()) {
      const ModelConfig& mc = d.config();
      bytes += double(l.moe.router.nbytes()) + double(l.moe.gate_up.nbytes() + l.moe.down.nbytes()) *
                                                   double(mc.experts_per_token) / double(mc.num_experts);
    }
  }
  const ModelConfig& c = d.config();
  double kv_per_token = 0;  // keys and values of every layer that stores its own
  for (const LayerConfig& l : c.layers)
    if (l.kv_source < 0)
      kv_per_token += 2.0 * double(l.kv_heads * l.head_dim) * double(dtype_size(d.compute_dtype()));
  return bytes + kv_per_token * context;
}

// Device memory bandwidth in GB/s: a bf16 add of two 256 MiB tensors (three tensors move).
double measure_bandwidth_gbs(Device dev) {
  const int64_t n = is_cpu_class(dev) ? (int64_t(1) << 22) : (int64_t(1) << 27);
  Tensor x = Tensor::full({n}, 1.0f, DType::bf16, dev), y = Tensor::full({n}, 2.0f, DType::bf16, dev);
  const double ms = time_op([&] { return ops::add(x, y); }, dev, 10);
  return 3.0 * double(n) * 2.0 / (ms * 1e-3) / 1e9;
}

std::vector<infer::Sequence> random_prompts(const BenchGenerateOptions& o, int64_t vocab) {
  Rng rng(o.seed);
  infer::SamplingParams greedy;
  infer::StopParams stop;
  stop.max_tokens = int(o.new_tokens);
  std::vector<infer::Sequence> seqs;
  for (int64_t b = 0; b < o.batch; ++b) {
    std::vector<int32_t> ids(size_t(o.prompt_tokens));
    for (int32_t& id : ids) id = int32_t(rng.next_u64() % uint64_t(vocab));
    seqs.emplace_back(std::move(ids), greedy, stop);
  }
  return seqs;
}

void run_bench_generate(const std::string& device, BenchGenerateOptions o) {
  apply_device_option(device);
  if (o.prompt_tokens < 1 || o.new_tokens < 2 || o.batch < 1)
    throw ConfigError("bench generate: --prompt-tokens and --batch must be >= 1, --new-tokens >= 2");
  models::Decoder decoder = load_base_model(o.model);
  for (const auto& spec : o.model.adapters) infer::load_adapter(decoder, infer::parse_adapter_spec(spec));
  const Device dev = decoder.device();
  const int64_t vocab = decoder.config().vocab_size;

  {  // warm-up: pipelines compile on first use and the clocks come up
    BenchGenerateOptions w = o;
    w.new_tokens = o.warmup_tokens;
    std::vector<infer::Sequence> seqs = random_prompts(w, vocab);
    infer::generate(decoder, seqs, o.batch);
  }
  backend(dev).reset_peak();
  std::vector<infer::Sequence> seqs = random_prompts(o, vocab);
  infer::GenerationStats st = infer::generate(decoder, seqs, o.batch);

  const double bandwidth = o.bandwidth_gbs > 0 ? o.bandwidth_gbs : measure_bandwidth_gbs(dev);
  const double step_bytes = bytes_per_step(decoder, double(o.prompt_tokens) + double(o.new_tokens) / 2);
  const double bound = double(o.batch) * bandwidth * 1e9 / step_bytes;
  const double decode = st.decode_tokens_per_s();
  nlohmann::json j{{"tool", "lmtune"},
                   {"device", device_description(dev)},
                   {"model", o.model.model},
                   {"model_type", decoder.config().model_type},
                   {"compute_dtype", dtype_name(decoder.compute_dtype())},
                   {"adapters", o.model.adapters.size()},
                   {"batch", o.batch},
                   {"prompt_tokens", o.prompt_tokens},
                   {"new_tokens", o.new_tokens},
                   {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
                   {"decode_tokens_per_s", decode},
                   {"decode_ms_per_step", decode > 0 ? 1e3 * double(o.batch) / decode : 0.0},
                   {"bytes_per_step", step_bytes},
                   {"bandwidth_gbs", bandwidth},
                   {"bandwidth_measured", o.bandwidth_gbs <= 0},
                   {"bound_tokens_per_s", bound},
                   {"fraction_of_bound", bound > 0 ? decode / bound : 0.0},
                   {"peak_memory_bytes", st.peak_bytes}};
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("lmtune bench generate on %s\n", j["device"].get<std::string>().c_str());
  std::printf("  model        %s (%s), %s compute, %zu adapter(s)\n", o.model.model.c_str(),
              decoder.config().model_type.c_str(), std::string(dtype_name(decoder.compute_dtype())).c_str(),
              o.model.adapters.size());
  std::printf("  shape        batch %lld, prompt %lld, %lld new tokens (greedy)\n", (long long)o.batch,
              (long long)o.prompt_tokens, (long long)o.new_tokens);
  std::printf("  prefill      %.1f tokens/s\n", st.prefill_tokens_per_s());
  std::printf("  decode       %.1f tokens/s (%.3f ms per step)\n", decode, j["decode_ms_per_step"].get<double>());
  std::printf("  bound        %.1f tokens/s: %.3g GB per step at %.1f GB/s (%s); reached %.1f%%\n", bound,
              step_bytes / 1e9, bandwidth, o.bandwidth_gbs > 0 ? "given" : "measured", 100 * decode / bound);
  std::printf("  peak memory  %.1f MiB\n", double(st.peak_bytes) / double(1 << 20));
}

}  // namespace

void add_bench_generate_command(CLI::App& bench, const std::string& device) {
  auto* cmd = bench.add_subcommand("generate", "Prefill and decode tokens/s against the memory-bandwidth bound");
  auto o = std::make_shared<BenchGenerateOptions>();
  o->model.compute_dtype = "auto";
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_model_options(*cmd, o->model);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "random prompt tokens per sequence (default 128)");
  cmd->add_option("--new-tokens", o->new_tokens, "tokens decoded per sequence (default 256)");
  cmd->add_option("--batch", o->batch, "sequences decoded together (default 1)");
  cmd->add_option("--warmup-tokens", o->warmup_tokens, "tokens of a warm-up generation first (default 16)");
  cmd->add_option("--bandwidth-gbs", o->bandwidth_gbs, "the device's memory bandwidth (default: measured)");
  cmd->add_option("--seed", o->seed, "seed of the random prompts (default 42)");
  cmd->add_flag("--json", o->json, "print one JSON object (docs/cli.md lists its fields)");
  cmd->callback([&device, o] { run_bench_generate(device, *o); });
}

}  // namespace lmtune::cli
