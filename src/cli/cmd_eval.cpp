// `lmtune eval`: loss and perplexity of the base model and of each --adapter on a JSONL file (the training
// formats and masks; infer::evaluate_loss), plus exact-match / contains of greedy generations for
// prompt/completion data; or, for multiple-choice data ({"prompt", "choices", "answer"} records), log-likelihood
// accuracy (acc, acc_norm; infer::score_choices). Prints a table, or one JSON object per model with --json.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <functional>
#include <memory>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "core/error.h"
#include "data/dataset.h"
#include "infer/evaluate.h"
#include "infer/score.h"
#include "models/adapters.h"

namespace lmtune::cli {
namespace {

struct EvalArgs {
  ModelArgs model;
  std::string data, format = "auto";
  int batch_size = 4, max_seq_len = 1024;
  bool packing = false, no_base = false, no_generate = false, json = false;
};

// Runs `evaluate` on the base model (unless --no-base) and with each adapter attached alone.
void for_each_model(models::Decoder& decoder, const EvalArgs& a, const std::vector<infer::AdapterSpec>& specs,
                    const std::function<void(const std::string&)>& evaluate) {
  if (!a.no_base) evaluate("base");
  for (size_t i = 0; i < specs.size(); ++i) {
    infer::load_adapter(decoder, specs[i]);
    evaluate(a.model.adapters[i]);  // named as given on the command line
    models::remove_adapter(decoder.weights(), specs[i].name);
  }
}

// Multiple-choice data: the accuracy of picking the most likely choice (lm-eval's acc and acc_norm).
void run_choice_eval(models::Decoder& decoder, const Tokenizer& tok, const EvalArgs& a,
                     const std::vector<infer::AdapterSpec>& specs) {
  std::vector<infer::ChoiceRecord> records = infer::read_choice_records(a.data);
  spdlog::info("eval: {} multiple-choice records (log-likelihood accuracy)", records.size());
  std::vector<nlohmann::json> rows;
  for_each_model(decoder, a, specs, [&](const std::string& name) {
    infer::ChoiceAccuracy acc =
        infer::choice_accuracy(records, infer::score_choices(decoder, tok, records, a.data, a.batch_size));
    nlohmann::json j{{"name", name}, {"acc", acc.acc}, {"acc_norm", acc.acc_norm}, {"examples", acc.examples}};
    if (a.json) std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    rows.push_back(j);
  });
  if (a.json) return;
  size_t w = 5;
  for (const auto& r : rows) w = std::max(w, r["name"].get<std::string>().size());
  std::printf("%-*s %10s %10s %10s\n", int(w), "model", "acc", "acc_norm", "examples");
  for (const auto& r : rows)
    std::printf("%-*s %10.4f %10.4f %10lld\n", int(w), r["name"].get<std::string>().c_str(), r["acc"].get<double>(),
                r["acc_norm"].get<double>(), (long long)r["examples"].get<int64_t>());
}

void run_eval(const std::string& device, const EvalArgs& a) {
  apply_device_option(device);
  if (a.no_base && a.model.adapters.empty()) throw ConfigError("eval: --no-base needs at least one --adapter");
  if (a.batch_size <= 0 || a.max_seq_len <= 1) throw ConfigError("eval: --batch-size and --max-seq-len must be positive");
  std::vector<infer::AdapterSpec> specs;
  for (const auto& s : a.model.adapters) specs.push_back(infer::parse_adapter_spec(s));
  Tokenizer tok = load_model_tokenizer(a.model);
  const bool choices = infer::is_choice_file(a.data);
  if (choices) (void)infer::read_choice_records(a.data);  // bad records refused before the slow model load
  models::Decoder decoder = load_base_model(a.model);
  if (choices) return run_choice_eval(decoder, tok, a, specs);
  DataOptions opt;
  opt.format = a.format;
  opt.max_seq_len = a.max_seq_len;
  Dataset ds = load_dataset(a.data, tok, opt);
  std::vector<infer::PromptCompletion> pcs;
  if (!a.no_generate && ds.stats.format == "completion") pcs = infer::read_prompt_completions(a.data);
  spdlog::info("eval: {} samples, {} trainable tokens ({} format){}", ds.stats.samples, ds.stats.trainable_tokens,
               ds.stats.format, pcs.empty() ? "" : ", with generation metrics");

  std::vector<nlohmann::json> rows;
  auto evaluate = [&](const std::string& name) {
    infer::LossResult r = infer::evaluate_loss(decoder, ds, a.batch_size, a.max_seq_len, a.packing);
    nlohmann::json j{{"name", name}, {"loss", r.loss}, {"ppl", r.ppl()}, {"tokens", r.tokens}};
    if (!pcs.empty()) {
      infer::GenerationMetrics g = infer::evaluate_generation(decoder, tok, pcs, a.batch_size);
      j["exact_match"] = g.exact_match;
      j["contains"] = g.contains;
      j["examples"] = g.examples;
    }
    if (a.json) std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    rows.push_back(j);
  };
  for_each_model(decoder, a, specs, evaluate);
  if (a.json) return;
  size_t w = 5;
  for (const auto& r : rows) w = std::max(w, r["name"].get<std::string>().size());
  std::printf("%-*s %10s %12s %10s", int(w), "model", "loss", "ppl", "tokens");
  if (!pcs.empty()) std::printf(" %12s %10s", "exact_match", "contains");
  std::printf("\n");
  for (const auto& r : rows) {
    std::printf("%-*s %10.4f %12.4f %10lld", int(w), r["name"].get<std::string>().c_str(), r["loss"].get<double>(),
                r["ppl"].get<double>(), (long long)r["tokens"].get<int64_t>());
    if (!pcs.empty()) std::printf(" %12.4f %10.4f", r["exact_match"].get<double>(), r["contains"].get<double>());
    std::printf("\n");
  }
}

}  // namespace

void add_eval_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("eval", "Loss / perplexity (and generation metrics for prompt/completion "
                                         "data; acc / acc_norm for multiple-choice data) of the base model and "
                                         "each adapter on a JSONL file");
  auto a = std::make_shared<EvalArgs>();
  add_model_options(*cmd, a->model);
  cmd->add_option("--data", a->data, "JSONL file (text, prompt/completion, messages, or multiple-choice "
                                     "{\"prompt\", \"choices\", \"answer\"} records)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--format", a->format, "auto | text | completion | chat")->default_val("auto");
  cmd->add_option("--batch-size", a->batch_size, "sequences per forward pass")->default_val(4);
  cmd->add_option("--max-seq-len", a->max_seq_len, "longer samples are truncated, as in training")->default_val(1024);
  cmd->add_flag("--packing", a->packing, "pack samples into rows (same loss, fewer padded tokens)");
  cmd->add_flag("--no-base", a->no_base, "evaluate only the adapters");
  cmd->add_flag("--no-generate", a->no_generate, "skip generation metrics for prompt/completion data");
  cmd->add_flag("--json", a->json, "one JSON object per model: name, loss, ppl, tokens[, exact_match, contains] "
                                    "(multiple choice: name, acc, acc_norm, examples)");
  cmd->callback([&device, a] { run_eval(device, *a); });
}

}  // namespace lmtune::cli
