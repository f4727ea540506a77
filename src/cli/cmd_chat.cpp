// `lmtune chat`: an interactive conversation. Each stdin line is a user message; the conversation so far is
// rendered with the chat template (add_generation_prompt) and the reply streams to stdout. EOF or /exit ends it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "infer/generator.h"
#include "tokenizer/chat_template.h"

namespace lmtune::cli {
namespace {

struct ChatArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string system;
};

void run_chat(const std::string& device, const ChatArgs& a) {
  apply_device_option(device);
  a.sampling.params.validate();
  models::Decoder decoder = load_base_model(a.model);
  for (const auto& spec : a.model.adapters) infer::load_adapter(decoder, infer::parse_adapter_spec(spec));
  Tokenizer tok = load_model_tokenizer(a.model);
  ChatTemplate tmpl(tok);
  infer::StopParams stop;
  stop.max_tokens = a.sampling.max_tokens;
  stop.stop_strings = a.sampling.stops;
  stop.stop_ids = tmpl.stop_ids();
  nlohmann::json messages = nlohmann::json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  const bool interactive = isatty(STDIN_FILENO);
  infer::SamplingParams params = a.sampling.params;
  std::string line;
  for (;;) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<infer::Sequence> seqs;
    seqs.emplace_back(tmpl.encode_prompt(messages), params, stop, &tok);
    infer::generate(decoder, seqs, 1, [](size_t, const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", seqs[0].text()}});
    ++params.seed;  // a new random stream per turn, still reproducible
  }
}

}  // namespace

void add_chat_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("chat", "Interactive chat with the model's chat template (stdin lines; /exit or EOF ends)");
  auto a = std::make_shared<ChatArgs>();
  add_model_options(*cmd, a->model);
  cmd->add_option("--system", a->system, "system message");
  add_sampling_options(*cmd, a->sampling);
  cmd->callback([&device, a] { run_chat(device, *a); });
}

}  // namespace lmtune::cli
