// The list of subcommands.
#include "cli/commands.h"

#include <CLI/CLI.hpp>

namespace lmtune::cli {

void add_commands(CLI::App& app, const std::string& device) {
  add_info_command(app, device);
  add_tokenize_command(app);
  add_bench_command(app, device);
  add_init_command(app, device);
  add_train_command(app, device);
  add_generate_command(app, device);
  add_chat_command(app, device);
  add_eval_command(app, device);
  add_export_command(app, device);
}

}  // namespace lmtune::cli
