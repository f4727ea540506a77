// Registration of the CLI subcommands; each lives in cli/cmd_<name>.cpp.
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace lmtune::cli {

// Adds every subcommand. `device` is the global --device option, applied by apply_device_option().
void add_commands(CLI::App& app, const std::string& device);
// Sets the default device from --device (if given) and the log level; call at the start of each command.
void apply_device_option(const std::string& device);
// The non-empty entries of a comma-separated option value ("a,,b" -> a, b).
std::vector<std::string> split_commas(const std::string& s);

void add_info_command(CLI::App& app, const std::string& device);
void add_bench_command(CLI::App& app, const std::string& device);
// `lmtune bench train` (cli/cmd_bench_train.cpp), a subcommand of `bench`.
void add_bench_train_command(CLI::App& bench, const std::string& device);
// `lmtune bench generate` (cli/cmd_bench_generate.cpp), a subcommand of `bench`.
void add_bench_generate_command(CLI::App& bench, const std::string& device);
void add_tokenize_command(CLI::App& app);
// `lmtune info MODEL_DIR` (cli/model_info.cpp): the model and a LoRA training memory estimate.
struct ModelInfoOptions {
  long long seq = 2048, batch = 1, rank = 16;
  std::string quantize = "none";  // the base projections' format in the estimate (QLoRA)
};
void print_model_info(const std::string& model_dir, const ModelInfoOptions& options);
// `lmtune init --arch A --config preset.yaml [--tokenizer DIR] --out DIR` (cli/cmd_init.cpp).
void add_init_command(CLI::App& app, const std::string& device);
// `lmtune train RECIPE [key=value ...] [--dry-run]` (cli/cmd_train.cpp).
void add_train_command(CLI::App& app, const std::string& device);
// Inference (cli/cmd_{generate,chat,eval,export}.cpp; the work is in src/infer/).
void add_generate_command(CLI::App& app, const std::string& device);
void add_chat_command(CLI::App& app, const std::string& device);
void add_eval_command(CLI::App& app, const std::string& device);
// `lmtune score` (cli/cmd_score.cpp; the work is in infer/score.h).
void add_score_command(CLI::App& app, const std::string& device);
void add_export_command(CLI::App& app, const std::string& device);
// `lmtune serve` (cli/cmd_serve.cpp; the work is in src/serve/).
void add_serve_command(CLI::App& app, const std::string& device);

}  // namespace lmtune::cli
