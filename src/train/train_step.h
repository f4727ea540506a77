// One optimizer step and one evaluation pass, independent of files and logging so tests can drive them:
// token-weighted gradient accumulation over micro-batches, fp16 loss scaling, NaN/Inf detection, global-norm
// clipping (f32) and the fused AdamW/SGD update. docs/training.md describes the sequence.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/batcher.h"
#include "dist/communicator.h"
#include "models/decoder.h"
#include "train/loss_scaler.h"
#include "train/optimizer.h"
#include "train/recipe.h"

namespace lmtune {

// Σ over the batch's trainable targets of the token cross-entropy (f32 scalar, recorded for backward when
// gradients are on). `dropout_step`/`micro` feed the LoRA dropout scope the caller may have opened.
// With checkpoint_layers, the last `unchecked_layers` layers keep their activations (train.checkpoint_layers).
// router_logits, when given, receives the mixture-of-experts layers' router logits (ForwardOptions).
Tensor batch_loss_sum(const models::Decoder& model, const Batch& batch, bool checkpoint_layers,
                      int64_t unchecked_layers = 0, std::vector<Tensor>* router_logits = nullptr);

// Wall time of a step's phases, summed over its micro-batches (`lmtune bench train`).
struct StepPhaseTimes {
  double forward_s = 0;    // forward of each micro-batch up to its loss, then a device synchronize
  double backward_s = 0;   // backward of each micro-batch, then a device synchronize
  double optimizer_s = 0;  // loss reads, gradient norm, clipping and the update, then a device synchronize
  double all_reduce_s = 0;  // several ranks: the loss and gradient all-reduce (train/grad_sync.h)
};

struct StepOptions {
  double lr = 0;
  double grad_clip = 0;          // 0: no clipping
  bool checkpoint_layers = false;
  int64_t unchecked_layers = 0;  // with checkpoint_layers: the last N layers are not checkpointed
  uint64_t seed = 0;             // LoRA dropout masks derive from (seed, step, micro-batch)
  int64_t step = 0;              // 0-based optimizer step
  bool dropout = true;           // open a LoRA dropout scope (adapters with dropout 0 are unaffected)
  StepPhaseTimes* phase_times = nullptr;  // when set: synchronize after each phase and add its time here
  // Data parallelism: the ranks that share the step. Rank r runs backward over the r-th of size() equal
  // consecutive slices of the micro-batches; losses and gradients are summed over the ranks. Null: all of them.
  dist::Communicator* ranks = nullptr;
  // Mixture-of-experts models: the load-balancing loss of each micro-batch (models::router_aux_loss over its
  // tokens), times this and averaged over the step's micro-batches, is added to the objective; 0: not computed.
  double router_aux_loss_coef = 0;
};

// The micro-batches [begin, end) this rank runs: the rank-th of o.ranks' size equal consecutive slices (all of them
// without ranks). Throws ConfigError when they do not split evenly.
struct MicroSlice {
  size_t begin = 0, end = 0, ranks = 1;
};
MicroSlice rank_slice(size_t micro_batches, const StepOptions& o);

// What recipe r gives optimizer step `step` (0-based) at learning rate lr.
StepOptions step_options(const Recipe& r, int64_t step, double lr);
// The load-balancing loss weight recipe r gives a model of `config` (StepOptions::router_aux_loss_coef): 0 for a
// dense model; train.router_aux_loss_coef when set; else the config's when it sets output_router_logits, else 0.
double router_aux_loss_coef(const Recipe& r, const ModelConfig& config);

struct StepResult {
  double loss = 0;               // Σ token losses / trainable tokens of the step (NaN when not finite)
  double grad_norm = 0;          // before clipping, unscaled
  int64_t trainable_tokens = 0;
  int64_t tokens = 0;            // B·T slots fed to the model, padding included
  bool applied = false;          // the optimizer update happened
  bool overflow = false;         // fp16: gradients overflowed; the scale was backed off
  std::string skip_reason;       // why the step was skipped (empty when applied)
  std::vector<std::pair<std::string, double>> metrics;  // the objective's own (preference rewards), logged too
};

// Accumulates the gradients of all micro-batches (each loss scaled by loss_scale / total trainable tokens),
// checks them, clips, and updates. Gradients are zeroed before returning. The micro-batches must hold at least
// one trainable target in total. With options.ranks, `micro_batches` is the whole step's (the same list on every
// rank), each rank computes its slice, and the result (loss, token counts, update) is the same on every rank.
StepResult train_step(const models::Decoder& model, Optimizer& optimizer, LossScaler& scaler,
                      const std::vector<Batch>& micro_batches, const StepOptions& options);

// The end of every objective's step, once its gradients are accumulated (scaled by loss_scale) and r.loss is
// known finite: gradient norm, fp16 overflow and non-finite checks, clipping and the update. Zeroes gradients.
void finish_step(StepResult& r, Optimizer& optimizer, LossScaler& scaler, const StepOptions& options,
                 double loss_scale);

}  // namespace lmtune
