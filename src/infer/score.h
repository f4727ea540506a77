// Log-likelihood scoring (lm-eval's loglikelihood requests): the log-probability the model gives each token of a
// continuation after its context, from prefill-only forwards over batches of records. Used by `lmtune score`,
// `lmtune eval`'s multiple-choice accuracy and the server's echo / prompt log-probs.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::infer {

struct ScoreRequest {
  std::vector<int32_t> context;       // at least one token (the first continuation token is predicted from it)
  std::vector<int32_t> continuation;  // the scored tokens
};

struct TopLogprob {
  int32_t id = 0;
  float logprob = 0;
};
struct TokenScore {
  int32_t id = 0;
  float logprob = 0;             // log-softmax of the raw logits (temperature 1, no sampling filters)
  std::vector<TopLogprob> top;   // the top_n most likely tokens, descending (empty when top_n == 0)
};

struct ScoreOptions {
  int batch_size = 8;  // records per forward
  int top_n = 0;       // > 0: also the top_n alternatives of every scored position (reads logits back)
  // nullopt: every adapter attached to the decoder applies (the CLI); "" the base model alone; else only the
  // adapter of that name (the server, where several are attached).
  std::optional<std::string> adapter;
  std::string progress;  // non-empty: log "<progress>: done/total records (records/s)" every few seconds
};

// One TokenScore per continuation token of each request. Each batch is right-padded (causal attention never
// lets a real token see the padding after it) and runs forward_hidden once; lm_head runs only on the rows that
// predict a continuation token: with top_n == 0 through Decoder::token_losses (fused, no [rows, V] logits),
// else logits + log_softmax, read back in chunks of at most 64 MiB. Runs without gradients.
std::vector<std::vector<TokenScore>> score_tokens(const models::Decoder& decoder,
                                                  const std::vector<ScoreRequest>& requests,
                                                  const ScoreOptions& options = {});

// The top_n entries of a log-softmax row [V], descending (ties by lower id).
std::vector<TopLogprob> top_logprobs(const float* row, int64_t V, int top_n);

// Records of `lmtune score` and of multiple-choice eval; `line` is the JSONL line number (for messages).
struct CompletionRecord {
  std::string prompt, completion;
  int64_t line = 0;
};
struct ChoiceRecord {
  std::string prompt;
  std::vector<std::string> choices;
  int answer = 0;
  int64_t line = 0;
};
// Every non-blank line must be {"prompt": string, "completion": string} (resp. {"prompt": string, "choices":
// [string, ...] (at least 2), "answer": index}); anything else -> FileError "FILE:LINE: ...".
std::vector<CompletionRecord> read_completion_records(const std::filesystem::path& file);
std::vector<ChoiceRecord> read_choice_records(const std::filesystem::path& file);
// Whether the first non-blank line of a JSONL file is an object with a "choices" key.
bool is_choice_file(const std::filesystem::path& file);

// Tokenization as training's prompt/completion format: encode(prompt, true) + encode(completion, false).
// FileError "WHERE: ..." when either part has no tokens.
ScoreRequest completion_request(const Tokenizer& tokenizer, const std::string& prompt,
                                const std::string& completion, const std::string& where);

struct ChoiceScore {
  double logprob = 0;   // Σ over the choice's tokens
  int64_t tokens = 0;
  int64_t chars = 0;    // Unicode code points of the choice text (lm-eval's acc_norm divides by len(str))
};
struct ChoiceScores {
  std::vector<ChoiceScore> choices;
  int predicted = 0;       // argmax of logprob (first on ties)
  int predicted_norm = 0;  // argmax of logprob / chars
};
struct ChoiceAccuracy {
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;
};
// Scores every choice of every record (one request per choice, batched together), with spdlog progress.
std::vector<ChoiceScores> score_choices(const models::Decoder& decoder, const Tokenizer& tokenizer,
                                        const std::vector<ChoiceRecord>& records, const std::string& file,
                                        int batch_size);
ChoiceAccuracy choice_accuracy(const std::vector<ChoiceRecord>& records, const std::vector<ChoiceScores>& results);

// Code points of a UTF-8 string (bytes that are not continuation bytes).
int64_t utf8_length(const std::string& s);

}  // namespace lmtune::infer
