// Registration of the CLI subcommands; each lives in cli/cmd_<name>.cpp.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace lmtune::cli {

// Adds every subcommand. `device` is the global --device option, applied by apply_device_option().
void add_commands(CLI::App& app, const std::string& device);
// Sets the default device from --device (if given) and the log level; call at the start of each command.
void apply_device_option(const std::string& device);

void add_info_command(CLI::App& app, const std::string& device);
void add_bench_command(CLI::App& app, const std::string& device);
void add_tokenize_command(CLI::App& app);

}  // namespace lmtune::cli
