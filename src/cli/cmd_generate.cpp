// `lmtune generate`: one prompt (raw, or wrapped in the chat template with --chat), streamed to stdout, or one
// JSON object with the ids, text and speed (--json). The engine is infer::Session (infer/generator.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "infer/generator.h"
#include "infer/model_checks.h"
#include "tokenizer/chat_template.h"

namespace lmtune::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string prompt;
  bool chat = false, json = false;
};

void run_generate(const std::string& device, const GenerateArgs& a) {
  apply_device_option(device);
  a.sampling.params.validate();  // before the slow model load
  models::Decoder decoder = load_base_model(a.model);
  for (const auto& spec : a.model.adapters) infer::load_adapter(decoder, infer::parse_adapter_spec(spec));
  Tokenizer tok = load_model_tokenizer(a.model);
  infer::StopParams stop;
  stop.max_tokens = a.sampling.max_tokens;
  stop.stop_strings = a.sampling.stops;
  stop.stop_ids = tok.eos_ids();
  std::vector<int32_t> prompt;
  if (a.chat) {
    ChatTemplate tmpl(tok);
    prompt = tmpl.encode_prompt(nlohmann::json::array({{{"role", "user"}, {"content", a.prompt}}}));
    for (int32_t id : tmpl.stop_ids()) stop.stop_ids.push_back(id);
  } else {
    prompt = tok.encode(a.prompt, true);
  }
  infer::warn_past_context(decoder.config(), int64_t(prompt.size()), stop.max_tokens);
  std::vector<infer::Sequence> seqs;
  seqs.emplace_back(prompt, a.sampling.params, stop, &tok);
  infer::GenerationStats st = infer::generate(decoder, seqs, 1, [&](size_t, const std::string& piece) {
    if (a.json) return;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  const infer::Sequence& s = seqs[0];
  if (a.json) {
    nlohmann::json j{{"prompt_tokens", prompt.size()},
                     {"ids", s.generated()},
                     {"text", s.text()},
                     {"finish_reason", infer::finish_reason_name(s.finish_reason())},
                     {"prefill_tokens_per_s", st.prefill_tokens_per_s()},
                     {"decode_tokens_per_s", st.decode_tokens_per_s()},
                     {"prefill_seconds", st.prefill_seconds},
                     {"decode_seconds", st.decode_seconds},
                     {"peak_memory_bytes", st.peak_bytes},
                     {"device", decoder.device().str()}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
  }
}

}  // namespace

void add_generate_command(CLI::App& app, const std::string& device) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  auto a = std::make_shared<GenerateArgs>();
  add_model_options(*cmd, a->model);
  cmd->add_option("--prompt", a->prompt, "prompt text")->required();
  cmd->add_flag("--chat", a->chat, "wrap the prompt as a user message in the model's chat template");
  add_sampling_options(*cmd, a->sampling);
  cmd->add_flag("--json", a->json, "print one JSON object: ids, text, finish_reason, tokens/s, peak memory");
  cmd->callback([&device, a] { run_generate(device, *a); });
}

}  // namespace lmtune::cli
