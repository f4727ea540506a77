// Token sampling for generation: greedy, temperature, top-k, top-p, min-p and the repetition penalty, applied in
// transformers' order (repetition penalty, temperature, top-k, top-p, min-p), drawing from our portable Rng so a
// seed reproduces the same tokens on every platform. Works on one host row of logits; the engine
// (infer/generator.h) decides what to read back from the device.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/random.h"

namespace lmtune::infer {

struct SamplingParams {
  float temperature = 0;         // 0: greedy (argmax); the filters below are then ignored
  int top_k = 0;                 // > 0: keep the k most likely tokens
  float top_p = 1;               // (0, 1]: keep the smallest set of tokens whose probability reaches top_p
  float min_p = 0;               // [0, 1]: keep tokens with probability >= min_p * the largest probability
  float repetition_penalty = 1;  // > 0; 1 = off. HF: logit / pen if logit > 0 else logit * pen, once per id
  uint64_t seed = 0;

  // Throws ConfigError naming the parameter (temperature < 0, top_k < 0, top_p outside (0, 1], min_p outside
  // [0, 1], repetition_penalty <= 0).
  void validate() const;
  bool greedy() const { return temperature == 0; }
  // The next token only depends on the largest top_k logits (no penalty reorders them): the engine may then
  // read back only those from the device.
  bool needs_full_row() const { return repetition_penalty != 1 || (!greedy() && top_k == 0); }
};

// transformers' RepetitionPenaltyLogitsProcessor, in place: every distinct id of `history` is penalised once.
void apply_repetition_penalty(std::vector<float>& logits, const std::vector<int32_t>& history, float penalty);

// The distribution a non-greedy draw samples from, after temperature, top-k, top-p and min-p (the repetition
// penalty is applied by the caller): (id, probability) pairs, most likely first, probabilities summing to 1.
// `ids` names the entries of `logits` (empty: 0..n-1), e.g. the candidates a device top-k returned.
std::vector<std::pair<int32_t, double>> sampling_distribution(const std::vector<float>& logits,
                                                              const SamplingParams& params,
                                                              const std::vector<int32_t>& ids = {});

// One sequence's sampler: its parameters and its random stream.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // validates

  // Picks the next id from a full row of logits [V]; `history` (prompt + generated ids) feeds the penalty.
  int32_t sample(std::vector<float> logits, const std::vector<int32_t>& history);
  // Picks from candidates (the largest logits, descending, with their ids) when !params().needs_full_row().
  int32_t sample_candidates(const std::vector<float>& values, const std::vector<int32_t>& ids);

  const SamplingParams& params() const { return params_; }

 private:
  int32_t draw(const std::vector<std::pair<int32_t, double>>& dist);
  SamplingParams params_;
  Rng rng_;
};

}  // namespace lmtune::infer
