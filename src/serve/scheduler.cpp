// The engine thread and its jobs (see scheduler.h).
#include "serve/scheduler.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace lmtune::serve {

// ---------------------------------------------------------------------------------------------------------------
// Job

Job::Job(GenerationRequest request, const Tokenizer& tokenizer)
    : request_(std::move(request)), tokenizer_(tokenizer) {
  seqs_.reserve(size_t(request_.n));
  for (int i = 0; i < request_.n; ++i) {
    infer::SamplingParams p = request_.sampling;
    p.seed += uint64_t(i);  // n seeded choices differ from each other but are each reproducible
    seqs_.emplace_back(request_.prompt, p, request_.stop, &tokenizer);
    seqs_.back().set_logprobs(request_.logprobs);
  }
  reported_.assign(seqs_.size(), false);
  results_.resize(seqs_.size());
  if (request_.echo)
    for (ChoiceResult& r : results_) r.text = request_.prompt_text;
}

void Job::set_prompt_scores(const std::vector<infer::TokenScore>& scores) {
  std::vector<TokenLogprob> prompt;
  prompt.push_back(TokenLogprob{tokenizer_.decode({request_.prompt[0]}), std::nullopt, {}});
  for (TokenLogprob& t : wire_logprobs(tokenizer_, scores)) prompt.push_back(std::move(t));
  std::lock_guard<std::mutex> lock(mu_);
  for (ChoiceResult& r : results_) r.logprobs = prompt;
}

bool Job::all_finished() const { return finished_ == int(seqs_.size()) || !error_.empty(); }

bool Job::wait(std::vector<Update>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || all_finished(); });
  for (Update& u : pending_) out.push_back(std::move(u));
  pending_.clear();
  return all_finished();
}

std::string Job::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::vector<ChoiceResult> Job::results() const {
  std::lock_guard<std::mutex> lock(mu_);
  return results_;
}

void Job::publish() {
  std::vector<Update> news;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    infer::Sequence& s = seqs_[i];
    Update u{int(i), s.take_text(), "", {}};
    if (request_.logprobs >= 0) u.logprobs = wire_logprobs(tokenizer_, s.take_logprobs());
    if (s.finished() && !reported_[i]) {
      u.finish_reason = openai_finish_reason(s.finish_reason());
      reported_[i] = true;
    }
    if (!u.text.empty() || !u.finish_reason.empty() || !u.logprobs.empty()) news.push_back(std::move(u));
  }
  if (news.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Update& u : news) {
      ChoiceResult& r = results_[size_t(u.index)];
      r.text += u.text;
      r.logprobs.insert(r.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
      if (!u.finish_reason.empty()) {
        r.finish_reason = u.finish_reason;
        r.completion_tokens = int64_t(seqs_[size_t(u.index)].generated().size());
        ++finished_;
      }
      pending_.push_back(std::move(u));
    }
  }
  cv_.notify_all();
}

void Job::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = what.empty() ? "generation failed" : what;
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------------------------
// Scheduler

Scheduler::Scheduler(const models::Decoder& decoder, SchedulerOptions options)
    : options_(options), decoder_(decoder), engine_(decoder, options.max_batch) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whatever was left never runs.
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(queue_);
  }
  for (auto& job : left) job->fail("the server is shutting down");
  fail_all("the server is shutting down");
}

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
  if (job->request().n > options_.max_batch)
    throw ApiError(400, "'n' = " + std::to_string(job->request().n) + " exceeds this server's batch size (" +
                            std::to_string(options_.max_batch) + ")",
                   "n");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || queue_.size() >= options_.queue_limit) return false;
    queue_.push_back(job);
    stats_.queued = queue_.size();
  }
  cv_.notify_all();
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<std::shared_ptr<Job>> Scheduler::admit() {
  std::vector<std::shared_ptr<Job>> out;
  int64_t room = options_.max_batch - engine_.size();
  std::lock_guard<std::mutex> lock(mu_);
  // First come, first served: a job that does not fit yet blocks those behind it (no starvation of large n).
  while (!queue_.empty()) {
    const std::shared_ptr<Job>& front = queue_.front();
    if (front->cancelled()) {
      front->fail("cancelled");
      queue_.pop_front();
      continue;
    }
    if (front->request().n > room) break;
    room -= front->request().n;
    out.push_back(front);
    queue_.pop_front();
  }
  stats_.queued = queue_.size();
  return out;
}

void Scheduler::score_prompts(const std::vector<std::shared_ptr<Job>>& jobs) {
  for (const auto& job : jobs) {
    if (!job->needs_prompt_scores()) continue;
    const std::vector<int32_t>& p = job->request().prompt;
    infer::ScoreOptions opt;
    opt.top_n = job->request().logprobs;
    opt.adapter = job->request().adapter;  // this request's adapter alone ("" = the base model)
    std::vector<infer::TokenScore> scores;
    if (p.size() > 1) {
      infer::ScoreRequest request;
      request.context.assign(p.begin(), p.begin() + 1);
      request.continuation.assign(p.begin() + 1, p.end());
      scores = infer::score_tokens(decoder_, {request}, opt)[0];
    }
    job->set_prompt_scores(scores);
  }
}

void Scheduler::fail_all(const std::string& what) {
  for (auto& job : active_) job->fail(what);
  active_.clear();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || engine_.size() > 0; });
      if (stop_) break;
    }
    std::vector<std::shared_ptr<Job>> joining = admit();
    int64_t prompt_tokens = 0, generated = 0, done = 0;
    try {
      if (!joining.empty()) {
        std::vector<infer::Sequence*> seqs;
        std::vector<std::string> adapters;
        for (auto& job : joining) {
          for (infer::Sequence& s : job->seqs_) {
            if (s.finished()) continue;
            seqs.push_back(&s);
            adapters.push_back(job->request().adapter);
          }
          prompt_tokens += int64_t(job->request().prompt.size());
          active_.push_back(job);
        }
        score_prompts(joining);
        engine_.join(seqs, adapters);
      }
      if (engine_.size() > 0) engine_.step();
      // Publish, then drop what finished or was cancelled.
      std::vector<infer::Sequence*> leaving;
      std::vector<std::shared_ptr<Job>> still;
      for (auto& job : active_) {
        job->publish();
        const bool cancelled = job->cancelled();
        bool all = true;
        for (infer::Sequence& s : job->seqs_) {
          if (s.finished() || cancelled) leaving.push_back(&s);
          all &= s.finished();
        }
        if (all || cancelled) {
          if (cancelled && !all) job->fail("cancelled");
          for (infer::Sequence& s : job->seqs_) generated += int64_t(s.generated().size());
          ++done;
        } else {
          still.push_back(job);
        }
      }
      active_.swap(still);
      if (!leaving.empty()) engine_.remove(leaving);
    } catch (const std::exception& e) {
      // The engine's state is unknown after a failure: fail every job in it and start over with an empty batch.
      spdlog::error("serve: generation failed: {}", e.what());
      engine_.reset();
      fail_all(e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = engine_.size();
    stats_.jobs_done += done;
    stats_.prompt_tokens += prompt_tokens;
    stats_.generated_tokens += generated;
    ++stats_.steps;
  }
}

}  // namespace lmtune::serve
