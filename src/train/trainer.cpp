// The training run (see trainer.h and docs/training.md).
#include "train/trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "core/backend.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/weights.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/metrics.h"
#include "train/model_setup.h"
#include "train/objective.h"
#include "train/schedule.h"
#include "train/train_step.h"

namespace lmtune {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = long(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

// A step's micro-batches are train.grad_accum × ranks consecutive batches of the data order, so a run may resume
// on another number of ranks exactly when that product stays the same.
void check_same_global_batch(int64_t accum_was, int64_t ranks_was, int64_t accum_now, int64_t ranks_now,
                             const fs::path& file) {
  const int64_t was = accum_was * ranks_was, now = accum_now * ranks_now;
  if (was != now)
    throw ConfigError("resume: the checkpoint " + file.string() + " was trained on " + std::to_string(ranks_was) +
                      " rank(s) with train.grad_accum " + std::to_string(accum_was) + " (" + std::to_string(was) +
                      " micro-batches per step), this run has " + std::to_string(ranks_now) + " rank(s) with " +
                      std::to_string(accum_now) + " (" + std::to_string(now) + "), so its data order and batches "
                      "would differ; resume with ranks x train.grad_accum = " + std::to_string(was));
  if (ranks_was != ranks_now)
    spdlog::warn("resume: the checkpoint {} was trained on {} rank(s), this run has {}; ranks x train.grad_accum "
                 "is {} as before, so every step sees the same micro-batches (sums may differ in the last bits)",
                 file.string(), ranks_was, ranks_now, now);
}

// Settings a resumed run must share with the checkpoint's recipe to continue the same run.
void check_resume_compatible(const Recipe& now, const CheckpointMeta& saved, const fs::path& file, int ranks) {
  Recipe was = parse_recipe(saved.recipe_yaml, file.string() + " (recipe)");
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  };
  struct Key {
    const char* name;
    std::string a, b;
  };
  const Key keys[] = {
      {"model", was.model, now.model},
      {"finetune", to_string(was.finetune), to_string(now.finetune)},
      {"objective", to_string(was.objective), to_string(now.objective)},
      {"precision", to_string(was.precision), to_string(now.precision)},
      {"quantize", quantize_name(was.quantize), quantize_name(now.quantize)},
      {"data.train", was.data.train, now.data.train},
      {"data.max_seq_len", std::to_string(was.data.max_seq_len), std::to_string(now.data.max_seq_len)},
      {"data.packing", std::to_string(was.data.packing), std::to_string(now.data.packing)},
      {"lora.rank", std::to_string(was.lora.rank), std::to_string(now.lora.rank)},
      {"lora.alpha", std::to_string(was.lora.alpha), std::to_string(now.lora.alpha)},
      {"lora.rslora", std::to_string(was.lora.rslora), std::to_string(now.lora.rslora)},
      {"lora.targets", join(was.lora.targets), join(now.lora.targets)},
      {"lora.init_from", was.lora.init_from, now.lora.init_from},
      {"optimizer.name", to_string(was.optimizer.name), to_string(now.optimizer.name)},
      {"train.batch_size", std::to_string(was.train.batch_size), std::to_string(now.train.batch_size)},
      {"train.seed", std::to_string(was.train.seed), std::to_string(now.train.seed)},
  };
  for (const Key& k : keys)
    if (k.a != k.b)
      throw ConfigError("resume: " + std::string(k.name) + " is '" + k.b + "' but the checkpoint " + file.string() +
                        " was trained with '" + k.a + "' (use another save.dir, or resume=false with --overwrite)");
  check_same_global_batch(was.train.grad_accum, saved.ranks, now.train.grad_accum, ranks, file);
  if (was.train.steps != now.train.steps)
    spdlog::warn("resume: train.steps changed from {} to {}; the learning-rate schedule changes with it",
                 was.train.steps, now.train.steps);
}

// The checkpoint to continue from, or nullopt for a fresh start. Throws before anything in save.dir is written
// when checkpoints exist but resume is off (without --overwrite), or none of them can be resumed from.
std::optional<ResumePoint> resume_or_fresh(const Recipe& r, const TrainOptions& options, int ranks) {
  const fs::path save_dir = r.save.dir;
  if (!r.resume) {
    const std::vector<fs::path> existing = list_checkpoints(save_dir);
    if (!existing.empty() && !options.overwrite)
      throw ConfigError("save.dir " + save_dir.string() + " already holds checkpoints (" +
                        existing.front().filename().string() +
                        "): set resume=true to continue that run, or pass --overwrite to start again");
    return std::nullopt;
  }
  std::optional<ResumePoint> p = find_resume_checkpoint(save_dir);
  if (!p) spdlog::info("resume: no checkpoint in {}, starting from step 0", checkpoint_dir(save_dir).string());
  else check_resume_compatible(r, p->meta, p->file, ranks);
  return p;
}

// Every rank resumes from the same step, or a rank reads another save.dir (several hosts need a shared one).
void check_ranks_agree(dist::Communicator& ranks, int64_t step, const std::string& save_dir) {
  const std::vector<double> steps = ranks.all_gather(double(step));
  for (size_t k = 1; k < steps.size(); ++k)
    if (steps[k] != steps[0])
      throw ConfigError("resume: rank " + std::to_string(k) + " starts at step " + std::to_string(int64_t(steps[k])) +
                        " but rank 0 at step " + std::to_string(int64_t(steps[0])) + ": every rank must see the same "
                        "save.dir " + save_dir + " (on several hosts, a shared filesystem)");
}

// Publishes what a save produces besides the checkpoint: the PEFT adapter (LoRA) or the model (full).
fs::path write_output(const Recipe& r, TrainableModel& tm) {
  const fs::path save = r.save.dir;
  if (r.finetune == Finetune::full) {
    const fs::path out = save / "model";
    models::save_weights(tm.decoder->config(), tm.decoder->weights(), out, DType::f32);
    for (const auto& e : fs::directory_iterator(r.model)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && n.find(".safetensors") == std::string::npos)
        fs::copy_file(e.path(), out / n, fs::copy_options::overwrite_existing);
    }
    return out;
  }
  const fs::path out = save / "adapter";
  PeftAdapter p = models::extract_peft(tm.decoder->weights(), "default", tm.lora_rank, tm.lora_alpha, tm.lora_rslora,
                                       r.lora.dropout, fs::absolute(r.model).lexically_normal().string());
  models::warn_unless_peft_reads(tm.decoder->config().model_type, p);
  save_peft_adapter(p, out);
  return out;
}

}  // namespace

