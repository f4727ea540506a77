// `lmtune score`: log-likelihood of JSONL records (infer/score.h). Prompt/completion records get the sum and
// mean log-probability of the completion's tokens given the prompt; with --choices, {"prompt", "choices",
// "answer"} records get each choice's log-likelihood, the predicted index and the accuracy (acc and acc_norm as
// lm-eval defines them). A table, or one JSON object per record and a final summary object with --json.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "core/error.h"
#include "infer/model_checks.h"
#include "infer/score.h"

namespace lmtune::cli {
namespace {

struct ScoreArgs {
  ModelArgs model;
  std::string data;
  int batch_size = 8;
  bool choices = false, json = false;
};

void print_json(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// Refuses records longer than the model's context (their scores would be meaningless past it).
void check_context(const models::Decoder& decoder, const infer::ScoreRequest& r, const std::string& where) {
  const int64_t ctx = infer::model_context(decoder.config());
  const int64_t n = int64_t(r.context.size() + r.continuation.size());
  if (ctx > 0 && n > ctx)
    throw FileError(where + ": " + std::to_string(n) + " tokens exceed the model's context (" + std::to_string(ctx) +
                    ")");
}

void score_completions(const models::Decoder& decoder, const Tokenizer& tok, const ScoreArgs& a) {
  std::vector<infer::CompletionRecord> records = infer::read_completion_records(a.data);
  std::vector<infer::ScoreRequest> requests;
  for (const auto& r : records) {
    const std::string where = a.data + ":" + std::to_string(r.line);
    requests.push_back(infer::completion_request(tok, r.prompt, r.completion, where));
    check_context(decoder, requests.back(), where);
  }
  spdlog::info("score: {} records from {}", records.size(), a.data);
  infer::ScoreOptions opt;
  opt.batch_size = a.batch_size;
  opt.progress = "score";
  auto scores = infer::score_tokens(decoder, requests, opt);
  double total = 0;
  int64_t tokens = 0;
  if (!a.json) std::printf("%8s %14s %12s %8s\n", "line", "logprob", "mean", "tokens");
  for (size_t i = 0; i < records.size(); ++i) {
    double sum = 0;
    for (const auto& t : scores[i]) sum += double(t.logprob);
    const int64_t n = int64_t(scores[i].size());
    total += sum;
    tokens += n;
    if (a.json)
      print_json({{"line", records[i].line}, {"logprob", sum}, {"mean", sum / double(n)}, {"tokens", n}});
    else
      std::printf("%8lld %14.6f %12.6f %8lld\n", (long long)records[i].line, sum, sum / double(n), (long long)n);
  }
  const double mean = tokens > 0 ? total / double(tokens) : 0;
  if (a.json)
    print_json({{"summary", {{"records", records.size()}, {"logprob", total}, {"mean", mean}, {"tokens", tokens}}}});
  else
    std::printf("total: %zu records, %lld tokens, logprob %.6f, mean %.6f per token\n", records.size(),
                (long long)tokens, total, mean);
}

void score_choice_records(const models::Decoder& decoder, const Tokenizer& tok, const ScoreArgs& a) {
  std::vector<infer::ChoiceRecord> records = infer::read_choice_records(a.data);
  for (const auto& r : records)
    for (size_t c = 0; c < r.choices.size(); ++c) {
      const std::string where = a.data + ":" + std::to_string(r.line) + ": choice " + std::to_string(c);
      check_context(decoder, infer::completion_request(tok, r.prompt, r.choices[c], where), where);
    }
  spdlog::info("score: {} multiple-choice records from {}", records.size(), a.data);
  auto results = infer::score_choices(decoder, tok, records, a.data, a.batch_size);
  infer::ChoiceAccuracy acc = infer::choice_accuracy(records, results);
  if (!a.json) std::printf("%8s %6s %9s %14s  %s\n", "line", "answer", "predicted", "predicted_norm", "logprobs");
  for (size_t i = 0; i < records.size(); ++i) {
    const infer::ChoiceScores& r = results[i];
    if (a.json) {
      nlohmann::json choices = nlohmann::json::array();
      for (const auto& c : r.choices)
        choices.push_back({{"logprob", c.logprob}, {"tokens", c.tokens}, {"mean", c.logprob / double(c.tokens)},
                           {"chars", c.chars}, {"logprob_per_char", c.logprob / double(c.chars)}});
      print_json({{"line", records[i].line}, {"answer", records[i].answer}, {"predicted", r.predicted},
                  {"predicted_norm", r.predicted_norm}, {"choices", choices}});
    } else {
      std::string lps;
      for (const auto& c : r.choices) lps += (lps.empty() ? "" : " ") + std::to_string(c.logprob);
      std::printf("%8lld %6d %9d %14d  %s\n", (long long)records[i].line, records[i].answer, r.predicted,
                  r.predicted_norm, lps.c_str());
    }
  }
  if (a.json)
    print_json({{"summary", {{"examples", acc.examples}, {"acc", acc.acc}, {"acc_norm", acc.acc_norm}}}});
  else
    std::printf("examples %lld  acc %.4f  acc_norm %.4f\n", (long long)acc.examples, acc.acc, acc.acc_norm);
}

void run_score(const std::string& device, const ScoreArgs& a) {
  apply_device_option(device);
  if (a.batch_size <= 0) throw ConfigError("score: --batch-size must be positive");
  Tokenizer tok = load_model_tokenizer(a.model);
  // The records are read (and bad ones refused) before the slow model load.
  if (a.choices)
    (void)infer::read_choice_records(a.data);
  else
    (void)infer::read_completion_records(a.data);
  models::Decoder decoder = load_base_model(a.model);
  for (const auto& spec : a.model.adapters) infer::load_adapter(decoder, infer::parse_adapter_spec(spec));
  if (a.choices)
    score_choice_records(decoder, tok, a);
  else
    score_completions(decoder, tok, a);
  std::fflush(stdout);
}

}  // namespace

void add_score_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("score", "Log-likelihood of completions given prompts (or multiple-choice "
                                          "accuracy with --choices) from a JSONL file");
  auto a = std::make_shared<ScoreArgs>();
  add_model_options(*cmd, a->model);
  cmd->add_option("--data", a->data, "JSONL: {\"prompt\", \"completion\"} records, or with --choices {\"prompt\", "
                                     "\"choices\": [...], \"answer\": index}")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_flag("--choices", a->choices, "multiple-choice records: per-choice log-likelihoods, acc and acc_norm");
  cmd->add_option("--batch-size", a->batch_size, "records (choices) per forward pass")->default_val(8);
  cmd->add_flag("--json", a->json, "one JSON object per record, then {\"summary\": ...}");
  cmd->callback([&device, a] { run_score(device, *a); });
}

}  // namespace lmtune::cli
