// What the trainer's loop asks of its objective, whatever it is: the training data and its batcher, one optimizer
// step over train.grad_accum micro-batches, and validation. SFT (token cross-entropy on text, completion or chat
// data) and the preference objectives (DPO, ORPO, SimPO on prompt/chosen/rejected pairs) implement it.
#pragma once
#include <memory>
#include <string>

#include "data/batcher.h"
#include "models/decoder.h"
#include "train/metrics.h"
#include "train/recipe.h"
#include "train/train_step.h"

namespace lmtune {

class Tokenizer;

class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual const std::string& data_hash() const = 0;  // checkpoints record it; resume checks it
  virtual bool has_valid() const = 0;
  virtual Batcher::Cursor cursor() const = 0;
  virtual void set_cursor(Batcher::Cursor cursor) = 0;
  // Draws the step's micro-batches and runs it (train_step or preference_train_step).
  virtual StepResult step(const models::Decoder& model, Optimizer& optimizer, LossScaler& scaler,
                          const StepOptions& options) = 0;
  // The validation metrics, "loss" first. `summary` receives a line's worth of what was measured.
  virtual MetricValues validate(const models::Decoder& model, std::string& summary) = 0;
};

// Loads the recipe's data for its objective (logging its statistics) and sets up the batcher. With `ranks` > 1
// (data parallelism) every step draws train.grad_accum × ranks micro-batches, exactly those one device
// with ranks times the accumulation would draw, and StepOptions::ranks shares them out.
std::unique_ptr<StepSource> make_step_source(const Recipe& recipe, const Tokenizer& tokenizer, int ranks = 1);

}  // namespace lmtune
