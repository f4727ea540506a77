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
  add_score_command(app, device);
  add_export_command(app, device);
  add_serve_command(app, device);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

}  // namespace lmtune::cli
