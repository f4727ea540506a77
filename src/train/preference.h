// Preference objectives (DPO, ORPO, SimPO; definitions as TRL's, docs/training.md) on batches of pairs. The
// per-sequence log-probability logp(y|x) is the sum over response tokens of log p(token): the fused per-token
// losses (Decoder::token_losses) summed per sequence by a product with a 0/1 [sequences, B*T] matrix, so
// autodiff carries the gradients on every backend without a kernel of its own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/preference.h"
#include "models/decoder.h"
#include "train/recipe.h"
#include "train/train_step.h"

namespace lmtune {

// The recipe's preference data: data.train, and data.valid or a data.valid_split of the training pairs.
struct PreferenceData {
  PreferenceDataset train, valid;
  std::string hash;  // checkpoints record it
};
PreferenceData load_preference_data(const Recipe& recipe, const Tokenizer& tokenizer);

struct PreferenceSettings {
  Objective objective = Objective::dpo;
  double beta = 0.1, label_smoothing = 0, gamma = 0.5;
};
PreferenceSettings preference_settings(const Recipe& recipe);

// log p of each sequence of the batch: f32 [2·pairs], recorded for backward when gradients are on. With
// adapters_off every Linear runs its base weights alone (the DPO reference), LoRA left out.
Tensor sequence_logps(const models::Decoder& model, const PairBatch& batch, bool checkpoint_layers = false,
                      int64_t unchecked_layers = 0, bool adapters_off = false);

// One micro-batch's share of the objective. The step's loss is Σ pair_loss / pairs + Σ nll / chosen tokens
// (nll only for ORPO): a mean over the step's pairs however they fall into micro-batches.
struct PreferenceTerms {
  Tensor pair_loss;                       // f32 scalar: Σ over pairs of the pair term
  Tensor nll;                             // ORPO: Σ token NLL over the chosen responses; else undefined
  Tensor chosen_reward, rejected_reward;  // f32 [pairs], detached
  int64_t chosen_tokens = 0;
};
// `reference`: the reference model's logps for DPO (f32 [2·pairs], no gradient); ignored by ORPO and SimPO.
PreferenceTerms preference_terms(const Tensor& logps, const Tensor& reference, const PairBatch& batch,
                                 const PreferenceSettings& settings);
// sequence_logps (and for DPO the reference's, without gradient) then preference_terms.
PreferenceTerms batch_preference_terms(const models::Decoder& model, const PairBatch& batch,
                                       const PreferenceSettings& settings, bool checkpoint_layers = false,
                                       int64_t unchecked_layers = 0);

// Rewards summed over pairs (host side) into the metrics the trainer logs.
struct RewardStats {
  int64_t pairs = 0;
  double chosen = 0, rejected = 0, wins = 0;
  void add(const Tensor& chosen_reward, const Tensor& rejected_reward);
  // reward_margin (mean chosen - rejected), accuracy (fraction of pairs with chosen > rejected), chosen_reward,
  // rejected_reward (means).
  std::vector<std::pair<std::string, double>> metrics() const;
};

// train_step for a preference objective: the micro-batches' terms accumulate into one step's gradient (each
// scaled as in PreferenceTerms), then the shared clip/skip/update. The result's metrics hold RewardStats.
StepResult preference_train_step(const models::Decoder& model, Optimizer& optimizer, LossScaler& scaler,
                                 const std::vector<PairBatch>& micro_batches, const StepOptions& options,
                                 const PreferenceSettings& settings);

struct PreferenceEval {
  double loss = 0;  // the objective over every pair visited
  RewardStats rewards;
  int64_t batches = 0;
};
// The objective and rewards over `data` in file order, without gradients; max_batches > 0 stops early.
PreferenceEval evaluate_preference(const models::Decoder& model, const PreferenceDataset& data, int pairs_per_batch,
                                   int seq_len, bool packing, const PreferenceSettings& settings,
                                   int max_batches = 0);

}  // namespace lmtune
