// The generation engine shared by `lmtune generate`, `chat`, `eval` and (next) serving.
//
// A Sequence is one request: its prompt ids, sampler (parameters + random stream), stop conditions, generated ids
// and streamed text. A Session runs a batch of sequences over one decoder and one KV cache whose rows are the
// sequences' slots:
//   prefill(seqs)  one forward pass over all prompts, left-padded to the longest; the padding is masked out of
//                  attention (ForwardOptions::attend_mask, remembered by the KvCache) and positions start at 0 at
//                  each prompt's first real token, so every sequence sees exactly what it would see alone. Only
//                  the last position's hidden state goes through lm_head; each sequence samples its first token.
//   step()         one decode forward of [B, 1] over the cache for all slots, then one sample per running
//                  sequence. Greedy and top-k sampling (without a repetition penalty) read back only the arg-max
//                  or the top-k candidates per row from the device; other samplers read back one row of logits
//                  per sequence.
// Finished sequences keep their slot (their row is computed and ignored) until the batch is done.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "infer/sampler.h"
#include "infer/score.h"
#include "infer/text_stream.h"
#include "models/decoder.h"
#include "tokenizer/tokenizer.h"

namespace lmtune::infer {

struct StopParams {
  int max_tokens = 256;                   // generated tokens at most (the stop id is not counted)
  std::vector<int32_t> stop_ids;          // end generation; not part of generated() or text()
  std::vector<std::string> stop_strings;  // matched on the decoded text; the text stops before it
};

enum class FinishReason { running, length, stop_id, stop_string };
const char* finish_reason_name(FinishReason reason);

class Sequence;
// Samples one token for every unfinished row from logits [B, V] (row b belongs to rows[b]) and feeds it to the
// sequence: greedy and top-k sampling (without a repetition penalty) read back only the arg-max or the top-k
// candidates per row; other samplers read back the rows. When a row wants log-probs, the log-softmax of every
// row is read back too and each sequence records its token's entry. Shared by Session and the serving engine
// (infer/batch_engine.h).
void sample_rows(const Tensor& logits, const std::vector<Sequence*>& rows);

// Prompts left-padded into one [B, P] prefill batch: ids, positions counted from each prompt's first real token,
// and the attention mask (0 on padding). Also sets each sequence's next position to its prompt length.
struct PaddedPrompts {
  int64_t B = 0, P = 0;
  std::vector<int32_t> ids, positions, mask;
  bool padded = false;  // some row is shorter than P
  int64_t tokens = 0;   // real prompt tokens
};
PaddedPrompts left_pad_prompts(const std::vector<Sequence*>& seqs);

// One decode step's inputs: each row's last token and its position, [B] each. Advances the position of every
// unfinished row and returns how many there are (the step's decode tokens).
struct DecodeInputs {
  std::vector<int32_t> ids, positions;
  int64_t running = 0;
};
DecodeInputs decode_inputs(const std::vector<Sequence*>& rows);
// Whether every unfinished row takes the arg-max and wants no log-probs: the device's argmax is then each row's
// token, and steps can be recorded ahead of reading it (pipelined: Session::step, BatchEngine::step).
bool greedy_on_device(const std::vector<Sequence*>& rows);

class Sequence {
 public:
  // `tokenizer` (may be null: no text, no stop strings) must outlive the sequence.
  Sequence(std::vector<int32_t> prompt, const SamplingParams& sampling, StopParams stop,
           const Tokenizer* tokenizer = nullptr);

  const std::vector<int32_t>& prompt() const { return prompt_; }
  // Sampled ids. A stop id is not included; the ids that formed a stop string are.
  const std::vector<int32_t>& generated() const { return generated_; }
  const std::string& text() const;  // the text emitted so far ("" without a tokenizer)
  std::string take_text();          // the text emitted since the last call (streaming)
  bool finished() const { return finish_ != FinishReason::running; }
  FinishReason finish_reason() const { return finish_; }
  const SamplingParams& sampling() const { return sampler_.params(); }
  // Log-probs of each generated token (and its top_n alternatives) from the raw logits, before the sampling
  // transforms (temperature 1, no filters or penalty: what OpenAI's API reports). -1 = off (the default).
  void set_logprobs(int top_n) { logprobs_top_ = top_n; }
  int logprobs_top() const { return logprobs_top_; }
  const std::vector<TokenScore>& logprobs() const { return logprobs_; }  // one per generated() id
  std::vector<TokenScore> take_logprobs();  // the entries since the last call (streaming)

