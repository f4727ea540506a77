// The SFT and preference step sources (see objective.h).
#include "train/objective.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "core/error.h"
#include "infer/evaluate.h"
#include "train/preference.h"
#include "train/train_data.h"

namespace lmtune {
namespace {

class SftSource : public StepSource {
 public:
  SftSource(const Recipe& r, const Tokenizer& tok, int ranks)
      : r_(r),
        micro_per_step_(r.train.grad_accum * ranks),
        data_(load_train_data(r, tok)),
        batcher_(data_.train, r.train.batch_size, r.data.max_seq_len, r.data.packing, r.train.seed) {
    spdlog::info("data: {} training samples ({} tokens, {} trainable), {} validation samples",
                 data_.train.stats.samples, data_.train.stats.tokens, data_.train.stats.trainable_tokens,
                 data_.valid.samples.size());
  }
  const std::string& data_hash() const override { return data_.hash; }
  bool has_valid() const override { return data_.has_valid(); }
  Batcher::Cursor cursor() const override { return batcher_.cursor(); }
  void set_cursor(Batcher::Cursor c) override { batcher_.set_cursor(c); }

  StepResult step(const models::Decoder& model, Optimizer& opt, LossScaler& scaler, const StepOptions& o) override {
    std::vector<Batch> micro;
    for (int i = 0; i < micro_per_step_; ++i) micro.push_back(batcher_.next());
    return train_step(model, opt, scaler, micro, o);
  }

  MetricValues validate(const models::Decoder& model, std::string& summary) override {
    // The same function as `lmtune eval`, so the two report the same loss.
    infer::LossResult e = infer::evaluate_loss(model, data_.valid, r_.train.batch_size, r_.data.max_seq_len,
                                               r_.data.packing, r_.eval.batches);
    const double loss = e.tokens > 0 ? e.loss : std::nan("");
    summary = fmt::format("loss {:.4f} | {} tokens in {} batches", loss, e.tokens, e.batches);
    return {{"loss", loss}, {"tokens", double(e.tokens)}};
  }

 private:
  const Recipe& r_;
  int micro_per_step_;
  TrainData data_;
  Batcher batcher_;
};

class PreferenceSource : public StepSource {
 public:
  PreferenceSource(const Recipe& r, const Tokenizer& tok, int ranks)
      : r_(r),
        micro_per_step_(r.train.grad_accum * ranks),
        settings_(preference_settings(r)),
        data_(load_preference_data(r, tok)),
        batcher_(data_.train, r.train.batch_size, r.data.max_seq_len, r.data.packing, r.train.seed) {
    spdlog::info("data: {} training pairs ({} tokens, {} in responses), {} validation pairs; objective {}",
                 data_.train.stats.samples, data_.train.stats.tokens, data_.train.stats.trainable_tokens,
                 data_.valid.pairs.size(), to_string(r.objective));
  }
  const std::string& data_hash() const override { return data_.hash; }
  bool has_valid() const override { return !data_.valid.pairs.empty(); }
  Batcher::Cursor cursor() const override { return batcher_.cursor(); }
  void set_cursor(Batcher::Cursor c) override { batcher_.set_cursor(c); }

  StepResult step(const models::Decoder& model, Optimizer& opt, LossScaler& scaler, const StepOptions& o) override {
    std::vector<PairBatch> micro;
    for (int i = 0; i < micro_per_step_; ++i) micro.push_back(batcher_.next());
    return preference_train_step(model, opt, scaler, micro, o, settings_);
  }

  MetricValues validate(const models::Decoder& model, std::string& summary) override {
    PreferenceEval e = evaluate_preference(model, data_.valid, r_.train.batch_size, r_.data.max_seq_len,
                                           r_.data.packing, settings_, r_.eval.batches);
    MetricValues m{{"loss", e.loss}};
    for (const auto& kv : e.rewards.metrics()) m.push_back(kv);
    m.push_back({"pairs", double(e.rewards.pairs)});
    summary = fmt::format("loss {:.4f} | reward_margin {:.3f} | accuracy {:.3f} | {} pairs in {} batches", e.loss,
                          e.rewards.metrics()[0].second, e.rewards.metrics()[1].second, e.rewards.pairs, e.batches);
    return m;
  }

 private:
  const Recipe& r_;
  int micro_per_step_;
  PreferenceSettings settings_;
  PreferenceData data_;
  PairBatcher batcher_;
};

}  // namespace

std::unique_ptr<StepSource> make_step_source(const Recipe& r, const Tokenizer& tok, int ranks) {
  if (r.objective == Objective::sft) return std::make_unique<SftSource>(r, tok, ranks);
  return std::make_unique<PreferenceSource>(r, tok, ranks);
}

}  // namespace lmtune