TrainSummary train(const Recipe& r, const TrainOptions& options) {
  const std::unique_ptr<dist::Communicator> alone = options.ranks ? nullptr : dist::single_process();
  dist::Communicator& ranks = options.ranks ? *options.ranks : *alone;
  const bool root = ranks.is_root();  // rank 0 alone validates and writes files
  const Device device = training_device(r, options.device);
  check_model_files(r);  // before anything is written
  const fs::path save_dir = r.save.dir;

  // Resume or a fresh start; never silently mix runs, and never start over in place of a run that exists.
  std::optional<ResumePoint> resume_point = resume_or_fresh(r, options, ranks.size());
  const std::optional<fs::path> resume_from =
      resume_point ? std::optional<fs::path>(resume_point->file) : std::nullopt;
  const CheckpointMeta meta = resume_point ? resume_point->meta : CheckpointMeta{};

  Tokenizer tokenizer = Tokenizer::load(r.model);
  check_recipe_fits(r, tokenizer, device);
  // Rank 0 tokenizes first and fills the token cache in save.dir; the others then read it instead of racing it.
  if (!root) ranks.barrier();
  std::unique_ptr<StepSource> source = make_step_source(r, tokenizer, ranks.size());
  if (root) ranks.barrier();
  if (resume_from && meta.dataset_hash != source->data_hash())
    throw ConfigError("resume: the training data differs from the data " + resume_from->string() +
                      " was trained on (dataset hash " + source->data_hash() + " vs " + meta.dataset_hash +
                      "); resuming needs the same files, tokenizer and data settings");

  TrainableModel tm = build_trainable_model(r, device);
  const ModelConfig& config = tm.decoder->config();
  spdlog::info("model: {} ({} layers, hidden {}, vocab {}) on {}, weights {}{}, compute {}; {} trainable parameters",
               config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size, device.str(),
               dtype_name(tm.weight_dtype), r.quantize ? " (projections " + quantize_name(r.quantize) + ")" : "",
               to_string(r.precision), tm.trainable_count());
  Optimizer optimizer(tm.params, r.optimizer);

  TrainProgress pr;
  pr.seed = r.train.seed;
  pr.scaler = LossScaler::for_training(r.precision, device);
  if (resume_from) {
    TrainProgress loaded = load_checkpoint(*resume_from, optimizer);
    loaded.scaler.enabled = pr.scaler.enabled;
    pr = loaded;
    spdlog::info("resumed from {} at step {}", resume_from->string(), pr.step);
  }
  check_ranks_agree(ranks, pr.step, r.save.dir);
  source->set_cursor(pr.cursor);
  std::optional<MetricsLog> metrics;
  if (root) metrics.emplace(save_dir, resume_from ? pr.step : -1);
  const CheckpointMeta out_meta{r.resolved_yaml, source->data_hash(), ranks.size()};

  Backend& be = backend(device);
  TrainSummary sum;
  sum.base_valid_loss = sum.final_valid_loss = std::nan("");
  auto validate = [&](int64_t step) {
    auto t0 = Clock::now();
    std::string summary;
    const MetricValues values = source->validate(*tm.decoder, summary);
    metrics->log("valid", step, values);
    spdlog::info("valid step {}/{} | {} | {:.1f} s", step, r.train.steps, summary, seconds_since(t0));
    return values.front().second;
  };
  if (root && pr.step == 0 && source->has_valid() && r.eval.every > 0) sum.base_valid_loss = validate(0);

  const auto session_start = Clock::now();
  auto last_line = Clock::time_point{};
  int64_t session_tokens = 0;
  for (int64_t s = pr.step; s < r.train.steps; ++s) {
    test_crash_point("step-start", s + 1);
    const Batcher::Cursor step_cursor = source->cursor();
    StepOptions so = step_options(r, s, learning_rate(r.schedule, r.optimizer.lr, int(s), r.train.steps));
    so.unchecked_layers = tm.unchecked_layers;
    so.router_aux_loss_coef = router_aux_loss_coef(r, tm.decoder->config());
    if (ranks.size() > 1) so.ranks = &ranks;
    be.reset_peak();
    const auto t0 = Clock::now();
    StepResult res = source->step(*tm.decoder, optimizer, pr.scaler, so);
    const double dt = seconds_since(t0);
    const size_t peak = be.peak_bytes();
    sum.peak_bytes = std::max(sum.peak_bytes, peak);

    pr.step = s + 1;
    pr.cursor = source->cursor();
    pr.tokens_seen += res.tokens;
    session_tokens += res.tokens;
    if (res.applied) {
      pr.consecutive_skips = 0;
    } else {
      ++pr.skipped_steps;
      if (!res.overflow) ++pr.consecutive_skips;
      // Without a loss scaler nothing will change for the next batch: the weights or data are broken. Stop
      // before anything is saved, so the last good checkpoint and adapter stay as they are.
      if (!pr.scaler.enabled && !std::isfinite(res.loss))
        throw Error("training stopped at step " + std::to_string(pr.step) + ": " + res.skip_reason +
                    " (data epoch " + std::to_string(step_cursor.epoch) + ", samples " +
                    std::to_string(step_cursor.index) + ".." + std::to_string(pr.cursor.index - 1) +
                    " of the epoch's order); nothing was saved for this step. Check the model weights and the "
                    "data, or lower optimizer.lr");
      spdlog::warn("step {}/{} skipped: {} (data epoch {}, samples {}..{} of the epoch's order)", pr.step,
                   r.train.steps, res.skip_reason, step_cursor.epoch, step_cursor.index, pr.cursor.index - 1);
      if (pr.consecutive_skips >= r.train.max_skipped_steps)
        throw Error("training stopped at step " + std::to_string(pr.step) + " after " +
                    std::to_string(pr.consecutive_skips) + " consecutive skipped steps (train.max_skipped_steps): " +
                    res.skip_reason + "; last batch: data epoch " + std::to_string(step_cursor.epoch) + ", samples " +
                    std::to_string(step_cursor.index) + ".." + std::to_string(pr.cursor.index - 1) +
                    " of the epoch's order. Lower optimizer.lr, check the data, or use precision=bf16/fp32");
    }
    const double tps = double(res.tokens) / std::max(dt, 1e-9);
    MetricValues row{{"loss", res.loss}, {"lr", so.lr}, {"grad_norm", res.grad_norm}, {"tokens_per_s", tps},
                     {"peak_mib", double(peak) / double(1 << 20)}, {"loss_scale", pr.scaler.scale},
                     {"trainable_tokens", double(res.trainable_tokens)}, {"skipped", res.applied ? 0.0 : 1.0}};
    row.insert(row.end(), res.metrics.begin(), res.metrics.end());
    if (metrics) metrics->log("train", pr.step, row);
    sum.final_train_loss = res.loss;

    const double session_s = seconds_since(session_start);
    const bool last = pr.step == r.train.steps;
    const bool due = options.log_every > 0 ? pr.step % options.log_every == 0
                                           : seconds_since(last_line) >= 2.0 || r.train.steps <= 200;
    sum.steps_this_session += 1;
    if (due || last || s == 0) {
      last_line = Clock::now();
      const double avg = session_s / double(sum.steps_this_session);
      std::string extra;  // the objective's own metrics (preference: reward margin and accuracy)
      for (const auto& [name, value] : res.metrics)
        if (name == "reward_margin" || name == "accuracy") extra += fmt::format(" | {} {:.3f}", name, value);
      spdlog::info("step {}/{} | loss {:.4f}{} | lr {:.2e} | grad {:.3f} | {:.0f} tok/s | peak {} | eta {}{}",
                   pr.step, r.train.steps, res.loss, extra, so.lr, res.grad_norm,
                   double(session_tokens) / std::max(session_s, 1e-9), mib(peak),
                   hms(avg * double(r.train.steps - pr.step)),
                   pr.scaler.enabled ? " | scale " + std::to_string(int64_t(pr.scaler.scale)) : std::string());
    }

    if (root && source->has_valid() && r.eval.every > 0 && (pr.step % r.eval.every == 0 || last))
      sum.final_valid_loss = validate(pr.step);
    if (root && ((r.save.every > 0 && pr.step % r.save.every == 0) || last)) {
      TrainProgress snapshot = pr;
      snapshot.elapsed_s = pr.elapsed_s + seconds_since(session_start);
      fs::path file = save_checkpoint(save_dir, snapshot, optimizer, out_meta);
      sum.output = write_output(r, tm);
      spdlog::info("saved {} and {}", file.string(), sum.output.string());
      test_crash_point("checkpoint-done", pr.step);
    }
  }
  sum.steps = pr.step;
  sum.seconds = seconds_since(session_start);
  sum.tokens_per_s = double(session_tokens) / std::max(sum.seconds, 1e-9);
  sum.skipped_steps = pr.skipped_steps;
  if (sum.output.empty()) sum.output = save_dir / (r.finetune == Finetune::full ? "model" : "adapter");
  spdlog::info("done: {} steps ({} this session) in {}, {:.0f} tok/s, final train loss {:.4f}, valid loss {}, "
               "peak memory {}, {} skipped step(s); {} in {}",
               sum.steps, sum.steps_this_session, hms(sum.seconds), sum.tokens_per_s, sum.final_train_loss,
               std::isnan(sum.final_valid_loss) ? std::string("-") : fmt::format("{:.4f}", sum.final_valid_loss),
               mib(sum.peak_bytes), sum.skipped_steps, r.finetune == Finetune::full ? "model" : "adapter",
               sum.output.string());
  return sum;
}

}  // namespace lmtune
