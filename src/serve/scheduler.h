// The scheduler of `lmtune serve`: one thread owns the engine (infer::BatchEngine) and runs continuous batching;
// HTTP threads hand it Jobs through a bounded queue and wait on each Job for its text.
//
// Loop: admit queued jobs while the batch has room (all n choices of a job join together) and prefill them;
// then one decode step over every running sequence, whichever adapter each uses; publish each sequence's new
// text to its job; drop finished and cancelled sequences. A full queue refuses new jobs (the server answers 503).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "infer/batch_engine.h"
#include "serve/api.h"

namespace lmtune::serve {

// One request in flight: its n sequences (owned here, driven by the scheduler thread) and what the HTTP thread
// has not read yet (guarded by the job's mutex).
class Job {
 public:
  Job(GenerationRequest request, const Tokenizer& tokenizer);

  const GenerationRequest& request() const { return request_; }

  struct Update {
    int index = 0;
    std::string text;
    std::string finish_reason;  // "" while running
    std::vector<TokenLogprob> logprobs;  // the tokens generated since the last update (when requested)
  };
  // HTTP side: waits up to `timeout` for news and moves it into `out`. Returns true once every choice finished
  // (or the job failed) and nothing is left to read.
  bool wait(std::vector<Update>& out, std::chrono::milliseconds timeout);
  // The client went away or gave up: the scheduler drops the sequences before its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Set when the engine failed on this job (the server answers 500).
  std::string error() const;
  // After wait() returned true: the choices as they ended.
  std::vector<ChoiceResult> results() const;

 private:
  friend class Scheduler;
  void publish();                     // scheduler thread: moves new text and ends to the HTTP side
  void fail(const std::string& what);  // scheduler thread
  bool all_finished() const;
  bool needs_prompt_scores() const { return request_.echo && request_.logprobs >= 0; }
  // Scheduler thread, before the first publish: the prompt's log-probs (echo), the first token's null.
  void set_prompt_scores(const std::vector<infer::TokenScore>& scores);

  GenerationRequest request_;
  const Tokenizer& tokenizer_;
  std::vector<infer::Sequence> seqs_;  // fixed size: the engine holds pointers to them
  std::vector<bool> reported_;         // finish published (scheduler thread only)
  std::atomic<bool> cancelled_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Update> pending_;
  std::vector<ChoiceResult> results_;
  int finished_ = 0;
  std::string error_;
};

struct SchedulerOptions {
  int64_t max_batch = 8;     // sequences decoded together
  size_t queue_limit = 64;   // jobs waiting for a batch slot; more -> submit() refuses
};

struct SchedulerStats {
  size_t queued = 0;
  int64_t running = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, jobs_done = 0, steps = 0;
};

class Scheduler {
 public:
  // `decoder` (adapters attached) must outlive the scheduler. Starts the engine thread.
  Scheduler(const models::Decoder& decoder, SchedulerOptions options);
  ~Scheduler();  // stops the thread; unfinished jobs fail
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // False when the queue is full. Throws ApiError 400 when the job can never fit a batch (n > max_batch).
  bool submit(const std::shared_ptr<Job>& job);
  SchedulerStats stats() const;
  void stop();

 private:
  void loop();
  std::vector<std::shared_ptr<Job>> admit();  // jobs that fit now (engine thread)
  void score_prompts(const std::vector<std::shared_ptr<Job>>& jobs);  // echo with log-probs (engine thread)
  void fail_all(const std::string& what);

  SchedulerOptions options_;
  const models::Decoder& decoder_;
  infer::BatchEngine engine_;  // engine thread only
  std::vector<std::shared_ptr<Job>> active_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace lmtune::serve
