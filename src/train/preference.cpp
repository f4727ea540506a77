// Preference objectives (see preference.h).
#include "train/preference.h"

#include <cmath>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "models/linear.h"
#include "train/grad_sync.h"
#include "train/train_data.h"

namespace lmtune {
namespace {

// log σ(z) = -log(e⁰ + e^(-z)), by logsumexp: stable for large |z| (log(sigmoid(z)) is -inf below about -88).
Tensor log_sigmoid(const Tensor& z) {
  const int64_t n = z.numel();
  Tensor zero = Tensor::zeros({n, 1}, DType::f32, z.device());
  return ops::neg(ops::logsumexp(ops::concat({zero, ops::reshape(ops::neg(z), {n, 1})}, 1), 1));
}

// -(1 - ls) log σ(z) - ls log σ(-z): DPO's loss with conservative label smoothing (cDPO, as TRL's "sigmoid").
Tensor smoothed_loss(const Tensor& z, double ls) {
  Tensor loss = ops::scale(log_sigmoid(z), float(-(1 - ls)));
  if (ls > 0) loss = ops::sub(loss, ops::scale(log_sigmoid(ops::neg(z)), float(ls)));
  return loss;
}

// Column `c` (0 chosen, 1 rejected) of x [2·pairs] viewed as [pairs, 2] -> [pairs].
Tensor column(const Tensor& x, int64_t pairs, int64_t c) {
  return ops::reshape(ops::slice(ops::reshape(x, {pairs, 2}), 1, c, c + 1), {pairs});
}

}  // namespace

PreferenceData load_preference_data(const Recipe& r, const Tokenizer& tok) {
  PreferenceData d;
  d.train = load_preference_dataset(r.data.train, tok, data_options(r));
  d.hash = "preference:" + d.train.hash;
  if (!r.data.valid.empty()) {
    d.valid = load_preference_dataset(r.data.valid, tok, data_options(r));
    d.hash += "+valid:" + d.valid.hash;
  } else if (r.data.valid_split > 0) {
    d.valid = split_preference_dataset(d.train, r.data.valid_split, r.train.seed);
    d.hash += "+split:" + std::to_string(r.data.valid_split) + ":" + std::to_string(r.train.seed);
  }
  return d;
}

PreferenceSettings preference_settings(const Recipe& r) {
  return {r.objective, r.preference.beta, r.preference.label_smoothing, r.preference.gamma};
}

Tensor sequence_logps(const models::Decoder& model, const PairBatch& pb, bool checkpoint_layers,
                      int64_t unchecked_layers, bool adapters_off) {
  const Batch& b = pb.batch;
  const Device d = model.device();
  const Shape shape{b.B, b.T};
  const int64_t N = int64_t(b.B) * b.T, S = 2 * pb.pairs;
  models::ForwardOptions fo;
  fo.doc_ids = Tensor::from_ints(b.doc_ids, shape, d);
  fo.checkpoint_layers = checkpoint_layers;
  fo.unchecked_layers = unchecked_layers;
  const models::RowAdapters none;  // no group: every row runs the base weights alone
  if (adapters_off) fo.row_adapters = &none;
  Tensor hidden =
      model.forward_hidden(Tensor::from_ints(b.ids, shape, d), Tensor::from_ints(b.positions, shape, d), fo);
  Tensor nll = model.token_losses(hidden, Tensor::from_ints(b.targets, {N}, d));  // [N], 0 off the responses
  std::vector<float> segments(size_t(S * N), 0.0f);
  for (int64_t i = 0; i < N; ++i)
    if (pb.sequence[size_t(i)] >= 0) segments[size_t(pb.sequence[size_t(i)]) * size_t(N) + size_t(i)] = 1.0f;
  Tensor sums = ops::matmul(Tensor::from_floats(segments, {S, N}, DType::f32, d), ops::reshape(nll, {N, 1}));
  return ops::neg(ops::reshape(sums, {S}));
}

PreferenceTerms preference_terms(const Tensor& logps, const Tensor& reference, const PairBatch& pb,
                                 const PreferenceSettings& s) {
  const int64_t P = pb.pairs;
  PreferenceTerms t;
  for (int64_t p = 0; p < P; ++p) t.chosen_tokens += pb.response_tokens[size_t(2 * p)];
  const float beta = float(s.beta);
  Tensor c = column(logps, P, 0), r = column(logps, P, 1), loss;
  if (s.objective == Objective::dpo) {
    if (!reference.defined()) throw Error("dpo: the reference log-probabilities are missing");
    Tensor dc = ops::sub(c, column(reference, P, 0)), dr = ops::sub(r, column(reference, P, 1));
    loss = smoothed_loss(ops::scale(ops::sub(dc, dr), beta), s.label_smoothing);
    t.chosen_reward = ops::scale(dc, beta).detach();
    t.rejected_reward = ops::scale(dr, beta).detach();
  } else {
    // SimPO and ORPO use the length-normalised log-probability a = logp / response tokens.
    std::vector<float> inv(pb.response_tokens.size());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / float(pb.response_tokens[i]);
    Tensor avg = ops::mul(logps, Tensor::from_floats(inv, {2 * P}, DType::f32, logps.device()));
    Tensor ac = column(avg, P, 0), ar = column(avg, P, 1);
    if (s.objective == Objective::simpo) {
      loss = smoothed_loss(ops::add_scalar(ops::scale(ops::sub(ac, ar), beta), float(-s.gamma)), s.label_smoothing);
    } else if (s.objective == Objective::orpo) {
      // log odds(y) = a - log(1 - e^a); the odds-ratio term is -beta · log σ(log odds_c - log odds_r).
      auto log1m_exp = [](const Tensor& a) { return ops::log(ops::add_scalar(ops::neg(ops::exp(a)), 1.0f)); };
      Tensor log_odds = ops::sub(ops::sub(ac, ar), ops::sub(log1m_exp(ac), log1m_exp(ar)));
      loss = ops::scale(log_sigmoid(log_odds), -beta);
      t.nll = ops::neg(ops::sum_all(c));
    } else {
      throw Error("preference_terms: objective '" + to_string(s.objective) + "' is not a preference objective");
    }
    t.chosen_reward = ops::scale(ac, beta).detach();
    t.rejected_reward = ops::scale(ar, beta).detach();
  }
  t.pair_loss = ops::sum_all(loss);
  return t;
}

PreferenceTerms batch_preference_terms(const models::Decoder& model, const PairBatch& pb,
                                       const PreferenceSettings& s, bool checkpoint_layers,
                                       int64_t unchecked_layers) {
  Tensor reference;
  if (s.objective == Objective::dpo) {
    NoGrad no_grad;  // the reference is a constant of the step
    reference = sequence_logps(model, pb, false, 0, true);
  }
  Tensor logps = sequence_logps(model, pb, checkpoint_layers, unchecked_layers);
  return preference_terms(logps, reference, pb, s);
}

void RewardStats::add(const Tensor& chosen_reward, const Tensor& rejected_reward) {
  const std::vector<float> c = chosen_reward.to_floats(), r = rejected_reward.to_floats();
  for (size_t i = 0; i < c.size(); ++i) {
    chosen += c[i];
    rejected += r[i];
    wins += c[i] > r[i] ? 1 : 0;
  }
  pairs += int64_t(c.size());
}

std::vector<std::pair<std::string, double>> RewardStats::metrics() const {
  const double n = double(std::max<int64_t>(pairs, 1));
  return {{"reward_margin", (chosen - rejected) / n},
          {"accuracy", wins / n},
          {"chosen_reward", chosen / n},
          {"rejected_reward", rejected / n}};
}

StepResult preference_train_step(const models::Decoder& model, Optimizer& opt, LossScaler& scaler,
                                 const std::vector<PairBatch>& micro, const StepOptions& o,
                                 const PreferenceSettings& s) {
  StepResult r;
  int64_t pairs = 0, chosen_tokens = 0;
  for (const PairBatch& b : micro) {
    pairs += b.pairs;
    r.trainable_tokens += b.batch.trainable_tokens;
    r.tokens += int64_t(b.batch.B) * b.batch.T;
    for (int64_t p = 0; p < b.pairs; ++p) chosen_tokens += b.response_tokens[size_t(2 * p)];
  }
  if (pairs == 0) throw ConfigError("training step " + std::to_string(o.step + 1) + ": no preference pair");
  opt.zero_grad();
  const double loss_scale = scaler.enabled ? scaler.scale : 1.0;
  // Each micro-batch adds its pairs' terms / the step's pairs (and ORPO's NLL / the step's chosen tokens), so the
  // step's gradient is that of one batch of all its pairs.
  const float pair_weight = float(loss_scale / double(pairs));
  const float nll_weight = float(loss_scale / double(std::max<int64_t>(chosen_tokens, 1)));
  std::vector<Tensor> pair_sums, nll_sums;
  RewardStats rewards;
  // Data parallelism: rank r takes the r-th of `ranks` equal consecutive slices of the micro-batches.
  const MicroSlice mine = rank_slice(micro.size(), o);
  const size_t ranks = mine.ranks;
  for (size_t i = mine.begin; i < mine.end; ++i) {
    if (micro[i].pairs == 0) continue;
    std::unique_ptr<models::LoraDropoutScope> dropout;
    if (o.dropout) dropout = std::make_unique<models::LoraDropoutScope>(o.seed, uint64_t(o.step), uint64_t(i));
    PreferenceTerms t = batch_preference_terms(model, micro[i], s, o.checkpoint_layers, o.unchecked_layers);
    Tensor objective = ops::scale(t.pair_loss, pair_weight);
    if (t.nll.defined()) objective = ops::add(objective, ops::scale(t.nll, nll_weight));
    backward(objective);
    pair_sums.push_back(t.pair_loss.detach());
    if (t.nll.defined()) nll_sums.push_back(t.nll.detach());
    rewards.add(t.chosen_reward, t.rejected_reward);
  }
  // The step's sums over every rank (each rank then decides alike whether to skip it).
  std::vector<double> sums{0, 0, rewards.chosen, rewards.rejected, rewards.wins, double(rewards.pairs)};
  for (const Tensor& t : pair_sums) sums[0] += t.item();
  for (const Tensor& t : nll_sums) sums[1] += t.item();
  if (ranks > 1) o.ranks->all_reduce_sum(sums);
  rewards = {int64_t(sums[5]), sums[2], sums[3], sums[4]};
  r.loss = sums[0] / double(pairs);
  if (s.objective == Objective::orpo) r.loss += sums[1] / double(std::max<int64_t>(chosen_tokens, 1));
  r.metrics = rewards.metrics();
  if (!std::isfinite(r.loss)) {
    r.skip_reason = "loss is " + std::string(std::isnan(r.loss) ? "NaN" : "Inf");
    opt.zero_grad();
    return r;
  }
  if (ranks > 1) all_reduce_gradients(opt.params(), *o.ranks);
  finish_step(r, opt, scaler, o, loss_scale);
  return r;
}

PreferenceEval evaluate_preference(const models::Decoder& model, const PreferenceDataset& data, int pairs_per_batch,
                                   int seq_len, bool packing, const PreferenceSettings& s, int max_batches) {
  NoGrad no_grad;
  PreferenceEval e;
  PairBatcher batcher(data, pairs_per_batch, seq_len, packing, 0, false);
  double pair_sum = 0, nll_sum = 0;
  int64_t chosen_tokens = 0;
  while (!batcher.epoch_finished() && (max_batches <= 0 || e.batches < max_batches)) {
    PairBatch pb = batcher.next();
    PreferenceTerms t = batch_preference_terms(model, pb, s);
    pair_sum += t.pair_loss.item();
    if (t.nll.defined()) nll_sum += t.nll.item();
    chosen_tokens += t.chosen_tokens;
    e.rewards.add(t.chosen_reward, t.rejected_reward);
    ++e.batches;
  }
  e.loss = pair_sum / double(std::max<int64_t>(e.rewards.pairs, 1));
  if (s.objective == Objective::orpo) e.loss += nll_sum / double(std::max<int64_t>(chosen_tokens, 1));
  return e;
}

}  // namespace lmtune
