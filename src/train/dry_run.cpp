// `lmtune train --dry-run`: everything train() checks before its first step, and what the run would use.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/backend.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "models/memory.h"
#include "tokenizer/tokenizer.h"
#include "train/model_setup.h"
#include "train/preference.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  return buf;
}

void print_stats(const char* name, const Dataset& d, int seq_len, bool packing, uint64_t seed) {
  const DatasetStats& s = d.stats;
  std::printf("%s data (%s)\n", name, s.format.c_str());
  std::printf("  samples           %lld (of %lld lines)\n", (long long)s.samples, (long long)s.lines);
  std::printf("  tokens            %lld, trainable %lld\n", (long long)s.tokens, (long long)s.trainable_tokens);
  std::printf("  truncated         %lld, dropped (over-long) %lld, rejected (nothing trainable) %lld\n",
              (long long)s.truncated, (long long)s.dropped_overlong, (long long)s.rejected_untrainable);
  std::printf("  sequences/epoch   %lld (%s, %d tokens each)\n", (long long)sequences_per_epoch(d, seq_len, packing, seed),
              packing ? "packed" : "one sample per row", seq_len);
}

void print_pair_stats(const char* name, const PreferenceDataset& d, int per_step, int steps) {
  const DatasetStats& s = d.stats;
  std::printf("%s data (preference pairs)\n", name);
  std::printf("  pairs             %lld (of %lld lines)\n", (long long)s.samples, (long long)s.lines);
  std::printf("  tokens            %lld, in responses %lld\n", (long long)s.tokens, (long long)s.trainable_tokens);
  std::printf("  truncated         %lld, dropped (over-long) %lld, rejected (empty response) %lld\n",
              (long long)s.truncated, (long long)s.dropped_overlong, (long long)s.rejected_untrainable);
  if (per_step > 0)
    std::printf("steps/epoch       %lld (%d pairs per step); %d steps = %.2f epochs\n",
                (long long)((s.samples + per_step - 1) / per_step), per_step, steps,
                double(steps) * double(per_step) / double(std::max<int64_t>(s.samples, 1)));
}

// The objective's data, loaded (and its errors thrown) before anything is printed.
struct DryRunData {
  std::optional<TrainData> sft;
  std::optional<PreferenceData> preference;
};

// The data part of the dry run: statistics of the objective's data.
void print_data(const Recipe& r, const DryRunData& d) {
  if (d.preference) {
    const PreferenceData& data = *d.preference;
    print_pair_stats("training", data.train, r.train.batch_size * r.train.grad_accum, r.train.steps);
    if (!data.valid.pairs.empty()) print_pair_stats("validation", data.valid, 0, 0);
    return;
  }
  const TrainData& data = *d.sft;
  print_stats("training", data.train, r.data.max_seq_len, r.data.packing, r.train.seed);
  if (data.has_valid()) print_stats("validation", data.valid, r.data.max_seq_len, r.data.packing, r.train.seed);
  const int64_t seqs = sequences_per_epoch(data.train, r.data.max_seq_len, r.data.packing, r.train.seed);
  const int64_t per_step = int64_t(r.train.batch_size) * r.train.grad_accum;
  std::printf("steps/epoch       %lld (%lld sequences per step); %d steps = %.2f epochs\n",
              (long long)((seqs + per_step - 1) / per_step), (long long)per_step, r.train.steps,
              double(r.train.steps) * double(per_step) / double(seqs));
}

}  // namespace

void dry_run(const Recipe& r, const TrainOptions& options) {
  const Device device = training_device(r, options.device);
  check_model_files(r);
  ModelConfig config = load_model_config(r.model);
  Tokenizer tokenizer = Tokenizer::load(r.model);
  check_recipe_fits(r, tokenizer, device);
  DryRunData data;
  if (r.objective == Objective::sft) data.sft = load_train_data(r, tokenizer);
  else data.preference = load_preference_data(r, tokenizer);

  std::printf("# resolved recipe (%s)\n%s\n", r.source.string().c_str(), r.resolved_yaml.c_str());
  std::printf("device            %s\n", device.str().c_str());
  print_data(r, data);

  models::TrainingMemoryOptions mo;
  mo.batch = sequences_per_micro_batch(r);
  mo.seq = r.data.max_seq_len;
  mo.rank = r.finetune == Finetune::full ? 0 : r.lora.rank;
  mo.compute_dtype = compute_dtype(r);
  mo.weight_dtype = r.finetune == Finetune::full ? DType::f32 : mo.compute_dtype;
  mo.quantize = r.quantize;
  models::TrainingMemoryEstimate e = models::estimate_training_memory(config, mo);
  std::printf("memory estimate (LoRA rank %lld on all projections, batch %lld x %lld%s%s)\n", (long long)mo.rank,
              (long long)mo.batch, (long long)mo.seq, r.quantize ? ", base projections in " : "",
              r.quantize ? std::string(quant::info(*r.quantize).name).c_str() : "");
  std::printf("  weights %s, adapters+grads+AdamW %s, activations %s (%s with gradient checkpointing)\n",
              mib(e.weights).c_str(), mib(e.lora_params + e.lora_grads + e.optimizer).c_str(),
              mib(e.activations).c_str(), mib(e.activations_checkpointed).c_str());
  std::printf("  total             %s%s\n", mib(e.total(r.train.grad_checkpointing)).c_str(),
              r.finetune == Finetune::full ? " (full fine-tuning adds 16 bytes per parameter: grads and AdamW moments)"
                                           : "");
  const uint64_t available = backend(device).available_bytes();
  if (r.train.grad_checkpointing && r.train.checkpoint_layers == "auto" && r.finetune != Finetune::full) {
    const int64_t unchecked = models::layers_to_leave_unchecked(e, available);
    std::printf("  checkpoint_layers auto: the last %lld of %lld layers keep their activations: %s\n",
                (long long)unchecked, (long long)e.layers, mib(e.total_checkpointing_all_but(unchecked)).c_str());
  }
  std::printf("  available         %s on %s\n", available ? mib(available).c_str() : "unknown", device.str().c_str());
}

}  // namespace lmtune