 private:
  friend class Session;
  friend class BatchEngine;
  friend void sample_rows(const Tensor& logits, const std::vector<Sequence*>& rows);
  friend PaddedPrompts left_pad_prompts(const std::vector<Sequence*>& seqs);
  friend DecodeInputs decode_inputs(const std::vector<Sequence*>& rows);
  friend bool greedy_on_device(const std::vector<Sequence*>& rows);
  void accept(int32_t id);  // one sampled id: stop checks, streaming
  void finish(FinishReason reason);
  std::vector<int32_t> history() const;  // prompt + generated, for the repetition penalty

  std::vector<int32_t> prompt_, generated_;
  Sampler sampler_;
  StopParams stop_;
  std::optional<TextStream> stream_;
  std::string unread_;
  int logprobs_top_ = -1;
  std::vector<TokenScore> logprobs_;
  size_t logprobs_read_ = 0;
  FinishReason finish_ = FinishReason::running;
  int64_t position_ = 0;  // position of the next token fed to the model
  int32_t last_ = 0;      // the token to feed next
};

struct SessionOptions {
  int64_t cache_chunk = 256;  // KvCache growth step in tokens
  bool use_cache = true;      // false: recompute the whole sequences at every step (the tests' reference)
};

struct GenerationStats {
  int64_t prefill_tokens = 0;  // prompt tokens (padding not counted)
  int64_t decode_tokens = 0;   // tokens fed by decode steps, running sequences only
  double prefill_seconds = 0;  // prefill forward + first sample
  double decode_seconds = 0;
  size_t peak_bytes = 0;       // device memory peak (weights included) since the first prefill
  double prefill_tokens_per_s() const { return prefill_seconds > 0 ? double(prefill_tokens) / prefill_seconds : 0; }
  double decode_tokens_per_s() const { return decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0; }
  void add(const GenerationStats& o);
};

class Session {
 public:
  // `decoder` must outlive the session; `max_batch` bounds the sequences of one prefill.
  Session(const models::Decoder& decoder, int64_t max_batch, SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Starts a batch: places `seqs` (at most max_batch, not finished; they must outlive the batch) in slots
  // 0..n-1 and prefills them together, sampling each one's first token. Any previous batch must be done
  // (running() == 0); its cache is reused.
  void prefill(const std::vector<Sequence*>& seqs);
  // One decode step for every running sequence. Returns how many are still running. With a cache and every
  // running row greedy (no log-probs), steps are pipelined: each call records the next step on the device's own
  // argmax of the last one, and only then reads that argmax and accepts its tokens, so the device never waits
  // for the host between steps. The host then lags one step: the first call accepts nothing, and the call that
  // finishes the last sequence leaves one step computed in vain.
  int64_t step();
  int64_t running() const;
  const GenerationStats& stats() const { return stats_; }

 private:
  Tensor forward_last(const Tensor& ids, const Tensor& positions, const Tensor& mask,
                      bool ids_on_device = false);  // -> logits [B, V]
  bool pipelines() const;  // whether step() records ahead (above)
  int64_t step_pipelined();
  std::vector<int32_t> take_pending();  // the recorded step's argmax, read (waiting for that step only)
  void accept_pending();                // takes it and accepts each running row's token
  void drop_pending();                  // takes it, if any, and ignores it

  const models::Decoder& decoder_;
  int64_t max_batch_;
  SessionOptions options_;
  std::unique_ptr<models::KvCache> cache_;
  std::vector<Sequence*> rows_;
  // use_cache == false: every row's full token, position and mask columns so far.
  std::vector<std::vector<int32_t>> all_ids_, all_pos_, all_mask_;
  Tensor pending_;  // pipelined steps: i32 [B], the last recorded step's argmax, not yet read
  uint64_t pending_read_ = 0;  // its copy to the host (Backend::read_later)
  GenerationStats stats_;
  bool peak_reset_ = false;
};

// Runs `seqs` to completion in batches of at most max_batch (in order). on_text(index, piece) receives the
// streamed text of each sequence as it is produced.
GenerationStats generate(const models::Decoder& decoder, std::vector<Sequence>& seqs, int64_t max_batch = 8,
                         const std::function<void(size_t, const std::string&)>& on_text = {},
                         SessionOptions options = {});

}  // namespace lmtune::infer
