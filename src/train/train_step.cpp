// Training step and evaluation (see train_step.h).
#include "train/train_step.h"

#include <chrono>
#include <cmath>

#include "core/autodiff.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/linear.h"
#include "models/moe.h"
#include "train/grad_sync.h"

namespace lmtune {

namespace {

// Adds the wall time since the last lap to a phase of StepPhaseTimes, after a device synchronize. Without a
// StepPhaseTimes (the trainer) it does nothing, so the step never waits for the device mid-way.
class PhaseClock {
 public:
  PhaseClock(StepPhaseTimes* times, Device device) : times_(times), device_(device) {}
  void lap(double StepPhaseTimes::*phase) {
    if (!times_) return;
    backend(device_).synchronize();
    const auto now = std::chrono::steady_clock::now();
    times_->*phase += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  StepPhaseTimes* times_;
  Device device_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

Tensor batch_loss_sum(const models::Decoder& model, const Batch& b, bool checkpoint_layers,
                      int64_t unchecked_layers, std::vector<Tensor>* router_logits) {
  const Device d = model.device();
  const Shape shape{b.B, b.T};
  Tensor ids = Tensor::from_ints(b.ids, shape, d);
  Tensor positions = Tensor::from_ints(b.positions, shape, d);
  Tensor targets = Tensor::from_ints(b.targets, {int64_t(b.B) * b.T}, d);
  models::ForwardOptions fo;
  fo.doc_ids = Tensor::from_ints(b.doc_ids, shape, d);  // packed documents (and padding) attend only to themselves
  fo.checkpoint_layers = checkpoint_layers;
  fo.unchecked_layers = unchecked_layers;
  fo.router_logits = router_logits;
  // lm_head + cross-entropy fused over vocabulary chunks: no [B*T, V] logits (Decoder::token_losses).
  return ops::sum_all(model.token_losses(model.forward_hidden(ids, positions, fo), targets));
}

StepOptions step_options(const Recipe& r, int64_t step, double lr) {
  StepOptions so;
  so.lr = lr;
  so.grad_clip = r.train.grad_clip;
  so.checkpoint_layers = r.train.grad_checkpointing;
  so.seed = r.train.seed;
  so.step = step;
  return so;
}

MicroSlice rank_slice(size_t micro_batches, const StepOptions& o) {
  const size_t rank = o.ranks ? size_t(o.ranks->rank()) : 0, ranks = o.ranks ? size_t(o.ranks->size()) : 1;
  if (micro_batches % ranks != 0)
    throw ConfigError("training step: " + std::to_string(micro_batches) + " micro-batches do not split over " +
                      std::to_string(ranks) + " ranks");
  const size_t per_rank = micro_batches / ranks;
  return {rank * per_rank, (rank + 1) * per_rank, ranks};
}

double router_aux_loss_coef(const Recipe& r, const ModelConfig& config) {
  if (config.num_experts == 0) return 0;
  if (r.train.router_aux_loss_coef) return *r.train.router_aux_loss_coef;
  return config.output_router_logits ? config.router_aux_loss_coef : 0;
}

StepResult train_step(const models::Decoder& model, Optimizer& opt, LossScaler& scaler,
                      const std::vector<Batch>& micro, const StepOptions& o) {
  StepResult r;
  for (const Batch& b : micro) {
    r.trainable_tokens += b.trainable_tokens;
    r.tokens += int64_t(b.B) * b.T;
  }
  if (r.trainable_tokens == 0) throw ConfigError("training step " + std::to_string(o.step + 1) + ": no trainable token");
  opt.zero_grad();
  // Token weighting: each micro-batch contributes its summed token losses / the step's trainable tokens, so the
  // step's loss and gradient are those of one big batch, however the tokens fall into micro-batches.
  const double loss_scale = scaler.enabled ? scaler.scale : 1.0;
  const float weight = float(loss_scale / double(r.trainable_tokens));
  // The host reads the micro-batches' losses only after recording every backward pass: no wait for the GPU in
  // the middle of a step. A non-finite loss then skips the step as before (its gradients are discarded).
  std::vector<Tensor> sums;
  std::vector<size_t> sum_micro;  // the micro-batch of each sum
  std::vector<Tensor> aux_sums;   // each micro-batch's router load-balancing loss (mixtures of experts)
  const MicroSlice mine = rank_slice(micro.size(), o);
  const size_t ranks = mine.ranks;
  PhaseClock clock(o.phase_times, model.device());
  for (size_t i = mine.begin; i < mine.end; ++i) {
    if (micro[i].trainable_tokens == 0) continue;
    std::unique_ptr<models::LoraDropoutScope> dropout;
    if (o.dropout) dropout = std::make_unique<models::LoraDropoutScope>(o.seed, uint64_t(o.step), uint64_t(i));
    std::vector<Tensor> router_logits;
    const bool aux = o.router_aux_loss_coef > 0;
    Tensor sum = batch_loss_sum(model, micro[i], o.checkpoint_layers, o.unchecked_layers,
                                aux ? &router_logits : nullptr);
    Tensor objective = ops::scale(sum, weight);
    if (aux) {  // transformers adds coef x aux to each micro-batch's mean loss; the step averages micro-batches
      Tensor a = models::router_aux_loss(router_logits, model.config().experts_per_token);
      const double aux_weight = o.router_aux_loss_coef * loss_scale / double(micro.size());
      objective = ops::add(objective, ops::scale(a, float(aux_weight)));
      aux_sums.push_back(a.detach());
    }
    clock.lap(&StepPhaseTimes::forward_s);
    backward(objective);
    sums.push_back(sum.detach());
    sum_micro.push_back(i);
    clock.lap(&StepPhaseTimes::backward_s);
  }
  double loss_sum = 0;
  for (size_t i = 0; i < sums.size() && std::isfinite(loss_sum); ++i) {
    loss_sum += sums[i].item();
    if (!std::isfinite(loss_sum))
      r.skip_reason = "loss is " + std::string(std::isnan(loss_sum) ? "NaN" : "Inf") + " in micro-batch " +
                      std::to_string(sum_micro[i] + 1) + " of " + std::to_string(micro.size());
  }
  if (ranks > 1) {  // the step's loss, and whether any rank saw a non-finite one
    std::vector<double> total{loss_sum};
    o.ranks->all_reduce_sum(total);
    if (!std::isfinite(total[0]) && r.skip_reason.empty())
      r.skip_reason = "loss is " + std::string(std::isnan(total[0]) ? "NaN" : "Inf") + " on another rank";
    loss_sum = total[0];
  }
  if (!std::isfinite(loss_sum)) {
    r.loss = loss_sum;
    opt.zero_grad();
    return r;
  }
  if (ranks > 1) {
    all_reduce_gradients(opt.params(), *o.ranks);
    clock.lap(&StepPhaseTimes::all_reduce_s);
  }
  r.loss = loss_sum / double(r.trainable_tokens);
  if (!aux_sums.empty()) {  // the mean over this rank's micro-batches, summed over ranks then averaged
    std::vector<double> aux{0};
    for (const Tensor& a : aux_sums) aux[0] += a.item();
    if (ranks > 1) o.ranks->all_reduce_sum(aux);
    r.metrics.push_back({"router_aux_loss", aux[0] / double(micro.size())});
  }
  finish_step(r, opt, scaler, o, loss_scale);
  if (!r.applied) return r;
  clock.lap(&StepPhaseTimes::optimizer_s);  // the loss reads, gradient norm, clipping and the update
  return r;
}

void finish_step(StepResult& r, Optimizer& opt, LossScaler& scaler, const StepOptions& o, double loss_scale) {
  r.grad_norm = opt.grad_norm(loss_scale);
  const bool finite = std::isfinite(r.grad_norm);
  if (!finite && scaler.enabled && scaler.scale > scaler.min_scale) {
    r.overflow = true;
    scaler.update(true);
    r.skip_reason = "f16 gradient overflow; loss scale backed off to " + std::to_string(scaler.scale);
    opt.zero_grad();
    return;
  }
  if (!finite) {
    r.skip_reason = "gradient norm is " + std::string(std::isnan(r.grad_norm) ? "NaN" : "Inf");
    opt.zero_grad();
    return;
  }
  scaler.update(false);
  // torch.nn.utils.clip_grad_norm_: multiply by max_norm / (norm + 1e-6) when that is below 1.
  double clip = 1.0;
  if (o.grad_clip > 0) clip = std::min(1.0, o.grad_clip / (r.grad_norm + 1e-6));
  opt.step(o.lr, clip / loss_scale);
  opt.zero_grad();
  r.applied = true;
}

}  // namespace lmtune
