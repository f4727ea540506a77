// Evaluation: the token-weighted mean loss of a dataset (the same JSONL formats, masks, batching and packing as
// training, so `lmtune eval` and the trainer's validation loss are one number), and generation metrics for
// prompt/completion data.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::infer {

struct LossResult {
  double loss = 0;      // Σ cross-entropy over every target / tokens
  int64_t tokens = 0;   // targets counted (trainable tokens that have a predecessor in their row)
  int64_t batches = 0;
  double ppl() const { return std::exp(loss); }
};

// Token-weighted mean cross-entropy of `decoder` over every sample of `dataset`, visited once in file order by
// Batcher(dataset, batch_size, seq_len, packing, seed 0, shuffle=false). Each batch runs forward_hidden with the
// batch's doc ids and positions; lm_head and the loss run on the target rows only (Decoder::token_losses: fused
// over vocabulary chunks, or the reference over row chunks), so [B*T, V] logits are never materialised. The sum over all batches is divided by the total target count (not a mean of batch
// means). max_batches > 0 stops after that many batches (the trainer's eval.batches). Runs without gradients.
// The trainer's validation loss is this function too (train/trainer.cpp), so train and `lmtune eval` agree.
LossResult evaluate_loss(const models::Decoder& decoder, const Dataset& dataset, int batch_size, int seq_len,
                         bool packing, int max_batches = 0);

struct PromptCompletion {
  std::string prompt, completion;
};
// The prompt/completion records of a JSONL file (empty when its first record is not in that format).
std::vector<PromptCompletion> read_prompt_completions(const std::filesystem::path& file);

struct GenerationMetrics {
  int64_t examples = 0;
  double exact_match = 0;  // fraction whose stripped greedy output equals the stripped completion
  double contains = 0;     // fraction whose greedy output contains the stripped completion
};
// Greedy decoding of each prompt (tokenized as training does: encode(prompt, add_special_tokens=true)), up to
// the completion's token count + 16 new tokens, stopping at the tokenizer's EOS ids.
GenerationMetrics evaluate_generation(const models::Decoder& decoder, const Tokenizer& tokenizer,
                                      const std::vector<PromptCompletion>& examples, int batch_size);

// Whitespace stripped from both ends (as Python's str.strip()).
std::string strip(const std::string& s);

}  // namespace lmtune::infer
